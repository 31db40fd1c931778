"""The database clock: the one source of time for leases, read in SQL, and its instants as datetimes.

Every engine reads time here, never from the client (whose clock may be minutes off another
host's): :func:`clock` is the expression to put inside a statement, :func:`read_now` the value
read inside a transaction, and :func:`utc` turns the epoch seconds stored in the control tables
into the timezone-aware datetimes the public value objects show.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import select
from sqlalchemy.engine import Connection

from . import dialects


def clock() -> Any:
    """The database clock as UTC epoch seconds, an expression (spelled per dialect in :mod:`.dialects`)."""
    return dialects.db_now()


def read_now(conn: Connection) -> float:
    """The database clock read inside ``conn``'s transaction, as UTC epoch seconds."""
    return float(conn.scalar(select(clock())) or 0.0)


def utc(ts: Optional[float]) -> Optional[datetime]:
    """Epoch seconds from the control tables as an aware UTC datetime (None stays None)."""
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)
