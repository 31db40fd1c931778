"""The slot engine's workflow: transactions, locks, grant passes, waiting and leases (``SlotEngine``).

Statements come from :mod:`.statements`, the decision of who is granted from :mod:`.grants`; this
module decides when each runs and in which transaction, through the database layer (``Database.run``).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar, Union

from sqlalchemy.engine import Connection

from .. import dialects, errorcodes
from ..clock import read_now, utc
from ..defaults import (
    DEFAULT_PICKUP,
    FAILOVER_PICKUP,
    HISTORY_PRUNE_BATCH,
    HISTORY_PRUNE_INTERVAL,
    HISTORY_RETENTION,
    WITHDRAW_GRACE,
    WITHDRAW_RETRY_INTERVAL,
)
from ..errors import AcquireTimeout, ConfigurationError, LeaseLost, UnknownResourceError
from ..holders import process_holder_id
from ..runtime import Runtime, runtime_of
from ..validation import (
    check_attempt,
    check_mode,
    check_name,
    check_poll_interval,
    check_priority,
    check_seconds,
    normalize_request,
)
from . import grants
from . import statements as sql
from .history import compute_stats, to_record
from .keys import head_key, holder_key, key_size, request_key, slot_key
from .statements import EXPIRED, GRANTED, RELEASED
from .values import Entry, GrantRecord, Lease, Rate, ResourceStats, ResourceStatus, WaitInfo

log = logging.getLogger("controltable")

#: Without push: the longest a waiter sleeps between looks at its entry (far back in the queue).
MAX_POLL_INTERVAL = 2.0
#: Without push: how often the head of the queue looks (a grant waits for it to look).
HEAD_POLL_INTERVAL = 0.1
#: The same where pushes were expected but a pooler swallows them (the listener's self-probe
#: failed): each look there is a round trip through the pooler, so the head looks twice as often
#: to keep the handoff p50 within 100 ms until ``listen_url`` is set.
POOLED_HEAD_POLL_INTERVAL = 0.05
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
#: ... or sooner: this many seconds per position behind the head (up to ``REAP_GRACE``), so the
#: waiter right behind a dead head (a process that died in the queue) takes over within moments.
#: Every waiter times the holders' earliest expiry (a grant's pickup deadline included), so an
#: expiry wakes the next live waiter at once instead of at its next refresh.
BEHIND_GRACE = 0.25
#: Seconds past an ``acquire`` timeout that its last transaction may still take (then the
#: caller hears :class:`AcquireTimeout`, or the database error that stopped it).
DEADLINE_GRACE = 1.0
#: The shortest pickup deadline of a grant made on a waiter's behalf (its entry's own expiry
#: shortens the deadline down to this).
MIN_PICKUP = 1.0
#: A grant pass reads at most this many waiters (plus one) per queue and round.
HEAD_READ_LIMIT = 100

T = TypeVar("T")


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
    #: The server's failover epoch, read with the row lock (``dialects.token_epoch``).
    epoch: int = 1
    #: This transaction shortened the pickup of the queue the promoted server inherited.
    rejoined: bool = False

    def next_token(self) -> int:
        """Advance the fencing counter: above the last token and every token of an earlier epoch."""
        self.last_token = dialects.next_token(self.last_token, self.epoch)
        self.dirty = True
        return self.last_token


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
    #: Higher is granted first (see :mod:`controltable.slots.grants`).
    priority: int = 0


class _NeedLocks(Exception):
    """A grant pass met a multi-resource request whose other resources it has not locked."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


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
        #: Queue entries of failed acquires still to withdraw: (holder, request key) -> (request,
        #: give up at); retried by one background thread (see :meth:`_abandon`).
        self._withdrawals: dict[tuple[str, str], tuple[_Request, float]] = {}
        self._withdrawals_lock = threading.Lock()
        self._withdrawer: Optional[threading.Thread] = None

    # -- running a change followed by a grant pass ---------------------------------------------
    def _with_pass(self, names: set[str], action: Callable[[Connection, dict[str, Any], float], T],
                   deadline: Optional[float] = None) -> T:
        """Run ``action`` and a grant pass in one transaction, holding the locks of ``names``.

        If a chain of multi-resource requests keeps the locks moving (see :meth:`_in_lock_order`),
        the change is committed without passing the capacity on here: the waiters at the head run
        a pass themselves when they next look.
        """

        def with_pass(conn: Connection, res: dict[str, Any], now: float) -> T:
            result = action(conn, res, now)
            self._grant_pass(conn, res, now)
            return result

        return self._in_lock_order(names, with_pass, fallback=action, deadline=deadline)

    def _in_lock_order(
        self, names: set[str], fn: Callable[[Connection, dict[str, Any], float], T], *,
        deadline: Optional[float] = None, fallback: Optional[Callable[[Connection, dict[str, Any], float], T]] = None,
    ) -> T:
        """Run ``fn(conn, resources, now)`` in one transaction holding the locks of ``names``.

        If the grant pass inside meets a multi-resource request whose resources are not all locked
        and cannot be locked in name order any more, the transaction is rolled back and run again
        with those resources locked from the start (all locks are always taken in name order).
        After eight such rounds ``fallback`` runs instead (without a pass), or, without one, the
        caller gets :class:`AcquireTimeout`.
        """
        lockset = set(names)
        for _ in range(8):
            locks = set(lockset)

            def run(conn: Connection, locks: set[str] = locks) -> T:
                return fn(conn, *self._lock(conn, locks))

            try:
                return self.db.run(run, deadline=deadline)
            except _NeedLocks as need:
                lockset |= need.names
        if fallback is None:  # pragma: no cover - needs a chain of 8 multi-resource requests moving at once
            raise AcquireTimeout(f"could not lock the resources of {sorted(names)} in order; retry")
        return self.db.run(lambda c: fallback(c, *self._lock(c, lockset)))

    def _lock(self, conn: Connection, names: set[str]) -> tuple[dict[str, Any], float]:
        """Lock the resource rows in name order (so multi-resource requests cannot deadlock), then
        read the database time.

        The time is read after the last lock is held: by the last lock statement itself where the
        dialect evaluates a clock after the lock (:func:`controltable.dialects.with_lock_clock`),
        otherwise by a statement of its own. A clock taken when the locking statement starts would
        come from before the lock wait, and a request that waited behind a grant would be stamped
        as enqueued before that grant (its queue key too early, and the history showing it passed
        over).
        """
        clocked: list[float] = []
        rows = self._lock_rows(conn, names, {}, clocked)
        if not rows:
            return rows, 0.0
        return rows, (clocked[0] if clocked else read_now(conn))

    def _lock_rows(self, conn: Connection, names: set[str], rows: dict[str, Any],
                   clocked: Optional[list[float]] = None) -> dict[str, Any]:
        """Lock, in name order, the rows of ``names`` not in ``rows`` yet, adding them to ``rows``.

        With ``clocked``, the last lock statement also reads the database time after its lock is
        held where the dialect allows (appended to ``clocked``; one round trip fewer)."""
        todo = [name for name in sorted(names) if name not in rows]
        for name in todo:
            last = clocked is not None and name == todo[-1]
            row = conn.execute(*sql.lock_resource(self.t, self.ns, name,
                                                  self.db.dialect_name if last else None)).first()
            if last and row is not None and clocked is not None and "now" in row._mapping:
                clocked.append(float(row.now))
            if row is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; create it with "
                    f"set_capacity({name!r}, n) or `controltable capacity set {name} N`"
                )
            rows[name] = _Res(name, int(row.capacity), int(row.last_token), int(row.last_ticket),
                              rate_count=None if row.rate_count is None else int(row.rate_count),
                              rate_per=None if row.rate_per is None else float(row.rate_per),
                              aging=None if row.aging is None else float(row.aging),
                              epoch=int(row.epoch))
        return rows

    def _snapshot(self, conn: Connection, res: dict[str, Any]) -> list[Any]:
        """The holders of the locked resources and the head of each waiting queue, in one statement.

        Reads at most ``capacity + 2`` waiters per queue (no more can be granted by one pass, and
        the new head and the one behind it are told to look).
        """
        heads = {name: self._head_size(res[name]) for name in res}
        return list(conn.execute(*sql.snapshot(self.t, self.ns, heads)).all())

    def _budget(self, conn: Connection, res: _Res, now: float) -> Optional[int]:
        """Grants the resource's rate window still allows at ``now`` (None: no rate limit)."""
        if res.rate_count is None or res.rate_per is None:
            return None
        used = int(conn.scalar(sql.window_count(self.t, self.ns, res.name, now - res.rate_per)) or 0)
        return max(res.rate_count - used, 0)

    def _end_grants(self, conn: Connection, rows: list[Any], now: float, outcome: Optional[str] = None) -> None:
        """Close the history rows of the granted ``rows`` being removed: released while their lease
        was live, expired otherwise (or ``outcome``)."""
        for row in rows:
            if row.state != GRANTED or row.token is None:
                continue
            how = outcome or (RELEASED if float(row.expires_at) >= now else EXPIRED)
            conn.execute(sql.end_grant(self.t, self.ns, row.resource, int(row.token), how, now))

    @staticmethod
    def _head_size(res: _Res) -> int:
        # A capacity's worth can be granted by one pass; then the new head and the one behind it
        # (told to look: it times the grants' pickup deadlines in case the head is dead).
        return min(res.capacity, HEAD_READ_LIMIT) + 2

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
        reaped = 0
        for _ in range(100):  # each round grants at least one waiter or ends
            self._after_promotion(conn, res, own[0] if own is not None else None)
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
                    gone = dialects.changed_rows(conn, sql.delete_expired_row(self.t, row.id, now), self.t.request.c.id,
                                                 self.db.dialect_name)
                    if gone:
                        reaped += 1
                        self._end_grants(conn, [row], now, EXPIRED)
                        continue
                if row.state == GRANTED:
                    queue = queues[row.resource]
                    queue.used += int(row.slots)
                    queue.exclusive_held = queue.exclusive_held or row.mode == "exclusive"
                else:
                    waiting[row.resource].append(row)
            multi = sorted({row.request_key for rs in waiting.values() for row in rs if key_size(row.request_key) > 1})
            spans: dict[str, set[str]] = {}
            if multi:
                for key, resource in conn.execute(sql.request_spans(self.t, multi)):
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
                    self._lock_rows(conn, decision.need, res)  # still in name order; the pass keeps its time
                    continue
                raise _NeedLocks(decision.need)
            notify: list[str] = []
            others = False
            # The grants, their history rows and the counters: independent writes (different rows),
            # sent as few statements as the dialect allows (sql.run_grant_writes).
            writes: list[Any] = []
            counters: list[Any] = []
            for key in decision.grant:
                mine = own is not None and key == own[0]
                for row in rows_by_key[key]:
                    token = res[row.resource].next_token()
                    if granted is not None:
                        granted.setdefault(key, {})[row.resource] = token
                    if mine and own is not None:
                        # The caller's own request: picked up at once, with its lease.
                        grant = sql.grant_waiter(self.t, row.id, token, now, now + own[1], own[1])
                    else:
                        pickup = float(row.pickup_seconds) if row.pickup_seconds is not None else DEFAULT_PICKUP
                        # Never longer than the waiter promised to stay alive: a live waiter looks at
                        # its entry before that, a dead one (that stopped refreshing) lapses sooner.
                        grant = sql.grant_waiter(self.t, row.id, token, now,
                                                 now + min(pickup, max(float(row.expires_at) - now, MIN_PICKUP)))
                    # In the grant's transaction: the rate window counts these rows.
                    writes.append((grant, sql.record_grant(self.t, self.ns, row.resource, token, row,
                                                           int(row.priority), now)))
                if not mine:
                    others = True
                    first = min(row.resource for row in rows_by_key[key])
                    notify.append(holder_key(first, next(x.holder for x in rows_by_key[key] if x.resource == first)))
            for name in sorted(res):
                if res[name].dirty:
                    counters.append(sql.write_counters(self.t, self.ns, name, res[name].last_token,
                                                       res[name].last_ticket))
                    res[name].dirty = False
            sql.run_grant_writes(conn, writes, counters, self.db.dialect_name)
            for name, key in decision.heads.items():
                rate_spent = queues[name].budget == 0
                # A new head times the holders' leases; a head stopped by a spent rate budget times
                # the window's next opening (which nobody pushes): either way, tell it to look.
                if (key != first_before.get(name) or rate_spent) and key in rows_by_key:
                    # A new head: it now times the holders' leases, so tell it.
                    row = rows_by_key[key][0]
                    notify.append(head_key(min(spans.get(key, {name})), row.holder))
                if others:
                    # The waiter behind the head times the pickup deadlines of the grants just
                    # made too: the head may be dead (a process that died in the queue), and then
                    # nobody else notices a grant lapse. Tell it to look.
                    left = [w.key for w in queues[name].head if w.key not in decision.grant]
                    behind = left[1] if len(left) > 1 and left[0] == key else None
                    if behind is not None and behind in rows_by_key:
                        notify.append(head_key(min(spans.get(behind, {name})), rows_by_key[behind][0].holder))
            if others or reaped:
                notify.extend(slot_key(name) for name in sorted(res))
            if notify:
                self.runtime.notify(conn, notify)
            if not decision.more or not decision.grant:
                return reaped
        return reaped  # pragma: no cover - a hundred rounds of grants in one pass

    def _after_promotion(self, conn: Connection, res: dict[str, Any], own_key: Optional[str]) -> None:
        """Before the first grant on a promoted server, shorten the pickup of every waiting entry.

        With asynchronous replication the promoted server's queue is the old primary's as the
        standby last saw it: entries of callers that were granted, released or withdrew since
        (commits lost with the old primary) now wait for nobody, and each one granted on its
        behalf would hold its queue for its pickup deadline (8 s by default) before passing on.
        So until a token of the new epoch is issued (:func:`controltable.dialects.epoch_begins`),
        every waiting entry but the caller's gets ``FAILOVER_PICKUP``: a dead entry lapses within
        it, a live waiter looks sooner or re-enters and restores its own pickup.
        """
        for name in sorted(res):
            r = res[name]
            if not r.rejoined and dialects.epoch_begins(r.last_token, r.epoch):
                conn.execute(sql.shorten_pickups(self.t, self.ns, name, FAILOVER_PICKUP, own_key))
                r.rejoined = True

    # -- capacity ----------------------------------------------------------------------------
    def set_capacity(self, name: str, capacity: int, policy: Optional[dict[str, Any]] = None) -> None:
        """Create or change a resource; ``policy`` may hold ``rate`` (a Rate or None) and ``aging``
        (seconds or None) to set - keys left out are kept."""
        policy = policy or {}

        def create(conn: Connection) -> None:
            if conn.execute(sql.lock_resource_name(self.t, self.ns, name)).first() is None:
                conn.execute(sql.create_resource(self.t, self.ns, name, capacity))

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
                conn.execute(sql.reorder_queue(self.t, self.ns, name, aging))
            conn.execute(sql.change_resource(self.t, self.ns, name, values))
            res[name].capacity = capacity  # a larger capacity grants the waiters that now fit

        self._with_pass({name}, change)

    def delete_resource(self, name: str, *, force: bool = False) -> bool:
        def fn(conn: Connection) -> bool:
            if conn.execute(sql.lock_resource_name(self.t, self.ns, name)).first() is None:
                return False
            live = conn.scalar(sql.live_request(self.t, self.ns, name))
            if live is not None and not force:
                raise ConfigurationError(
                    f"resource {name!r} still has holders or waiters; release them, wait for their leases "
                    "to expire, or delete with force=True (--force)"
                )
            conn.execute(sql.delete_resource_requests(self.t, self.ns, name))
            conn.execute(sql.delete_history(self.t, self.ns, name))
            conn.execute(sql.delete_resource(self.t, self.ns, name))
            return True

        return self.db.run(fn)

    # -- acquire -----------------------------------------------------------------------------
    def _request(
        self, resource: Union[str, Mapping[str, int]], holder: Optional[str], slots: int, mode: str, lease: float,
        waiter_ttl: float, pickup: float, attempt: Optional[int], priority: int = 0,
    ) -> _Request:
        parts = normalize_request(resource, slots)
        mode = check_mode(mode)
        holder = check_name("holder", holder) if holder is not None else process_holder_id()
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
        self._forget_withdrawal(req)  # this holder asks again: a pending withdrawal of its old entry is moot
        # Whatever makes this call fail (the database gone while it waits, an interrupt, a bug),
        # its queue entry must not stay behind to be granted and block the queue for a pickup
        # window: it is withdrawn on the way out, or, failing that, on reconnect.
        entered: list[str] = []
        try:
            return self._acquire(req, wait, deadline, poll_interval, entered)
        except AcquireTimeout as exc:
            if not getattr(exc, "withdrawn", False):
                self._abandon(req, entered[-1] if entered else req.key)
            raise
        except BaseException:
            self._abandon(req, entered[-1] if entered else req.key)
            raise

    def _acquire(self, req: _Request, wait: Optional[float], deadline: Optional[float], poll_interval: float,
                 entered: list[str]) -> Lease:
        keys = [holder_key(min(req.parts), req.holder), head_key(min(req.parts), req.holder)]
        since = self.runtime.mark(keys)
        outcome = self._enqueue(req)
        entered.append(outcome.request_key)
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
                timeout = AcquireTimeout(
                    f"holder {req.holder!r} was not granted {req.parts!r} ({req.mode}) within {wait:g} s; "
                    f"it was waiting at {where}. Raise the timeout or the capacity, or see `controltable status`."
                )
                timeout.withdrawn = True  # type: ignore[attr-defined]
                raise timeout
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
                entered.append(outcome.request_key)
                refreshed = time.monotonic()
            elif peek.outcome is not None:
                outcome = peek.outcome
        return self._lease(req, outcome)

    # -- giving up: the queue entry goes with the caller ------------------------------------
    def _abandon(self, req: _Request, key: str) -> None:
        """Withdraw the entry of an ``acquire`` that failed, within :data:`WITHDRAW_GRACE` seconds.

        Removes the request's rows whatever their state (waiting, or granted and not yet handed
        to the caller, who will never see that lease) and passes the capacity on, like a
        release. If the database cannot be reached now, the withdrawal is queued and retried in
        the background by its request key (:meth:`_retry_withdrawals`).
        """
        try:
            self._remove(sql.request_match(self.t, self.ns, sorted(req.parts), req.holder, key),
                         deadline=time.monotonic() + WITHDRAW_GRACE)
        except Exception as exc:
            log.warning("controltable: could not withdraw the queue entry of %r on %s (%s); retrying on reconnect",
                        req.holder, sorted(req.parts), exc)
            self._defer_withdrawal(req, key)

    def _defer_withdrawal(self, req: _Request, key: str) -> None:
        # Past the entry's own expiry (plus a pickup window for a grant made meanwhile) it can no
        # longer hold anyone up: the next grant pass reaps it.
        give_up = time.monotonic() + req.ttl + req.pickup
        with self._withdrawals_lock:
            self._withdrawals[(req.holder, key)] = (req, give_up)
            if self._withdrawer is None or not self._withdrawer.is_alive():
                self._withdrawer = threading.Thread(target=self._retry_withdrawals, daemon=True,
                                                    name="controltable-withdraw")
                self._withdrawer.start()

    def _forget_withdrawal(self, req: _Request) -> None:
        """A new acquire of the same holder and resources: its old entry is its own again."""
        with self._withdrawals_lock:
            for pending in [k for k, (r, _) in self._withdrawals.items()
                            if r.holder == req.holder and r.parts == req.parts]:
                del self._withdrawals[pending]

    def _retry_withdrawals(self) -> None:
        """The background half of :meth:`_abandon`: one thread per engine while withdrawals are pending."""
        while True:
            time.sleep(WITHDRAW_RETRY_INTERVAL)
            with self._withdrawals_lock:
                pending = list(self._withdrawals.items())
                if not pending:
                    self._withdrawer = None
                    return
            for (holder, key), (req, give_up) in pending:
                done = time.monotonic() >= give_up
                if not done:
                    try:
                        self._remove(sql.request_match(self.t, self.ns, sorted(req.parts), holder, key),
                                     deadline=time.monotonic() + WITHDRAW_GRACE)
                        done = True
                        log.info("controltable: withdrew the queue entry %r of %r (a failed acquire)", key, holder)
                    except Exception:
                        continue  # still unreachable: try again next round
                with self._withdrawals_lock:
                    if self._withdrawals.get((holder, key), (None, None))[0] is req:
                        del self._withdrawals[(holder, key)]

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
        expiry = None
        if peek is not None and peek.holder_expiry_in is not None:
            # The head looks when the first holder's lease (or a grant's pickup) runs out; those
            # behind it a little later (see ``BEHIND_GRACE``), in case the head is dead too.
            behind = 0.0 if peek.head else min(REAP_GRACE, BEHIND_GRACE * (position - 1))
            expiry = peek.holder_expiry_in + behind
        if self.runtime.push_active:
            sleep = refresh_in
            if head or position <= HEAD_POSITIONS:
                sleep = min(sleep, max(delay * 10, PUSH_POLL_INTERVAL), req.pickup * 0.7)
        else:
            # Up to a capacity's worth of waiters can be granted by one release: pace by "rounds".
            capacity_rounds = 0.0 if head else max(position - 1, 0) / max(outcome.capacity, 1)
            head_poll = POOLED_HEAD_POLL_INTERVAL if self.runtime.wakeups.lost else HEAD_POLL_INTERVAL
            sleep = min(refresh_in, MAX_POLL_INTERVAL, req.ttl / 4.0, head_poll * (1 + capacity_rounds))
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
        names = sorted(req.parts)

        def action(conn: Connection, res: dict[str, Any], now: float) -> _Entered:
            for name, k in req.parts.items():
                if k > res[name].capacity:
                    raise ConfigurationError(
                        f"request for {k} slots of {name!r} can never be granted: its capacity is "
                        f"{res[name].capacity}; ask for fewer slots or raise the capacity"
                    )
            mine = list(conn.execute(sql.holder_rows(self.t, self.ns, names, req.holder)).all())
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
                    gone = dialects.changed_rows(conn, sql.delete_expired_request(self.t, mine[0].request_key, now),
                                                 self.t.request.c.id, self.db.dialect_name)
                    if gone:
                        conn.execute(sql.delete_requests(self.t, mine[0].request_key))
                        self._end_grants(conn, mine, now, EXPIRED)
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
                if all(row.state == GRANTED for row in mine):
                    # Idempotent re-acquire (or the pickup of a grant made on our behalf): the same
                    # grant, extended; a newer attempt gets new tokens in place.
                    tokens = {row.resource: int(row.token) for row in mine}
                    if newer:
                        for name in names:
                            new_token = res[name].next_token()
                            conn.execute(sql.retoken_grant(self.t, self.ns, name, tokens[name], now))
                            (row_of,) = [row for row in mine if row.resource == name]
                            conn.execute(sql.record_grant(self.t, self.ns, name, new_token, row_of,
                                                          int(row_of.priority), now, enqueued_at=now))
                            tokens[name] = new_token
                            conn.execute(sql.write_last_token(self.t, self.ns, name, tokens[name]))
                    for row in mine:
                        conn.execute(sql.extend_grant_row(self.t, row.id, tokens[row.resource], now + req.lease,
                                                          req.lease, attempt))
                    granted_at = float(min(row.granted_at for row in mine))
                    return _Entered(key, attempt, ticket, done=_Outcome(
                        True, key, {n: tokens[n] for n in req.parts}, now + req.lease, granted_at, {}, ticket,
                        attempt))
                conn.execute(sql.requeue_waiter(self.t, key, now + req.ttl, attempt, req.pickup))
                return _Entered(key, attempt, ticket)
            key = req.key
            tickets = {}
            for name in names:  # one ticket per resource, from its counter, under its lock
                res[name].last_ticket += 1
                res[name].dirty = True  # written by the grant pass that follows
                tickets[name] = res[name].last_ticket
                conn.execute(sql.insert_waiter(
                    self.t, self.ns, resource=name, holder=req.holder, key=key, slots=req.parts[name],
                    mode=req.mode, lease=req.lease, now=now, ttl=req.ttl, ticket=tickets[name], attempt=attempt,
                    pickup=req.pickup, priority=req.priority,
                    queue_key=grants.queue_key(req.priority, now, res[name].aging)))
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
                head = conn.scalar(sql.head_ticket(self.t, self.ns, name))
                position[name] = max(entered.ticket - int(head if head is not None else entered.ticket), 0) + 1
            capacity = min(res[name].capacity for name in names)
            return _Outcome(False, entered.key, {}, now + req.ttl, None, position, entered.ticket, entered.attempt,
                            capacity, any(res[name].rate_count is not None for name in names))

        return self._in_lock_order(set(names), fn, deadline=req.deadline)

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
        rows = conn.execute(sql.peek(self.t, self.ns, sorted(req.parts), req.holder)).all()
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
        if all(row.state == GRANTED for row in rows):
            if req.attempt is not None and req.attempt != recorded:
                return _Peek("granted", recorded_attempt=recorded)  # the caller re-enters for the attempt
            picked = dialects.confirmed_count(conn, *sql.extend_lease(self.t, key, now, req.lease),
                                              self.db.dialect_name)
            if picked != len(rows):
                return _Peek("lapsed", recorded_attempt=recorded)
            tokens = {row.resource: int(row.token) for row in rows}
            return _Peek("granted", _Outcome(True, key, {n: tokens[n] for n in req.parts}, now + req.lease,
                                             float(min(row.granted_at for row in rows)), {}, ticket, recorded),
                         recorded_attempt=recorded)
        if refresh:
            updated = dialects.confirmed_count(conn, *sql.refresh_waiter(self.t, key, now, req.ttl, req.pickup),
                                               self.db.dialect_name)
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
                times = [float(t) for t in conn.execute(sql.window_times(self.t, self.ns, row.resource, now - per))
                         .scalars()]
                queue.budget = grants.rate_budget(count, per, times, now)
                wait = grants.opens_in(count, per, times, now)
                if wait is not None:
                    opens_in = wait if opens_in is None else max(opens_in, wait)
                elif position[row.resource] == 2 and queue.budget > 0 and grants.fits(queue, 1, "shared"):
                    # Room and budget, yet the head still waits: if the window opened a while ago
                    # and nobody ran a pass since (a dead head), this waiter runs it.
                    left_at = conn.scalar(sql.last_left(self.t, self.ns, row.resource, now - per))
                    rescue = left_at is not None and now - (float(left_at) + per) > REAP_GRACE
            fits_all = fits_all and grants.fits(queue, int(row.slots), row.mode)
        capacity = min(int(row.capacity) for row in rows)
        grace = min(REAP_GRACE, BEHIND_GRACE * (max(position.values(), default=1) - 1))
        behind_expired = expired_holder and soonest is not None and soonest < -grace
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
        def action(conn: Connection, res: dict[str, Any], now: float) -> Optional[_Outcome]:
            rows = conn.execute(sql.withdraw_rows(self.t, self.ns, sorted(req.parts), req.holder)).all()
            if rows and all(row.state == GRANTED and float(row.expires_at) >= now for row in rows):
                key = rows[0].request_key
                conn.execute(sql.extend_request(self.t, key, now + req.lease, req.lease))
                tokens = {row.resource: int(row.token) for row in rows}
                return _Outcome(True, key, {n: tokens[n] for n in req.parts}, now + req.lease,
                                float(min(row.granted_at for row in rows)), {},
                                min(int(row.ticket) for row in rows), rows[0].attempt)
            for key in {row.request_key for row in rows}:
                conn.execute(sql.delete_requests(self.t, key))
            self._end_grants(conn, list(rows), now, EXPIRED)  # a grant made for us that lapsed
            return None

        return self._with_pass(set(req.parts), action)

    # -- holding -----------------------------------------------------------------------------
    def renew(self, lease: Lease, seconds: float) -> float:
        n = len(lease.resources)

        def fn(conn: Connection) -> float:
            now = read_now(conn)
            renewed = dialects.confirmed_count(conn, *sql.extend_lease(self.t, lease.request_key, now, seconds),
                                               self.db.dialect_name)
            if renewed != n:
                left = conn.execute(sql.request_rows(self.t, lease.request_key)).all()
                conn.execute(sql.delete_requests(self.t, lease.request_key))
                self._end_grants(conn, list(left), now, EXPIRED)
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
        n = len(lease.resources)
        completed = 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> tuple[int, int, float]:
            nonlocal completed
            if dialects.writes_in_one_statement(conn, self.db.dialect_name):
                # The rows, their removal and their history closed, in one statement.
                rows = conn.execute(*sql.remove_request(self.t, self.ns, lease.request_key, now)).all()
            elif dialects.deletes_returning(conn, self.db.dialect_name):
                rows = conn.execute(sql.delete_request_rows(self.t, lease.request_key)).all()
                self._end_grants(conn, list(rows), now)
            else:
                rows = conn.execute(sql.request_rows(self.t, lease.request_key)).all()
                if rows:
                    conn.execute(sql.delete_requests(self.t, lease.request_key))
                    self._end_grants(conn, list(rows), now)
            live = sum(1 for row in rows if row.state == GRANTED and float(row.expires_at) >= now)
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
        count = self.db.run(lambda c: c.scalar(sql.held_count(self.t, lease.request_key)))
        return int(count or 0) == len(lease.resources)

    def _remove(self, match: Any, check: Optional[Callable[[Connection], None]] = None,
                deadline: Optional[float] = None) -> int:
        """Remove the requests with rows matching ``match`` (whole requests), then pass capacity on.

        The resources involved are read first without locks, then locked in name order; rows of
        requests that appeared meanwhile on other resources are left for the next call.
        """
        names = {row[0] for row in self.db.run(lambda c: c.execute(sql.resources_matching(self.t, match)).all(),
                                               deadline=deadline)}
        if not names:
            if check is not None:
                self.db.run(check, deadline=deadline)
            return 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> int:
            if check is not None:
                check(conn)
            keys = sorted({row[0] for row in conn.execute(sql.keys_matching(self.t, match, sorted(res)))})
            if not keys:
                return 0
            spans = conn.execute(sql.request_spans(self.t, keys)).all()
            extra = {row.resource for row in spans} - set(res)
            if extra:
                raise _NeedLocks(extra)
            gone = conn.execute(sql.request_rows(self.t, keys)).all()
            conn.execute(sql.delete_requests(self.t, keys))
            self._end_grants(conn, list(gone), now)
            return len(keys)

        return self._with_pass(names, action, deadline=deadline)

    def release_holder(self, resource: str, holder: str) -> int:
        """Release whatever ``holder`` holds or waits for on ``resource`` (for shell scripts).

        Returns the requests removed: 0 means nothing was held. An unknown resource is an error.
        """
        def known(conn: Connection) -> None:
            if conn.scalar(sql.resource_name(self.t, self.ns, resource)) is None:
                raise UnknownResourceError(
                    f"resource {resource!r} does not exist in namespace {self.ns!r}; check the name and namespace"
                )

        return self._remove(sql.holder_match(self.t, self.ns, resource, holder), known)

    def release_holders(self, prefix: str) -> int:
        """Release every holder and withdraw every waiter whose holder id starts with ``prefix``.

        For run-status sensors and teardown of a whole scope (a DAG run, a Dagster run). The
        prefix is matched literally (``%`` and ``_`` are escaped). Returns the requests removed.
        """
        return self._remove(sql.prefix_match(self.t, self.ns, prefix))

    def wait_info(self, resource: str, holder: str) -> Optional[WaitInfo]:
        """Where ``holder`` stands on ``resource``: None when it neither holds nor waits."""
        def fn(conn: Connection) -> tuple[float, Optional[Any], list[Any]]:
            now = read_now(conn)
            mine = conn.execute(sql.own_entry(self.t, self.ns, resource, holder)).first()
            if mine is None or mine.state == GRANTED:
                return now, mine, []
            return now, mine, list(conn.execute(sql.ahead_of(self.t, self.ns, resource, mine)).all())

        now, mine, ahead = self.db.run(fn)
        if mine is None or float(mine.expires_at) < now:
            return None
        live = [row for row in ahead if float(row.expires_at) >= now]
        waiting_ahead = sum(1 for row in live if row.state == sql.WAITING)
        return WaitInfo(
            resource=resource,
            holder=holder,
            state=str(mine.state),
            position=0 if mine.state == GRANTED else waiting_ahead + 1,
            ahead=[str(row.holder) for row in live],
            waiting_since=utc(float(mine.enqueued_at)),
            token=None if mine.token is None or mine.state != GRANTED else int(mine.token),
            expires_at=utc(float(mine.expires_at)),
        )

    def find_lease(self, resource: str, holder: str) -> Optional[Lease]:
        """The live lease ``holder`` has on ``resource``, rebuilt from the table (for other processes)."""
        def fn(conn: Connection) -> list[Any]:
            key = conn.scalar(sql.granted_key(self.t, self.ns, resource, holder))
            if key is None:
                return []
            return list(conn.execute(sql.request_by_key(self.t, key)).all())

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
        def fn(conn: Connection) -> tuple[float, list[Any], list[Any], dict[str, list[float]]]:
            now = read_now(conn)
            resources = list(conn.execute(sql.resources(self.t, self.ns, names)).all())
            # The rate window's grant times, for the resources that have a rate (when it next opens).
            times = {res.name: [float(t) for t in conn.execute(
                sql.window_times(self.t, self.ns, res.name, now - float(res.rate_per))).scalars()]
                for res in resources if res.rate_count is not None and res.rate_per is not None}
            return now, resources, list(conn.execute(sql.requests(self.t, self.ns, names)).all()), times

        now, resources, requests, times = self.db.run(fn)
        out = []
        for res in resources:
            aging = None if res.aging is None else float(res.aging)
            rate = None if res.rate_count is None else Rate(int(res.rate_count), float(res.rate_per))
            st = ResourceStatus(res.name, int(res.capacity), 0, int(res.last_token), rate=rate, aging=aging)
            if rate is not None:
                st.rate_opens_in = grants.opens_in(rate.count, rate.per, times.get(res.name, []), now)
            mine = [row for row in requests if row.resource == res.name]
            waiting = sorted((row for row in mine if row.state != GRANTED),
                             key=lambda row: (grants.queue_key(int(row.priority), float(row.enqueued_at), aging),
                                              int(row.ticket)))
            live_ahead: list[str] = []
            for row in mine:
                if row.state != GRANTED:
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
    def history(self, resource: Optional[str], since: float, limit: int) -> list[GrantRecord]:
        def fn(conn: Connection) -> list[Any]:
            return list(conn.execute(sql.records(self.t, self.ns, resource, read_now(conn) - since, limit)).all())

        return [to_record(row) for row in self.db.run(fn)]

    def stats(self, names: Optional[list[str]], window: float) -> list[ResourceStats]:
        """Per resource (all when ``names`` is None), statistics of the last ``window`` seconds."""

        def fn(conn: Connection) -> list[ResourceStats]:
            now = read_now(conn)
            out = []
            for row in conn.execute(sql.capacities(self.t, self.ns, names)).all():
                rows = conn.execute(sql.overlapping(self.t, self.ns, row.name, now - window, now)).all()
                out.append(compute_stats(row.name, int(row.capacity), rows, now - window, now))
            return out

        return self.db.run(fn)

    def stats_series(self, name: str, window: float, buckets: int) -> list[ResourceStats]:
        def fn(conn: Connection) -> list[ResourceStats]:
            now = read_now(conn)
            capacity = conn.scalar(sql.capacity_of(self.t, self.ns, name))
            if capacity is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; check the name and namespace")
            start = now - window
            rows = conn.execute(sql.overlapping(self.t, self.ns, name, start, now)).all()
            step = window / buckets
            return [compute_stats(name, int(capacity), rows, start + i * step, start + (i + 1) * step)
                    for i in range(buckets)]

        return self.db.run(fn)

    def prune_history(self, older_than: float, names: Optional[list[str]] = None,
                      max_batches: Optional[int] = None) -> int:
        """Delete ended grants made more than ``older_than`` seconds ago, in batches of
        ``HISTORY_PRUNE_BATCH`` rows per transaction (each short; grants interleave).

        Never those inside a resource's rate window: its budget is counted from them, so a rate
        period longer than ``older_than`` (up to 30 days against 7 of retention) keeps its grants
        for the whole period."""
        if names is None:
            names = [row[0] for row in self.db.run(lambda c: c.execute(sql.resource_names(self.t, self.ns)).all())]
        total = 0
        for name in names:
            batches = 0
            while max_batches is None or batches < max_batches:
                def fn(conn: Connection, name: str = name) -> int:
                    period = conn.scalar(sql.rate_period(self.t, self.ns, name))
                    before = read_now(conn) - max(older_than, float(period or 0.0))
                    edge = conn.scalar(sql.prune_edge(self.t, self.ns, name, before, HISTORY_PRUNE_BATCH))
                    if edge is None:  # fewer than a batch left: the rest
                        return dialects.changed_rows(conn, sql.delete_ended(self.t, self.ns, name, before, False),
                                                     self.t.history.c.token, self.db.dialect_name)
                    return dialects.changed_rows(conn, sql.delete_ended(self.t, self.ns, name, float(edge), True),
                                                 self.t.history.c.token, self.db.dialect_name)

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
        names = {row[0] for row in self.db.run(lambda c: c.execute(sql.expired_resources(self.t, self.ns)).all())}
        if not names:
            return 0

        def action(conn: Connection, res: dict[str, Any], now: float) -> int:
            # Waiters anywhere in the queues (a pass only looks at the head); holders go in the pass.
            return dialects.changed_rows(conn, sql.delete_expired_waiters(self.t, self.ns, sorted(res), now),
                                         self.t.request.c.id, self.db.dialect_name)

        counted: list[int] = []

        def with_count(conn: Connection, res: dict[str, Any], now: float) -> int:
            n = action(conn, res, now)
            n += self._grant_pass(conn, res, now)
            counted.append(n)
            return n

        return self._in_lock_order(names, with_count)

    def iter_names(self) -> Iterator[str]:  # pragma: no cover - convenience
        for st in self.status():
            yield st.name
