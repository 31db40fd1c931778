"""Resource slots: FIFO counting semaphores and reader/writer locks with leases and fencing tokens.

The grant model: *whoever changes a queue grants*. Every transaction that releases, enqueues,
withdraws, reaps an expired holder or raises a capacity locks the resource rows (in name order,
so multi-resource requests cannot deadlock), then runs a grant pass: it reads the holders and
only the head of the waiting queue through the (namespace, resource, state, ticket) index, asks
:func:`grants.decide` who may run now (strict FIFO, all-or-nothing across resources), and grants
them on their behalf - state granted, the next fencing token, and a short pickup deadline.

A waiter reads only its own entry (no locks): woken by a push on PostgreSQL, polling elsewhere.
It picks its grant up by extending it to its lease; a grant not picked up in time lapses and the
next pass hands it on, so a dead waiter delays its queue by at most the pickup deadline. Expired
holders are reaped by the next pass, or by the head waiter when the first holder's lease runs
out. Tickets come from a per-resource counter bumped under the resource lock: exact FIFO on
every backend. Expiry is judged by the database clock, and a DELETE that re-checks it is the
only judge: a holder whose renewal wins the race keeps its slot, one that loses gets LeaseLost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

from sqlalchemy import and_, delete, func, insert, select, union_all, update
from sqlalchemy.engine import Connection

from . import dialects, errorcodes, grants
from . import history as hist
from .defaults import (  # noqa: F401 - re-exported
    DEFAULT_LEASE,
    DEFAULT_MODE,
    DEFAULT_PICKUP,
    DEFAULT_WAITER_TTL,
    HISTORY_PRUNE_BATCH,
    HISTORY_PRUNE_INTERVAL,
    HISTORY_RETENTION,
)
from .errors import AcquireTimeout, ConfigurationError, LeaseLost, UnknownResourceError
from .history import Rate
from .renewal import BackgroundRenewal
from .runtime import Runtime, runtime_of
from .validation import check_mode, check_name, check_poll_interval, check_priority, check_seconds, normalize_request

log = logging.getLogger("controltable")

#: Without push: the longest a waiter sleeps between looks at its entry (far back in the queue).
MAX_POLL_INTERVAL = 2.0
#: Without push: how often the head of the queue looks (a grant waits for it to look).
HEAD_POLL_INTERVAL = 0.1
#: With push: the fallback look of a waiter near the head, for a notification that was lost
#: (it backs off from this to half the pickup deadline while nothing happens).
PUSH_POLL_INTERVAL = 1.0
#: With push, the waiters this near the head keep the fallback look (further back: refresh only).
HEAD_POSITIONS = 1
#: With push, a waiter told it became the head waits this long for its grant before it looks.
HEAD_SETTLE = 1.0
#: A waiter refreshes its queue entry after this fraction of ``waiter_ttl``.
REFRESH_FRACTION = 0.5
#: A waiter behind the head reaps an expired holder itself once it is this many seconds overdue
#: (the head, which does it at once, may be dead).
REAP_GRACE = 2.0
#: Seconds past an ``acquire`` timeout that its last transaction may still take (then the
#: caller hears :class:`AcquireTimeout`, or the database error that stopped it).
DEADLINE_GRACE = 1.0
#: The shortest pickup deadline of a grant made on a waiter's behalf (its entry's own expiry
#: shortens the deadline down to this).
MIN_PICKUP = 1.0
#: A grant pass reads at most this many waiters (plus one) per queue and round.
HEAD_READ_LIMIT = 100

T = TypeVar("T")


def slot_key(resource: str) -> str:
    """The wake-up key of a resource's queue (pushed on every change of the queue)."""
    return f"slot:{resource}"


def head_key(resource: str, holder: str) -> str:
    """The wake-up key pushed when a request becomes the head of its queue (it then times the
    holders' leases); kept apart from :func:`holder_key` so a busy head is not woken twice."""
    return f"{holder_key(resource, holder)}\x1ehead"


def holder_key(resource: str, holder: str) -> str:
    """The wake-up key of one request: pushed when it is granted or becomes the head of its queue.

    A multi-resource request is keyed by its first resource in name order.
    """
    return f"slot:{resource}\x1e{holder}"


def utc(ts: Optional[float]) -> Optional[datetime]:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def check_attempt(value: object) -> Optional[int]:
    """An attempt number (a task's try number): None or a whole number from 0 up."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"attempt must be a whole number such as the task's try number, got {value!r}")
    if value < 0 or value > 2**31 - 1:
        raise ConfigurationError(f"attempt must be between 0 and {2**31 - 1}, got {value}")
    return value


def default_holder() -> str:
    """A holder id unique to this process and call (so two callers never share a request by accident)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass
class _Outcome:
    granted: bool
    request_key: str
    tokens: dict[str, int]
    expires_at: float
    granted_at: Optional[float]
    position: dict[str, int]
    ticket: int = 0
    attempt: Optional[int] = None
    #: The smallest capacity among the requested resources (to pace polling by queue position).
    capacity: int = 1
    #: One of the requested resources has a rate limit.
    rate_limited: bool = False


@dataclass
class _Res:
    """A locked resource row, kept up to date by the transaction that holds the lock."""

    name: str
    capacity: int
    last_token: int
    last_ticket: int
    #: The counters changed and are written back at the end of the transaction's grant pass.
    dirty: bool = False
    rate_count: Optional[int] = None
    rate_per: Optional[float] = None
    aging: Optional[float] = None


@dataclass
class _Entered:
    key: str
    attempt: Optional[int]
    ticket: int
    done: Optional[_Outcome] = None


@dataclass(frozen=True)
class _Request:
    """What a caller asked for, checked; ``key`` is chosen here, before the first transaction."""

    parts: dict[str, int]
    holder: str
    mode: str
    lease: float
    ttl: float
    pickup: float
    attempt: Optional[int]
    key: str
    #: When a waiting ``acquire(timeout=...)`` gives up (``time.monotonic()``), plus a short grace:
    #: bounds every transaction of the wait, so a silent server cannot hold the caller past it.
    deadline: Optional[float] = None
    #: Higher is granted first (see :mod:`controltable.grants`).
    priority: int = 0


class Lease(BackgroundRenewal):
    """A granted slot request. Renew it while working, release it when done.

    Usable as a context manager (``with ct.acquire(...) as lease``), which releases on exit.
    :meth:`ControlTable.slot` additionally renews it in the background.
    """

    def __init__(
        self,
        engine: SlotEngine,
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
    ) -> None:
        #: The engine that granted it: renewal and release go through it (never the ControlTable).
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

        Raises :class:`LeaseLost` if the lease already expired and was reaped or taken over.
        """
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        if self.released:
            raise LeaseLost(f"lease of {self.holder!r} on {self._names()} was already released")
        self._expires_at = self.engine.renew(self, seconds)
        self.lease_seconds = seconds
        return self

    def release(self) -> None:
        """Give the slots back. Raises :class:`LeaseLost` if they were no longer held."""
        self.stop_renewing()
        if self.released:
            return
        self.released = True
        self.engine.release(self)

    def is_held(self) -> bool:
        """Ask the database whether this lease still holds all its slots."""
        return not self.released and self.engine.is_held(self)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is no longer held (e.g. before a critical write)."""
        if self.lost is not None:
            raise self.lost
        if not self.is_held():
            raise LeaseLost(f"lease of {self.holder!r} on {self._names()} is no longer held")

    def _names(self) -> str:
        return ", ".join(repr(n) for n in self.resources)

    # -- background renewal ----------------------------------------------------------------
    def _renew_interval(self) -> float:
        return self.lease_seconds / 3.0

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop_renewing()
        try:
            self.release()
        except LeaseLost:
            if exc_type is None:
                raise
            log.warning("controltable: lease of %r was lost before release", self.holder)
        if exc_type is None and self.lost is not None:
            raise self.lost


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


class _NeedLocks(Exception):
    """A grant pass met a multi-resource request whose other resources it has not locked."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


def request_key(parts: Mapping[str, int]) -> str:
    """A new request key, chosen by the client before its first transaction.

    A multi-resource key carries its number of resources (``m2-...``), so a grant pass knows
    without another read that a waiter at its head needs more than the one queue, and can tell
    a request whose rows were partly removed (never granted then).
    """
    hexkey = uuid.uuid4().hex
    return hexkey if len(parts) == 1 else f"m{len(parts)}-{hexkey}"


def key_size(key: str) -> int:
    """How many resources the request with this key spans (1 for keys without a count)."""
    if key.startswith("m") and "-" in key:
        head = key[1:key.index("-")]
        if head.isdigit():
            return int(head)
    return 1


@dataclass
class _Peek:
    """What a waiter learns from reading its own entry (no locks)."""

    state: str  # "granted" (picked up now) | "waiting" | "gone" | "lapsed" | "mismatch"
    outcome: Optional[_Outcome] = None
    #: Whether this waiter should run a grant pass itself (a holder's lease ran out, or it fits).
    needs_pass: bool = False
    #: Seconds until the earliest holder's lease runs out (for the head of the queue).
    holder_expiry_in: Optional[float] = None
    head: bool = False
    recorded_attempt: Optional[int] = None
    #: Seconds until the rate window allows the next grant (when the head waits for it).
    rate_opens_in: Optional[float] = None
    #: One of the request's resources has a rate limit (a new head then looks at once: the grant
    #: it would wait for may be the rate window's, which nobody pushes).
    rate_limited: bool = False


class SlotEngine:
    """The SQL behind slots, for one namespace of one installation.

    Grants are made by whoever changes a queue: every transaction that releases, enqueues,
    withdraws, reaps or raises a capacity ends with :meth:`_grant_pass` under the resource row
    locks, which hands the freed capacity to the waiters at the head (decided by
    :func:`grants.decide`). Waiters only read their own entry and pick the grant up.
    """

    def __init__(self, runtime: Any) -> None:
        rt: Runtime = runtime_of(runtime)
        self.runtime = rt
        self.db = rt.db
        self.t = rt.tables
        self.ns = rt.namespace
        #: When this process next prunes a batch of history (``time.monotonic()``).
        self._next_prune = time.monotonic() + HISTORY_PRUNE_INTERVAL * random.random()

    # -- running a change followed by a grant pass ---------------------------------------------
    def _with_pass(self, names: set[str], action: Callable[[Connection, dict[str, Any], float], T]) -> T:
        """Run ``action`` and a grant pass in one transaction, holding the locks of ``names``.

        If the pass meets a multi-resource request whose resources are not all locked and cannot
        be locked in name order any more, the transaction is rolled back and run again with
        those resources locked from the start (all locks are always taken in name order).
        """
        lockset = set(names)
        for _ in range(8):
            locks = set(lockset)

            def run(conn: Connection, locks: set[str] = locks) -> T:
                return self._locked(conn, locks, action)

            try:
                return self.db.run(run)
            except _NeedLocks as need:
                lockset |= need.names
        # A chain of multi-resource requests kept moving: commit the change without passing the
        # capacity on here; the waiters at the head run a pass themselves when they next look.
        return self.db.run(lambda c: self._locked(c, lockset, action, grant=False))

    def _locked(
        self,
        conn: Connection,
        lockset: set[str],
        action: Callable[[Connection, dict[str, Any], float], T],
        grant: bool = True,
    ) -> T:
        res, now = self._lock(conn, lockset)
        result = action(conn, res, now)
        if grant:
            self._grant_pass(conn, res, now)
        return result

    def _lock(
        self, conn: Connection, names: set[str], into: Optional[dict[str, Any]] = None
    ) -> tuple[dict[str, Any], float]:
        """Lock the resource rows in name order (so multi-resource requests cannot deadlock).

        The database time comes back with the last lock. On PostgreSQL it is taken when that
        statement starts, before a lock wait: a time a little early only errs on the safe side
        (an expiry judged a little late, a lease a little shorter).
        """
        r = self.t.resource
        rows: dict[str, Any] = {} if into is None else into
        now = 0.0
        for name in sorted(names):
            if name in rows:
                continue
            row = conn.execute(
                dialects.lock_rows(
                    select(r.c.name, r.c.capacity, r.c.last_token, r.c.last_ticket, r.c.rate_count, r.c.rate_per,
                           r.c.aging, dialects.db_now().label("now"))
                    .where(r.c.namespace == self.ns, r.c.name == name),
                    r,
                )
            ).first()
            if row is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; create it with "
                    f"set_capacity({name!r}, n) or `controltable capacity set {name} N`"
                )
            rows[name] = _Res(name, int(row.capacity), int(row.last_token), int(row.last_ticket),
                              rate_count=None if row.rate_count is None else int(row.rate_count),
                              rate_per=None if row.rate_per is None else float(row.rate_per),
                              aging=None if row.aging is None else float(row.aging))
            now = max(now, float(row.now))
        return rows, now

    def _cols(self, q: Any) -> list[Any]:
        return [q.c.id, q.c.resource, q.c.holder, q.c.request_key, q.c.slots, q.c.mode, q.c.state, q.c.token,
                q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt, q.c.pickup_seconds, q.c.lease_seconds,
                q.c.priority, q.c.enqueued_at, q.c.queue_key]

    def _snapshot(self, conn: Connection, res: dict[str, Any]) -> list[Any]:
        """The holders of the locked resources and the head of each waiting queue, in one statement.

        Reads at most ``capacity + 1`` waiters per queue (no more can be granted by one pass),
        in queue order through the (namespace, resource, state, queue_key, ticket) index: the work
        does not depend on how many wait behind.
        """
        q = self.t.request
        cols = self._cols(q)
        parts: list[Any] = [
            select(*cols).where(q.c.namespace == self.ns, q.c.resource.in_(sorted(res)), q.c.state == "granted")
        ]
        for name in sorted(res):
            head = (
                select(*cols)
                .where(q.c.namespace == self.ns, q.c.resource == name, q.c.state == "waiting")
                .order_by(q.c.queue_key, q.c.ticket)
                .limit(self._head_size(res[name]))
                .subquery()
            )
            parts.append(select(*head.c))
        return list(conn.execute(union_all(*parts)).all())

    def _budget(self, conn: Connection, res: _Res, now: float) -> Optional[int]:
        """Grants the resource's rate window still allows at ``now`` (None: no rate limit)."""
        if res.rate_count is None or res.rate_per is None:
            return None
        used = int(conn.scalar(hist.window_count(self.t, self.ns, res.name, now - res.rate_per)) or 0)
        return max(res.rate_count - used, 0)

    def _end_grants(self, conn: Connection, rows: list[Any], now: float, outcome: Optional[str] = None) -> None:
        """Close the history rows of the granted ``rows`` being removed: released while their lease
        was live, expired otherwise (or ``outcome``)."""
        for row in rows:
            if row.state != "granted" or row.token is None:
                continue
            how = outcome or (hist.RELEASED if float(row.expires_at) >= now else hist.EXPIRED)
            conn.execute(hist.end_grant(self.t, self.ns, row.resource, int(row.token), how, now))

    @staticmethod
    def _head_size(res: _Res) -> int:
        return min(res.capacity, HEAD_READ_LIMIT) + 1

    def _grant_pass(
        self, conn: Connection, res: dict[str, Any], now: float, own: Optional[tuple[str, float]] = None,
        granted: Optional[dict[str, dict[str, int]]] = None,
    ) -> int:
        """Reap expired holders and grant every waiter that may now run, in FIFO order.

        Returns how many expired entries it removed. Grants are made on the waiters' behalf:
        state granted, a token from the resource's fencing counter, and ``pickup_seconds`` to
        pick the grant up before it lapses (see :meth:`_peek`). ``own`` is the (request key,
        lease) of the caller's own request, granted with its lease at once and not notified;
        ``granted`` collects the tokens of every grant made. The resource rows' counters are
        written once, at the end.
        """
        q, r = self.t.request, self.t.resource
        reaped = 0
        for _ in range(100):  # each round grants at least one waiter or ends
            rows = self._snapshot(conn, res)
            queues = {name: grants.Queue(name, res[name].capacity, aging=res[name].aging,
                                         budget=self._budget(conn, res[name], now)) for name in res}
            waiting: dict[str, list[Any]] = {name: [] for name in res}
            first_before: dict[str, str] = {}
            seen: set[int] = set()
            for row in rows:
                if row.id in seen:
                    continue
                seen.add(row.id)
                if float(row.expires_at) < now:
                    # The only judge of expiry: a renewal or pickup committed meanwhile keeps the row.
                    gone = conn.execute(delete(q).where(q.c.id == row.id, q.c.expires_at < now)).rowcount
                    if gone:
                        reaped += 1
                        if row.state == "granted" and row.token is not None:
                            conn.execute(hist.end_grant(self.t, self.ns, row.resource, int(row.token),
                                                        hist.EXPIRED, now))
                        continue
                if row.state == "granted":
                    queue = queues[row.resource]
                    queue.used += int(row.slots)
                    queue.exclusive_held = queue.exclusive_held or row.mode == "exclusive"
                else:
                    waiting[row.resource].append(row)
            multi = sorted({row.request_key for rs in waiting.values() for row in rs if key_size(row.request_key) > 1})
            spans: dict[str, set[str]] = {}
            if multi:
                found = conn.execute(select(q.c.request_key, q.c.resource).where(q.c.request_key.in_(multi)))
                for key, resource in found:
                    spans.setdefault(key, set()).add(resource)
            rows_by_key: dict[str, list[Any]] = {}
            for name, rs in waiting.items():
                rs.sort(key=lambda row: int(row.ticket))
                queue = queues[name]
                queue.complete = len(rs) < self._head_size(res[name])
                for row in rs:
                    span = spans.get(row.request_key, {name})
                    if len(span) != key_size(row.request_key):
                        continue  # partly removed (expired or withdrawn): never granted, expires whole
                    queue.head.append(grants.Waiter(row.request_key, int(row.ticket), int(row.slots), row.mode,
                                                    frozenset(span), int(row.priority), float(row.enqueued_at)))
                    rows_by_key.setdefault(row.request_key, []).append(row)
                queue.head = grants.order(queue.head, queue.aging)
                if queue.head:
                    first_before[name] = queue.head[0].key
            decision = grants.decide(queues)
            if decision.need:
                if min(decision.need) > max(res):
                    self._lock(conn, decision.need, into=res)  # still in name order: no deadlock
                    continue
                raise _NeedLocks(decision.need)
            notify: list[str] = []
            others = False
            for key in decision.grant:
                mine = own is not None and key == own[0]
                for row in rows_by_key[key]:
                    res[row.resource].last_token += 1
                    res[row.resource].dirty = True
                    token = res[row.resource].last_token
                    if granted is not None:
                        granted.setdefault(key, {})[row.resource] = token
                    if mine and own is not None:
                        # The caller's own request: picked up at once, with its lease.
                        values: dict[str, Any] = dict(expires_at=now + own[1], lease_seconds=own[1])
                    else:
                        pickup = float(row.pickup_seconds) if row.pickup_seconds is not None else DEFAULT_PICKUP
                        # Never longer than the waiter promised to stay alive: a live waiter looks at
                        # its entry before that, a dead one (that stopped refreshing) lapses sooner.
                        values = dict(expires_at=now + min(pickup, max(float(row.expires_at) - now, MIN_PICKUP)))
                    conn.execute(
                        update(q).where(q.c.id == row.id, q.c.state == "waiting").values(
                            state="granted", token=token, granted_at=now, **values
                        )
                    )
                    # In the grant's transaction: the rate window counts these rows.
                    conn.execute(hist.record_grant(self.t, self.ns, row.resource, token, row, int(row.priority), now))
                if not mine:
                    others = True
                    first = min(row.resource for row in rows_by_key[key])
                    notify.append(holder_key(first, next(x.holder for x in rows_by_key[key] if x.resource == first)))
            for name in sorted(res):
                if res[name].dirty:
                    conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name)
                                 .values(last_token=res[name].last_token, last_ticket=res[name].last_ticket))
                    res[name].dirty = False
            for name, key in decision.heads.items():
                rate_spent = queues[name].budget == 0
                # A new head times the holders' leases; a head stopped by a spent rate budget times
                # the window's next opening (which nobody pushes): either way, tell it to look.
                if (key != first_before.get(name) or rate_spent) and key in rows_by_key:
                    # A new head: it now times the holders' leases, so tell it.
                    row = rows_by_key[key][0]
                    notify.append(head_key(min(spans.get(key, {name})), row.holder))
            if others or reaped:
                notify.extend(slot_key(name) for name in sorted(res))
            if notify:
                self.runtime.notify(conn, notify)
            if not decision.more or not decision.grant:
                return reaped
        return reaped  # pragma: no cover - a hundred rounds of grants in one pass

    # -- capacity ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int, policy: Optional[dict[str, Any]] = None) -> None:
        """Create or change a resource; ``policy`` may hold ``rate`` (a Rate or None) and ``aging``
        (seconds or None) to set - keys left out are kept."""
        r, q = self.t.resource, self.t.request
        policy = policy or {}

        def create(conn: Connection) -> None:
            found = conn.execute(
                dialects.lock_rows(select(r.c.name).where(r.c.namespace == self.ns, r.c.name == name), r)
            ).first()
            if found is None:
                conn.execute(
                    insert(r).values(
                        namespace=self.ns, name=name, capacity=capacity, last_token=0, last_ticket=0,
                        created_at=dialects.db_now(),
                    )
                )

        try:
            self.db.run(create)
        except Exception as exc:  # a concurrent insert of the same name: the row exists now
            if not errorcodes.is_unique_violation(exc):
                raise

        def change(conn: Connection, res: dict[str, Any], now: float) -> None:
            values: dict[str, Any] = dict(capacity=capacity)
            if "rate" in policy:
                rate: Optional[Rate] = policy["rate"]
                values.update(rate_count=None if rate is None else rate.count,
                              rate_per=None if rate is None else rate.per)
                res[name].rate_count = values["rate_count"]
                res[name].rate_per = values["rate_per"]
            if "aging" in policy and policy["aging"] != res[name].aging:
                aging: Optional[float] = policy["aging"]
                values["aging"] = aging
                res[name].aging = aging
                # The queue order's key depends on aging: rewrite it for the waiters (under the lock).
                key = -q.c.priority if aging is None else q.c.enqueued_at - q.c.priority * aging
                conn.execute(update(q).where(q.c.namespace == self.ns, q.c.resource == name, q.c.state == "waiting")
                             .values(queue_key=key))
            conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name).values(**values))
            res[name].capacity = capacity  # a larger capacity grants the waiters that now fit

        self._with_pass({name}, change)

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        r, q = self.t.resource, self.t.request

        def fn(conn: Connection) -> bool:
            row = conn.execute(
                dialects.lock_rows(select(r.c.name).where(r.c.namespace == self.ns, r.c.name == name), r)
            ).first()
            if row is None:
                return False
            live = conn.scalar(
                select(q.c.id)
                .where(q.c.namespace == self.ns, q.c.resource == name, q.c.expires_at >= dialects.db_now())
                .limit(1)
            )
            if live is not None and not force:
                raise ConfigurationError(
                    f"resource {name!r} still has holders or waiters; release them, wait for their leases "
                    "to expire, or delete with force=True (--force)"
                )
            conn.execute(delete(q).where(q.c.namespace == self.ns, q.c.resource == name))
            conn.execute(hist.delete_resource(self.t, self.ns, name))
            conn.execute(delete(r).where(r.c.namespace == self.ns, r.c.name == name))
            return True

        return self.db.run(fn)

    # -- acquire -----------------------------------------------------------------------------
    def _request(
        self, resource: Union[str, Mapping[str, int]], holder: Optional[str], slots: int, mode: str, lease: float,
        waiter_ttl: float, pickup: float, attempt: Optional[int], priority: int = 0,
    ) -> _Request:
        parts = normalize_request(resource, slots)
        mode = check_mode(mode)
        holder = check_name("holder", holder) if holder is not None else default_holder()
        lease_s = check_seconds("lease", lease)
        ttl = check_seconds("waiter_ttl", waiter_ttl)
        pick = check_seconds("pickup", pickup)
        att = check_attempt(attempt)
        assert lease_s is not None and ttl is not None and pick is not None
        return _Request(parts, holder, mode, lease_s, ttl, pick, att, request_key(parts),
                        priority=check_priority(priority))

    def acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: Optional[str],
        slots: int,
        mode: str,
        timeout: Optional[float],
        lease: float,
        waiter_ttl: float,
        poll_interval: float,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = 0,
    ) -> Lease:
        req = self._request(resource, holder, slots, mode, lease, waiter_ttl, pickup, attempt, priority)
        wait = check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        poll_interval = check_poll_interval("poll_interval", poll_interval)
        deadline = None if wait is None else time.monotonic() + wait
        if deadline is not None:
            req = dataclasses.replace(req, deadline=deadline + DEADLINE_GRACE)
        keys = [holder_key(min(req.parts), req.holder), head_key(min(req.parts), req.holder)]
        since = self.runtime.mark(keys)
        outcome = self._enqueue(req)
        refreshed = time.monotonic()
        delay = max(min(poll_interval, HEAD_POLL_INTERVAL), 0.01)
        peek: Optional[_Peek] = None
        while not outcome.granted:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                granted = self._withdraw(req)
                if granted is not None:  # granted between our last look and the withdrawal
                    outcome = granted
                    break
                where = ", ".join(f"{n!r} (about position {p})" for n, p in outcome.position.items())
                raise AcquireTimeout(
                    f"holder {req.holder!r} was not granted {req.parts!r} ({req.mode}) within {wait:g} s; "
                    f"it was waiting at {where}. Raise the timeout or the capacity, or see `controltable status`."
                )
            sleep = self._sleep_for(req, outcome, peek, refreshed, delay)
            delay = min(delay * 1.5, MAX_POLL_INTERVAL)
            if deadline is not None:
                sleep = min(sleep, max(deadline - now, 0.0))
            if self.runtime.wait(keys, sleep, since):
                delay = HEAD_POLL_INTERVAL
                woke = self.runtime.mark(keys)
                rate_limited = peek.rate_limited if peek is not None else outcome.rate_limited
                if woke[0] == since[0] and woke[1] == since[1] and not rate_limited:
                    # Only "you are the head now": in a busy queue the grant follows within
                    # moments, so wait a little for it and look once for both.
                    grant_only = (woke[0], woke[1])
                    self.runtime.wait(keys[:1], HEAD_SETTLE, grant_only)
            since = self.runtime.mark(keys)
            # Refresh on any look once most of the interval has passed (sleeps are jittered both ways).
            refresh = time.monotonic() - refreshed >= req.ttl * REFRESH_FRACTION * 0.6
            peek = self._look(req, refresh)
            if refresh and peek.state == "waiting":
                refreshed = time.monotonic()
            if peek.state == "granted" and peek.outcome is not None:
                outcome = peek.outcome
            elif peek.state in ("gone", "lapsed", "mismatch") or peek.needs_pass:
                # Our entry expired, our grant lapsed, or we must pass the capacity on ourselves.
                outcome = self._enqueue(req)
                refreshed = time.monotonic()
            elif peek.outcome is not None:
                outcome = peek.outcome
        return self._lease(req, outcome)

    def _sleep_for(
        self, req: _Request, outcome: _Outcome, peek: Optional[_Peek], refreshed: float, delay: float
    ) -> float:
        """How long a waiter sleeps before it looks at its entry again.

        With push, it is woken when granted, so it looks only to refresh its entry (rarely), and
        - at the head of the queue - when the first holder's lease runs out or, as the fallback
        for a lost notification, every few seconds. Without push it polls its own entry: often
        at the head, rarely far back.
        """
        refresh_in = max(req.ttl * REFRESH_FRACTION - (time.monotonic() - refreshed), 0.01)
        position = max(outcome.position.values() or [1])
        head = position <= 1 if peek is None else peek.head
        expiry = peek.holder_expiry_in if peek is not None and peek.head else None
        if self.runtime.push_active:
            sleep = refresh_in
            if head or position <= HEAD_POSITIONS:
                sleep = min(sleep, max(delay * 10, PUSH_POLL_INTERVAL), req.pickup * 0.7)
        else:
            # Up to a capacity's worth of waiters can be granted by one release: pace by "rounds".
            capacity_rounds = 0.0 if head else max(position - 1, 0) / max(outcome.capacity, 1)
            sleep = min(refresh_in, MAX_POLL_INTERVAL, req.ttl / 4.0, HEAD_POLL_INTERVAL * (1 + capacity_rounds))
        if expiry is not None:
            sleep = min(sleep, expiry + 0.05)
        if peek is not None and peek.rate_opens_in is not None:
            # The rate window's next opening: no jitter early (that would only look too soon).
            return min(sleep * (0.75 + random.random() / 2), peek.rate_opens_in + 0.01 + 0.02 * random.random())
        return sleep * (0.75 + random.random() / 2)

    def _lease(self, req: _Request, outcome: _Outcome) -> Lease:
        return Lease(
            self,
            resources=req.parts,
            mode=req.mode,
            holder=req.holder,
            request_key=outcome.request_key,
            tokens=outcome.tokens,
            lease_seconds=req.lease,
            expires_at=outcome.expires_at,
            granted_at=outcome.granted_at,
            ticket=outcome.ticket,
            attempt=outcome.attempt,
        )

    def try_acquire(
        self,
        resource: Union[str, Mapping[str, int]],
        *,
        holder: str,
        slots: int,
        mode: str,
        lease: float,
        waiter_ttl: float,
        attempt: Optional[int] = None,
        pickup: float = DEFAULT_PICKUP,
        priority: int = 0,
    ) -> Optional[Lease]:
        """One look that keeps the queue entry when not granted (for sensors and triggers).

        A waiter already queued reads its own entry without locks (and picks up a grant made on
        its behalf); only a new request, a new attempt or a head that must pass capacity on
        itself takes the resource locks.
        """
        req = self._request(resource, check_name("holder", holder), slots, mode, lease, waiter_ttl, pickup, attempt,
                            priority)
        peek = self._look(req, True)
        newer = attempt is not None and attempt != peek.recorded_attempt
        if peek.state == "granted" and peek.outcome is not None and not newer:
            return self._lease(req, peek.outcome)
        if peek.state == "waiting" and not peek.needs_pass and not newer:
            return None
        outcome = self._enqueue(req)
        return self._lease(req, outcome) if outcome.granted else None

    def _enqueue(self, req: _Request) -> _Outcome:
        """Enter the queue (or find our entry), then run a grant pass; picks the grant up if made."""
        q, r = self.t.request, self.t.resource
        names = sorted(req.parts)

        def action(conn: Connection, res: dict[str, Any], now: float) -> _Entered:
            for name, k in req.parts.items():
                if k > res[name].capacity:
                    raise ConfigurationError(
                        f"request for {k} slots of {name!r} can never be granted: its capacity is "
                        f"{res[name].capacity}; ask for fewer slots or raise the capacity"
                    )
            mine = list(conn.execute(
                select(*self._cols(q)).where(q.c.namespace == self.ns, q.c.resource.in_(names),
                                             q.c.holder == req.holder)
            ).all())
            if mine:
                wanted = {(n, k, req.mode) for n, k in req.parts.items()}
                have = {(row.resource, int(row.slots), row.mode) for row in mine}
                keys = {row.request_key for row in mine}
                if have != wanted or len(keys) != 1:
                    raise ConfigurationError(
                        f"holder {req.holder!r} already holds or waits for {sorted(have)} which differs from this "
                        f"request {sorted(wanted)}; release it first or use another holder id"
                    )
                if any(float(row.expires_at) < now for row in mine):
                    # Our entry expired (a waiter that stopped looking) or our grant lapsed: it goes,
                    # and we queue again at the back. The delete re-checks: a pickup may have won.
                    gone = conn.execute(delete(q).where(q.c.request_key == mine[0].request_key,
                                                        q.c.expires_at < now)).rowcount
                    if gone:
                        conn.execute(delete(q).where(q.c.request_key == mine[0].request_key))
                        self._end_grants(conn, mine, now, hist.EXPIRED)
                        mine = []
            attempt = req.attempt
            if mine:
                key = mine[0].request_key
                recorded = max((int(row.attempt) for row in mine if row.attempt is not None), default=None)
                if attempt is not None and recorded is not None and attempt < recorded:
                    raise LeaseLost(
                        f"holder {req.holder!r} on {', '.join(repr(n) for n in names)} was superseded by attempt "
                        f"{recorded}; attempt {attempt} must stop (a newer attempt of the same work runs)"
                    )
                newer = attempt is not None and (recorded is None or attempt > recorded)
                if not newer:
                    attempt = recorded
                ticket = min(int(row.ticket) for row in mine)
                if all(row.state == "granted" for row in mine):
                    # Idempotent re-acquire (or the pickup of a grant made on our behalf): the same
                    # grant, extended; a newer attempt gets new tokens in place.
                    values: dict[str, Any] = dict(expires_at=now + req.lease, lease_seconds=req.lease,
                                                  attempt=attempt)
                    tokens = {row.resource: int(row.token) for row in mine}
                    if newer:
                        for name in names:
                            res[name].last_token += 1
                            conn.execute(hist.retoken_grant(self.t, self.ns, name, tokens[name],
                                                            res[name].last_token))
                            tokens[name] = res[name].last_token
                            conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name)
                                         .values(last_token=tokens[name]))
                    for row in mine:
                        conn.execute(update(q).where(q.c.id == row.id).values(token=tokens[row.resource], **values))
                    granted_at = float(min(row.granted_at for row in mine))
                    return _Entered(key, attempt, ticket, done=_Outcome(
                        True, key, {n: tokens[n] for n in req.parts}, now + req.lease, granted_at, {}, ticket,
                        attempt))
                conn.execute(update(q).where(q.c.request_key == key, q.c.state == "waiting")
                             .values(expires_at=now + req.ttl, attempt=attempt, pickup_seconds=req.pickup))
                return _Entered(key, attempt, ticket)
            key = req.key
            tickets = {}
            for name in names:  # one ticket per resource, from its counter, under its lock
                res[name].last_ticket += 1
                res[name].dirty = True  # written by the grant pass that follows
                tickets[name] = res[name].last_ticket
                conn.execute(insert(q).values(
                    namespace=self.ns, resource=name, holder=req.holder, request_key=key, slots=req.parts[name],
                    mode=req.mode, state="waiting", lease_seconds=req.lease, enqueued_at=now,
                    expires_at=now + req.ttl, ticket=tickets[name], attempt=attempt, pickup_seconds=req.pickup,
                    priority=req.priority, queue_key=grants.queue_key(req.priority, now, res[name].aging)))
            return _Entered(key, attempt, min(tickets.values()))

        def fn(conn: Connection, res: dict[str, Any], now: float) -> _Outcome:
            entered = action(conn, res, now)
            if entered.done is not None:
                return entered.done
            made: dict[str, dict[str, int]] = {}
            self._grant_pass(conn, res, now, own=(entered.key, req.lease), granted=made)
            if entered.key in made:  # granted by this very pass: picked up in the same transaction
                tokens = made[entered.key]
                return _Outcome(True, entered.key, {n: tokens[n] for n in req.parts}, now + req.lease, now, {},
                                entered.ticket, entered.attempt)
            position = {}
            for name in names:
                head = conn.scalar(select(q.c.ticket).where(
                    q.c.namespace == self.ns, q.c.resource == name, q.c.state == "waiting")
                    .order_by(q.c.queue_key, q.c.ticket).limit(1))
                position[name] = max(entered.ticket - int(head if head is not None else entered.ticket), 0) + 1
            capacity = min(res[name].capacity for name in names)
            return _Outcome(False, entered.key, {}, now + req.ttl, None, position, entered.ticket, entered.attempt,
                            capacity, any(res[name].rate_count is not None for name in names))

        return self._with_pass_custom(set(names), fn, deadline=req.deadline)

    def _with_pass_custom(
        self, names: set[str], fn: Callable[[Connection, dict[str, Any], float], T], *,
        deadline: Optional[float] = None,
    ) -> T:
        """Like :meth:`_with_pass` for actions that run the grant pass themselves."""
        lockset = set(names)
        for _ in range(8):
            locks = set(lockset)

            def run(conn: Connection, locks: set[str] = locks) -> T:
                return fn(conn, *self._lock(conn, locks))

            try:
                return self.db.run(run, deadline=deadline)
            except _NeedLocks as need:
                lockset |= need.names
        raise AcquireTimeout(  # pragma: no cover - needs a chain of 8 multi-resource requests moving at once
            f"could not lock the resources of {sorted(names)} in order; retry"
        )

    def _look(self, req: _Request, refresh: bool) -> _Peek:
        def fn(conn: Connection) -> _Peek:
            return self._peek(conn, req, refresh)

        return self.db.run(fn, deadline=req.deadline)

    def _peek(self, conn: Connection, req: _Request, refresh: bool) -> _Peek:
        """Read our own entry by (namespace, resource, holder), no locks; pick up a grant made for us.

        Also reads, through the queue index, the head ticket of each of our queues and the
        holders' usage and first lease expiry, so that the head can time the reap of a holder
        whose lease runs out (or a grant that lapses) and run the grant pass itself.
        """
        q, r = self.t.request, self.t.resource
        names = sorted(req.parts)
        hq, wq = q.alias("hq"), q.alias("wq")
        same_h = and_(hq.c.namespace == q.c.namespace, hq.c.resource == q.c.resource, hq.c.state == "granted")
        same_w = and_(wq.c.namespace == q.c.namespace, wq.c.resource == q.c.resource, wq.c.state == "waiting")
        # The head's ticket: the first waiter in queue order, one index probe.
        head_ticket = (select(wq.c.ticket).where(same_w).order_by(wq.c.queue_key, wq.c.ticket).limit(1)
                       .scalar_subquery())
        hold_exp = select(func.min(hq.c.expires_at)).where(same_h).scalar_subquery()
        used = select(func.coalesce(func.sum(hq.c.slots), 0)).where(same_h).scalar_subquery()
        excl = select(func.count()).where(same_h, hq.c.mode == "exclusive").scalar_subquery()
        rows = conn.execute(
            select(*self._cols(q), dialects.db_now().label("now"), head_ticket.label("head_ticket"),
                   hold_exp.label("hold_exp"), used.label("used"), excl.label("excl"), r.c.capacity,
                   r.c.rate_count, r.c.rate_per)
            .select_from(q.join(r, and_(r.c.namespace == q.c.namespace, r.c.name == q.c.resource)))
            .where(q.c.namespace == self.ns, q.c.resource.in_(names), q.c.holder == req.holder)
        ).all()
        if not rows:
            return _Peek("gone")
        now = float(rows[0].now)
        have = {(row.resource, int(row.slots), row.mode) for row in rows}
        recorded = max((int(row.attempt) for row in rows if row.attempt is not None), default=None)
        if have != {(n, k, req.mode) for n, k in req.parts.items()} or len({row.request_key for row in rows}) != 1:
            return _Peek("mismatch", recorded_attempt=recorded)
        key = rows[0].request_key
        ticket = min(int(row.ticket) for row in rows)
        if any(float(row.expires_at) < now for row in rows):
            return _Peek("lapsed", recorded_attempt=recorded)
        if all(row.state == "granted" for row in rows):
            if req.attempt is not None and req.attempt != recorded:
                return _Peek("granted", recorded_attempt=recorded)  # the caller re-enters for the attempt
            picked = dialects.confirmed_count(
                conn,
                update(q).where(q.c.request_key == key, q.c.state == "granted", q.c.expires_at >= now)
                .values(expires_at=now + req.lease, lease_seconds=req.lease),
                select(func.count()).select_from(q).where(
                    q.c.request_key == key, q.c.state == "granted", q.c.expires_at == now + req.lease),
                self.db.dialect_name,
            )
            if picked != len(rows):
                return _Peek("lapsed", recorded_attempt=recorded)
            tokens = {row.resource: int(row.token) for row in rows}
            return _Peek("granted", _Outcome(True, key, {n: tokens[n] for n in req.parts}, now + req.lease,
                                             float(min(row.granted_at for row in rows)), {}, ticket, recorded),
                         recorded_attempt=recorded)
        if refresh:
            updated = dialects.confirmed_count(
                conn,
                update(q).where(q.c.request_key == key, q.c.state == "waiting", q.c.expires_at >= now)
                .values(expires_at=now + req.ttl),
                select(func.count()).select_from(q).where(
                    q.c.request_key == key, q.c.state == "waiting", q.c.expires_at == now + req.ttl),
                self.db.dialect_name,
            )
            if updated != len(rows):
                return _Peek("lapsed", recorded_attempt=recorded)
        position = {}
        head = True
        fits_all = True
        expired_holder = False
        soonest: Optional[float] = None
        opens_in: Optional[float] = None
        rescue = False
        for row in rows:
            first = int(row.head_ticket) if row.head_ticket is not None else int(row.ticket)
            position[row.resource] = max(int(row.ticket) - first, 0) + 1
            head = head and first == int(row.ticket)
            if row.hold_exp is not None:
                left = float(row.hold_exp) - now
                expired_holder = expired_holder or left < 0
                soonest = left if soonest is None else min(soonest, left)
            queue = grants.Queue(row.resource, int(row.capacity), int(row.used or 0), int(row.excl or 0) > 0)
            if row.rate_count is not None and row.rate_per is not None and position[row.resource] <= 2:
                # The head (and the one behind it, should the head be gone) times the rate window:
                # nobody else grants when it opens, so a waiter sleeps until then and runs the pass.
                count, per = int(row.rate_count), float(row.rate_per)
                times = [float(t) for t in conn.execute(hist.window_times(self.t, self.ns, row.resource, now - per))
                         .scalars()]
                queue.budget = grants.rate_budget(count, per, times, now)
                opening = grants.next_opening(count, per, times, now)
                if opening is not None and opening > now:
                    wait = opening - now
                    opens_in = wait if opens_in is None else max(opens_in, wait)
                elif position[row.resource] == 2 and queue.budget > 0 and grants.fits(queue, 1, "shared"):
                    # Room and budget, yet the head still waits: if the window opened a while ago
                    # and nobody ran a pass since (a dead head), this waiter runs it.
                    left_at = conn.scalar(hist.last_left(self.t, self.ns, row.resource, now - per))
                    rescue = left_at is not None and now - (float(left_at) + per) > REAP_GRACE
            fits_all = fits_all and grants.fits(queue, int(row.slots), row.mode)
        capacity = min(int(row.capacity) for row in rows)
        behind_expired = expired_holder and soonest is not None and soonest < -REAP_GRACE
        return _Peek(
            "waiting",
            _Outcome(False, key, {}, now + req.ttl, None, position, ticket, recorded, capacity),
            needs_pass=(head and (expired_holder or fits_all)) or behind_expired or rescue,
            holder_expiry_in=None if soonest is None else max(soonest, 0.0),
            head=head,
            recorded_attempt=recorded,
            rate_opens_in=opens_in,
            rate_limited=any(row.rate_count is not None for row in rows),
        )

    def _withdraw(self, req: _Request) -> Optional[_Outcome]:
        """Leave the queue after a timeout; if we were granted meanwhile, take that grant."""
        q = self.t.request

        def action(conn: Connection, res: dict[str, Any], now: float) -> Optional[_Outcome]:
            rows = conn.execute(
                select(q.c.resource, q.c.state, q.c.token, q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt,
                       q.c.request_key)
                .where(q.c.namespace == self.ns, q.c.resource.in_(sorted(req.parts)), q.c.holder == req.holder)
            ).all()
            if rows and all(row.state == "granted" and float(row.expires_at) >= now for row in rows):
                key = rows[0].request_key
                conn.execute(update(q).where(q.c.request_key == key)
                             .values(expires_at=now + req.lease, lease_seconds=req.lease))
                tokens = {row.resource: int(row.token) for row in rows}
                return _Outcome(True, key, {n: tokens[n] for n in req.parts}, now + req.lease,
                                float(min(row.granted_at for row in rows)), {},
                                min(int(row.ticket) for row in rows), rows[0].attempt)
            for key in {row.request_key for row in rows}:
                conn.execute(delete(q).where(q.c.request_key == key))
            self._end_grants(conn, list(rows), now, hist.EXPIRED)  # a grant made for us that lapsed
            return None

        return self._with_pass(set(req.parts), action)

    # -- holding -----------------------------------------------------------------------------
    def renew(self, lease: Lease, seconds: float) -> float:
        q = self.t.request
        n = len(lease.resources)

        def fn(conn: Connection) -> float:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            renewed = dialects.confirmed_count(
                conn,
                update(q)
                .where(q.c.request_key == lease.request_key, q.c.state == "granted", q.c.expires_at >= now)
                .values(expires_at=now + seconds, lease_seconds=seconds),
                select(func.count()).select_from(q).where(
                    q.c.request_key == lease.request_key, q.c.state == "granted",
                    q.c.expires_at == now + seconds),
                self.db.dialect_name,
            )
            if renewed != n:
                left = conn.execute(select(q.c.resource, q.c.state, q.c.token, q.c.expires_at)
                                    .where(q.c.request_key == lease.request_key)).all()
                conn.execute(delete(q).where(q.c.request_key == lease.request_key))
                self._end_grants(conn, list(left), now, hist.EXPIRED)
                return -1.0
            return now + seconds

        expires = self.db.run(fn)
        if expires < 0:
            lease.released = True
            raise LeaseLost(
                f"lease of {lease.holder!r} on {lease._names()} expired and was reaped before it was renewed; "
                "renew more often than the lease length or ask for a longer lease"
            )
        return expires

    def release(self, lease: Lease) -> None:
        """Delete the lease's rows and pass the capacity on; an expired lease is lost even if unreaped.

        Retry-safe: the request key was chosen by the client, so when a retry (after a COMMIT whose
        reply was lost) finds no rows while the lease could not yet have expired, the first
        COMMIT is what removed them and the release succeeded.
        """
        q = self.t.request
        n = len(lease.resources)
        completed = 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> tuple[int, int, float]:
            nonlocal completed
            rows = conn.execute(
                select(q.c.id, q.c.resource, q.c.state, q.c.token, q.c.expires_at)
                .where(q.c.request_key == lease.request_key)
            ).all()
            live = sum(1 for row in rows if row.state == "granted" and float(row.expires_at) >= now)
            if rows:
                conn.execute(delete(q).where(q.c.request_key == lease.request_key))
                self._end_grants(conn, list(rows), now)
            completed += 1
            return live, len(rows), now

        live, found, now = self._with_pass(set(lease.resources), action)
        self._maybe_prune(lease.resources)
        if live == n:
            return
        if found == 0 and completed > 1 and now < lease._expires_at:
            return  # our first COMMIT went through; its reply was lost
        if found:
            raise LeaseLost(
                f"lease of {lease.holder!r} on {lease._names()} had expired when it was released (at "
                f"{lease.expires_at.isoformat()}); work done after the expiry may have overlapped with another "
                "holder. Renew more often than the lease length or ask for a longer lease"
            )
        raise LeaseLost(
            f"lease of {lease.holder!r} on {lease._names()} had already expired and been reaped when it "
            "was released; work done after the expiry may have overlapped with another holder"
        )

    def is_held(self, lease: Lease) -> bool:
        q = self.t.request
        count = self.db.run(
            lambda c: c.scalar(
                select(func.count()).select_from(q).where(
                    and_(q.c.request_key == lease.request_key, q.c.state == "granted",
                         q.c.expires_at >= dialects.db_now())
                )
            )
        )
        return int(count or 0) == len(lease.resources)

    def _remove(self, match: Any, check: Optional[Callable[[Connection], None]] = None) -> int:
        """Remove the requests with rows matching ``match`` (whole requests), then pass capacity on.

        The resources involved are read first without locks, then locked in name order; rows of
        requests that appeared meanwhile on other resources are left for the next call.
        """
        q = self.t.request
        names = {row[0] for row in self.db.run(lambda c: c.execute(select(q.c.resource).where(match).distinct()).all())}
        if not names:
            if check is not None:
                self.db.run(check)
            return 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> int:
            if check is not None:
                check(conn)
            keys = sorted({row[0] for row in conn.execute(select(q.c.request_key).where(match,
                                                                                       q.c.resource.in_(sorted(res))))})
            if not keys:
                return 0
            spans = conn.execute(select(q.c.request_key, q.c.resource).where(q.c.request_key.in_(keys))).all()
            extra = {row.resource for row in spans} - set(res)
            if extra:
                raise _NeedLocks(extra)
            gone = conn.execute(select(q.c.resource, q.c.state, q.c.token, q.c.expires_at)
                                .where(q.c.request_key.in_(keys))).all()
            conn.execute(delete(q).where(q.c.request_key.in_(keys)))
            self._end_grants(conn, list(gone), now)
            return len(keys)

        return self._with_pass(names, action)

    def release_holder(self, resource: str, holder: str) -> int:
        """Release whatever ``holder`` holds or waits for on ``resource`` (for shell scripts).

        Returns the requests removed: 0 means nothing was held. An unknown resource is an error.
        """
        q, r = self.t.request, self.t.resource

        def known(conn: Connection) -> None:
            if conn.scalar(select(r.c.name).where(r.c.namespace == self.ns, r.c.name == resource)) is None:
                raise UnknownResourceError(
                    f"resource {resource!r} does not exist in namespace {self.ns!r}; check the name and namespace"
                )

        return self._remove(and_(q.c.namespace == self.ns, q.c.resource == resource, q.c.holder == holder), known)

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For run-status sensors and teardown of a whole scope (a DAG run, a Dagster run). The
        prefix is matched literally (``%`` and ``_`` are escaped). Returns the requests removed.
        """
        q = self.t.request
        return self._remove(and_(q.c.namespace == self.ns, q.c.holder.startswith(prefix, autoescape=True)))

    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        """Where ``holder`` stands on ``resource``: None when it neither holds nor waits."""
        q = self.t.request

        def fn(conn: Connection) -> tuple[float, Optional[Any], list[Any]]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            mine = conn.execute(
                select(q).where(q.c.namespace == self.ns, q.c.resource == resource, q.c.holder == holder)
            ).first()
            if mine is None or mine.state == "granted":
                return now, mine, []
            before = (q.c.queue_key < mine.queue_key) | ((q.c.queue_key == mine.queue_key) & (q.c.ticket < mine.ticket))
            ahead = conn.execute(
                select(q.c.holder, q.c.state, q.c.expires_at)
                .where(q.c.namespace == self.ns, q.c.resource == resource, (q.c.state == "granted") | before)
                .order_by(q.c.state, q.c.queue_key, q.c.ticket)  # "granted" sorts before "waiting"
            ).all()
            return now, mine, list(ahead)

        now, mine, ahead = self.db.run(fn)
        if mine is None or float(mine.expires_at) < now:
            return None
        live = [row for row in ahead if float(row.expires_at) >= now]
        waiting_ahead = sum(1 for row in live if row.state == "waiting")
        return WaitInfo(
            resource=resource,
            holder=holder,
            state=str(mine.state),
            position=0 if mine.state == "granted" else waiting_ahead + 1,
            ahead=[str(row.holder) for row in live],
            waiting_since=utc(float(mine.enqueued_at)),
            token=None if mine.token is None or mine.state != "granted" else int(mine.token),
            expires_at=utc(float(mine.expires_at)),
        )

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        """The live lease ``holder`` has on ``resource``, rebuilt from the table (for other processes)."""
        q = self.t.request

        def fn(conn: Connection) -> list[Any]:
            key = conn.scalar(
                select(q.c.request_key).where(
                    q.c.namespace == self.ns, q.c.resource == resource, q.c.holder == holder, q.c.state == "granted"
                )
            )
            if key is None:
                return []
            return list(conn.execute(select(q).where(q.c.request_key == key).order_by(q.c.resource)).all())

        rows = self.db.run(fn)
        if not rows:
            return None
        return Lease(
            self,
            resources={row.resource: int(row.slots) for row in rows},
            mode=rows[0].mode,
            holder=holder,
            request_key=rows[0].request_key,
            tokens={row.resource: int(row.token) for row in rows},
            lease_seconds=float(rows[0].lease_seconds),
            expires_at=float(rows[0].expires_at),
            granted_at=float(rows[0].granted_at),
            ticket=int(rows[0].ticket),
            attempt=None if rows[0].attempt is None else int(rows[0].attempt),
        )

    # -- observing ---------------------------------------------------------------------------
    def status(self, names: Optional[list[str]] = None) -> list[ResourceStatus]:
        q, r = self.t.request, self.t.resource

        def fn(conn: Connection) -> tuple[float, list[Any], list[Any]]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            rs = select(r).where(r.c.namespace == self.ns).order_by(r.c.name)
            qs = select(q).where(q.c.namespace == self.ns).order_by(q.c.resource, q.c.ticket)
            if names:
                rs = rs.where(r.c.name.in_(names))
                qs = qs.where(q.c.resource.in_(names))
            return now, list(conn.execute(rs).all()), list(conn.execute(qs).all())

        now, resources, requests = self.db.run(fn)
        out = []
        for res in resources:
            aging = None if res.aging is None else float(res.aging)
            rate = None if res.rate_count is None else Rate(int(res.rate_count), float(res.rate_per))
            st = ResourceStatus(res.name, int(res.capacity), 0, int(res.last_token), rate=rate, aging=aging)
            mine = [row for row in requests if row.resource == res.name]
            waiting = sorted((row for row in mine if row.state != "granted"),
                             key=lambda row: (grants.queue_key(int(row.priority), float(row.enqueued_at), aging),
                                              int(row.ticket)))
            live_ahead: list[str] = []
            for row in mine:
                if row.state != "granted":
                    continue
                expired = float(row.expires_at) < now
                eff = grants.effective_priority(int(row.priority), float(row.enqueued_at), float(row.granted_at), aging)
                st.holders.append(Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.granted_at),
                                        utc(row.expires_at), int(row.token), 0, expired, int(row.priority), eff))
                if not expired:
                    st.used += int(row.slots)
                    live_ahead.append(row.holder)
            pos = 0
            for row in waiting:
                expired = float(row.expires_at) < now
                pos += 0 if expired else 1
                eff = grants.effective_priority(int(row.priority), float(row.enqueued_at), now, aging)
                st.waiters.append(Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.enqueued_at),
                                        utc(row.expires_at), None, pos, expired, int(row.priority), eff,
                                        list(live_ahead)))
                if not expired:
                    live_ahead.append(row.holder)
            out.append(st)
        return out

    # -- history -----------------------------------------------------------------------------
    def history(self, resource: Optional[str], since: float, limit: int) -> list[hist.GrantRecord]:
        def fn(conn: Connection) -> list[Any]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            return list(conn.execute(hist.records_query(self.t, self.ns, resource, now - since, limit)).all())

        return [hist.to_record(row) for row in self.db.run(fn)]

    def stats(self, names: Optional[list[str]], window: float) -> list[hist.ResourceStats]:
        """Per resource (all when ``names`` is None), statistics of the last ``window`` seconds."""
        r = self.t.resource

        def fn(conn: Connection) -> tuple[float, list[Any]]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            rs = select(r.c.name, r.c.capacity).where(r.c.namespace == self.ns).order_by(r.c.name)
            if names:
                rs = rs.where(r.c.name.in_(names))
            out = []
            for row in conn.execute(rs).all():
                rows = conn.execute(hist.overlapping(self.t, self.ns, row.name, now - window, now)).all()
                out.append(hist.compute_stats(row.name, int(row.capacity), rows, now - window, now))
            return now, out

        return self.db.run(fn)[1]

    def stats_series(self, name: str, window: float, buckets: int) -> list[hist.ResourceStats]:
        r = self.t.resource

        def fn(conn: Connection) -> list[hist.ResourceStats]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            capacity = conn.scalar(select(r.c.capacity).where(r.c.namespace == self.ns, r.c.name == name))
            if capacity is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; check the name and namespace")
            start = now - window
            rows = conn.execute(hist.overlapping(self.t, self.ns, name, start, now)).all()
            step = window / buckets
            return [hist.compute_stats(name, int(capacity), rows, start + i * step, start + (i + 1) * step)
                    for i in range(buckets)]

        return self.db.run(fn)

    def prune_history(self, older_than: float, names: Optional[list[str]] = None,
                      max_batches: Optional[int] = None) -> int:
        """Delete ended grants made more than ``older_than`` seconds ago, in batches of
        ``HISTORY_PRUNE_BATCH`` rows per transaction (each short; grants interleave)."""
        r = self.t.resource
        if names is None:
            names = [row[0] for row in self.db.run(
                lambda c: c.execute(select(r.c.name).where(r.c.namespace == self.ns)).all())]
        total = 0
        for name in names:
            batches = 0
            while max_batches is None or batches < max_batches:
                def fn(conn: Connection, name: str = name) -> int:
                    now = float(conn.scalar(select(dialects.db_now())) or 0.0)
                    before = now - older_than
                    edge = conn.scalar(hist.prune_edge(self.t, self.ns, name, before, HISTORY_PRUNE_BATCH))
                    if edge is None:  # fewer than a batch left: the rest
                        return int(conn.execute(hist.delete_ended(self.t, self.ns, name, before, False)).rowcount)
                    return int(conn.execute(hist.delete_ended(self.t, self.ns, name, float(edge), True)).rowcount)

                n = self.db.run(fn)
                total += n
                batches += 1
                if n < HISTORY_PRUNE_BATCH:
                    break
        return total

    def _maybe_prune(self, names: Mapping[str, int]) -> None:
        """Now and then (once per ``HISTORY_PRUNE_INTERVAL`` per process), after a release, prune
        one batch of the released resources' history: pruning keeps pace with the grants
        without a job to schedule, and never runs on the grant path."""
        if time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + HISTORY_PRUNE_INTERVAL
        try:
            self.prune_history(HISTORY_RETENTION, sorted(names), max_batches=1)
        except Exception as exc:  # pruning is housekeeping: never fail a release for it
            log.warning("controltable: pruning the grant history failed (%s); it is retried later", exc)

    def reap(self) -> int:
        """Remove expired holders and waiters of this namespace, passing freed capacity on."""
        q = self.t.request
        names = {row[0] for row in self.db.run(lambda c: c.execute(
            select(q.c.resource).where(q.c.namespace == self.ns, q.c.expires_at < dialects.db_now()).distinct()
        ).all())}
        if not names:
            return 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> int:
            # Waiters anywhere in the queues (a pass only looks at the head); holders go in the pass.
            return int(conn.execute(delete(q).where(
                q.c.namespace == self.ns, q.c.resource.in_(sorted(res)), q.c.state == "waiting", q.c.expires_at < now
            )).rowcount)

        counted: list[int] = []

        def with_count(conn: Connection, res: dict[str, Any], now: float) -> int:
            n = action(conn, res, now)
            n += self._grant_pass(conn, res, now)
            counted.append(n)
            return n

        return self._with_pass_custom(names, with_count)

    def iter_names(self) -> Iterator[str]:  # pragma: no cover - convenience
        for st in self.status():
            yield st.name
