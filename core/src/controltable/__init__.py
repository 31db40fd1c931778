"""controltable: resource slots and event batch claiming in a control table inside your own database."""

from .control import ControlTable
from .errors import (
    AcquireTimeout,
    ConfigurationError,
    ControlTableError,
    DatabaseUnavailableError,
    LeaseLost,
    NotInstalledError,
    UnknownResourceError,
)
from .events import Batch, EventStats, EventTable
from .slots import Entry, Lease, ResourceStatus, WaitInfo
from .worklist import Item, WorkList, WorkListBlocked, WorkListStatus

__version__ = "0.1.0"

__all__ = [
    "AcquireTimeout",
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
    "Lease",
    "LeaseLost",
    "NotInstalledError",
    "ResourceStatus",
    "UnknownResourceError",
    "WaitInfo",
    "__version__",
]
