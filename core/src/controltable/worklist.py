"""Ordered work lists: every item of one order is done before the next order starts.

Allocation locks the work list's row, so two workers can never both decide "order 300 is
finished" from a stale view: a 300 and a 400 task starting together, the race of an unlocked
check, cannot happen. Completion needs no lock: it can only make the lowest unfinished order
move forward, and an allocation that ran just before it merely saw the older, stricter state.

Every operation is safe to run twice across a lost COMMIT reply: a retried allocation finds the
item its first attempt stamped, and a retried complete/fail recognises "already done by this
token" (fencing tokens are never reissued), so a dropped connection costs neither an orphaned
item nor a false LeaseLost.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, TypeVar

from sqlalchemy import and_, case, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from . import dialects
from .defaults import DEFAULT_ITEM_LEASE  # noqa: F401 - re-exported
from .errors import ConfigurationError, ControlTableError, LeaseLost
from .renewal import BackgroundRenewal
from .slots import default_holder, utc
from .validation import check_name, check_order, check_poll_interval, check_priority, check_seconds

if TYPE_CHECKING:  # pragma: no cover
    from .control import ControlTable

T = TypeVar("T")

NEW, ACTIVE, DONE, ERROR = "new", "active", "done", "error"
UNFINISHED = (NEW, ACTIVE, ERROR)
_INSERT_CHUNK = 500


class WorkListBlocked(ControlTableError):
    """The lowest unfinished order has only errored items: clear or retry them to go on."""


@dataclass
class Item(BackgroundRenewal):
    """An allocated work item. Finish it with complete, fail or free."""

    worklist: WorkList
    id: int
    payload: Any
    order: int
    priority: int
    owner: str
    token: int
    attempts: int
    _expires_at: float
    lease_seconds: float = DEFAULT_ITEM_LEASE

    @property
    def expires_at(self) -> datetime:
        value = utc(self._expires_at)
        assert value is not None
        return value

    def handle(self) -> dict[str, Any]:
        """A JSON-serialisable reference to this item (for XCom or metadata)."""
        return {"worklist": self.worklist.name, "id": self.id, "token": self.token, "owner": self.owner,
                "order": self.order, "payload": self.payload}

    def complete(self) -> None:
        """Mark done. Raises :class:`LeaseLost` if the lease expired and the item was re-allocated.

        Safe to retry: an item already done under this item's token counts as completed.
        """
        self.stop_renewing()
        self.worklist._finish(self, DONE, None)

    def fail(self, reason: str) -> None:
        """Mark as error; it blocks later orders until cleared (``clear_error``) or reset."""
        self.stop_renewing()
        self.worklist._finish(self, ERROR, str(reason))

    def free(self) -> None:
        """Give the item back untouched, for another worker."""
        self.stop_renewing()
        self.worklist._finish(self, NEW, None)

    def _renew_interval(self) -> float:
        return self.lease_seconds / 3.0

    def renew(self, lease: Optional[float] = None) -> Item:
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        self._expires_at = self.worklist._renew(self, seconds)
        return self


@dataclass
class OrderStatus:
    order: int
    new: int = 0
    active: int = 0
    done: int = 0
    error: int = 0
    expired: int = 0


@dataclass
class WorkListStatus:
    """Counts per order and state, and what the list is waiting for."""

    name: str
    orders: list[OrderStatus] = field(default_factory=list)
    current_order: Optional[int] = None
    blocked_by_errors: bool = False

    @property
    def finished(self) -> bool:
        return self.current_order is None

    def total(self, state: str) -> int:
        return sum(getattr(o, state) for o in self.orders)


class WorkList:
    """An ordered list of tasks with JSON payloads, kept in the namespace's control tables."""

    def __init__(self, ct: ControlTable, name: str, *, lease: float = DEFAULT_ITEM_LEASE) -> None:
        self.ct = ct
        self.name = name
        self.lease = check_seconds("lease", lease) or DEFAULT_ITEM_LEASE
        self.t = ct.tables.item
        self.w = ct.tables.worklist
        self.ns = ct.namespace

    def __repr__(self) -> str:
        return f"WorkList({self.name!r}, namespace={self.ns!r})"

    @property
    def wakeup_key(self) -> str:
        """Wake-up key for allocators waiting on this list (finished items, new items)."""
        return f"worklist:{self.name}"

    def _mine(self) -> Any:
        return and_(self.t.c.namespace == self.ns, self.t.c.worklist == self.name)

    def _ensure(self, conn: Connection) -> Any:
        """Lock (creating if needed) the work list's row: the allocation lock."""
        w = self.w
        stmt = dialects.lock_rows(
            select(w.c.last_token).where(
                w.c.namespace == self.ns, w.c.name == self.name
            ),
            w,
        )
        row = conn.execute(stmt).first()
        if row is None:
            # Two first uses of a new list may both find no row; the loser's INSERT fails on the
            # primary key and :meth:`_run` runs its transaction again, which then finds the row.
            conn.execute(
                insert(w).values(namespace=self.ns, name=self.name, last_token=0, created_at=dialects.db_now())
            )
            row = conn.execute(stmt).first()
        return row

    def _run(self, fn: Callable[[Connection], T], *, idempotent: bool = True) -> T:
        """Run a transaction that begins with :meth:`_ensure`, once more if it lost the race to create the row.

        The first attempt rolled back entirely (the failed INSERT aborts it), so the second run
        starts clean and finds the winner's row.
        """
        try:
            return self.ct.db.run(fn, idempotent=idempotent)
        except ControlTableError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            return self.ct.db.run(fn, idempotent=idempotent)

    # -- filling ----------------------------------------------------------------------------------
    def populate(
        self,
        payloads: Iterable[Any],
        order: int = 100,
        *,
        priority: int = 0,
        progress: Optional[Callable[[int], None]] = None,
    ) -> int:
        """Add one item per payload at execution ``order`` (a work list's populate step).

        Payloads are checked for JSON first, so a bad one adds nothing. Returns the count added.
        """
        order, priority = check_order(order), check_priority(priority)
        encoded = []
        for i, payload in enumerate(payloads):
            try:
                encoded.append(json.dumps(payload, sort_keys=True, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(
                    f"payload #{i} is not JSON-serialisable ({exc}): {payload!r}; nothing was added"
                ) from exc

        def fn(conn: Connection) -> int:
            self._ensure(conn)
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            for start in range(0, len(encoded), _INSERT_CHUNK):
                chunk = encoded[start:start + _INSERT_CHUNK]
                conn.execute(insert(self.t), [
                    dict(namespace=self.ns, worklist=self.name, exec_order=order, priority=priority, payload=p,
                         state=NEW, attempts=0, created_at=now) for p in chunk])
                if progress is not None:
                    progress(len(chunk))
            self.ct._notify(conn, [self.wakeup_key])
            return len(encoded)

        return self._run(fn, idempotent=False)

    # -- working ----------------------------------------------------------------------------------
    def allocate(self, owner: Optional[str] = None, lease: Optional[float] = None) -> Optional[Item]:
        """Hand out one item of the lowest order that still has unfinished items, or ``None``.

        ``None`` means: everything is done, or the current order's remaining items are all being
        worked on (or errored). :meth:`status` tells which. When the reply to the allocation's
        COMMIT is lost, the retry returns the item that COMMIT allocated, not a second one.
        """
        owner = check_name("owner", owner) if owner is not None else default_holder()
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease
        assert lease_s is not None
        t = self.t
        # What the last attempt wrote, known to this client before its COMMIT was sent: if the
        # reply to that COMMIT is lost, the retry looks for exactly this allocation (the item
        # id, its fencing token and the database-clock instant it was stamped with) and returns
        # it, instead of allocating a second item and orphaning the first for its lease.
        attempted: list[tuple[int, int, float]] = []

        def fn(conn: Connection) -> Optional[Item]:
            lock = self._ensure(conn)
            if attempted:
                found = self._find_allocation(conn, owner, *attempted[-1])
                if found is not None:
                    return found
            # The clock is read in the same statement that sees which orders are finished: a
            # completion's finished_at is stamped before its COMMIT, and a statement sees only
            # COMMITs from before it started, so started_at is never before the finished_at of
            # any item of a lower order (reading the clock first left a window where it was).
            head = conn.execute(
                select(func.min(t.c.exec_order).label("current"), dialects.db_now().label("now"))
                .where(self._mine(), t.c.state.in_(UNFINISHED))
            ).one()
            now, current = float(head.now), head.current
            if current is None:
                return None
            row = conn.execute(
                select(t.c.id, t.c.payload, t.c.exec_order, t.c.priority, t.c.attempts)
                .where(self._mine(), t.c.exec_order == current,
                       or_(t.c.state == NEW, and_(t.c.state == ACTIVE, t.c.expires_at < now)))
                .order_by(t.c.priority.desc(), t.c.id)
                .limit(1)
            ).first()
            if row is None:
                return None
            token = int(lock.last_token) + 1
            conn.execute(update(self.w).where(self.w.c.namespace == self.ns, self.w.c.name == self.name)
                         .values(last_token=token))
            conn.execute(update(t).where(t.c.id == row.id).values(
                state=ACTIVE, owner=owner, token=token, attempts=t.c.attempts + 1, started_at=now,
                finished_at=None, expires_at=now + lease_s))
            attempted.append((int(row.id), token, now))
            return Item(self, int(row.id), json.loads(row.payload), int(row.exec_order), int(row.priority), owner,
                        token, int(row.attempts) + 1, now + lease_s, lease_s)

        return self._run(fn)

    def _find_allocation(self, conn: Connection, owner: str, item_id: int, token: int,
                         started_at: float) -> Optional[Item]:
        """The item an earlier attempt of this allocation committed, if it did (else ``None``).

        A fencing token is handed out once per work list only when its transaction commits, so
        a row still active under this token, owner and start instant can only be that attempt's.
        """
        t = self.t
        row = conn.execute(select(t).where(
            self._mine(), t.c.id == item_id, t.c.token == token, t.c.owner == owner,
            t.c.started_at == started_at, t.c.state == ACTIVE)).first()
        if row is None:
            return None
        return self._item(row)

    def _item(self, row: Any) -> Item:
        lease_s = float(row.expires_at - row.started_at) if row.expires_at and row.started_at else self.lease
        return Item(self, int(row.id), json.loads(row.payload), int(row.exec_order), int(row.priority),
                    str(row.owner), int(row.token), int(row.attempts), float(row.expires_at or 0), lease_s)

    def items(
        self, owner: Optional[str] = None, *, lease: Optional[float] = None, poll: float = 0.5,
        timeout: Optional[float] = None,
    ) -> Iterator[Item]:
        """Allocate items until the list is finished, waiting while the current order is busy.

        Raises :class:`WorkListBlocked` when only errored items stand in the way.
        """
        wait = check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        poll = check_poll_interval("poll", poll)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            since = self.ct._wakeups.mark([self.wakeup_key])
            item = self.allocate(owner, lease)
            if item is not None:
                yield item
                continue
            st = self.status()
            if st.finished:
                return
            if st.blocked_by_errors:
                raise WorkListBlocked(
                    f"work list {self.name!r} is blocked at order {st.current_order} by errored items; "
                    "fix them and run clear_errors() (or `controltable worklist clear-errors`)"
                )
            if deadline is not None and time.monotonic() >= deadline:
                return
            self.ct._wait_for_wakeup([self.wakeup_key], poll, since)

    def _finish(self, item: Item, state: str, error: Optional[str]) -> None:
        t = self.t
        values: dict[str, Any] = {"state": state, "expires_at": None}
        if state == DONE:
            values.update(finished_at=dialects.db_now(), last_error=None)
        elif state == ERROR:
            values.update(finished_at=dialects.db_now(), last_error=error)
        else:
            values.update(owner=None, token=None, started_at=None)

        def fn(conn: Connection) -> int:
            # After the update the row carries ``state`` under this token (a freed row carries
            # no token): that is what confirms the update where rowcount cannot be trusted.
            after = (and_(t.c.id == item.id, t.c.token.is_(None), t.c.state == NEW) if state == NEW
                     else and_(t.c.id == item.id, t.c.token == item.token, t.c.state == state))
            count = dialects.confirmed_count(
                conn,
                update(t).where(t.c.id == item.id, t.c.token == item.token, t.c.state == ACTIVE).values(values),
                select(func.count()).select_from(t).where(after),
                self.ct.db.dialect_name,
            )
            if count == 0 and state != NEW:
                # Already done by this token: the first attempt's COMMIT went through and only
                # its reply was lost (or the caller finished the item twice). The token is never
                # handed out again, so the row can only be in this state by our own hand.
                count = int(conn.scalar(select(func.count()).select_from(t).where(
                    t.c.id == item.id, t.c.token == item.token, t.c.state == state)) or 0)
                return count
            self.ct._notify(conn, [self.wakeup_key])
            return count

        # Every finish is idempotent across a lost COMMIT reply (see above), so it is retried.
        if self.ct.db.run(fn) != 1:
            if state == NEW:
                return
            raise LeaseLost(
                f"work item {item.id} of {self.name!r} is no longer held under token {item.token} "
                "(its lease expired and it was re-allocated or reset); its work may have run twice"
            )

    def _renew(self, item: Item, seconds: float) -> float:
        t = self.t

        def fn(conn: Connection) -> float:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            n = dialects.confirmed_count(
                conn,
                update(t).where(t.c.id == item.id, t.c.token == item.token, t.c.state == ACTIVE)
                .values(expires_at=now + seconds),
                select(func.count()).select_from(t).where(
                    t.c.id == item.id, t.c.token == item.token, t.c.state == ACTIVE, t.c.expires_at == now + seconds),
                self.ct.db.dialect_name,
            )
            if n != 1:
                raise LeaseLost(f"work item {item.id} of {self.name!r} is no longer held under token {item.token}")
            return now + seconds

        return self.ct.db.run(fn)

    # -- administration ----------------------------------------------------------------------------------
    def status(self) -> WorkListStatus:
        t = self.t

        def fn(conn: Connection) -> tuple[float, list[Any]]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            expired = func.sum(
                case((and_(t.c.state == ACTIVE, t.c.expires_at < now), 1), else_=0))
            return now, list(conn.execute(
                select(t.c.exec_order, t.c.state, func.count(), expired)
                .where(self._mine()).group_by(t.c.exec_order, t.c.state).order_by(t.c.exec_order)).all())

        _, rows = self.ct.db.run(fn)
        st = WorkListStatus(self.name)
        by_order: dict[int, OrderStatus] = {}
        for order, state, count, expired in rows:
            o = by_order.setdefault(int(order), OrderStatus(int(order)))
            setattr(o, state, int(count))
            o.expired += int(expired or 0)
        st.orders = [by_order[k] for k in sorted(by_order)]
        for o in st.orders:
            if o.new or o.active or o.error:
                st.current_order = o.order
                st.blocked_by_errors = o.error > 0 and o.new == 0 and (o.active - o.expired) <= 0
                break
        return st

    def items_list(self, state: Optional[str] = None, limit: int = 100) -> list[dict[str, Any]]:
        """Items as dictionaries (for listings), optionally of one state."""
        t = self.t
        stmt = select(t).where(self._mine()).order_by(t.c.exec_order, t.c.priority.desc(), t.c.id).limit(limit)
        if state is not None:
            stmt = stmt.where(t.c.state == state)
        rows = self.ct.db.run(lambda c: list(c.execute(stmt).all()))
        return [dict(r._mapping, payload=json.loads(r.payload)) for r in rows]

    def get(self, item_id: int, token: Optional[int] = None) -> Item:
        """Rebuild an allocated :class:`Item` by id (e.g. to complete it from another process)."""
        t = self.t
        row = self.ct.db.run(lambda c: c.execute(select(t).where(self._mine(), t.c.id == item_id)).first())
        if row is None:
            raise ConfigurationError(f"work list {self.name!r} has no item {item_id}")
        if row.state != ACTIVE:
            raise LeaseLost(f"work item {item_id} of {self.name!r} is {row.state}, not allocated")
        if token is not None and int(row.token) != int(token):
            raise LeaseLost(f"work item {item_id} of {self.name!r} was re-allocated (token {row.token}, not {token})")
        return self._item(row)

    def reset_all(self) -> int:
        """Every item back to new (a rerun of the whole list)."""
        t = self.t
        return self._update(update(t).where(self._mine()).values(
            state=NEW, owner=None, token=None, attempts=0, last_error=None, started_at=None, finished_at=None,
            expires_at=None))

    def clear_error(self, item_id: int) -> int:
        """One errored item back to new (it unblocks later orders once none is left in error)."""
        t = self.t
        return self._update(update(t).where(self._mine(), t.c.id == item_id, t.c.state == ERROR).values(
            state=NEW, owner=None, token=None, last_error=None, finished_at=None))

    def clear_errors(self) -> int:
        """Every errored item back to new (later orders run again)."""
        t = self.t
        return self._update(update(t).where(self._mine(), t.c.state == ERROR).values(
            state=NEW, owner=None, token=None, last_error=None, finished_at=None))

    def drop(self) -> int:
        """Delete the work list and its items; returns items deleted."""
        t, w = self.t, self.w

        def fn(conn: Connection) -> int:
            n = int(conn.execute(delete(t).where(self._mine())).rowcount)
            conn.execute(delete(w).where(w.c.namespace == self.ns, w.c.name == self.name))
            return n

        return self.ct.db.run(fn)

    def _update(self, stmt: Any) -> int:
        def fn(conn: Connection) -> int:
            count = int(conn.execute(stmt).rowcount)
            self.ct._notify(conn, [self.wakeup_key])
            return count

        return self.ct.db.run(fn)
