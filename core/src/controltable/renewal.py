"""Background renewal for anything held under a lease: slot leases, event batches, work items.

A renewer keeps a lease alive only while the work it covers can still be going on. Two signals
say it cannot: the owner says so (``alive()`` returns false), or the process was orphaned (the
parent it started under is gone, e.g. an Airflow task supervisor or a Dagster run worker that was
SIGKILLed). Then the renewer stops and lets the lease run out on the database clock, so the slot,
batch or item comes back to others within one lease instead of when the orphan finally ends.

The other way round, work must not outlive its lease: when the renewer finds the lease lost
(taken over, reaped, let go) or expired (renewals kept failing until the lease ran out), it
interrupts the work, but only while the work is inside a ``with`` block that armed the interrupt
(:meth:`BackgroundRenewal.interrupting`, :meth:`BackgroundRenewal.renewing`, ``with lease:``): its
running statements are cancelled in the server and :class:`~controltable.errors.LeaseLostInterrupt`
is raised in its thread, a blocked main thread included (:mod:`controltable.interrupt` says how).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType
from typing import Any, Callable, Optional

from . import interrupt as interrupts
from . import threads
from .defaults import INTERRUPT_ON_LEASE_LOSS, ORPHAN_CHECK_INTERVAL, STOP_RENEWING_WHEN_ORPHANED
from .errors import LeaseLost, LeaseLostInterrupt

log = logging.getLogger("controltable")


def parent_gone(original_ppid: int) -> bool:
    """True once this process's parent is no longer ``original_ppid`` (it died; we were re-parented).

    POSIX re-parents an orphan to init or to the nearest subreaper, so a changed ``getppid()``
    is the portable sign, with no race against PID reuse. A process started by PID 1 (a container's
    entry point) has no parent to lose.
    """
    return original_ppid > 1 and os.getppid() != original_ppid


class Renewer(threading.Thread):
    """Calls ``target.renew()`` every ``interval`` seconds; remembers a loss in ``target.lost``.

    A failed renewal that is not a loss (the database briefly unreachable) is retried at the next
    tick: the lease may well outlive the outage. Once the lease's length has passed since the
    last renewal that went through (on this machine's monotonic clock, counted from before that
    renewal was sent, so never later than the database's expiry) the lease is taken as expired:
    a :class:`LeaseLost` is recorded. Between renewals the renewer looks at least every
    :data:`~controltable.defaults.ORPHAN_CHECK_INTERVAL` seconds whether it should stop (orphaned,
    or ``alive()`` false); stopping that way records a :class:`LeaseLost` in ``target.lost`` so the
    owner's next complete/release/check reports that the lease was let go. Every recorded loss
    also interrupts the owner's work if it armed the interrupt.
    """

    def __init__(self, target: BackgroundRenewal, interval: float, name: str, *, stop_when_orphaned: bool = False,
                 alive: Optional[Callable[[], bool]] = None) -> None:
        super().__init__(name=f"controltable-renew-{name}", daemon=True)
        self.target = target
        self.interval = interval
        self.alive = alive
        #: The parent this process had when renewal started (None: orphan detection is off).
        self.parent_pid: Optional[int] = os.getppid() if stop_when_orphaned else None
        #: Why the renewer stopped by itself ("orphaned", "owner ended the work"), if it did.
        self.stopped_because: Optional[str] = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=10)

    def _reason_to_stop(self) -> Optional[str]:
        if self.parent_pid is not None and parent_gone(self.parent_pid):
            return f"the process was orphaned (parent {self.parent_pid} is gone)"
        if self.alive is not None:
            try:
                if not self.alive():
                    return "its owner said the work ended"
            except Exception as exc:  # a broken callback must not keep a lease alive forever
                return f"the owner's alive() check failed ({type(exc).__name__}: {exc})"
        return None

    def _lose(self, exc: LeaseLost) -> None:
        """Record the loss for the owner's next call, and interrupt its work if it armed that."""
        self.target.lost = exc
        self.target._interrupt_owner(self._stop_event)

    def run(self) -> None:
        watching = self.parent_pid is not None or self.alive is not None
        step = min(self.interval, ORPHAN_CHECK_INTERVAL) if watching else self.interval
        started = time.monotonic()
        next_renewal = started + self.interval
        seconds = getattr(self.target, "lease_seconds", None)
        # When the lease runs out unless renewed: at most its length after renewal started (the
        # grant came before that), then its length after the last renewal that went through.
        expires = started + float(seconds) if seconds else None
        while not self._stop_event.wait(max(min(step, next_renewal - time.monotonic()), 0.0)):
            reason = self._reason_to_stop()
            if reason is not None:
                self.stopped_because = reason
                interrupts.say(logging.WARNING, "controltable: stopped renewing %s: %s; the lease will expire",
                               self.name, reason)
                self._lose(LeaseLost(f"renewal stopped because {reason}; the lease was left to expire", gone=False))
                return
            if time.monotonic() < next_renewal:
                continue
            sent = time.monotonic()
            next_renewal = sent + self.interval
            try:
                self.target.renew()
            except LeaseLost as exc:
                interrupts.say(logging.ERROR, "controltable: %s", exc)
                self._lose(exc)
                return
            except Exception as exc:
                if expires is not None and time.monotonic() >= expires:
                    interrupts.say(logging.ERROR, "controltable: lease of %s expired while renewal failed: %s",
                                   self.name, exc)
                    self._lose(LeaseLost(
                        f"the lease expired: renewals kept failing for its whole length ({exc}); another "
                        "holder may have it now"))
                    return
                interrupts.say(logging.WARNING, "controltable: lease renewal failed, will retry: %s", exc)
                if expires is not None:
                    next_renewal = min(next_renewal, expires)  # notice the expiry when it comes
            else:
                seconds = getattr(self.target, "lease_seconds", None)
                expires = sent + float(seconds) if seconds else None


class BackgroundRenewal:
    """Mixin: ``start_renewing()`` keeps the object's lease alive from a daemon thread."""

    lost: Optional[LeaseLost] = None
    _renewer: Optional[Renewer] = None
    #: Whether :meth:`interrupting` (``with lease:``, ``slot()``, :meth:`renewing`) arms the
    #: interrupt by default; ``slot(interrupt=...)`` sets it for a lease.
    interrupt: bool = INTERRUPT_ON_LEASE_LOSS
    #: The armed block (its thread, and whether the interrupt was sent or delivered), if any.
    _arming: Optional[interrupts.Arming] = None

    def renew(self, lease: Optional[float] = None) -> Any:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def _renew_interval(self) -> float:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def start_renewing(
        self,
        interval: Optional[float] = None,
        *,
        stop_when_orphaned: Optional[bool] = None,
        alive: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Renew in a daemon thread every ``interval`` seconds (default: a third of the lease).

        A loss is recorded in ``lost`` and raised by the next complete/release (or ``check``).

        ``stop_when_orphaned``: stop renewing (and let the lease expire) once the parent process
        this process started under is gone, so the slot comes back within one lease rather than when
        the orphan ends. Default :data:`~controltable.defaults.STOP_RENEWING_WHEN_ORPHANED` (off: a
        ``nohup`` job outlives its shell on purpose); supervised workers (Airflow, Dagster) pass ``True``.

        ``alive``: a callback checked as often as the orphan test; renewal stops when it returns
        false (or raises), e.g. ``lambda: not finished.is_set()`` or a run-status check.
        """
        if self._renewer is None:
            orphan = STOP_RENEWING_WHEN_ORPHANED if stop_when_orphaned is None else bool(stop_when_orphaned)
            self._renewer = Renewer(
                self, interval or max(self._renew_interval(), 0.05), type(self).__name__,
                stop_when_orphaned=orphan, alive=alive,
            )
            threads.start(self._renewer)

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    # -- interrupting the work when the lease is gone ------------------------------------------
    def _interrupt_owner(self, stopping: Optional[threading.Event] = None) -> None:
        """From the renewer: cancel the armed block's statements and interrupt its thread, once."""
        interrupts.interrupt(self._arming, stopping)

    @interrupts.protected
    def _arm(self) -> bool:
        """Arm the interrupt for the calling thread; False if a block already did (it is shared)."""
        if self.lost is not None:  # lost before the work began: do not begin it
            raise LeaseLostInterrupt(f"the lease was already lost before the work began: {self.lost}",
                                     self.lost.keys) from self.lost
        if self._arming is not None:
            return False
        self._arming = interrupts.arm(self)
        return True

    @interrupts.protected
    def _disarm(self) -> bool:
        """Disarm: no interrupt reaches the block after this; whether one was sent."""
        block, self._arming = self._arming, None
        return interrupts.disarm(block) if block is not None else False

    @interrupts.protected
    def _leave_armed(self, exc: Optional[BaseException]) -> Optional[BaseException]:
        """Disarm at the block's end; what it raises instead of ``exc`` (see :func:`interrupt.outcome`)."""
        block, self._arming = self._arming, None
        return interrupts.outcome(block, exc) if block is not None else None

    def interrupting(self, interrupt: Optional[bool] = None) -> Interrupting:
        """While the block runs, a lease found lost or expired by the renewer interrupts it.

        Its running statements are cancelled in the server and the block gets
        :class:`~controltable.errors.LeaseLostInterrupt` in this thread, blocked or not (how, and what
        the caller then sees: :mod:`controltable.interrupt`). ``interrupt=False`` turns it off for this
        block (default: :attr:`interrupt`). Nested blocks of the same thread share the outer one's
        arming. Only a background renewer (:meth:`start_renewing`) interrupts.
        """
        return Interrupting(self, self.interrupt if interrupt is None else bool(interrupt))

    def renewing(
        self,
        interval: Optional[float] = None,
        *,
        stop_when_orphaned: Optional[bool] = None,
        alive: Optional[Callable[[], bool]] = None,
        interrupt: Optional[bool] = None,
    ) -> Renewing:
        """Renew in the background while the block runs, and interrupt the block if the lease is gone.

        ``with item.renewing(): work(item.payload)`` then ``item.complete()`` (inside or after the
        block). The renewal stops when the block ends; a loss met while it ran is raised on
        exit (:class:`LeaseLost`) unless the block raised. ``interrupt=False`` lets the work run
        on after a loss (it then learns of it at exit or from its next complete/check).
        Arguments as :meth:`start_renewing`.
        """
        return Renewing(self, interval, stop_when_orphaned, alive,
                        self.interrupt if interrupt is None else bool(interrupt))


class Interrupting:
    """The context manager of :meth:`BackgroundRenewal.interrupting` (a class: its entry and exit
    are code the interrupt never lands in, see :func:`controltable.interrupt.protected`)."""

    def __init__(self, owner: BackgroundRenewal, enabled: bool) -> None:
        self.owner = owner
        self.enabled = enabled
        self.armed = False

    @interrupts.protected
    def __enter__(self) -> Any:
        if self.enabled:
            self.armed = self.owner._arm()
        return self.owner

    @interrupts.protected
    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if not self.armed:
            return
        self.armed = False
        replacement = self.owner._leave_armed(exc)
        if replacement is not None:
            raise replacement


class Renewing:
    """The context manager of :meth:`BackgroundRenewal.renewing`."""

    def __init__(self, owner: BackgroundRenewal, interval: Optional[float], stop_when_orphaned: Optional[bool],
                 alive: Optional[Callable[[], bool]], enabled: bool) -> None:
        self.owner = owner
        self.args = (interval, stop_when_orphaned, alive)
        self.inner = Interrupting(owner, enabled)

    @interrupts.protected
    def __enter__(self) -> Any:
        interval, orphan, alive = self.args
        self.owner.start_renewing(interval, stop_when_orphaned=orphan, alive=alive)
        try:
            return self.inner.__enter__()
        except BaseException:
            self.owner.stop_renewing()
            raise

    @interrupts.protected
    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self.inner.__exit__(exc_type, exc, tb)
        finally:
            self.owner.stop_renewing()
        if exc_type is None and self.owner.lost is not None:
            raise self.owner.lost
