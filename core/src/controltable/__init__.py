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
from .slots import Entry, Lease, ResourceStatus

__version__ = "0.1.0"

__all__ = [
    "AcquireTimeout",
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
    "__version__",
]
