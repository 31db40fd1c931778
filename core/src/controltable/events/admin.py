"""Administration of an event table: counts, error rows, backlog, and the bulk resets (retry errors, reap, reset).

A base class of :class:`~controltable.events.workflow.EventTable` (split from the workflow
module, which keeps claiming and the fenced finishes); every method runs through ``Database.run``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from sqlalchemy import Table
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from ..clock import clock, read_now
from ..db import Database
from ..validation import check_positive_int
from . import statements as sql
from .statements import CLAIMED, ERROR, STATE_NAMES, ClaimColumns, Where
from .values import EventStats


class EventAdministration:
    """The administration methods of :class:`~controltable.events.workflow.EventTable`."""

    if TYPE_CHECKING:  # provided by EventTable
        db: Database
        cols: ClaimColumns
        key: str
        order_by: str
        time_column: Optional[str]

        @property
        def table(self) -> Table: ...

        @property
        def qualified_name(self) -> str: ...

        def _where_clause(self, where: Where) -> list[ColumnElement[Any]]: ...

        def _is(self, state: int) -> ColumnElement[bool]: ...

        def _col(self, name: str) -> Any: ...

        def _key_chunks(self, keys: Sequence[Any]) -> Iterator[list[Any]]: ...

    def stats(self) -> EventStats:
        """Counts per state (claimed rows whose lease ran out count as ``expired`` too)."""
        t, cols = self.table, self.cols

        def fn(conn: Connection) -> EventStats:
            now = read_now(conn)
            st = EventStats(self.qualified_name)
            for row in conn.execute(sql.counts_by_state(t, cols)):
                setattr(st, STATE_NAMES.get(int(row[0]), "error"), int(row[1]))
            st.expired = int(conn.scalar(sql.count_expired(t, cols, now)) or 0)
            first = conn.execute(sql.oldest_pending(t, cols, self.key, self.order_by, self.time_column)).first()
            if first is not None:
                st.oldest_pending_key = first[0]
                if self.time_column is not None and first[1] is not None:
                    st.oldest_pending_age = _age(first[1], now)
            return st

        return self.db.run(fn)

    def error_rows(self, limit: int = 20) -> list[dict[str, Any]]:
        """The rows in the error state (key, attempts, last error), in claim order.

        For status pages and alerts: which events gave up and why, without the caller writing SQL
        against the claim columns. At most ``limit`` rows.
        """
        stmt = sql.error_rows(self.table, self.cols, self.key, self.order_by, check_positive_int("limit", limit))
        rows = self.db.run(lambda c: list(c.execute(stmt).all()))
        return [{"key": r[0], "attempts": int(r[1] or 0), "error": r[2]} for r in rows]

    def backlog(self, where: Where = None) -> tuple[int, Any]:
        """(rows a claim could take now, the largest ``order_by`` value among them) in one query.

        Sensors use the pair as a run key: a new key means new work arrived.
        """
        t = self.table

        def fn(conn: Connection) -> tuple[int, Any]:
            row = conn.execute(sql.backlog(t, self.cols, self.order_by, read_now(conn),
                                           self._where_clause(where))).one()
            return int(row[0] or 0), row[1]

        return self.db.run(fn)

    def pending_count(self, where: Where = None) -> int:
        """How many rows a claim could take right now."""
        t = self.table

        def fn(conn: Connection) -> int:
            return int(conn.scalar(sql.pending_count(t, self.cols, read_now(conn), self._where_clause(where))) or 0)

        return self.db.run(fn)

    def _update_where(self, conditions: list[ColumnElement[Any]], values: dict[str, Any]) -> int:
        """``UPDATE <table> SET values WHERE conditions``; returns how many rows it changed.

        One statement where the backend allows it. On SQL Server, which escalates a statement
        taking about 5,000 row locks to a table lock and whose reported row counts are not
        trusted, the rows are paged by key: each transaction locks at most
        ``Traits.rows_per_statement`` rows, updates them by key and counts them itself.
        """
        t = self.table
        cap = self.db.traits.rows_per_statement
        if cap is None:
            return self.db.run(lambda c: int(c.execute(sql.update_where(t, conditions, values)).rowcount))
        total, last = 0, None
        while True:
            def page(conn: Connection, after: Any = last) -> list[Any]:
                found = [r[0] for r in conn.execute(sql.page_keys(t, self.key, conditions, after, cap))]
                for chunk in self._key_chunks(found):
                    conn.execute(sql.update_keys(t, self.key, chunk, values, *conditions))
                return found

            keys = self.db.run(page)
            total += len(keys)
            if len(keys) < cap:
                return total
            last = keys[-1]

    def retry_errors(self, where: Where = None) -> int:
        """Put error rows back to pending with their attempts reset."""
        return self._update_where([self._is(ERROR), *self._where_clause(where)], sql.retry_values(self.cols))

    def reap(self) -> int:
        """Return expired claims to pending now (claims would take them anyway); returns how many."""
        return self._update_where([self._is(CLAIMED), self._col("expires_at") < clock()],
                                  sql.reap_values(self.cols))

    def reset(self) -> int:
        """Every row back to pending, attempts cleared (for reprocessing a table from scratch)."""
        return self._update_where([], sql.reset_values(self.cols))


def _age(value: Any, now: float) -> Optional[float]:
    """Seconds between an event time (datetime or epoch number) and the database clock."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return max(now - value.timestamp(), 0.0)
    if isinstance(value, (int, float, Decimal)):  # a reflected MySQL DOUBLE/NUMERIC reads as Decimal
        return max(now - float(value), 0.0)
    return None

