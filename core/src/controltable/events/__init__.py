"""Event batch claiming on the user's own table: the public names of the event engine.

controltable adds claim columns to the event table, never a copy of the data. A claim is one
short transaction that skips rows other workers are claiming (``FOR UPDATE SKIP LOCKED`` or
SQL Server's ``READPAST``) and marks the batch with a random token and a lease; no lock is held
while the batch is processed (a "soft lock"). Completion is fenced on that token in one
statement, so a worker whose lease ran out can never mark rows another worker re-claimed.

Where things are: :mod:`.statements` builds every statement (pure functions over a
:class:`ClaimColumns`), :mod:`.decisions` holds the pure decisions (back-off schedule, crash
loops, batch handles), :mod:`.ddl` reflects the table and prepares it, :mod:`.workflow` is the
workflow (:class:`EventTable`), :mod:`.values` the value objects (:class:`Batch`, :class:`EventStats`).
"""

from .ddl import AddColumn, TableBusyError
from .statements import (
    CLAIMED,
    DONE,
    ERROR,
    ERROR_LENGTH,
    PENDING,
    STATE_NAMES,
    ClaimColumns,
    EventStatements,
    Where,
    claim_columns,
)
from .values import Batch, EventStats
from .workflow import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BACKOFF,
    EXPIRED_CHECK_INTERVAL,
    EventTable,
)

__all__ = [
    "AddColumn",
    "Batch",
    "CLAIMED",
    "ClaimColumns",
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BACKOFF",
    "DONE",
    "ERROR",
    "ERROR_LENGTH",
    "EXPIRED_CHECK_INTERVAL",
    "EventStatements",
    "EventStats",
    "EventTable",
    "PENDING",
    "STATE_NAMES",
    "TableBusyError",
    "Where",
    "claim_columns",
]
