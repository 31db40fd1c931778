"""controltable: resource slots and event batch claiming in a control table inside your own database."""

from .control import ControlTable
from .doctor import Finding
from .errors import (
    AcquireTimeout,
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    ControlTableError,
    DatabaseBusyError,
    DatabaseMissingError,
    DatabaseUnavailableError,
    ErrorOutcome,
    LeaseLost,
    LeaseLostInterrupt,
    NotInstalledError,
    PermissionDeniedError,
    PoolerError,
    ReadOnlyDatabaseError,
    StatementTimeoutError,
    TooManyConnectionsError,
    UnexpectedDatabaseError,
    UnknownResourceError,
    error_outcome,
    is_retryable,
)
from .events import Batch, EventStats, EventTable, TableBusyError
from .slots import Entry, GrantRecord, Lease, Rate, ResourceStats, ResourceStatus, WaitInfo
from .wakeups import PushStatus
from .worklist import Item, WorkList, WorkListBlocked, WorkListStatus

__version__ = "0.1.0"

__all__ = [
    "AcquireTimeout",
    "AuthenticationError",
    "ConflictError",
    "DatabaseBusyError",
    "DatabaseMissingError",
    "PermissionDeniedError",
    "PoolerError",
    "ReadOnlyDatabaseError",
    "StatementTimeoutError",
    "TooManyConnectionsError",
    "UnexpectedDatabaseError",
    "ErrorOutcome",
    "error_outcome",
    "is_retryable",
    "Batch",
    "EventStats",
    "EventTable",
    "Item",
    "WorkList",
    "WorkListBlocked",
    "WorkListStatus",
    "ConfigurationError",
    "ControlTable",
    "ControlTableError",
    "DatabaseUnavailableError",
    "Entry",
    "Finding",
    "PushStatus",
    "GrantRecord",
    "Rate",
    "ResourceStats",
    "Lease",
    "LeaseLost",
    "LeaseLostInterrupt",
    "NotInstalledError",
    "ResourceStatus",
    "TableBusyError",
    "UnknownResourceError",
    "WaitInfo",
    "__version__",
]
