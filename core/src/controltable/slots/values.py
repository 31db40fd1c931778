"""The slot engine's value objects: ``Lease`` and what ``status()``, ``history()`` and ``stats()`` show.

A :class:`Lease` renews and releases through the small :class:`LeaseEngine` interface it is given
(the slot engine's :class:`~controltable.slots.holding.Holding`), so this module imports nothing of
the engine. The policy values
(:class:`Rate`) and the history figures (:class:`GrantRecord`, :class:`ResourceStats`) are plain
frozen dataclasses; ``parse_rate`` and ``parse_duration`` read them from the command line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Optional, Protocol, Union

from .. import tracing
from ..clock import utc
from ..db import Database
from ..errors import ConfigurationError, DatabaseUnavailableError, LeaseLost
from ..interrupt import protected
from ..leaseclock import bounded_release, local_expiry, within_lease
from ..renewal import BackgroundRenewal
from ..validation import check_positive_int, check_seconds

log = logging.getLogger("controltable")


class LeaseEngine(Protocol):
    """What a :class:`Lease` needs of the engine that granted it: renew, release, ask whether it is
    held, and the database whose deadlines bound those calls (``Holding`` implements it)."""

    db: Database

    def renew(self, lease: Lease, seconds: float) -> float: ...

    def release(self, lease: Lease) -> None: ...

    def is_held(self, lease: Lease) -> bool: ...


class Lease(BackgroundRenewal):
    """A granted slot request. Renew it while working, release it when done.

    Usable as a context manager (``with ct.acquire(...) as lease``), which releases on exit.
    :meth:`ControlTable.slot` additionally renews it in the background; with a renewer running,
    the block is interrupted (:class:`~controltable.errors.LeaseLostInterrupt`) when the renewer
    finds the lease lost or expired, unless :attr:`interrupt` is false.
    """

    def __init__(
        self,
        engine: LeaseEngine,
        *,
        resources: dict[str, int],
        mode: str,
        holder: str,
        request_key: str,
        tokens: dict[str, int],
        lease_seconds: float,
        expires_at: float,
        granted_at: Optional[float],
        ticket: int = 0,
        attempt: Optional[int] = None,
        sent: Optional[float] = None,
    ) -> None:
        #: What renewal and release go through (the granting engine's ``Holding``, never the ControlTable).
        self.engine = engine
        #: The caller's attempt number this grant belongs to (None when none was given).
        self.attempt = attempt
        #: The queue ticket (FIFO position); grants follow ticket order, so tokens do too.
        self.ticket = ticket
        self.resources = resources
        self.mode = mode
        self.holder = holder
        self.request_key = request_key
        self.tokens = tokens
        self.lease_seconds = lease_seconds
        self._expires_at = expires_at
        self._granted_at = granted_at
        self.released = False
        self.lost: Optional[LeaseLost] = None
        self._armed_here = False
        #: When the lease runs out at the latest on this machine's monotonic clock: its length
        #: after the grant was sent (``sent``; by default when this object was made, which is
        #: after the grant: a grant's reply delay is not counted), then after each renewal's send.
        self._local_expires = local_expiry(time.monotonic() if sent is None else sent, lease_seconds)

    # -- facts -----------------------------------------------------------------------------
    @property
    def token(self) -> int:
        """The fencing token; for a multi-resource request, the first resource's (see ``tokens``)."""
        return self.tokens[next(iter(self.resources))]

    @property
    def resource(self) -> str:
        return next(iter(self.resources))

    @property
    def slots(self) -> int:
        return self.resources[self.resource]

    @property
    def expires_at(self) -> datetime:
        """When the lease runs out on the database clock, unless renewed (UTC)."""
        value = utc(self._expires_at)
        assert value is not None
        return value

    @property
    def granted_at(self) -> Optional[datetime]:
        return utc(self._granted_at)

    def __repr__(self) -> str:
        return (
            f"Lease(resources={self.resources!r}, mode={self.mode!r}, holder={self.holder!r}, "
            f"tokens={self.tokens!r}, expires_at={self.expires_at.isoformat()})"
        )

    # -- actions ---------------------------------------------------------------------------
    def renew(self, lease: Optional[float] = None) -> Lease:
        """Extend the lease to ``lease`` seconds (default: the original length) from now.

        Raises :class:`LeaseLost` if the lease already expired and was reaped or taken over, or
        if the database could not be reached before it would have expired (see
        :mod:`controltable.leaseclock`); :class:`~controltable.errors.DatabaseUnavailableError`
        before that (the lease may outlive the outage: retry).
        """
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        if self.released:
            raise LeaseLost(f"lease of {self.holder!r} on {self._names()} was already released")
        sent = time.monotonic()
        with within_lease(self.engine.db, self._local_expires, self._what()):
            self._expires_at = self.engine.renew(self, seconds)
        self._local_expires = local_expiry(sent, seconds)
        self.lease_seconds = seconds
        return self

    @tracing.ends_hold
    def release(self) -> None:
        """Give the slots back. Raises :class:`LeaseLost` if they were no longer held.

        A lease the renewer already found gone (taken over, reaped, expired unrenewed) is not
        asked after again: there is nothing to give back, and the path to the database may be
        what lost it, so its :attr:`lost` is raised at once. One whose renewal only stopped on
        purpose (orphaned, ``alive()`` false: ``lost.gone`` is false) still holds its rows: they
        are given back first (bounded), then the stop is reported.
        """
        self.stop_renewing()
        if self.released:
            return
        self.released = True
        if self.lost is not None and self.lost.gone:
            raise self.lost
        with bounded_release(self.engine.db):
            self.engine.release(self)
        if self.lost is not None:
            raise self.lost

    def is_held(self) -> bool:
        """Ask the database whether this lease still holds all its slots."""
        if self.released:
            return False
        with within_lease(self.engine.db, self._local_expires, self._what()):
            return self.engine.is_held(self)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is no longer held (e.g. before a critical write).

        Also when the database could not be reached before the lease would have expired: the
        answer comes by the lease's expiry plus :data:`~controltable.defaults.TIMEOUT_MARGIN`.
        """
        if self.lost is not None:
            raise self.lost
        if not self.is_held():
            raise LeaseLost(f"lease of {self.holder!r} on {self._names()} is no longer held")

    def _what(self) -> str:
        return f"lease of {self.holder!r} on {self._names()}"

    def _names(self) -> str:
        return ", ".join(repr(n) for n in self.resources)

    # -- background renewal ----------------------------------------------------------------
    def _renew_interval(self) -> float:
        return self.lease_seconds / 3.0

    @protected
    def __enter__(self) -> Lease:
        # With a background renewer, a lease found lost or expired interrupts the block (see
        # ``BackgroundRenewal.interrupting``; ``self.interrupt = False`` or ``slot(interrupt=False)``
        # opts out). Disarmed first thing on exit, before the release.
        self._armed_here = self.interrupt and self._arm()
        tracing.enter_hold(self)  # the work's spans are the hold's children
        return self

    @protected
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Entry and exit are protected: an interrupt arriving here is reported by the exit (as
        # ``LeaseLostInterrupt``, the block's own error chained), never raised halfway through it.
        tracing.leave_hold(self)
        replacement = None
        if getattr(self, "_armed_here", False):
            self._armed_here = False
            replacement = self._leave_armed(exc)
        self.stop_renewing()
        quiet = exc_type is not None or replacement is not None  # an error is already on its way
        try:
            self.release()  # a lease known lost is not asked after (see release)
        except LeaseLost:
            if not quiet:
                raise
            log.warning("controltable: lease of %r was lost before release", self.holder)
        except DatabaseUnavailableError as err:
            # A lease already lost (e.g. the database went silent past its expiry) is the news:
            # the rows expire by themselves; the block's own exception is not masked either.
            if not quiet and self.lost is None:
                raise
            log.warning("controltable: lease of %r could not be released: %s", self.holder, err)
        if replacement is not None:
            raise replacement
        if exc_type is None and self.lost is not None:
            raise self.lost


class SlotBlock:
    """The context manager of :meth:`ControlTable.slot`: acquire, renew in the background, release.

    A class, not a ``@contextmanager`` generator: its entry and exit are code the lease-loss
    interrupt never lands in (:func:`~controltable.interrupt.protected`). A generator's exit runs
    in contextlib first, where an interrupt arriving as the work finished would be raised before
    the generator resumed, leaving the block armed and the release to the generator's finalisation.
    """

    def __init__(self, acquire: Callable[[], Lease], interrupt: Optional[bool]) -> None:
        self._acquire = acquire
        self._interrupt = interrupt
        self.lease: Optional[Lease] = None

    @protected
    def __enter__(self) -> Lease:
        lease = self._acquire()
        if self._interrupt is not None:
            lease.interrupt = bool(self._interrupt)
        lease.start_renewing()
        self.lease = lease.__enter__()
        return self.lease

    @protected
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.__exit__(exc_type, exc, tb)


@dataclass
class Entry:
    """One holder or waiter of a resource, as shown by ``status()``."""

    holder: str
    slots: int
    mode: str
    state: str
    since: Optional[datetime]
    expires_at: Optional[datetime]
    token: Optional[int]
    position: int
    expired: bool = False
    priority: int = 0
    #: The priority plus what aging added (waiters: now; holders: when granted).
    effective_priority: float = 0.0
    #: For waiters: the holders and the waiters ahead of it, in order (who it waits behind).
    ahead: list[str] = field(default_factory=list)


@dataclass
class WaitInfo:
    """Where one request stands in its queue, for logs ("position 3 behind X and Y") and metadata."""

    resource: str
    holder: str
    state: str  # "waiting" | "granted"
    #: 1 is the head of the queue; 0 once granted.
    position: int
    #: The holders and waiters ahead of it (holders first, then waiters in queue order).
    ahead: list[str]
    waiting_since: Optional[datetime]
    #: The fencing token once granted.
    token: Optional[int]
    expires_at: Optional[datetime] = None


@dataclass
class ResourceStatus:
    """A resource with its capacity, current holders and queue."""

    name: str
    capacity: int
    used: int
    last_token: int
    holders: list[Entry] = field(default_factory=list)
    waiters: list[Entry] = field(default_factory=list)
    rate: Optional[Rate] = None
    aging: Optional[float] = None
    #: Seconds until the rate window allows the next grant; None without a rate or while it allows one.
    rate_opens_in: Optional[float] = None


@dataclass(frozen=True)
class Rate:
    """At most ``count`` grants in any window of ``per`` seconds (beside the capacity)."""

    count: int
    per: float

    def __str__(self) -> str:
        return f"{self.count}/{self.per:g}s"


def check_rate(value: Union[Rate, tuple[int, float], None]) -> Optional[Rate]:
    """A rate from a :class:`Rate`, a ``(count, per)`` pair or None (no rate)."""
    if value is None:
        return None
    if isinstance(value, Rate):
        count, per = value.count, value.per
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        count, per = value
    else:
        raise ConfigurationError(
            f"rate must be Rate(count, per) or a (count, per) pair such as (100, 60), got {value!r}")
    n = check_positive_int("rate count", count)
    seconds = check_seconds("rate period", per)
    assert seconds is not None
    return Rate(n, seconds)


def parse_rate(text: str) -> Rate:
    """``"100/60s"``, ``"100/60"``, ``"100/1m"`` or ``"10/1h"`` as a :class:`Rate` (for the CLI)."""
    count, sep, per = text.partition("/")
    if not sep:
        raise ConfigurationError(f"rate {text!r} must look like COUNT/PERIOD, e.g. 100/60s")
    try:
        n = int(count)
    except ValueError:
        raise ConfigurationError(f"rate {text!r}: {count!r} is not a whole number; write e.g. 100/60s") from None
    rate = check_rate((n, parse_duration(per)))
    assert rate is not None  # a tuple is never checked to None
    return rate


def parse_duration(text: str) -> float:
    """``"30"``, ``"30s"``, ``"5m"``, ``"1h"`` or ``"2d"`` in seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip().lower()
    factor = units.get(raw[-1:])
    number = raw[:-1] if factor is not None else raw
    try:
        value = float(number) * (factor or 1.0)
    except ValueError:
        raise ConfigurationError(f"duration {text!r} must be a number of seconds or e.g. 30s, 5m, 1h") from None
    seconds = check_seconds("duration", value)
    assert seconds is not None
    return seconds


@dataclass(frozen=True)
class GrantRecord:
    """One grant of a slot request on one resource, from the history table."""

    resource: str
    holder: str
    mode: str
    slots: int
    priority: int
    token: int
    enqueued_at: datetime
    granted_at: datetime
    ended_at: Optional[datetime]
    outcome: str  # "held" | "released" | "expired"

    @property
    def wait_seconds(self) -> float:
        """How long the request waited in the queue before it was granted."""
        return max((self.granted_at - self.enqueued_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class ResourceStats:
    """What a resource's grants looked like over a window (from the grant history)."""

    resource: str
    start: datetime
    end: datetime
    capacity: int
    #: Grants made in the window.
    grants: int
    #: Queue waits of those grants (seconds); None without grants.
    wait_p50: Optional[float]
    wait_p95: Optional[float]
    wait_max: Optional[float]
    #: Slot-seconds held within the window / (capacity * window length), 0..1.
    utilisation: Optional[float]
    grants_per_hour: float
    #: Leases that ran out within the window (holders that died or stopped renewing).
    expired: int
