"""Resource slots: FIFO counting semaphores and reader/writer locks with leases and fencing tokens.

Seed 000's control table, with its races fixed:

* Every step that looks at a queue first locks the rows of the resources involved (in name order,
  so two multi-resource requests can never deadlock each other). Tickets are assigned under those
  locks, so "who is ahead of me" is never decided on a ticket that is not yet visible.
* A request is granted only when nothing waits ahead of it in any of its queues and it fits:
  strict FIFO, so a waiting writer blocks readers that come after it.
* Holders and waiters both carry a lease on the database clock. Expired rows are deleted under the
  resource lock before anything is counted; that DELETE is the only judge of expiry, so a holder
  whose renewal wins the race keeps its slot and one that loses gets :class:`LeaseLost`.
* Each grant takes the next value of the resource's fencing counter.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from . import dialects
from .defaults import DEFAULT_LEASE, DEFAULT_MODE, DEFAULT_PICKUP, DEFAULT_WAITER_TTL  # noqa: F401 - re-exported
from .errors import AcquireTimeout, ConfigurationError, LeaseLost, UnknownResourceError
from .renewal import BackgroundRenewal
from .validation import check_mode, check_name, check_poll_interval, check_seconds, normalize_request

if TYPE_CHECKING:  # pragma: no cover
    from .control import ControlTable

log = logging.getLogger("controltable")

# A waiter polls at most every ``waiter_ttl / 4`` seconds, so only a dead waiter's entry ever expires.
MAX_POLL_INTERVAL = 2.0
#: The longest the first waiter in a queue sleeps between polls.
HEAD_POLL_INTERVAL = 0.1
#: With push wake-ups (PostgreSQL), polls are only a fallback for a lost notification (and keep
#: the waiter's queue entry alive): the head of the queue polls at most this often...
PUSH_POLL_INTERVAL = 1.0
#: ...and waiters further back this often (never beyond a quarter of their ``waiter_ttl``).
PUSH_IDLE_POLL_INTERVAL = 5.0


def slot_key(resource: str) -> str:
    """The wake-up key of a resource's queue (pushed on every change of the queue)."""
    return f"slot:{resource}"


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
    """A holder id unique to this process and call (seed 000's 'robust requesting ids')."""
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


class Lease(BackgroundRenewal):
    """A granted slot request. Renew it while working, release it when done.

    Usable as a context manager (``with ct.acquire(...) as lease``), which releases on exit.
    :meth:`ControlTable.slot` additionally renews it in the background.
    """

    def __init__(
        self,
        ct: ControlTable,
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
        self._ct = ct
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
        self._expires_at = self._ct._slots.renew(self, seconds)
        self.lease_seconds = seconds
        return self

    def release(self) -> None:
        """Give the slots back. Raises :class:`LeaseLost` if they were no longer held."""
        self.stop_renewing()
        if self.released:
            return
        self.released = True
        self._ct._slots.release(self)

    def is_held(self) -> bool:
        """Ask the database whether this lease still holds all its slots."""
        return not self.released and self._ct._slots.is_held(self)

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


class SlotEngine:
    """The SQL behind slots, for one namespace of one installation."""

    def __init__(self, ct: ControlTable) -> None:
        self.ct = ct
        self.db = ct.db
        self.t = ct.tables
        self.ns = ct.namespace

    # -- capacity ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int) -> None:
        r = self.t.resource

        def fn(conn: Connection) -> None:
            found = conn.execute(
                dialects.lock_rows(select(r.c.name).where(r.c.namespace == self.ns, r.c.name == name), r)
            ).first()
            if found is None:
                conn.execute(
                    insert(r).values(
                        namespace=self.ns, name=name, capacity=capacity, last_token=0, created_at=dialects.db_now()
                    )
                )
            else:
                conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name).values(capacity=capacity))

        try:
            self.db.run(fn)
        except Exception as exc:  # a concurrent insert of the same name: the row exists now
            if "unique" in str(exc).lower() or "duplicate" in str(exc).lower():
                self.db.run(
                    lambda c: c.execute(
                        update(r).where(r.c.namespace == self.ns, r.c.name == name).values(capacity=capacity)
                    )
                )
            else:
                raise

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
            conn.execute(delete(r).where(r.c.namespace == self.ns, r.c.name == name))
            return True

        return self.db.run(fn)

    # -- acquire -----------------------------------------------------------------------------
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
    ) -> Lease:
        parts = normalize_request(resource, slots)
        mode = check_mode(mode)
        holder = check_name("holder", holder) if holder is not None else default_holder()
        lease_s = check_seconds("lease", lease)
        ttl = check_seconds("waiter_ttl", waiter_ttl)
        pick = check_seconds("pickup", pickup)
        wait = check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        poll_interval = check_poll_interval("poll_interval", poll_interval)
        att = check_attempt(attempt)
        assert lease_s is not None and ttl is not None and pick is not None
        deadline = None if wait is None else time.monotonic() + wait
        max_poll = min(MAX_POLL_INTERVAL, ttl / 4.0)
        delay = min(poll_interval, max_poll)
        req = _Request(parts, holder, mode, lease_s, ttl, pick, att, uuid.uuid4().hex)

        keys = [slot_key(n) for n in parts]
        since = self.ct._wakeups.mark(keys)
        outcome = self.db.run(lambda c: self._attempt(c, req))
        while not outcome.granted:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                granted = self._withdraw(outcome.request_key)
                if granted is not None:  # granted between our last poll and the withdrawal
                    outcome = granted
                    break
                where = ", ".join(f"{n!r} (position {p})" for n, p in outcome.position.items())
                raise AcquireTimeout(
                    f"holder {holder!r} was not granted {parts!r} ({mode}) within {wait:g} s; "
                    f"it was waiting at {where}. Raise the timeout or the capacity, or see `controltable status`."
                )
            # Back off, but by queue position: the head of the queue is next when a holder leaves,
            # so it polls often (short handoffs); waiters far back poll rarely (cheap idling).
            # With push wake-ups the poll is only the fallback for a lost notification.
            place = max(outcome.position.values() or [1])
            if self.ct._wakeups.active:
                cap = PUSH_POLL_INTERVAL if place <= 1 else min(PUSH_IDLE_POLL_INTERVAL, ttl / 4.0)
            else:
                cap = min(max_poll, HEAD_POLL_INTERVAL if place <= 1 else HEAD_POLL_INTERVAL * 2 * place)
            delay = min(delay * 1.5, cap)
            sleep = delay * (0.5 + random.random())
            if deadline is not None:
                sleep = min(sleep, max(deadline - now, 0.0))
            self.ct._wait_for_wakeup(keys, sleep, since)
            since = self.ct._wakeups.mark(keys)
            outcome = self.db.run(lambda c: self._attempt(c, req))
        return self._lease(req, outcome)

    def _lease(self, req: _Request, outcome: _Outcome) -> Lease:
        return Lease(
            self.ct,
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
    ) -> Optional[Lease]:
        """One poll that keeps the queue entry when not granted (for sensors and triggers)."""
        parts = normalize_request(resource, slots)
        mode = check_mode(mode)
        holder = check_name("holder", holder)
        lease_s = check_seconds("lease", lease)
        ttl = check_seconds("waiter_ttl", waiter_ttl)
        pick = check_seconds("pickup", pickup)
        att = check_attempt(attempt)
        assert lease_s is not None and ttl is not None and pick is not None
        req = _Request(parts, holder, mode, lease_s, ttl, pick, att, uuid.uuid4().hex)
        outcome = self.db.run(lambda c: self._attempt(c, req))
        if not outcome.granted:
            return None
        return self._lease(req, outcome)

    def _lock_resources(self, conn: Connection, names: list[str]) -> dict[str, Any]:
        """Lock the resource rows in name order (so multi-resource requests cannot deadlock)."""
        r = self.t.resource
        rows: dict[str, Any] = {}
        for name in sorted(names):
            row = conn.execute(
                dialects.lock_rows(
                    select(r.c.name, r.c.capacity, r.c.last_token, r.c.last_ticket).where(
                        r.c.namespace == self.ns, r.c.name == name
                    ),
                    r,
                )
            ).first()
            if row is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; create it with "
                    f"set_capacity({name!r}, n) or `controltable capacity set {name} N`"
                )
            rows[name] = row
        return rows

    def _read_queues(self, conn: Connection, names: list[str]) -> tuple[list[Any], float]:
        """The live queue entries of the locked resources, and the database time, in one round trip.

        The time is read here, once the locks are held (read in the locking select it would be
        the time *before* waiting for the lock). The resource rows are outer-joined so that the
        time comes back even when the queues are empty. Expired entries are then deleted one by
        one, each delete re-checking the expiry: that delete is the only judge of expiry, so an
        entry whose renewal committed in between stays, and its holder keeps the slot.
        """
        q, r = self.t.request, self.t.resource
        joined = r.outerjoin(q, and_(q.c.namespace == r.c.namespace, q.c.resource == r.c.name))
        result = conn.execute(
            select(dialects.db_now().label("now"), q.c.id, q.c.resource, q.c.holder, q.c.request_key, q.c.slots,
                   q.c.mode, q.c.state, q.c.token, q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt)
            .select_from(joined)
            .where(r.c.namespace == self.ns, r.c.name.in_(names))
            .order_by(q.c.ticket)
        ).all()
        now = float(result[0].now)
        rows = []
        for row in result:
            if row.id is None:
                continue
            if float(row.expires_at) < now:
                gone = conn.execute(delete(q).where(q.c.id == row.id, q.c.expires_at < now)).rowcount
                if gone:
                    continue
            rows.append(row)
        return rows, now

    def _bump_tokens(self, conn: Connection, res: dict[str, Any], names: list[str]) -> dict[str, int]:
        r = self.t.resource
        tokens: dict[str, int] = {}
        for name in names:
            tokens[name] = int(res[name].last_token) + 1
            conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name).values(last_token=tokens[name]))
        return tokens

    def _attempt(self, conn: Connection, req: _Request) -> _Outcome:
        """One poll: enqueue (or find our entry), reap, and grant if we are first and fit."""
        q, r = self.t.request, self.t.resource
        parts, holder, mode = req.parts, req.holder, req.mode
        names = sorted(parts)
        res = self._lock_resources(conn, names)
        for name, k in parts.items():
            if k > res[name].capacity:
                raise ConfigurationError(
                    f"request for {k} slots of {name!r} can never be granted: its capacity is "
                    f"{res[name].capacity}; ask for fewer slots or raise the capacity"
                )
        rows, now = self._read_queues(conn, names)
        mine = {row.resource: row for row in rows if row.holder == holder}
        attempt = req.attempt
        if mine:
            wanted = {(n, k, mode) for n, k in parts.items()}
            have = {(row.resource, row.slots, row.mode) for row in mine.values()}
            keys = {row.request_key for row in mine.values()}
            if have != wanted or len(keys) != 1:
                raise ConfigurationError(
                    f"holder {holder!r} already holds or waits for {sorted(have)} which differs from this "
                    f"request {sorted(wanted)}; release it first or use another holder id"
                )
            key = keys.pop()
            recorded = max((int(row.attempt) for row in mine.values() if row.attempt is not None), default=None)
            if attempt is not None and recorded is not None and attempt < recorded:
                raise LeaseLost(
                    f"holder {holder!r} on {', '.join(repr(n) for n in names)} was superseded by attempt "
                    f"{recorded}; attempt {attempt} must stop (a newer attempt of the same work runs)"
                )
            newer = attempt is not None and (recorded is None or attempt > recorded)
            if not newer:
                attempt = recorded
            if all(row.state == "granted" for row in mine.values()):
                # Idempotent re-acquire: the same lease, extended; a newer attempt gets new tokens.
                expires = now + req.lease
                values: dict[str, Any] = dict(expires_at=expires, lease_seconds=req.lease, attempt=attempt)
                if newer:
                    tokens = self._bump_tokens(conn, res, names)
                    for name in names:
                        conn.execute(update(q).where(q.c.id == mine[name].id).values(token=tokens[name], **values))
                else:
                    tokens = {row.resource: int(row.token) for row in mine.values()}
                    conn.execute(update(q).where(q.c.request_key == key).values(**values))
                return _Outcome(True, key, {n: tokens[n] for n in parts}, expires,
                                float(min(row.granted_at for row in mine.values())), {},
                                min(int(row.ticket) for row in mine.values()), attempt)
            my_tickets = {row.resource: int(row.ticket) for row in mine.values()}
            my_ids = {row.resource: int(row.id) for row in mine.values()}
        else:
            key = req.key
            my_tickets = {}
            my_ids = {}

        position: dict[str, int] = {}
        eligible = True
        for name in names:
            queue = [row for row in rows if row.resource == name]
            mine_t = my_tickets.get(name)
            ahead = [row for row in queue if row.state == "waiting" and (mine_t is None or row.ticket < mine_t)]
            holders = [row for row in queue if row.state == "granted"]
            position[name] = len(ahead) + 1
            if ahead:
                eligible = False
            elif mode == "exclusive":
                eligible = eligible and not holders
            else:
                used = sum(row.slots for row in holders)
                excl = any(row.mode == "exclusive" for row in holders)
                eligible = eligible and not excl and used + parts[name] <= res[name].capacity

        if not my_ids:  # enqueue: one ticket per resource, from its counter, under its lock
            for name in names:
                my_tickets[name] = int(res[name].last_ticket) + 1
                conn.execute(update(r).where(r.c.namespace == self.ns, r.c.name == name)
                             .values(last_ticket=my_tickets[name]))

        if eligible:
            tokens = self._bump_tokens(conn, res, names)
            values = dict(state="granted", granted_at=now, expires_at=now + req.lease, lease_seconds=req.lease,
                          attempt=attempt)
            if my_ids:
                for name in names:
                    conn.execute(update(q).where(q.c.id == my_ids[name]).values(token=tokens[name], **values))
            else:
                for name in names:
                    conn.execute(insert(q).values(
                        namespace=self.ns, resource=name, holder=holder, request_key=key, slots=parts[name],
                        mode=mode, token=tokens[name], enqueued_at=now, ticket=my_tickets[name],
                        pickup_seconds=req.pickup, **values))
            if any(row.state == "waiting" and row.holder != holder for row in rows):
                self.ct._notify(conn, [slot_key(n) for n in names])  # the next in line may fit too
            ordered = {n: tokens[n] for n in parts}
            return _Outcome(True, key, ordered, now + req.lease, now, {}, min(my_tickets.values()), attempt)

        expires = now + req.ttl
        if my_ids:
            conn.execute(update(q).where(q.c.request_key == key).values(expires_at=expires, attempt=attempt))
        else:
            for name in names:
                conn.execute(insert(q).values(
                    namespace=self.ns, resource=name, holder=holder, request_key=key, slots=parts[name], mode=mode,
                    state="waiting", lease_seconds=req.lease, enqueued_at=now, expires_at=expires,
                    ticket=my_tickets[name], attempt=attempt, pickup_seconds=req.pickup))
        return _Outcome(False, key, {}, expires, None, position, min(my_tickets.values()), attempt)

    def _withdraw(self, request_key: str) -> Optional[_Outcome]:
        """Leave the queue after a timeout; if we were granted meanwhile, return that grant."""
        q = self.t.request

        def fn(conn: Connection) -> Optional[_Outcome]:
            names = [r[0] for r in conn.execute(select(q.c.resource).where(q.c.request_key == request_key))]
            conn.execute(delete(q).where(q.c.request_key == request_key, q.c.state == "waiting"))
            self.ct._notify(conn, [slot_key(n) for n in names])
            rows = conn.execute(
                select(q.c.id, q.c.resource, q.c.token, q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt).where(
                    q.c.request_key == request_key, q.c.state == "granted"
                )
            ).all()
            if not rows:
                return None
            return _Outcome(True, request_key, {row.resource: int(row.token) for row in rows},
                            float(rows[0].expires_at), float(rows[0].granted_at), {},
                            min(int(row.ticket) for row in rows), rows[0].attempt)

        return self.db.run(fn)

    # -- holding -----------------------------------------------------------------------------
    def renew(self, lease: Lease, seconds: float) -> float:
        q = self.t.request
        n = len(lease.resources)

        def fn(conn: Connection) -> float:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            result = conn.execute(
                update(q)
                .where(q.c.request_key == lease.request_key, q.c.state == "granted", q.c.expires_at >= now)
                .values(expires_at=now + seconds, lease_seconds=seconds)
            )
            if result.rowcount != n:
                conn.execute(delete(q).where(q.c.request_key == lease.request_key))
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
        """Delete the lease's rows; a lease that already expired is lost even if nobody reaped it yet.

        Retry-safe: the request key was chosen by the client, so when a retry (after a COMMIT whose
        reply was lost) finds no rows while the lease could not yet have expired, the first
        COMMIT is what removed them and the release succeeded.
        """
        q = self.t.request
        n = len(lease.resources)
        runs = 0

        def fn(conn: Connection) -> tuple[int, int, float]:
            nonlocal runs
            runs += 1
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            live = int(conn.execute(
                delete(q).where(q.c.request_key == lease.request_key, q.c.state == "granted", q.c.expires_at >= now)
            ).rowcount)
            stale = int(conn.execute(delete(q).where(q.c.request_key == lease.request_key)).rowcount)
            self.ct._notify(conn, [slot_key(name) for name in lease.resources])
            return live, stale, now

        live, stale, now = self.db.run(fn)
        if live == n:
            return
        if live == 0 and stale == 0 and runs > 1 and now < lease._expires_at:
            return  # our first COMMIT went through; its reply was lost
        if stale:
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

    def release_holder(self, resource: str, holder: str) -> int:
        """Release whatever ``holder`` holds or waits for on ``resource`` (for shell scripts).

        Returns the rows removed: 0 means nothing was held. An unknown resource is an error.
        """
        q, r = self.t.request, self.t.resource

        def fn(conn: Connection) -> int:
            if conn.scalar(select(r.c.name).where(r.c.namespace == self.ns, r.c.name == resource)) is None:
                raise UnknownResourceError(
                    f"resource {resource!r} does not exist in namespace {self.ns!r}; check the name and namespace"
                )
            keys = [
                row.request_key
                for row in conn.execute(
                    select(q.c.request_key).where(
                        q.c.namespace == self.ns, q.c.resource == resource, q.c.holder == holder
                    )
                )
            ]
            if not keys:
                return 0
            self.ct._notify(conn, [slot_key(resource)])
            return int(conn.execute(delete(q).where(q.c.request_key.in_(keys))).rowcount)

        return self.db.run(fn)

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For run-status sensors and teardown of a whole scope (a DAG run, a Dagster run). The
        prefix is matched literally (``%`` and ``_`` are escaped). Returns the requests removed.
        """
        q = self.t.request

        def fn(conn: Connection) -> int:
            match = and_(q.c.namespace == self.ns, q.c.holder.startswith(prefix, autoescape=True))
            rows = conn.execute(select(q.c.resource, q.c.request_key).where(match)).all()
            if not rows:
                return 0
            conn.execute(delete(q).where(match))
            self.ct._notify(conn, sorted({slot_key(row.resource) for row in rows}))
            return len({row.request_key for row in rows})

        return self.db.run(fn)

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
            ahead = conn.execute(
                select(q.c.holder, q.c.state, q.c.expires_at)
                .where(q.c.namespace == self.ns, q.c.resource == resource,
                       (q.c.state == "granted") | (q.c.ticket < mine.ticket))
                .order_by(q.c.state, q.c.ticket)  # "granted" sorts before "waiting"
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
            self.ct,
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
            st = ResourceStatus(res.name, int(res.capacity), 0, int(res.last_token))
            pos = 0
            for row in requests:
                if row.resource != res.name:
                    continue
                expired = float(row.expires_at) < now
                if row.state == "granted":
                    entry = Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.granted_at),
                                  utc(row.expires_at), int(row.token), 0, expired)
                    st.holders.append(entry)
                    if not expired:
                        st.used += int(row.slots)
                else:
                    pos += 0 if expired else 1
                    st.waiters.append(Entry(row.holder, int(row.slots), row.mode, row.state, utc(row.enqueued_at),
                                            utc(row.expires_at), None, pos, expired))
            out.append(st)
        return out

    def reap(self) -> int:
        q = self.t.request
        n = self.db.run(
            lambda c: int(
                c.execute(delete(q).where(q.c.namespace == self.ns, q.c.expires_at < dialects.db_now())).rowcount
            )
        )
        return n

    def iter_names(self) -> Iterator[str]:  # pragma: no cover - convenience
        for st in self.status():
            yield st.name
