"""Administration of an event table: counts, error rows, backlog, and the bulk resets (retry errors, reap, reset).

A base class of :class:`~controltable.events.workflow.EventTable` (split from the workflow
module, which keeps claiming and the fenced finishes); every method runs through ``Database.run``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from ..clock import clock, read_now
from ..db import Database
from ..validation import check_positive_int
from .statements import (
    CLAIMED,
    ERROR,
    STATE_NAMES,
    ClaimColumns,
    EventStatements,
    Where,
    reap_values,
    reset_values,
    retry_values,
)
from .values import EventStats


class EventAdministration:
    """The administration methods of :class:`~controltable.events.workflow.EventTable`."""

    if TYPE_CHECKING:  # provided by EventTable
        db: Database
        cols: ClaimColumns
        time_column: Optional[str]

        @property
        def sql(self) -> EventStatements: ...

        @property
        def qualified_name(self) -> str: ...

        def _key_chunks(self, keys: Sequence[Any]) -> Iterator[list[Any]]: ...

    def stats(self) -> EventStats:
        """Counts per state (claimed rows whose lease ran out count as ``expired`` too)."""
        q = self.sql

        def fn(conn: Connection) -> EventStats:
            now = read_now(conn)
            st = EventStats(self.qualified_name)
            for row in conn.execute(q.counts_by_state()):
                setattr(st, STATE_NAMES.get(int(row[0]), "error"), int(row[1]))
            st.expired = int(conn.scalar(q.count_expired(now)) or 0)
            first = conn.execute(q.oldest_pending()).first()
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
        stmt = self.sql.error_rows(check_positive_int("limit", limit))
        rows = self.db.run(lambda c: list(c.execute(stmt).all()))
        return [{"key": r[0], "attempts": int(r[1] or 0), "error": r[2]} for r in rows]

    def backlog(self, where: Where = None) -> tuple[int, Any]:
        """(rows a claim could take now, the largest ``order_by`` value among them) in one query.

        Sensors use the pair as a run key: a new key means new work arrived.
        """
        q = self.sql

        def fn(conn: Connection) -> tuple[int, Any]:
            row = conn.execute(q.backlog(read_now(conn), where)).one()
            return int(row[0] or 0), row[1]

        return self.db.run(fn)

    def pending_count(self, where: Where = None) -> int:
        """How many rows a claim could take right now."""
        q = self.sql
        return self.db.run(lambda conn: int(conn.scalar(q.pending_count(read_now(conn), where)) or 0))

    def _update_where(self, conditions: list[ColumnElement[Any]], values: dict[str, Any]) -> int:
        """``UPDATE <table> SET values WHERE conditions``; returns how many rows it changed.

        One statement where the backend allows it. On SQL Server, which escalates a statement
        taking about 5,000 row locks to a table lock and whose reported row counts are not
        trusted, the rows are paged by key: each transaction locks at most
        the traits' ``rows_per_statement`` rows, updates them by key and counts them itself.
        """
        q = self.sql
        cap = q.traits.rows_per_statement
        if cap is None:
            return self.db.run(lambda c: int(c.execute(q.update_where(conditions, values)).rowcount))
        total, last = 0, None
        while True:
            def page(conn: Connection, after: Any = last) -> list[Any]:
                found = [r[0] for r in conn.execute(q.page_keys(conditions, after, cap))]
                for chunk in self._key_chunks(found):
                    conn.execute(q.update_keys(chunk, values, *conditions))
                return found

            keys = self.db.run(page)
            total += len(keys)
            if len(keys) < cap:
                return total
            last = keys[-1]

    def retry_errors(self, where: Where = None) -> int:
        """Put error rows back to pending with their attempts reset."""
        return self._update_where([self.sql.is_state(ERROR), *self.sql.where_clauses(where)], retry_values(self.cols))

    def reap(self) -> int:
        """Return expired claims to pending now (claims would take them anyway); returns how many."""
        return self._update_where([self.sql.is_state(CLAIMED), self.sql.col("expires_at") < clock()],
                                  reap_values(self.cols))

    def reset(self) -> int:
        """Every row back to pending, attempts cleared (for reprocessing a table from scratch)."""
        return self._update_where([], reset_values(self.cols))


def _age(value: Any, now: float) -> Optional[float]:
    """Seconds between an event time (datetime or epoch number) and the database clock."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return max(now - value.timestamp(), 0.0)
    if isinstance(value, (int, float, Decimal)):  # a reflected MySQL DOUBLE/NUMERIC reads as Decimal
        return max(now - float(value), 0.0)
    return None

