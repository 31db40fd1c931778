"""The work list's SQL: :class:`WorkListStatements`, every statement of one list, bound once; nothing run here.

The workflow (:mod:`controltable.worklist.workflow`) decides transactions and retries; every
statement it sends is built by a method of the :class:`WorkListStatements` it made once from the
declared ``item`` and ``worklist`` tables, the namespace and the list's name (as pgqueuer's query
builder is bound once to its settings). Each method returns one statement, run with
``conn.execute(stmt)``; the method's name is the statement's name in the golden SQL files
(``core/sql/<dialect>.sql``, ``-- name: next_item``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sqlalchemy import Table, and_, case, delete, func, insert, select, union_all, update
from sqlalchemy.sql.elements import ColumnElement

from .. import dialects
from ..clock import clock
from ..sqlnotes import sql_notes

NEW, ACTIVE, DONE, ERROR = "new", "active", "done", "error"
UNFINISHED = (NEW, ACTIVE, ERROR)
#: Items per INSERT when populating.
INSERT_CHUNK = 500
_CONFIRMS = "confirms {}: a trigger or server-wide NOCOUNT changes the row count the driver reports"
_COUNTED = "OUTPUT {}.id: the rows are counted as returned, never by the reported row count"


def allocation_order(row: Any) -> tuple[int, int]:
    """The order items are allocated in within an order: higher priority first, then by id."""
    return -int(row.priority), int(row.id)


def finish_values(state: str, error: Optional[str]) -> dict[str, Any]:
    """What finishing an item writes: done, error (with the message) or back to new (freed)."""
    values: dict[str, Any] = {"state": state, "expires_at": None}
    if state == DONE:
        values.update(finished_at=clock(), last_error=None)
    elif state == ERROR:
        values.update(finished_at=clock(), last_error=error)
    else:
        values.update(owner=None, token=None, started_at=None)
    return values


class WorkListStatements:
    """Every statement of one work list: the ``item`` and ``worklist`` tables, the namespace and the
    list's name are bound here once, so a call passes only what varies (an item, a token, a time)."""

    def __init__(self, items: Table, lists: Table, namespace: str, name: str) -> None:
        self.items = items
        self.lists = lists
        self.namespace = namespace
        self.name = name

    def _mine(self) -> ColumnElement[bool]:
        """The items of this work list."""
        return and_(self.items.c.namespace == self.namespace, self.items.c.worklist == self.name)

    def _list_row(self) -> list[ColumnElement[bool]]:
        return [self.lists.c.namespace == self.namespace, self.lists.c.name == self.name]

    @sql_notes(
        mssql="table hints WITH (UPDLOCK, ROWLOCK): SQLAlchemy's SQL Server dialect drops FOR UPDATE",
        sqlite="no FOR UPDATE: the transaction's BEGIN IMMEDIATE already holds the database's write lock",
        postgresql="the epoch is the server's timeline (from the WAL file name): tokens jump above the old "
                   "primary's after a failover",
    )
    def lock_list(self) -> Any:
        """Lock the work list's row: the allocation lock."""
        # The fencing tokens' epoch is read where they advance (see ``dialects.token_epoch``).
        return dialects.lock_rows(select(self.lists.c.last_token, dialects.token_epoch().label("epoch"))
                                  .where(*self._list_row()), self.lists)

    def create_list(self) -> Any:
        return insert(self.lists).values(namespace=self.namespace, name=self.name, last_token=0, created_at=clock())

    def insert_items(self) -> Any:
        """The INSERT :meth:`item_rows` are sent with (one executemany per chunk)."""
        return insert(self.items)

    def item_rows(self, payloads: Sequence[str], order: int, priority: int, now: float) -> list[dict[str, Any]]:
        return [dict(namespace=self.namespace, worklist=self.name, exec_order=order, priority=priority, payload=p,
                     state=NEW, attempts=0, created_at=now) for p in payloads]

    def current_order(self) -> Any:
        """The lowest order with unfinished items, and the database clock, read in one statement.

        A completion's ``finished_at`` is stamped before its COMMIT, and a statement sees only
        COMMITs from before it started, so ``started_at`` is never before the ``finished_at`` of any
        item of a lower order (reading the clock first left a window where it was).
        """
        t = self.items
        return (select(func.min(t.c.exec_order).label("current"), clock().label("now"))
                .where(self._mine(), t.c.state.in_(UNFINISHED)))

    def next_item(self, order: int, now: float, skip: Sequence[int] = ()) -> Any:
        """The next item of ``order`` to hand out: new, or active under an expired lease.

        Read without a row lock (the list lock serialises allocations, not finishes): what it read
        is re-checked by :meth:`allocate_item`. ``skip``: items this allocation found changed
        under it (a finish or renewal that committed while it waited on the row).

        At most two rows, the first new item and the first expired one in allocation order, one
        branch per state: each is the start of a range of the (namespace, worklist, state,
        exec_order, priority DESC, id) index, read in index order (one ``OR`` over both states would
        sort every new item of the order). The caller takes the first by :func:`allocation_order`.
        """
        t = self.items
        parts = []
        for state in (NEW, ACTIVE):
            part = (select(t.c.id, t.c.payload, t.c.exec_order, t.c.priority, t.c.attempts, t.c.state, t.c.token)
                    .where(self._mine(), t.c.state == state, t.c.exec_order == order)
                    .order_by(t.c.priority.desc(), t.c.id)
                    .limit(1))
            if state == ACTIVE:
                part = part.where(t.c.expires_at < now)
            if skip:
                part = part.where(t.c.id.notin_(list(skip)))
            parts.append(select(*part.subquery().c))
        return union_all(*parts)

    def set_last_token(self, token: int) -> Any:
        return update(self.lists).where(*self._list_row()).values(last_token=token)

    def allocate_item(self, item_id: int, owner: str, token: int, now: float, lease: float, read_state: str,
                      read_token: Optional[int]) -> Any:
        """Stamp an item as allocated, only if it is still as :meth:`next_item` read it.

        The read took no row lock, so the old holder of an expired item may have finished, freed
        or renewed it since (its COMMIT landing while this UPDATE waited on the row): the UPDATE
        re-checks the state, the token and the expiry it saw, and changes nothing if any moved on.
        Both backends with row locks re-evaluate the WHERE on the row as committed, so the old
        holder's finish and this allocation never both succeed.
        """
        t = self.items
        if read_state == NEW:
            still = t.c.state == NEW
        else:
            still = and_(t.c.state == ACTIVE, t.c.token == read_token, t.c.expires_at < now)
        return update(t).where(t.c.id == item_id, still).values(
            state=ACTIVE, owner=owner, token=token, attempts=t.c.attempts + 1, started_at=now,
            finished_at=None, expires_at=now + lease)

    @sql_notes(mssql=_CONFIRMS.format("the allocation"))
    def count_allocated(self, item_id: int, token: int, now: float) -> Any:
        """Rows an allocation stamped (this token, this instant): what confirms it where rowcount is not trusted."""
        t = self.items
        return select(func.count()).select_from(t).where(
            t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE, t.c.started_at == now)

    def find_allocation(self, item_id: int, token: int, owner: str, started_at: float) -> Any:
        """The item an earlier attempt of an allocation stamped (id, token, owner, start instant)."""
        t = self.items
        return select(t).where(self._mine(), t.c.id == item_id, t.c.token == token, t.c.owner == owner,
                               t.c.started_at == started_at, t.c.state == ACTIVE)

    def finish(self, item_id: int, token: int, values: dict[str, Any]) -> Any:
        """The fenced finish: only while the item is active under ``token``."""
        t = self.items
        return update(t).where(t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE).values(values)

    @sql_notes(mssql=_CONFIRMS.format("the finish"))
    def count_finished(self, item_id: int, token: int, state: str) -> Any:
        """Rows carrying ``state`` after a finish (a released row carries no token): what confirms it."""
        t = self.items
        after = (and_(t.c.id == item_id, t.c.token.is_(None), t.c.state == NEW) if state == NEW
                 else and_(t.c.id == item_id, t.c.token == token, t.c.state == state))
        return select(func.count()).select_from(t).where(after)

    def count_in_state(self, item_id: int, token: int, state: str) -> Any:
        """Whether the item is in ``state`` under ``token`` already (a retry whose first COMMIT went through)."""
        t = self.items
        return select(func.count()).select_from(t).where(t.c.id == item_id, t.c.token == token, t.c.state == state)

    def renew(self, item_id: int, token: int, expires_at: float) -> Any:
        t = self.items
        return update(t).where(t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE).values(
            expires_at=expires_at)

    @sql_notes(mssql=_CONFIRMS.format("the renewal"))
    def count_renewed(self, item_id: int, token: int, expires_at: float) -> Any:
        t = self.items
        return select(func.count()).select_from(t).where(
            t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE, t.c.expires_at == expires_at)

    def counts(self, now: float) -> Any:
        """Items per order and state, with how many active ones have an expired lease."""
        t = self.items
        expired = func.sum(case((and_(t.c.state == ACTIVE, t.c.expires_at < now), 1), else_=0))
        return (select(t.c.exec_order, t.c.state, func.count(), expired)
                .where(self._mine()).group_by(t.c.exec_order, t.c.state).order_by(t.c.exec_order))

    def listing(self, state: Optional[str], limit: int) -> Any:
        t = self.items
        stmt = select(t).where(self._mine()).order_by(t.c.exec_order, t.c.priority.desc(), t.c.id).limit(limit)
        if state is not None:
            stmt = stmt.where(t.c.state == state)
        return stmt

    def by_id(self, item_id: int) -> Any:
        return select(self.items).where(self._mine(), self.items.c.id == item_id)

    @sql_notes(mssql=_COUNTED.format("inserted"))
    def reset(self) -> Any:
        return update(self.items).where(self._mine()).values(
            state=NEW, owner=None, token=None, attempts=0, last_error=None, started_at=None, finished_at=None,
            expires_at=None)

    @sql_notes(mssql=_COUNTED.format("inserted"))
    def clear_errors(self, item_id: Optional[int] = None) -> Any:
        t = self.items
        only = [t.c.id == item_id] if item_id is not None else []
        return update(t).where(self._mine(), *only, t.c.state == ERROR).values(
            state=NEW, owner=None, token=None, last_error=None, finished_at=None)

    @sql_notes(mssql=_COUNTED.format("deleted"))
    def drop_items(self) -> Any:
        return delete(self.items).where(self._mine())

    def drop_list(self) -> Any:
        return delete(self.lists).where(*self._list_row())
