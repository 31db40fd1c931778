"""Event tables for tests: one definition, created, filled, prepared and dropped the same way everywhere."""

from __future__ import annotations

import uuid
from typing import Any, Optional

from sqlalchemy import MetaData, Table, insert, select

from support.event_workers import event_rows, event_table
from support.live import wait_until


def new_name(prefix: str = "ev") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def create(ct: Any, n: int = 0, *, name: Optional[str] = None) -> Table:
    """Create the standard event table (``id`` key, ``payload``, ``created_at``) with rows 1..n."""
    table = event_table(name or new_name())
    table.create(ct.engine)
    fill(ct, table.name, 1, n)
    return table


def fill(ct: Any, name: str, start: int, count: int) -> None:
    """Insert events ``start .. start + count - 1`` (in chunks a backend's parameter limit allows)."""
    table = event_table(name)
    with ct.engine.begin() as conn:
        for s in range(start, start + count, 5000):
            conn.execute(insert(table), event_rows(s, min(5000, start + count - s)))


def drop(ct: Any, name: str) -> None:
    Table(name, MetaData()).drop(ct.engine, checkfirst=True)


def rows(ct: Any, name: str) -> dict[Any, dict[str, Any]]:
    """Every row of the table by ``id``, claim columns included."""
    t = Table(name, MetaData(), autoload_with=ct.engine)
    with ct.engine.connect() as conn:
        return {r.id: dict(r._mapping) for r in conn.execute(select(t))}


def wait_past(ct: Any, expires_at: float, timeout: float = 30.0) -> None:
    """Wait until the database clock is past ``expires_at`` (leases run on the database clock), not
    for a local sleep that may end before it on a loaded machine or a clock apart from the server's."""
    wait_until(lambda: ct.now() > expires_at + 0.05, timeout, "the database clock to pass the expiry", interval=0.1)
