"""The work list's SQL: pure SQLAlchemy builders over the control tables, nothing run here.

The workflow (:mod:`controltable.worklist.workflow`) decides transactions and retries; every
statement it sends is built here from the declared ``item`` and ``worklist`` tables, the
namespace and the list's name.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from sqlalchemy import Table, and_, case, delete, func, insert, select, union_all, update
from sqlalchemy.sql.elements import ColumnElement

from .. import dialects
from ..clock import clock

NEW, ACTIVE, DONE, ERROR = "new", "active", "done", "error"
UNFINISHED = (NEW, ACTIVE, ERROR)
#: Items per INSERT when populating.
INSERT_CHUNK = 500


def mine(items: Table, namespace: str, name: str) -> ColumnElement[bool]:
    """The items of one work list."""
    return and_(items.c.namespace == namespace, items.c.worklist == name)


def list_row(lists: Table, namespace: str, name: str) -> list[ColumnElement[bool]]:
    return [lists.c.namespace == namespace, lists.c.name == name]


def lock_list(lists: Table, namespace: str, name: str) -> Any:
    """Lock the work list's row: the allocation lock."""
    # The fencing tokens' epoch is read where they advance (see ``dialects.token_epoch``).
    return dialects.lock_rows(select(lists.c.last_token, dialects.token_epoch().label("epoch"))
                              .where(*list_row(lists, namespace, name)), lists)


def create_list(lists: Table, namespace: str, name: str) -> Any:
    return insert(lists).values(namespace=namespace, name=name, last_token=0, created_at=clock())


def insert_items(items: Table) -> Any:
    return insert(items)


def item_rows(namespace: str, name: str, payloads: Sequence[str], order: int, priority: int,
              now: float) -> list[dict[str, Any]]:
    return [dict(namespace=namespace, worklist=name, exec_order=order, priority=priority, payload=p,
                 state=NEW, attempts=0, created_at=now) for p in payloads]


def current_order(items: Table, namespace: str, name: str) -> Any:
    """The lowest order with unfinished items, and the database clock, read in one statement.

    A completion's ``finished_at`` is stamped before its COMMIT, and a statement sees only
    COMMITs from before it started, so ``started_at`` is never before the ``finished_at`` of any
    item of a lower order (reading the clock first left a window where it was).
    """
    return (select(func.min(items.c.exec_order).label("current"), clock().label("now"))
            .where(mine(items, namespace, name), items.c.state.in_(UNFINISHED)))


def next_item(items: Table, namespace: str, name: str, order: int, now: float,
              skip: Sequence[int] = ()) -> Any:
    """The next item of ``order`` to hand out: new, or active under an expired lease.

    Read without a row lock (the list lock serialises allocations, not finishes): what it read
    is re-checked by :func:`allocate_item`. ``skip``: items this allocation found changed
    under it (a finish or renewal that committed while it waited on the row).

    At most two rows, the first new item and the first expired one in allocation order, one
    branch per state: each is the start of a range of the (namespace, worklist, state,
    exec_order, priority DESC, id) index, read in index order (one ``OR`` over both states would
    sort every new item of the order). The caller takes the first by :func:`allocation_order`.
    """
    t = items
    parts = []
    for state in (NEW, ACTIVE):
        part = (select(t.c.id, t.c.payload, t.c.exec_order, t.c.priority, t.c.attempts, t.c.state, t.c.token)
                .where(mine(t, namespace, name), t.c.state == state, t.c.exec_order == order)
                .order_by(t.c.priority.desc(), t.c.id)
                .limit(1))
        if state == ACTIVE:
            part = part.where(t.c.expires_at < now)
        if skip:
            part = part.where(t.c.id.notin_(list(skip)))
        parts.append(select(*part.subquery().c))
    return union_all(*parts)


def allocation_order(row: Any) -> tuple[int, int]:
    """The order items are allocated in within an order: higher priority first, then by id."""
    return -int(row.priority), int(row.id)


def set_last_token(lists: Table, namespace: str, name: str, token: int) -> Any:
    return update(lists).where(*list_row(lists, namespace, name)).values(last_token=token)


def allocate_item(items: Table, item_id: int, owner: str, token: int, now: float, lease: float,
                  read_state: str, read_token: Optional[int]) -> Any:
    """Stamp an item as allocated, only if it is still as :func:`next_item` read it.

    The read took no row lock, so the old holder of an expired item may have finished, freed
    or renewed it since (its COMMIT landing while this UPDATE waited on the row): the UPDATE
    re-checks the state, the token and the expiry it saw, and changes nothing if any moved on.
    Both backends with row locks re-evaluate the WHERE on the row as committed, so the old
    holder's finish and this allocation never both succeed.
    """
    t = items
    if read_state == NEW:
        still = t.c.state == NEW
    else:
        still = and_(t.c.state == ACTIVE, t.c.token == read_token, t.c.expires_at < now)
    return update(t).where(t.c.id == item_id, still).values(
        state=ACTIVE, owner=owner, token=token, attempts=t.c.attempts + 1, started_at=now,
        finished_at=None, expires_at=now + lease)


def count_allocated(items: Table, item_id: int, token: int, now: float) -> Any:
    """Rows an allocation stamped (this token, this instant): what confirms it where rowcount is not trusted."""
    t = items
    return select(func.count()).select_from(t).where(
        t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE, t.c.started_at == now)


def find_allocation(items: Table, namespace: str, name: str, item_id: int, token: int, owner: str,
                    started_at: float) -> Any:
    """The item an earlier attempt of an allocation stamped (id, token, owner, start instant)."""
    t = items
    return select(t).where(mine(t, namespace, name), t.c.id == item_id, t.c.token == token, t.c.owner == owner,
                           t.c.started_at == started_at, t.c.state == ACTIVE)


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


def finish(items: Table, item_id: int, token: int, values: dict[str, Any]) -> Any:
    """The fenced finish: only while the item is active under ``token``."""
    t = items
    return update(t).where(t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE).values(values)


def count_finished(items: Table, item_id: int, token: int, state: str) -> Any:
    """Rows carrying ``state`` after a finish (a released row carries no token): what confirms it."""
    t = items
    after = (and_(t.c.id == item_id, t.c.token.is_(None), t.c.state == NEW) if state == NEW
             else and_(t.c.id == item_id, t.c.token == token, t.c.state == state))
    return select(func.count()).select_from(t).where(after)


def count_in_state(items: Table, item_id: int, token: int, state: str) -> Any:
    t = items
    return select(func.count()).select_from(t).where(t.c.id == item_id, t.c.token == token, t.c.state == state)


def renew(items: Table, item_id: int, token: int, expires_at: float) -> Any:
    t = items
    return update(t).where(t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE).values(expires_at=expires_at)


def count_renewed(items: Table, item_id: int, token: int, expires_at: float) -> Any:
    t = items
    return select(func.count()).select_from(t).where(
        t.c.id == item_id, t.c.token == token, t.c.state == ACTIVE, t.c.expires_at == expires_at)


def counts(items: Table, namespace: str, name: str, now: float) -> Any:
    """Items per order and state, with how many active ones have an expired lease."""
    t = items
    expired = func.sum(case((and_(t.c.state == ACTIVE, t.c.expires_at < now), 1), else_=0))
    return (select(t.c.exec_order, t.c.state, func.count(), expired)
            .where(mine(t, namespace, name)).group_by(t.c.exec_order, t.c.state).order_by(t.c.exec_order))


def listing(items: Table, namespace: str, name: str, state: Optional[str], limit: int) -> Any:
    t = items
    stmt = select(t).where(mine(t, namespace, name)).order_by(t.c.exec_order, t.c.priority.desc(), t.c.id).limit(limit)
    if state is not None:
        stmt = stmt.where(t.c.state == state)
    return stmt


def by_id(items: Table, namespace: str, name: str, item_id: int) -> Any:
    return select(items).where(mine(items, namespace, name), items.c.id == item_id)


def reset(items: Table, namespace: str, name: str) -> Any:
    return update(items).where(mine(items, namespace, name)).values(
        state=NEW, owner=None, token=None, attempts=0, last_error=None, started_at=None, finished_at=None,
        expires_at=None)


def clear_errors(items: Table, namespace: str, name: str, item_id: Optional[int] = None) -> Any:
    t = items
    only = [t.c.id == item_id] if item_id is not None else []
    return update(t).where(mine(t, namespace, name), *only, t.c.state == ERROR).values(
        state=NEW, owner=None, token=None, last_error=None, finished_at=None)


def drop_items(items: Table, namespace: str, name: str) -> Any:
    return delete(items).where(mine(items, namespace, name))


def drop_list(lists: Table, namespace: str, name: str) -> Any:
    return delete(lists).where(*list_row(lists, namespace, name))
