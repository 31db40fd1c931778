"""The slot engine's transactions: resource locks in name order, the grant pass that ends every change, removal.

:class:`GrantPasses` is the collaborator every other part of the slot engine works through (the
entering of a queue in :mod:`.entering`, the leases in :mod:`.holding`, capacity and reaping in
:mod:`.workflow`): it runs a change and a grant pass in one transaction under the resource row
locks (:meth:`GrantPasses.with_pass`) and removes whole requests (:meth:`GrantPasses.remove`). It
calls nothing of those parts. Who is granted is decided by :mod:`.grants`; this module sends the
statements of :mod:`.statements` that read the queues and write the grants. The records the parts
hand each other (:class:`Outcome`, :class:`Request`, :class:`LockedResource`, ...) are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Optional, Sequence, TypeVar, Union

from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from .. import dialects
from ..clock import read_now
from ..db import Database
from ..defaults import DEFAULT_PICKUP, FAILOVER_PICKUP
from ..dialect_traits import Traits
from ..errors import AcquireTimeout, ConfigurationError, UnknownResourceError
from ..runtime import Runtime
from . import grants
from . import statements as sql
from .keys import head_key, holder_key, slot_key
from .statements import EXPIRED, GRANTED, RELEASED, SlotStatements

#: The shortest pickup deadline of a grant made on a waiter's behalf (its entry's own expiry
#: shortens the deadline down to this).
MIN_PICKUP = 1.0
#: A grant pass reads at most this many waiters (plus one) per queue and round.
HEAD_READ_LIMIT = 100
#: The rounds of one grant pass at most (each grants someone or reaps a page of expired entries):
#: with ``HEAD_READ_LIMIT``, what bounds the work of one transaction.
MAX_ROUNDS = 100

T = TypeVar("T")


@dataclass
class Outcome:
    """Where a request stands after a transaction: granted (with its tokens), or waiting (at a position)."""

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

    @classmethod
    def grant(cls, *, key: str, tokens: Mapping[str, int], parts: Mapping[str, int], expires_at: float,
              granted_at: float, ticket: int, attempt: Optional[int]) -> Outcome:
        """A granted request: its tokens (one per resource of ``parts``) and its lease's expiry."""
        return cls(True, key, {n: tokens[n] for n in parts}, expires_at, granted_at, {}, ticket, attempt)

    @classmethod
    def wait(cls, *, key: str, expires_at: float, position: dict[str, int], ticket: int, attempt: Optional[int],
             capacity: int = 1, rate_limited: bool = False) -> Outcome:
        """A waiting request: its position in each queue and its entry's expiry."""
        return cls(False, key, {}, expires_at, None, position, ticket, attempt, capacity, rate_limited)


@dataclass
class LockedResource:
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
class Entered:
    """What entering a queue did under the locks: the request's key, attempt and first ticket, and,
    when it found its own grant (an idempotent re-acquire), the outcome already."""

    key: str
    attempt: Optional[int]
    ticket: int
    done: Optional[Outcome] = None


@dataclass
class Presnapped(Generic[T]):
    """What a change made under the locks returns when it also read the snapshot its grant pass
    starts from (one statement for both: :func:`.statements.enter_and_snapshot`,
    :func:`.statements.remove_and_snapshot`). The one way a first snapshot reaches a grant pass."""

    value: T
    snapshot: Optional[list[Any]]

    @staticmethod
    def split(result: Union[Presnapped[T], T]) -> tuple[T, Optional[list[Any]]]:
        """``(value, snapshot)`` of an action's result; a plain result has no snapshot."""
        if isinstance(result, Presnapped):
            return result.value, result.snapshot
        return result, None


@dataclass(frozen=True)
class Request:
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


class _AsLocked:
    """A snapshot row whose ``resource`` is spelled as the locked resource the database matched it to."""

    __slots__ = ("_row", "resource")

    def __init__(self, row: Any, resource: str) -> None:
        self._row = row
        self.resource = resource

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


def as_locked(rows: Sequence[Any], names: Mapping[str, Any]) -> list[Any]:
    """``rows`` with each resource spelled as the locked name (a key of ``names``) it was read by.

    The database selected the rows by its own comparison, and MySQL/MariaDB (PAD SPACE collations)
    and SQL Server ignore trailing blanks: an entry stored as ``'wh '`` (before such names were
    refused) is read by a pass over ``'wh'``. Looked up by its stored spelling it would fail with a
    bare ``KeyError``; it is counted under the resource the database says it belongs to, and a row
    that matches no locked name even so is reported as a ``ConfigurationError`` naming it.
    """
    out: list[Any] = []
    for row in rows:
        if row.resource in names:
            out.append(row)
            continue
        same = locked_name(row.resource, names)
        if same not in names:
            raise ConfigurationError(
                f"the database returned an entry of resource {row.resource!r} (holder {row.holder!r}) for the "
                f"resources {sorted(names)!r}: it compares names differently from Python; release that entry "
                f"with release_holder({str(row.resource).strip()!r}, {str(row.holder).strip()!r}) or delete its row"
            )
        out.append(_AsLocked(row, same))
    return out


def locked_name(name: str, names: Mapping[str, Any]) -> str:
    """The one name of ``names`` that ``name`` equals when trailing blanks are ignored (as MySQL's
    PAD SPACE collations and SQL Server compare), else ``name`` itself (see :func:`as_locked`)."""
    if name in names:
        return name
    same = [n for n in names if n.rstrip(" ") == str(name).rstrip(" ")]
    return same[0] if len(same) == 1 else name


class NeedLocks(Exception):
    """A grant pass met a multi-resource request whose other resources it has not locked."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


def send_grant_writes(conn: Connection, writes: Sequence[tuple[Any, Any]], counters: Sequence[Any],
                      traits: Traits) -> None:
    """Send a grant pass's writes: each grant's :func:`.statements.grant_waiter` and
    :func:`.statements.record_grant`, then the resources' :func:`.statements.write_counters`.

    Where the dialect allows (:func:`controltable.dialects.writes_in_one_statement`), each grant goes
    with its history row as one statement (:func:`.statements.all_at_once`), the last one with the
    counters when one resource's changed: a fixed set of statement shapes (2 or 3 writes), whatever
    the number of grants. Elsewhere one statement per write, in order."""
    if not dialects.writes_in_one_statement(conn, traits):
        for grant, record in writes:
            conn.execute(*grant)
            conn.execute(*record)
        for write in counters:
            conn.execute(*write)
        return
    rest = list(counters)
    for i, (grant, record) in enumerate(writes):
        if i == len(writes) - 1 and len(rest) == 1:
            conn.execute(*sql.all_at_once([grant, record, rest.pop()]))
        else:
            conn.execute(*sql.all_at_once([grant, record]))
    for write in rest:
        conn.execute(*write)


#: The resources a transaction holds locked, by name (kept up to date by that transaction).
Locked = dict[str, LockedResource]
#: A change made under the locks: ``(conn, locked resources, database time)`` -> its result.
Change = Callable[[Connection, Locked, float], T]
#: Inside a transaction: wake the waiters of these keys when it commits (``Runtime.notify``).
Notify = Callable[[Connection, list[str]], None]


class GrantPasses:
    """Transactions under resource locks in name order, the grant pass, removal of requests: the
    SQL behind slots, for one namespace of one installation. Every change of a queue ends with
    :meth:`grant_pass` under the locks (the grant model: see :mod:`controltable.slots`)."""

    def __init__(self, db: Database, statements: SlotStatements, notify: Notify) -> None:
        self.db = db
        #: The engine's statements (shared with the collaborators built over these passes).
        self.sql = statements
        self.t = statements.t
        self.ns = statements.ns
        self.notify = notify

    @classmethod
    def of(cls, runtime: Runtime) -> GrantPasses:
        """The grant passes of ``runtime``'s namespace, notifying through its wake-ups."""
        return cls(runtime.db, SlotStatements(runtime.tables, runtime.namespace), runtime.notify)

    # -- running a change followed by a grant pass ---------------------------------------------
    def with_pass(self, names: set[str], action: Change[Union[T, Presnapped[T]]],
                  deadline: Optional[float] = None) -> T:
        """Run ``action`` and a grant pass in one transaction, holding the locks of ``names``.

        If a chain of multi-resource requests keeps the locks moving (see :meth:`in_lock_order`),
        the change is committed without passing the capacity on here: the waiters at the head run
        a pass themselves when they next look.
        """

        def with_pass(conn: Connection, res: Locked, now: float) -> T:
            value, snapshot = Presnapped.split(action(conn, res, now))
            self.grant_pass(conn, res, now, snapshot=snapshot)
            return value

        def without_pass(conn: Connection, res: Locked, now: float) -> T:
            value, _ = Presnapped.split(action(conn, res, now))
            return value

        return self.in_lock_order(names, with_pass, fallback=without_pass, deadline=deadline)

    def in_lock_order(self, names: set[str], fn: Change[T], *, deadline: Optional[float] = None,
                      fallback: Optional[Change[T]] = None) -> T:
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
            except NeedLocks as need:
                lockset |= need.names
        if fallback is None:  # pragma: no cover - needs a chain of 8 multi-resource requests moving at once
            raise AcquireTimeout(f"could not lock the resources of {sorted(names)} in order; retry")
        return self.db.run(lambda c: fallback(c, *self._lock(c, lockset)))

    def _lock(self, conn: Connection, names: set[str]) -> tuple[Locked, float]:
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
        rows = self.lock_rows(conn, names, {}, clocked)
        if not rows:
            return rows, 0.0
        return rows, (clocked[0] if clocked else read_now(conn))

    def lock_rows(self, conn: Connection, names: set[str], rows: Locked,
                  clocked: Optional[list[float]] = None) -> Locked:
        """Lock, in name order, the rows of ``names`` not in ``rows`` yet, adding them to ``rows``.

        With ``clocked``, the last lock statement also reads the database time after its lock is
        held where the dialect allows (appended to ``clocked``; one round trip fewer)."""
        todo = [name for name in sorted(names) if name not in rows]
        for name in todo:
            last = clocked is not None and name == todo[-1]
            row = conn.execute(*self.sql.lock_resource(name, self.db.traits if last else None)).first()
            if last and row is not None and clocked is not None and "now" in row._mapping:
                clocked.append(float(row.now))
            if row is None:
                raise UnknownResourceError(
                    f"resource {name!r} does not exist in namespace {self.ns!r}; create it with "
                    f"set_capacity({name!r}, n) or `controltable capacity set {name} N`"
                )
            rows[name] = LockedResource(name, int(row.capacity), int(row.last_token), int(row.last_ticket),
                              rate_count=None if row.rate_count is None else int(row.rate_count),
                              rate_per=None if row.rate_per is None else float(row.rate_per),
                              aging=None if row.aging is None else float(row.aging),
                              epoch=int(row.epoch))
        return rows

    def snapshot(self, conn: Connection, res: Locked) -> list[Any]:
        """The holders of the locked resources and the head of each waiting queue, in one statement.

        Reads at most ``capacity + 2`` waiters per queue (no more can be granted by one pass, and
        the new head and the one behind it are told to look). Expired entries among them are
        reaped and the next page read (:func:`.grants.read_again`), so expired entries before the
        first live ones never stop a pass short of them.
        """
        return list(conn.execute(*self.sql.snapshot(self.heads(res))).all())

    def heads(self, res: Locked) -> dict[str, int]:
        """How many waiters a snapshot reads per queue (see :meth:`snapshot`)."""
        return {name: self._head_size(res[name]) for name in res}

    def snapshot_in_change(self, conn: Connection, res: Locked) -> bool:
        """Whether the statement that changes a queue may also read the snapshot the grant pass
        starts from (one round trip fewer): where several writes go as one statement
        (:func:`controltable.dialects.writes_in_one_statement`), and not on the first pass after a
        promotion (:meth:`_after_promotion` changes the queue before the pass reads it)."""
        return dialects.writes_in_one_statement(conn, self.db.traits) and not any(
            not r.rejoined and dialects.epoch_begins(r.last_token, r.epoch) for r in res.values())

    def _budget(self, conn: Connection, res: LockedResource, now: float) -> Optional[int]:
        """Grants the resource's rate window still allows at ``now`` (None: no rate limit)."""
        if res.rate_count is None or res.rate_per is None:
            return None
        used = int(conn.scalar(*self.sql.window_count(res.name, now - res.rate_per)) or 0)
        return max(res.rate_count - used, 0)

    def end_grants(self, conn: Connection, rows: list[Any], now: float, outcome: Optional[str] = None) -> None:
        """Close the history rows of the granted ``rows`` being removed: released while their lease
        was live, expired otherwise (or ``outcome``)."""
        for row in rows:
            if row.state != GRANTED or row.token is None:
                continue
            how = outcome or (RELEASED if float(row.expires_at) >= now else EXPIRED)
            conn.execute(*self.sql.end_grant(row.resource, int(row.token), how, now))

    @staticmethod
    def _head_size(res: LockedResource) -> int:
        # A capacity's worth can be granted by one pass; then the new head and the one behind it
        # (told to look: it times the grants' pickup deadlines in case the head is dead).
        return min(res.capacity, HEAD_READ_LIMIT) + 2

    def _reap_rows(self, conn: Connection, rows: list[Any], now: float) -> tuple[list[Any], int]:
        """The snapshot's rows without duplicates and without the expired ones this removes (the
        DELETE re-checks expiry: a renewal or pickup committed meanwhile keeps the row), and how
        many it removed."""
        live: list[Any] = []
        reaped = 0
        seen: set[int] = set()
        for row in rows:
            if row.id in seen:
                continue
            seen.add(row.id)
            if float(row.expires_at) < now:
                stmt, values = self.sql.delete_expired_row(row.id, now)
                gone = dialects.changed_rows(conn, stmt, self.t.request.c.id, self.db.traits, values)
                if gone:
                    reaped += 1
                    self.end_grants(conn, [row], now, EXPIRED)
                    continue
            live.append(row)
        return live, reaped

    def grant_pass(
        self, conn: Connection, res: Locked, now: float, own: Optional[tuple[str, float]] = None,
        granted: Optional[dict[str, dict[str, int]]] = None, snapshot: Optional[list[Any]] = None,
    ) -> int:
        """Reap expired holders and grant every waiter that may now run, in FIFO order.

        Returns how many expired entries it removed. Grants are made on the waiters' behalf:
        state granted, a token from the resource's fencing counter, and ``pickup_seconds`` to
        pick the grant up before it lapses (see :meth:`.entering.Entering.look`). ``own`` is the (request key,
        lease) of the caller's own request, granted with its lease at once and not notified;
        ``granted`` collects the tokens of every grant made. The resource rows' counters are
        written once, at the end. ``snapshot``: the first round's rows, read already by the statement
        that changed the queue (see :meth:`snapshot_in_change`).
        """
        reaped = 0
        for _ in range(MAX_ROUNDS):  # each round grants or reaps, or is the last
            self._after_promotion(conn, res, own[0] if own is not None else None)
            rows = as_locked(self.snapshot(conn, res) if snapshot is None else snapshot, res)
            snapshot = None
            queues = {name: grants.Queue(name, res[name].capacity, aging=res[name].aging,
                                         budget=self._budget(conn, res[name], now)) for name in res}
            live, gone = self._reap_rows(conn, rows, now)
            reaped += gone
            multi = grants.waiting_multi(live)
            spans: dict[str, set[str]] = {}
            if multi:
                for key, resource in conn.execute(*self.sql.request_spans(multi)):
                    spans.setdefault(key, set()).add(locked_name(resource, res))
            heads = grants.assemble(queues, live, spans, self.heads(res), read=grants.waiting_read(rows))
            rows_by_key = heads.rows_by_key
            decision = grants.decide(queues)
            if decision.need:
                if min(decision.need) > max(res):
                    self.lock_rows(conn, decision.need, res)  # still in name order; the pass keeps its time
                    continue
                raise NeedLocks(decision.need)
            notify: list[str] = []
            others = False
            # The grants, their history rows and the counters: independent writes (different rows),
            # sent as few statements as the dialect allows (send_grant_writes).
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
                        grant = self.sql.grant_waiter(row.id, token, now, now + own[1], own[1])
                    else:
                        pickup = float(row.pickup_seconds) if row.pickup_seconds is not None else DEFAULT_PICKUP
                        # Never longer than the waiter promised to stay alive: a live waiter looks at
                        # its entry before that, a dead one (that stopped refreshing) lapses sooner.
                        expires = now + min(pickup, max(float(row.expires_at) - now, MIN_PICKUP))
                        grant = self.sql.grant_waiter(row.id, token, now, expires)
                    # In the grant's transaction: the rate window counts these rows.
                    writes.append((grant, self.sql.record_grant(row.resource, token, row, int(row.priority), now)))
                if not mine:
                    others = True
                    first = min(row.resource for row in rows_by_key[key])
                    notify.append(holder_key(first, next(x.holder for x in rows_by_key[key] if x.resource == first)))
            for name in sorted(res):
                if res[name].dirty:
                    counters.append(self.sql.write_counters(name, res[name].last_token, res[name].last_ticket))
                    res[name].dirty = False
            send_grant_writes(conn, writes, counters, self.db.traits)
            for name, key in decision.heads.items():
                rate_spent = queues[name].budget == 0
                # A new head times the holders' leases; a head stopped by a spent rate budget times
                # the window's next opening (which nobody pushes): either way, tell it to look.
                if (key != heads.first_before.get(name) or rate_spent) and key in rows_by_key:
                    notify.append(head_key(min(spans.get(key, {name})), rows_by_key[key][0].holder))
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
                self.notify(conn, notify)
            # Expired entries before the first live ones are reaped a page (the head size) per
            # round until the pass reaches a live waiter: a round that only reaped reads on.
            if not grants.read_again(decision, granted=len(decision.grant), reaped=gone):
                return reaped
        # MAX_ROUNDS rounds of grants or pages of expired entries: the work of one transaction is
        # bounded. The first live waiter behind what is left sees itself at the head (the queue
        # head a waiter reads skips expired entries: statements.peek) and runs the next pass.
        return reaped

    def _after_promotion(self, conn: Connection, res: Locked, own_key: Optional[str]) -> None:
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
                conn.execute(*self.sql.shorten_pickups(name, FAILOVER_PICKUP, own_key))
                r.rejoined = True

    def remove(self, match: ColumnElement[bool], check: Optional[Callable[[Connection], None]] = None,
               deadline: Optional[float] = None) -> int:
        """Remove the requests with rows matching ``match`` (whole requests), then pass capacity on.

        The resources involved are read first without locks, then locked in name order; rows of
        requests that appeared meanwhile on other resources are left for the next call.
        """
        names = {row[0] for row in self.db.run(lambda c: c.execute(*self.sql.resources_matching(match)).all(),
                                               deadline=deadline)}
        if not names:
            if check is not None:
                self.db.run(check, deadline=deadline)
            return 0

        def action(conn: Connection, res: Locked, now: float) -> int:
            if check is not None:
                check(conn)
            keys = sorted({row[0] for row in conn.execute(*self.sql.keys_matching(match, sorted(res)))})
            if not keys:
                return 0
            spans = conn.execute(*self.sql.request_spans(keys)).all()
            extra = {row.resource for row in spans} - set(res)
            if extra:
                raise NeedLocks(extra)
            gone = conn.execute(*self.sql.request_rows(keys)).all()
            conn.execute(*self.sql.delete_requests(keys))
            self.end_grants(conn, list(gone), now)
            return len(keys)

        return self.with_pass(names, action, deadline=deadline)
