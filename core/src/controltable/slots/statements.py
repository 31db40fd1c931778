"""The slot engine's SQL: pure SQLAlchemy builders over the control tables, nothing run here.

Every statement the slot engine sends is built by :class:`SlotStatements`, bound once to the
declared tables (:class:`~controltable.schema.ControlSchema`) and the namespace, from plain values;
the engine's collaborators (:mod:`controltable.slots.workflow`) decide when to run them, in which
transaction and under which locks. The module-level helpers build the cached statements of the
grant path once per tables. Queue order is ``(queue_key, ticket)`` everywhere (see :func:`.grants.queue_key`), read
through the (namespace, resource, state, queue_key, ticket) index. Per-dialect differences (row
locks, the clock) are asked of :mod:`controltable.dialects`, never decided here.

A *fenced* change is returned as ``(update, confirm)``: the UPDATE and a ``SELECT count(*)`` of
the rows as it leaves them, for :func:`controltable.dialects.confirmed_count` (drivers that
misreport ``rowcount`` are answered by the count).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence, TypedDict, Union

from sqlalchemy import and_, bindparam, case, delete, func, insert, literal_column, or_, select, union_all, update
from sqlalchemy.sql import Delete, Insert, Select, Update
from sqlalchemy.sql.elements import ColumnElement

from .. import dialects
from ..clock import clock
from ..dialect_traits import Traits
from ..schema import ControlSchema

#: A request row's states: in the queue, or holding its slots.
WAITING, GRANTED = "waiting", "granted"
#: The outcomes of a grant in the history: still held, given back, or its lease ran out (the holder
#: died or stopped renewing; a grant made on a waiter's behalf that was never picked up also ends so).
HELD, RELEASED, EXPIRED = "held", "released", "expired"
#: A history row's outcome when a newer attempt of the same holder took the grant over with a new token.
SUPERSEDED = "superseded"

#: A fenced change: the UPDATE and the count that confirms it (see the module's docstring).
Fenced = tuple[Update, Select[Any]]
#: A statement built once with named binds, and the values of this call: ``conn.execute(*bound)``.
#: For the statements of every grant: building a SQLAlchemy construct costs as much as its round
#: trip, and the compiled cache only saves the compile.
Bound = tuple[Any, dict[str, Any]]


def _bind(name: str, placeholder: Any = None, **kw: Any) -> Any:
    """A named bind of a :data:`Bound` statement. Its placeholder is never sent (every execution
    passes the values): it lets ``controltable sql`` print the statement without them."""
    return bindparam(name, placeholder, **kw)


def _typed(name: str, column: Any) -> Any:
    """A named bind with the type of ``column`` (what a plain value compared with or written to the
    column gets: the same casts on PostgreSQL, the same result processing)."""
    return _bind(name, type_=column.type)
#: One request key, or several (a single key compares with ``=``, several with ``IN``).
Keys = Union[str, Sequence[str]]


# -- resources --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _lock_resource(t: ControlSchema, clock_for: Optional[Traits]) -> Select[Any]:
    r = t.resource
    stmt = dialects.lock_rows(
        select(r.c.name, r.c.capacity, r.c.last_token, r.c.last_ticket, r.c.rate_count, r.c.rate_per, r.c.aging,
               dialects.token_epoch().label("epoch"))  # the fencing tokens' epoch, read where they advance
        .where(r.c.namespace == _bind("ct_namespace"), r.c.name == _bind("ct_name")),
        r,
    )
    clocked = None if clock_for is None else dialects.with_lock_clock(stmt, clock_for)
    return stmt if clocked is None else clocked


@functools.lru_cache(maxsize=64)
def _write_counters(t: ControlSchema) -> Update:
    r = t.resource
    return (update(r).where(r.c.namespace == _typed("ct_c_namespace", r.c.namespace),
                            r.c.name == _typed("ct_c_name", r.c.name))
            .values(last_token=_typed("ct_c_last_token", r.c.last_token),
                    last_ticket=_typed("ct_c_last_ticket", r.c.last_ticket)))


# -- requests: reading ------------------------------------------------------------------------------
def request_columns(t: ControlSchema) -> list[Any]:
    """The request columns the grant pass and a waiter's own look read."""
    q = t.request
    return [q.c.id, q.c.resource, q.c.holder, q.c.request_key, q.c.slots, q.c.mode, q.c.state, q.c.token,
            q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt, q.c.pickup_seconds, q.c.lease_seconds,
            q.c.priority, q.c.enqueued_at, q.c.queue_key]


@functools.lru_cache(maxsize=256)
def _snapshot(t: ControlSchema, limits: tuple[int, ...]) -> Any:
    return union_all(*_snapshot_parts(t, limits))


def _snapshot_parts(t: ControlSchema, limits: tuple[int, ...], tag: Optional[str] = None) -> list[Any]:
    """The SELECTs of :func:`snapshot` (holders, then each queue's head); with ``tag``, each starts
    with a ``part`` column holding it (to tell them from other rows of one statement)."""
    q = t.request
    cols = request_columns(t)
    first: list[Any] = [] if tag is None else [literal_column(f"'{tag}'").label("part")]  # a constant of ours
    parts: list[Any] = [
        select(*first, *cols).where(q.c.namespace == _bind("ct_namespace"),
                                    q.c.resource.in_(_bind("ct_names", [""], expanding=True)), q.c.state == GRANTED)
    ]
    for i, limit in enumerate(limits):
        head = (
            select(*cols)
            .where(q.c.namespace == _bind("ct_namespace"), q.c.resource == _bind(f"ct_name_{i}"),
                   q.c.state == WAITING)
            .order_by(q.c.queue_key, q.c.ticket)
            .limit(limit)
            .subquery()
        )
        parts.append(select(*first, *head.c))
    return parts


#: The ``part`` of a row of :func:`enter_and_snapshot` / :func:`remove_and_snapshot`: the snapshot's.
SNAPSHOT_PART = "snap"


@functools.lru_cache(maxsize=256)
def _enter_and_snapshot(t: ControlSchema, limits: tuple[int, ...]) -> Any:
    entered = _insert_waiter(t).returning(*request_columns(t)).cte("entered")
    new = select(literal_column("'new'").label("part"), *entered.c)
    return union_all(new, *_snapshot_parts(t, limits, SNAPSHOT_PART))


@functools.lru_cache(maxsize=256)
def _remove_and_snapshot(t: ControlSchema, limits: tuple[int, ...]) -> Any:
    gone, ended = _removal(t)
    removed = select(literal_column("'gone'").label("part"), *gone.c).add_cte(ended)
    return union_all(removed, *_snapshot_parts(t, limits, SNAPSHOT_PART))


@functools.lru_cache(maxsize=64)
def _holder_rows(t: ControlSchema) -> Select[Any]:
    return select(*request_columns(t)).where(*_own_rows(t))


def _own_rows(t: ControlSchema) -> list[ColumnElement[bool]]:
    """A holder's own rows on some resources, by (namespace, resource, holder), as named binds
    (``ct_namespace``, ``ct_names``, ``ct_holder``: :func:`_own_row_values`)."""
    q = t.request
    return [q.c.namespace == _typed("ct_namespace", q.c.namespace),
            q.c.resource.in_(_bind("ct_names", [""], expanding=True)), q.c.holder == _typed("ct_holder", q.c.holder)]


def _own_row_values(namespace: str, names: Sequence[str], holder: str) -> dict[str, Any]:
    return {"ct_namespace": namespace, "ct_names": list(names), "ct_holder": holder}


def _keyed(t: ControlSchema, keys: Keys) -> ColumnElement[bool]:
    q = t.request
    return q.c.request_key == keys if isinstance(keys, str) else q.c.request_key.in_(keys)


def _this_attempt(t: ControlSchema, attempt: Optional[int] = None) -> ColumnElement[bool]:
    """The fence of a release, a renewal and a look at a lease: only the rows of the lease's own
    attempt (bind ``ct_attempt``; None: a lease taken without one). A newer attempt of the same holder
    takes the grant over in place (same request key, new tokens), so by the request key alone an older
    lease would free, extend or claim the newer one's grant. The attempt changes with the tokens, on
    every row at once: one comparison tells the generations apart (tokens differ per resource).
    ``attempt``: the value of a statement built per call (a :data:`Bound` one passes it at execution)."""
    q = t.request
    return q.c.attempt.is_not_distinct_from(_bind("ct_attempt", attempt, type_=q.c.attempt.type))


@functools.lru_cache(maxsize=64)
def _release_rows(t: ControlSchema) -> Select[Any]:
    q = t.request
    return (select(q.c.id, q.c.resource, q.c.state, q.c.token, q.c.expires_at)
            .where(q.c.request_key == _bind("ct_key"), _this_attempt(t)))


@functools.lru_cache(maxsize=64)
def _delete_release_rows(t: ControlSchema, returning: bool) -> Any:
    q = t.request
    stmt = delete(q).where(q.c.request_key == _bind("ct_key"), _this_attempt(t))
    return stmt.returning(q.c.id, q.c.resource, q.c.state, q.c.token, q.c.expires_at) if returning else stmt


@functools.lru_cache(maxsize=64)
def _peek(t: ControlSchema) -> Select[Any]:
    q, r = t.request, t.resource
    hq, wq = q.alias("hq"), q.alias("wq")
    same_h = and_(hq.c.namespace == q.c.namespace, hq.c.resource == q.c.resource, hq.c.state == GRANTED)
    same_w = and_(wq.c.namespace == q.c.namespace, wq.c.resource == q.c.resource, wq.c.state == WAITING)
    # The first *live* waiter: expired entries before it wait for nobody, and a live waiter behind
    # more of them than one grant pass reaps must still see itself at the head and run the pass.
    head = (select(wq.c.ticket).where(same_w, wq.c.expires_at >= clock()).order_by(wq.c.queue_key, wq.c.ticket)
            .limit(1).scalar_subquery())
    hold_exp = select(func.min(hq.c.expires_at)).where(same_h).scalar_subquery()
    used = select(func.coalesce(func.sum(hq.c.slots), 0)).where(same_h).scalar_subquery()
    excl = select(func.count()).where(same_h, hq.c.mode == "exclusive").scalar_subquery()
    return (
        select(*request_columns(t), clock().label("now"), head.label("head_ticket"),
               hold_exp.label("hold_exp"), used.label("used"), excl.label("excl"), r.c.capacity,
               r.c.rate_count, r.c.rate_per)
        .select_from(q.join(r, and_(r.c.namespace == q.c.namespace, r.c.name == q.c.resource)))
        .where(*_own_rows(t))
    )


# -- requests: changing -----------------------------------------------------------------------------
class NewEntry(TypedDict):
    """A new request's row in one queue: :func:`insert_waiter`'s (and :func:`enter_and_snapshot`'s) keywords,
    typed where the entering code builds them (a misspelt or missing keyword fails mypy, not a run)."""

    resource: str
    holder: str
    key: str
    slots: int
    mode: str
    lease: float
    now: float
    ttl: float
    ticket: int
    attempt: Optional[int]
    pickup: float
    priority: int
    queue_key: float


_WAITER_COLUMNS = ("namespace", "resource", "holder", "request_key", "slots", "mode", "state", "lease_seconds",
                   "enqueued_at", "expires_at", "ticket", "attempt", "pickup_seconds", "priority", "queue_key")


@functools.lru_cache(maxsize=64)
def _insert_waiter(t: ControlSchema) -> Insert:
    q = t.request
    return insert(q).values({name: _typed(f"ct_w_{name}", q.c[name]) for name in _WAITER_COLUMNS})


@functools.lru_cache(maxsize=64)
def _grant_waiter(t: ControlSchema, with_lease: bool) -> Update:
    q = t.request
    values: dict[str, Any] = {"state": _typed("ct_g_state", q.c.state), "token": _typed("ct_g_token", q.c.token),
                              "granted_at": _typed("ct_g_now", q.c.granted_at),
                              "expires_at": _typed("ct_g_expires", q.c.expires_at)}
    if with_lease:
        values["lease_seconds"] = _typed("ct_g_lease", q.c.lease_seconds)
    return update(q).where(q.c.id == _typed("ct_g_id", q.c.id), q.c.state == WAITING).values(**values)


def _fenced_extend(t: ControlSchema, key: str, state: str, now: float, expires_at: float,
                   values: Mapping[str, Any], *fence: ColumnElement[bool]) -> Fenced:
    q = t.request
    return (
        update(q).where(q.c.request_key == key, *fence, q.c.state == state, q.c.expires_at >= now).values(**values),
        select(func.count()).select_from(q).where(
            q.c.request_key == key, *fence, q.c.state == state, q.c.expires_at == expires_at),
    )


def all_at_once(writes: Sequence[Bound]) -> Bound:
    """Independent writes (different rows, none reading what another writes) as one statement of
    data-modifying CTEs, for dialects where
    :func:`controltable.dialects.writes_in_one_statement` holds; each runs exactly as it would alone.

    The writes are :data:`Bound` statements whose binds have distinct names (a grant's ``ct_g_*``,
    its history row's ``ct_h_*``, the counters' ``ct_c_*``); the combination is built once per
    combination of statements."""
    params: dict[str, Any] = {}
    for _, values in writes:
        params.update(values)
    return _all_at_once(tuple(stmt for stmt, _ in writes)), params


@functools.lru_cache(maxsize=64)
def _all_at_once(writes: tuple[Union[Insert, Update, Delete], ...]) -> Select[Any]:
    combined: Select[Any] = select(literal_column("1"))
    for i, write in enumerate(writes):
        combined = combined.add_cte(write.cte(f"w{i}"))  # one per call: SQLAlchemy 1.4 takes one
    return combined


@functools.lru_cache(maxsize=64)
def _remove_request(t: ControlSchema) -> Select[Any]:
    gone, ended = _removal(t, full=False)
    return select(gone.c.id, gone.c.resource, gone.c.state, gone.c.token, gone.c.expires_at).add_cte(ended)


@functools.lru_cache(maxsize=64)
def _removal(t: ControlSchema, full: bool = True) -> tuple[Any, Any]:
    """The CTEs of a removal: ``gone`` (the deleted rows: every request column with ``full``, else
    what the release needs) and ``ended`` (their history rows closed)."""
    q, h = t.request, t.history
    now = _bind("ct_now", type_=h.c.ended_at.type)
    returned = request_columns(t) if full else [q.c.id, q.c.resource, q.c.state, q.c.token, q.c.expires_at]
    gone = delete(q).where(q.c.request_key == _bind("ct_key"), _this_attempt(t)).returning(*returned).cte("gone")
    ended = (
        update(h)
        .where(h.c.namespace == _bind("ct_namespace"), h.c.resource == gone.c.resource,
               h.c.token == gone.c.token, gone.c.state == GRANTED, h.c.outcome == HELD)
        .values(outcome=case((gone.c.expires_at >= now, RELEASED), else_=EXPIRED), ended_at=now)
        .cte("ended")
    )
    return gone, ended


_HISTORY_COLUMNS = ("namespace", "resource", "token", "holder", "mode", "slots", "priority", "enqueued_at",
                    "granted_at", "ended_at", "outcome")


@functools.lru_cache(maxsize=64)
def _record_grant(t: ControlSchema) -> Insert:
    h = t.history
    return insert(h).values({name: _typed(f"ct_h_{name}", h.c[name]) for name in _HISTORY_COLUMNS})


class SlotStatements:
    """Every statement of the slot engine, bound once to the control tables and the namespace (one
    per engine, shared by its collaborators: callers pass only the values of a call).

    Every builder returns a :data:`Bound` ``(statement, values)`` for ``conn.execute(*bound)``; the
    grant path's statements are built once (the cached helpers above), the rest per call. A fenced
    change returns :data:`Fenced` instead; a match (``holder_match`` ...) a condition."""

    def __init__(self, tables: ControlSchema, namespace: str) -> None:
        self.t = tables
        self.ns = namespace

    def _resource_row(self, name: str) -> list[ColumnElement[bool]]:
        r = self.t.resource
        return [r.c.namespace == self.ns, r.c.name == name]

    def lock_resource(self, name: str, clock_for: Optional[Traits] = None) -> Bound:
        """Lock one resource row and read its counters and policy; with ``clock_for`` (the dialect's
        traits, for a transaction's last lock) also the database time as ``now`` once the lock is held,
        where the dialect can (:func:`controltable.dialects.with_lock_clock`; why after the lock: see
        ``GrantPasses._lock``). On the path of every grant: built once per (tables, dialect), see :data:`Bound`."""
        return _lock_resource(self.t, clock_for), {"ct_namespace": self.ns, "ct_name": name}

    def lock_resource_name(self, name: str) -> Bound:
        """Lock one resource row, reading only its name (does it exist?)."""
        r = self.t.resource
        return dialects.lock_rows(select(r.c.name).where(*self._resource_row(name)), r), {}

    def resource_name(self, name: str) -> Bound:
        """The resource's name if it exists (no lock)."""
        return select(self.t.resource.c.name).where(*self._resource_row(name)), {}

    def resource_names(self) -> Bound:
        """Every resource name of the namespace."""
        namespace, r = self.ns, self.t.resource
        return select(r.c.name).where(r.c.namespace == namespace), {}

    def create_resource(self, name: str, capacity: int) -> Bound:
        return insert(self.t.resource).values(
            namespace=self.ns, name=name, capacity=capacity, last_token=0, last_ticket=0, created_at=clock(),
        ), {}

    def change_resource(self, name: str, values: Mapping[str, Any]) -> Bound:
        """Set a resource's capacity and policy columns (``values``: column name -> value)."""
        return update(self.t.resource).where(*self._resource_row(name)).values(**values), {}

    def write_counters(self, name: str, last_token: int, last_ticket: int) -> Bound:
        """Write back the fencing-token and ticket counters a locked transaction advanced. On the path of
        every grant: built once per tables; binds named ``ct_c_*`` (see :meth:`grant_waiter`)."""
        return _write_counters(self.t), {"ct_c_namespace": self.ns, "ct_c_name": name, "ct_c_last_token": last_token,
                                    "ct_c_last_ticket": last_ticket}

    def write_last_token(self, name: str, last_token: int) -> Bound:
        return self.change_resource(name, {"last_token": last_token})

    def delete_resource(self, name: str) -> Bound:
        return delete(self.t.resource).where(*self._resource_row(name)), {}

    def resources(self, names: Optional[Sequence[str]]) -> Bound:
        """The resource rows of the namespace (all, or ``names``), by name."""
        namespace, r = self.ns, self.t.resource
        query = select(r).where(r.c.namespace == namespace).order_by(r.c.name)
        return query.where(r.c.name.in_(names)) if names else query, {}

    def capacities(self, names: Optional[Sequence[str]]) -> Bound:
        """(name, capacity) of the namespace's resources (all, or ``names``), by name."""
        namespace, r = self.ns, self.t.resource
        query = select(r.c.name, r.c.capacity).where(r.c.namespace == namespace).order_by(r.c.name)
        return query.where(r.c.name.in_(names)) if names else query, {}

    def rate_period(self, name: str) -> Bound:
        """The rate limit's period of a resource (NULL without a rate limit): pruning keeps that much."""
        return select(self.t.resource.c.rate_per).where(*self._resource_row(name)), {}

    def capacity_of(self, name: str) -> Bound:
        return select(self.t.resource.c.capacity).where(*self._resource_row(name)), {}

    def snapshot(self, heads: Mapping[str, int]) -> Bound:
        """The holders of the resources in ``heads`` and the first ``heads[name]`` waiters of each
        queue in queue order, in one statement: the work does not depend on how many wait behind.

        On the path of every grant: built once per (tables, head sizes) with named binds for the
        namespace and names and returned with their values (see :data:`Bound`)."""
        names = sorted(heads)
        params: dict[str, Any] = {"ct_namespace": self.ns, "ct_names": names}
        params.update({f"ct_name_{i}": name for i, name in enumerate(names)})
        return _snapshot(self.t, tuple(heads[name] for name in names)), params

    def enter_and_snapshot(self, heads: Mapping[str, int], **waiter: Any) -> Bound:
        """:func:`insert_waiter` and :func:`snapshot` in one statement (dialects where
        :func:`controltable.dialects.writes_in_one_statement` holds): the new row, returned by the
        INSERT with ``part`` = ``'new'``, and the snapshot's rows with ``part`` = :data:`SNAPSHOT_PART`.

        The snapshot does not see the new row (every part of a statement reads one snapshot); the
        caller merges it in (:func:`controltable.slots.grants.merge_entered`). Built once per (tables,
        head sizes); ``waiter`` are :func:`insert_waiter`'s keyword arguments."""
        return self._with_snapshot(heads, self.insert_waiter(**waiter)[1], _enter_and_snapshot)

    def remove_and_snapshot(self, key: str, attempt: Optional[int], now: float,
                            heads: Mapping[str, int]) -> Bound:
        """:func:`remove_request` and :func:`snapshot` in one statement (dialects where
        :func:`controltable.dialects.writes_in_one_statement` holds): the removed rows with ``part`` =
        ``'gone'``, then the snapshot's rows with ``part`` = :data:`SNAPSHOT_PART`.

        The snapshot is read as the statement starts, so it still shows the removed rows; the caller
        drops them (:func:`controltable.slots.grants.after_removal`). Built once per (tables, head sizes)."""
        return self._with_snapshot(heads, self.remove_request(key, attempt, now)[1], _remove_and_snapshot)

    def _with_snapshot(self, heads: Mapping[str, int], change: dict[str, Any], build: Any) -> Bound:
        """A change's values joined by the snapshot's (same names where they mean the same), and the
        statement ``build`` makes for these head sizes."""
        params = {**change, **self.snapshot(heads)[1]}
        return build(self.t, tuple(heads[name] for name in sorted(heads))), params

    def holder_rows(self, names: Sequence[str], holder: str) -> Bound:
        """A holder's own rows on ``names`` (its request, held or waiting), by (namespace, resource, holder).
        On the path of every acquire: built once per tables (see :data:`Bound`)."""
        return _holder_rows(self.t), _own_row_values(self.ns, names, holder)

    def withdraw_rows(self, names: Sequence[str], holder: str) -> Bound:
        """What a waiter that gives up must know of its rows: granted meanwhile, or still waiting."""
        namespace, q = self.ns, self.t.request
        return (select(q.c.resource, q.c.state, q.c.token, q.c.expires_at, q.c.granted_at, q.c.ticket, q.c.attempt,
                       q.c.request_key)
                .where(q.c.namespace == namespace, q.c.resource.in_(names), q.c.holder == holder), {})

    def request_rows(self, keys: Keys) -> Bound:
        """The rows of the request ``keys`` (one key or several) as their removal needs them (to close
        their history)."""
        q = self.t.request
        return select(q.c.id, q.c.resource, q.c.state, q.c.token, q.c.expires_at).where(_keyed(self.t, keys)), {}

    def release_rows(self, key: str, attempt: Optional[int]) -> Bound:
        """The rows a release of (request ``key``, ``attempt``) removes, as :func:`request_rows` reads
        them (fenced: :func:`_this_attempt`)."""
        return _release_rows(self.t), {"ct_key": key, "ct_attempt": attempt}

    def delete_release_rows(self, key: str, attempt: Optional[int]) -> Bound:
        """Remove the rows of :func:`release_rows`."""
        return _delete_release_rows(self.t, False), {"ct_key": key, "ct_attempt": attempt}

    def delete_request_rows(self, key: str, attempt: Optional[int]) -> Bound:  # a Delete with RETURNING
        """Remove the rows of :func:`release_rows` and return them (for dialects where
        :func:`controltable.dialects.deletes_returning` holds: the read and the delete in one)."""
        return _delete_release_rows(self.t, True), {"ct_key": key, "ct_attempt": attempt}

    def request_spans(self, keys: Sequence[str]) -> Bound:
        """(request key, resource) of every row of the requests ``keys``: which resources each spans."""
        q = self.t.request
        return select(q.c.request_key, q.c.resource).where(q.c.request_key.in_(keys)), {}

    def head_ticket(self, name: str) -> Bound:
        """The ticket of the first live waiter of ``name``'s queue (an index walk past the expired
        entries before it, which the next grant pass reaps: they wait for nobody)."""
        namespace, q = self.ns, self.t.request
        return (select(q.c.ticket).where(q.c.namespace == namespace, q.c.resource == name, q.c.state == WAITING,
                                         q.c.expires_at >= clock())
                .order_by(q.c.queue_key, q.c.ticket).limit(1), {})

    def peek(self, names: Sequence[str], holder: str) -> Bound:
        """A waiter's look at its own rows, no locks: with each queue's live head ticket, the holders' usage,
        exclusive holders and first lease expiry, the resource's capacity and rate, and the database time.

        On the path of every look of every waiter (a handoff's pickup starts with it): built once per
        tables (see :data:`Bound`); building it cost 0.5 ms, three times its execution."""
        return _peek(self.t), _own_row_values(self.ns, names, holder)

    def held_count(self, key: str, attempt: Optional[int]) -> Bound:
        """How many of a request's rows of ``attempt`` are granted with a live lease (the database
        clock judges; fenced: :func:`_this_attempt`, a newer attempt's rows are not the older lease's)."""
        q = self.t.request
        return select(func.count()).select_from(q).where(and_(q.c.request_key == key, _this_attempt(self.t, attempt),
                                                              q.c.state == GRANTED, q.c.expires_at >= clock())), {}

    def own_entry(self, resource: str, holder: str) -> Bound:
        namespace, q = self.ns, self.t.request
        return select(q).where(q.c.namespace == namespace, q.c.resource == resource, q.c.holder == holder), {}

    def ahead_of(self, resource: str, mine: Any) -> Bound:
        """The holders and the waiters before the request row ``mine``: holders first, then queue order."""
        namespace, q = self.ns, self.t.request
        before = (q.c.queue_key < mine.queue_key) | ((q.c.queue_key == mine.queue_key) & (q.c.ticket < mine.ticket))
        return (select(q.c.holder, q.c.state, q.c.expires_at)
                .where(q.c.namespace == namespace, q.c.resource == resource, (q.c.state == GRANTED) | before)
                .order_by(q.c.state, q.c.queue_key, q.c.ticket), {})  # "granted" sorts before "waiting"

    def granted_key(self, resource: str, holder: str) -> Bound:
        """The request key of what ``holder`` holds on ``resource``."""
        namespace, q = self.ns, self.t.request
        return select(q.c.request_key).where(
            q.c.namespace == namespace, q.c.resource == resource, q.c.holder == holder, q.c.state == GRANTED), {}

    def request_by_key(self, key: str) -> Bound:
        """Every row of one request, by resource name."""
        q = self.t.request
        return select(q).where(q.c.request_key == key).order_by(q.c.resource), {}

    def requests(self, names: Optional[Sequence[str]]) -> Bound:
        """Every request row of the namespace (all resources, or ``names``), by resource and ticket."""
        namespace, q = self.ns, self.t.request
        query = select(q).where(q.c.namespace == namespace).order_by(q.c.resource, q.c.ticket)
        return query.where(q.c.resource.in_(names)) if names else query, {}

    def live_request(self, name: str) -> Bound:
        """Any request of ``name`` whose lease or waiter entry is still live."""
        namespace, q = self.ns, self.t.request
        return (select(q.c.id).where(q.c.namespace == namespace, q.c.resource == name, q.c.expires_at >= clock())
                .limit(1), {})

    def expired_resources(self) -> Bound:
        """The resources that have a holder or waiter whose lease or entry ran out."""
        namespace, q = self.ns, self.t.request
        return select(q.c.resource).where(q.c.namespace == namespace, q.c.expires_at < clock()).distinct(), {}

    def resources_matching(self, match: ColumnElement[bool]) -> Bound:
        return select(self.t.request.c.resource).where(match).distinct(), {}

    def keys_matching(self, match: ColumnElement[bool], names: Sequence[str]) -> Bound:
        q = self.t.request
        return select(q.c.request_key).where(match, q.c.resource.in_(names)), {}

    def holder_match(self, resource: str, holder: str) -> ColumnElement[bool]:
        """The rows of one holder on one resource."""
        namespace, q = self.ns, self.t.request
        return and_(q.c.namespace == namespace, q.c.resource == resource, q.c.holder == holder)

    def request_match(self, names: Sequence[str], holder: str, key: str) -> ColumnElement[bool]:
        """The rows of one request of one holder (a waiter that gave up withdraws exactly these)."""
        namespace, q = self.ns, self.t.request
        return and_(q.c.namespace == namespace, q.c.resource.in_(names), q.c.holder == holder, q.c.request_key == key)

    def prefix_match(self, prefix: str) -> ColumnElement[bool]:
        """The rows of every holder whose id starts with ``prefix``, matched literally (``%``, ``_``
        and SQL Server's ``[`` escaped: :class:`controltable.dialects.starts_with`)."""
        namespace, q = self.ns, self.t.request
        return and_(q.c.namespace == namespace, dialects.starts_with(q.c.holder, prefix))

    def insert_waiter(self, *, resource: str, holder: str, key: str, slots: int,
                      mode: str, lease: float, now: float, ttl: float, ticket: int, attempt: Optional[int],
                      pickup: float, priority: int, queue_key: float) -> Bound:
        """A new request's row in one resource's queue, with its ticket and queue order. On the path of
        every acquire: built once per tables (see :data:`Bound`); binds named ``ct_w_*`` (never a control
        table's name: ``controltable sql --prefix`` renames only those)."""
        values = dict(namespace=self.ns, resource=resource, holder=holder, request_key=key, slots=slots,
                      mode=mode, state=WAITING, lease_seconds=lease, enqueued_at=now, expires_at=now + ttl,
                      ticket=ticket, attempt=attempt, pickup_seconds=pickup, priority=priority, queue_key=queue_key)
        return _insert_waiter(self.t), {f"ct_w_{name}": value for name, value in values.items()}

    def grant_waiter(self, row_id: int, token: int, now: float, expires_at: float,
                     lease_seconds: Optional[float] = None) -> Bound:
        """Grant a waiting row: the next fencing token, and a pickup deadline (or, for the caller's own
        request, its lease). On the path of every grant: built once per tables (see :data:`Bound`); its
        binds are named ``ct_g_*`` so that :func:`all_at_once` can join it to the grant's history row."""
        params: dict[str, Any] = {"ct_g_id": row_id, "ct_g_state": GRANTED, "ct_g_token": token, "ct_g_now": now,
                                  "ct_g_expires": expires_at}
        if lease_seconds is not None:
            params["ct_g_lease"] = lease_seconds
        return _grant_waiter(self.t, lease_seconds is not None), params

    def extend_grant_row(self, row_id: int, token: int, expires_at: float, lease: float,
                         attempt: Optional[int]) -> Bound:
        """An idempotent re-acquire (or a newer attempt, with a new token) extends one granted row."""
        q = self.t.request
        return update(q).where(q.c.id == row_id).values(token=token, expires_at=expires_at, lease_seconds=lease,
                                                        attempt=attempt), {}

    def extend_request(self, key: str, expires_at: float, lease: float) -> Bound:
        """Take up a request's grant with the caller's lease (a waiter that gave up, granted meanwhile)."""
        q = self.t.request
        return update(q).where(q.c.request_key == key).values(expires_at=expires_at, lease_seconds=lease), {}

    def requeue_waiter(self, key: str, expires_at: float, attempt: Optional[int], pickup: float) -> Bound:
        """A waiter that enters again keeps its place: a new entry expiry, attempt and pickup deadline."""
        q = self.t.request
        return (update(q).where(q.c.request_key == key, q.c.state == WAITING)
                .values(expires_at=expires_at, attempt=attempt, pickup_seconds=pickup), {})

    def shorten_pickups(self, name: str, pickup: float, keep: Optional[str]) -> Bound:
        """Every waiting entry of ``name`` but ``keep`` (the caller's) gets at most ``pickup`` seconds to
        pick up a grant made on its behalf: the first grant pass after a promotion (dead entries inherited
        from the old primary then delay the queue by ``pickup`` each, not by the pickup they asked for)."""
        namespace, q = self.ns, self.t.request
        where = [q.c.namespace == namespace, q.c.resource == name, q.c.state == WAITING,
                 or_(q.c.pickup_seconds.is_(None), q.c.pickup_seconds > pickup)]
        if keep is not None:
            where.append(q.c.request_key != keep)
        return update(q).where(*where).values(pickup_seconds=pickup), {}

    def reorder_queue(self, name: str, aging: Optional[float]) -> Bound:
        """Rewrite the queue order of ``name``'s waiters for a new aging rate (see :func:`.grants.queue_key`)."""
        namespace, q = self.ns, self.t.request
        # Multiplied by a float, never negated or multiplied as an INT: -(-2**31) and -2**31 * 30 overflow
        # INT on PostgreSQL and SQL Server (queue_key itself is a double, like grants.queue_key).
        key = q.c.priority * -1.0 if aging is None else q.c.enqueued_at - q.c.priority * float(aging)
        return (update(q).where(q.c.namespace == namespace, q.c.resource == name, q.c.state == WAITING)
                .values(queue_key=key), {})

    def extend_lease(self, key: str, attempt: Optional[int], now: float, lease: float) -> Fenced:
        """A granted request's rows of ``attempt`` get ``lease`` seconds from ``now``, unless they
        already ran out (the database clock judges): a holder renewing, or a waiter taking up a grant
        made on its behalf. Fenced (:func:`_this_attempt`): an older attempt's renewal must not extend
        the grant a newer attempt took over, nor report it as its own."""
        return _fenced_extend(self.t, key, GRANTED, now, now + lease,
                              {"expires_at": now + lease, "lease_seconds": lease}, _this_attempt(self.t, attempt))

    def refresh_waiter(self, key: str, now: float, ttl: float, pickup: float) -> Fenced:
        """A waiter shows it is alive: its entry's expiry moves on, unless it already ran out, and its
        pickup deadline is its own again (a grant pass after a promotion shortens it, see
        :func:`shorten_pickups`)."""
        return _fenced_extend(self.t, key, WAITING, now, now + ttl, {"expires_at": now + ttl, "pickup_seconds": pickup})

    def remove_request(self, key: str, attempt: Optional[int], now: float) -> Bound:
        """Delete a request's rows and close the history rows of its grants in one statement (for
        dialects where :func:`controltable.dialects.writes_in_one_statement` holds), returning the
        deleted rows as :func:`request_rows` reads them.

        Same outcome as :func:`request_rows`, :func:`delete_requests` and one :func:`end_grant` per
        granted row: released while the lease was live at ``now``, expired otherwise. Only the rows of
        ``attempt`` go (:func:`_this_attempt`). Built once per tables (see :data:`Bound`)."""
        return _remove_request(self.t), {"ct_namespace": self.ns, "ct_key": key, "ct_attempt": attempt, "ct_now": now}

    def delete_expired_row(self, row_id: int, now: float) -> Bound:
        """Reap one row whose lease ran out; the re-check makes this the only judge of expiry (a renewal
        or pickup committed meanwhile keeps the row)."""
        q = self.t.request
        return delete(q).where(q.c.id == row_id, q.c.expires_at < now), {}

    def delete_expired_request(self, key: str, now: float) -> Bound:
        """Remove a request's rows that ran out (re-checked: a pickup may have won)."""
        q = self.t.request
        return delete(q).where(q.c.request_key == key, q.c.expires_at < now), {}

    def delete_requests(self, keys: Keys) -> Bound:
        """Remove whole requests (every resource's row): one key or several."""
        return delete(self.t.request).where(_keyed(self.t, keys)), {}

    def delete_expired_waiters(self, names: Sequence[str], now: float) -> Bound:
        """Waiters anywhere in the queues of ``names`` whose entries ran out."""
        namespace, q = self.ns, self.t.request
        return delete(q).where(q.c.namespace == namespace, q.c.resource.in_(names), q.c.state == WAITING,
                               q.c.expires_at < now), {}

    def delete_resource_requests(self, name: str) -> Bound:
        namespace, q = self.ns, self.t.request
        return delete(q).where(q.c.namespace == namespace, q.c.resource == name), {}

    # -- grant history ----------------------------------------------------------------------------------
    def record_grant(self, resource: str, token: int, row: Any, priority: int,
                     now: float, enqueued_at: Optional[float] = None) -> Bound:
        """The history row of a grant just made (``row``: the request row granted), in the grant's own
        transaction: the rate window, counted from these rows, can never miss a grant. ``enqueued_at``:
        when the request for this token was made, if not the row's (a newer attempt taking a grant over).
        On the path of every grant: built once per tables (see :data:`Bound`); binds named ``ct_h_*``."""
        values = dict(namespace=self.ns, resource=resource, token=token, holder=row.holder, mode=row.mode,
                      slots=int(row.slots), priority=priority,
                      enqueued_at=float(row.enqueued_at) if enqueued_at is None else enqueued_at, granted_at=now,
                      ended_at=None, outcome=HELD)
        return _record_grant(self.t), {f"ct_h_{name}": value for name, value in values.items()}

    def end_grant(self, resource: str, token: int, outcome: str, now: float) -> Bound:
        """Close a grant's history row (only once: a row already closed keeps its outcome)."""
        namespace, h = self.ns, self.t.history
        return (update(h).where(h.c.namespace == namespace, h.c.resource == resource, h.c.token == token,
                                h.c.outcome == HELD).values(outcome=outcome, ended_at=now), {})

    def retoken_grant(self, resource: str, old: int, now: float) -> Bound:
        """A newer attempt took the grant over with a new fencing token: the old token's row ends here
        (``superseded``), and :func:`record_grant` adds the new token's row, so every token keeps its row."""
        return self.end_grant(resource, old, SUPERSEDED, now)

    def grant_outcomes(self, tokens: Mapping[str, int]) -> Bound:
        """How the grants ``tokens`` (resource -> token) ended: released, expired or superseded (what a
        release that finds its rows gone tells its caller). By the primary key's columns as two IN
        lists (one statement shape for any number of resources); the caller keeps the rows whose
        (resource, token) is one of ``tokens``."""
        namespace, h = self.ns, self.t.history
        return select(h.c.resource, h.c.token, h.c.outcome).where(
            h.c.namespace == namespace, h.c.resource.in_(sorted(tokens)),
            h.c.token.in_(sorted(set(tokens.values())))), {}

    def window_count(self, resource: str, since: float) -> Bound:
        """Grants of ``resource`` made after ``since`` (the rate window), through the time index."""
        namespace, h = self.ns, self.t.history
        return select(func.count()).select_from(h).where(
            h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at > since), {}

    def window_times(self, resource: str, since: float) -> Bound:
        """The grant times of ``resource`` after ``since``, oldest first (to find the next opening)."""
        namespace, h = self.ns, self.t.history
        return (select(h.c.granted_at).where(h.c.namespace == namespace, h.c.resource == resource,
                                             h.c.granted_at > since).order_by(h.c.granted_at), {})

    def last_left(self, resource: str, before: float) -> Bound:
        """The newest grant time at or before ``before`` (the grant that last left the window)."""
        namespace, h = self.ns, self.t.history
        return select(func.max(h.c.granted_at)).where(
            h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at <= before), {}

    def records(self, resource: Optional[str], since: float, limit: int) -> Bound:
        """The newest ``limit`` grants made since ``since`` (of one resource, or all)."""
        namespace, h = self.ns, self.t.history
        query = select(h).where(h.c.namespace == namespace, h.c.granted_at >= since)
        if resource is not None:
            query = query.where(h.c.resource == resource)
        return query.order_by(h.c.granted_at.desc(), h.c.token.desc()).limit(limit), {}

    def overlapping(self, resource: str, start: float, end: float) -> Bound:
        """Grants of ``resource`` that overlap ``[start, end)`` (made before its end, not ended before its start)."""
        namespace, h = self.ns, self.t.history
        return select(h.c.slots, h.c.enqueued_at, h.c.granted_at, h.c.ended_at, h.c.outcome).where(
            h.c.namespace == namespace, h.c.resource == resource, h.c.granted_at < end,
            or_(h.c.ended_at.is_(None), h.c.ended_at > start),
        ), {}

    def prune_edge(self, resource: str, before: float, batch: int) -> Bound:
        """The grant time of the ``batch``-th oldest ended grant made before ``before`` (None: fewer)."""
        namespace, h = self.ns, self.t.history
        return (select(h.c.granted_at).where(h.c.namespace == namespace, h.c.resource == resource,
                                             h.c.granted_at < before, h.c.outcome != HELD)
                .order_by(h.c.granted_at).offset(batch - 1).limit(1), {})

    def delete_ended(self, resource: str, upto: float, inclusive: bool) -> Bound:
        """Delete the ended grants of ``resource`` made before (or at) ``upto``: a range of the time
        index, so the plan does not depend on the table's statistics (a list of keys may be scanned)."""
        namespace, h = self.ns, self.t.history
        edge = h.c.granted_at <= upto if inclusive else h.c.granted_at < upto
        return delete(h).where(h.c.namespace == namespace, h.c.resource == resource, edge, h.c.outcome != HELD), {}

    def delete_history(self, resource: str) -> Bound:
        """A deleted resource's history goes with it (a new resource of that name restarts its tokens)."""
        namespace, h = self.ns, self.t.history
        return delete(h).where(h.c.namespace == namespace, h.c.resource == resource), {}
