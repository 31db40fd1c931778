"""The work list's workflow: ``WorkList`` runs allocation, fenced finishes and administration through ``Database.run``.

Allocation locks the work list's row, so two workers can never both decide "order 300 is
finished" from a stale view. Completion needs no lock: it can only make the lowest unfinished
order move forward, and an allocation that ran just before it merely saw the older, stricter state.
The item an allocation reads is not locked either, so its UPDATE re-checks what it read (state,
token, expiry) and counts what it stamped: an old holder's finish that commits while the
allocation waits on the row wins, and the allocation moves to the next item (never both).

Every operation is safe to run twice across a lost COMMIT reply: a retried allocation finds the
item its first attempt stamped, and a retried complete/fail recognises "already done by this
token" (fencing tokens are never reissued), so a dropped connection costs neither an orphaned
item nor a false LeaseLost.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from .. import dialects, tracing
from ..clock import read_now
from ..db import Database
from ..defaults import DEFAULT_ITEM_LEASE, RESUME_CALL_GRACE
from ..errors import ConfigurationError, ControlTableError, LeaseLost
from ..holders import process_holder_id
from ..runtime import Runtime, check_runtime
from ..validation import check_name, check_order, check_poll_interval, check_priority, check_seconds
from .statements import ACTIVE, INSERT_CHUNK, NEW, WorkListStatements, allocation_order, finish_values
from .values import Item, WorkListBlocked, WorkListStatus, status_from_counts

T = TypeVar("T")


class WorkList:
    """An ordered list of tasks with JSON payloads, kept in the namespace's control tables.

    The first argument is the ``ControlTable``'s :class:`Runtime` (``ct.worklist(name)`` passes it).
    """

    def __init__(self, runtime: Runtime, name: str, *, lease: float = DEFAULT_ITEM_LEASE) -> None:
        self.runtime: Runtime = check_runtime(runtime)
        self.db: Database = self.runtime.db
        self.name = name
        self.lease = check_seconds("lease", lease) or DEFAULT_ITEM_LEASE
        self.ns = self.runtime.namespace
        #: Every statement of this list, bound once to the control tables, the namespace and the name.
        self.sql = WorkListStatements(self.runtime.tables.item, self.runtime.tables.worklist, self.ns, name)

    def __repr__(self) -> str:
        return f"WorkList({self.name!r}, namespace={self.ns!r})"

    @property
    def wakeup_key(self) -> str:
        """Wake-up key for allocators waiting on this list (finished items, new items)."""
        return f"worklist:{self.name}"

    def _ensure(self, conn: Connection) -> Any:
        """Lock (creating if needed) the work list's row: the allocation lock."""
        stmt = self.sql.lock_list()
        row = conn.execute(stmt).first()
        if row is None:
            # Two first uses of a new list may both find no row; the loser's INSERT fails on the
            # primary key and :meth:`_run` runs its transaction again, which then finds the row.
            conn.execute(self.sql.create_list())
            row = conn.execute(stmt).first()
        return row

    def _run(self, fn: Callable[[Connection], T], *, idempotent: bool = True) -> T:
        """Run a transaction that begins with :meth:`_ensure`, once more if it lost the race to create the row.

        The first attempt rolled back entirely (the failed INSERT aborts it), so the second run
        starts clean and finds the winner's row.
        """
        try:
            return self.db.run(fn, idempotent=idempotent)
        except ControlTableError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            return self.db.run(fn, idempotent=idempotent)

    # -- filling ----------------------------------------------------------------------------------
    def populate(
        self,
        payloads: Iterable[Any],
        order: int = 100,
        *,
        priority: int = 0,
        progress: Optional[Callable[[int], None]] = None,
    ) -> int:
        """Add one item per payload at execution ``order``.

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
            now = read_now(conn)
            for start in range(0, len(encoded), INSERT_CHUNK):
                chunk = encoded[start:start + INSERT_CHUNK]
                conn.execute(self.sql.insert_items(), self.sql.item_rows(chunk, order, priority, now))
                if progress is not None:
                    progress(len(chunk))
            self.runtime.notify(conn, [self.wakeup_key])
            return len(encoded)

        return self._run(fn, idempotent=False)

    # -- working ----------------------------------------------------------------------------------
    @tracing.allocates
    def allocate(self, owner: Optional[str] = None, lease: Optional[float] = None) -> Optional[Item]:
        """Hand out one item of the lowest order that still has unfinished items, or ``None``.

        ``None`` means: everything is done, or the current order's remaining items are all being
        worked on (or errored). :meth:`status` tells which. When the reply to the allocation's
        COMMIT is lost, the retry returns the item that COMMIT allocated, not a second one.
        """
        owner = check_name("owner", owner) if owner is not None else process_holder_id()
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease
        assert lease_s is not None
        # What the last attempt wrote, known to this client before its COMMIT was sent: if the
        # reply to that COMMIT is lost, the retry looks for exactly this allocation (the item
        # id, its fencing token and the database-clock instant it was stamped with) and returns
        # it, instead of allocating a second item and orphaning the first for its lease.
        attempted: list[tuple[int, int, float]] = []

        def fn(conn: Connection) -> Optional[Item]:
            lock = self._ensure(conn)
            if attempted:
                # A fencing token is handed out once per work list only when its transaction commits, so
                # a row still active under this token, owner and start instant can only be that attempt's.
                item_id, earlier, started_at = attempted[-1]
                found = conn.execute(self.sql.find_allocation(item_id, earlier, owner, started_at)).first()
                if found is not None:
                    return self._item(found)
            head = conn.execute(self.sql.current_order()).one()
            now, current = float(head.now), head.current
            if current is None:
                return None
            token = dialects.next_token(int(lock.last_token), int(lock.epoch))
            # Items found changed under this allocation: an old holder's finish, release or
            # renewal that committed while the UPDATE waited on the row won it; move on. Each
            # skip is another transaction's committed change, so the loop ends.
            skip: list[int] = []
            while True:
                candidates = conn.execute(self.sql.next_item(current, now, skip)).all()
                if not candidates:
                    return None
                row = min(candidates, key=allocation_order)
                stamped = dialects.confirmed_count(
                    conn,
                    self.sql.allocate_item(int(row.id), owner, token, now, lease_s, str(row.state),
                                           None if row.token is None else int(row.token)),
                    self.sql.count_allocated(int(row.id), token, now), self.db.traits,
                )
                if stamped == 1:
                    break
                skip.append(int(row.id))
            conn.execute(self.sql.set_last_token(token))
            attempted.append((int(row.id), token, now))
            return Item(self, int(row.id), json.loads(row.payload), int(row.exec_order), int(row.priority), owner,
                        token, int(row.attempts) + 1, now + lease_s, lease_s)

        return self._run(fn)

    def _item(self, row: Any) -> Item:
        lease_s = float(row.expires_at - row.started_at) if row.expires_at and row.started_at else self.lease
        return Item(self, int(row.id), json.loads(row.payload), int(row.exec_order), int(row.priority),
                    str(row.owner), int(row.token), int(row.attempts), float(row.expires_at or 0), lease_s)

    def items(
        self, owner: Optional[str] = None, *, lease: Optional[float] = None, poll_interval: float = 0.5,
        timeout: Optional[float] = None,
    ) -> Iterator[Item]:
        """Allocate items until the list is finished, waiting while the current order is busy.

        Between attempts it waits up to ``poll_interval`` seconds (less when woken: finished or new
        items push on PostgreSQL). Raises :class:`WorkListBlocked` when only errored items stand in the way.

        With a ``timeout`` every statement runs under a client-side deadline (see
        :meth:`~controltable.db.Database.deadline`): the timeout, or shortly after the generator
        resumed when the consumer held it past the timeout. So the generator ends (or raises
        :class:`~controltable.errors.DatabaseUnavailableError` on a silent network) within its
        timeout plus :data:`~controltable.defaults.TIMEOUT_MARGIN`, whatever the network does.
        """
        wait = check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        interval = check_poll_interval("poll_interval", poll_interval)
        deadline = None if wait is None else time.monotonic() + wait
        keys = [self.wakeup_key]
        while True:
            # Never across the ``yield``: the deadline is this thread's, and the consumer's own.
            bound = None if deadline is None else max(deadline, time.monotonic() + RESUME_CALL_GRACE)
            with self.db.deadline(bound):
                since = self.runtime.mark(keys)
                item = self.allocate(owner, lease)
                st = None if item is not None else self.status()
            if item is not None:
                yield item
                continue
            assert st is not None
            if st.finished:
                return
            if st.blocked_by_errors:
                raise WorkListBlocked(
                    f"work list {self.name!r} is blocked at order {st.current_order} by errored items; "
                    "fix them and run clear_errors() (or `controltable worklist clear-errors`)"
                )
            if deadline is not None and time.monotonic() >= deadline:
                return
            pause = interval if deadline is None else min(interval, max(deadline - time.monotonic(), 0.0))
            self.runtime.wait(keys, pause, since)

    def _finish(self, item: Item, state: str, error: Optional[str]) -> None:
        values = finish_values(state, error)

        def fn(conn: Connection) -> int:
            # After the update the row carries ``state`` under this token (a freed row carries
            # no token): that is what confirms the update where rowcount cannot be trusted.
            count = dialects.confirmed_count(
                conn, self.sql.finish(item.id, item.token, values), self.sql.count_finished(item.id, item.token, state),
                self.db.traits,
            )
            if count == 0 and state != NEW:
                # Already done by this token: the first attempt's COMMIT went through and only
                # its reply was lost (or the caller finished the item twice). The token is never
                # handed out again, so the row can only be in this state by our own hand.
                return int(conn.scalar(self.sql.count_in_state(item.id, item.token, state)) or 0)
            self.runtime.notify(conn, [self.wakeup_key])
            return count

        # Every finish is idempotent across a lost COMMIT reply (see above), so it is retried.
        if self.db.run(fn) != 1:
            if state == NEW:
                return
            raise LeaseLost(
                f"work item {item.id} of {self.name!r} is no longer held under token {item.token} "
                "(its lease expired and it was re-allocated or reset); its work may have run twice"
            )

    def _renew(self, item: Item, seconds: float) -> float:
        def fn(conn: Connection) -> float:
            now = read_now(conn)
            n = dialects.confirmed_count(
                conn, self.sql.renew(item.id, item.token, now + seconds),
                self.sql.count_renewed(item.id, item.token, now + seconds), self.db.traits,
            )
            if n != 1:
                raise LeaseLost(f"work item {item.id} of {self.name!r} is no longer held under token {item.token}")
            return now + seconds

        return self.db.run(fn)

    # -- administration ------------------------------------------------------------------------------
    def status(self) -> WorkListStatus:
        rows: list[Any] = self.db.run(lambda conn: list(conn.execute(self.sql.counts(read_now(conn))).all()))
        return status_from_counts(self.name, rows)

    def items_list(self, state: Optional[str] = None, limit: int = 100) -> list[dict[str, Any]]:
        """Items as dictionaries (for listings), optionally of one state."""
        stmt = self.sql.listing(state, limit)
        rows = self.db.run(lambda c: list(c.execute(stmt).all()))
        return [dict(r._mapping, payload=json.loads(r.payload)) for r in rows]

    def get(self, item_id: int, token: Optional[int] = None) -> Item:
        """Rebuild an allocated :class:`Item` by id (e.g. to complete it from another process)."""
        row = self.db.run(lambda c: c.execute(self.sql.by_id(item_id)).first())
        if row is None:
            raise ConfigurationError(f"work list {self.name!r} has no item {item_id}")
        if row.state != ACTIVE:
            raise LeaseLost(f"work item {item_id} of {self.name!r} is {row.state}, not allocated")
        if token is not None and int(row.token) != int(token):
            raise LeaseLost(f"work item {item_id} of {self.name!r} was re-allocated (token {row.token}, not {token})")
        return self._item(row)

    def reset(self) -> int:
        """Every item back to new, attempts cleared (as ``EventTable.reset`` does for its rows)."""
        return self._update(self.sql.reset())

    def clear_error(self, item_id: int) -> int:
        """One errored item back to new."""
        return self._update(self.sql.clear_errors(item_id))

    def clear_errors(self) -> int:
        """Every errored item back to new."""
        return self._update(self.sql.clear_errors())

    def drop(self) -> int:
        """Delete the work list and its items; returns items deleted."""
        def fn(conn: Connection) -> int:
            n = dialects.changed_rows(conn, self.sql.drop_items(), self.sql.items.c.id, self.db.traits)
            conn.execute(self.sql.drop_list())
            return n

        return self.db.run(fn)

    def _update(self, stmt: Any) -> int:
        def fn(conn: Connection) -> int:
            count = dialects.changed_rows(conn, stmt, self.sql.items.c.id, self.db.traits)
            self.runtime.notify(conn, [self.wakeup_key])
            return count

        return self.db.run(fn)
