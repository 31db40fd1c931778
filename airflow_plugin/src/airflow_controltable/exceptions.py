"""Airflow-side errors, each saying what to fix.

Configuration mistakes (a connection that is not SQL, a resource that does not exist, a lost
lease) subclass :class:`AirflowFailException`: retrying the task cannot fix them, so they fail at
once instead of burning retries. A missing connection subclasses :class:`AirflowNotFoundException`
(it may appear later, e.g. from a secrets backend), and an unreachable database stays a plain
:class:`AirflowException` so the task's retries apply.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException


class ControlTableAirflowError(AirflowException):
    """Base class of the provider's own errors."""


class ControlTableConnectionNotFound(ControlTableAirflowError, AirflowNotFoundException):
    """The connection id is not defined in Airflow."""


class ControlTableConnectionError(ControlTableAirflowError, AirflowFailException):
    """The connection exists but cannot be used as a control table (not SQL, bad URL, bad extras)."""


class ControlTableConfigError(ControlTableAirflowError, AirflowFailException):
    """Bad task input: a missing resource, an invalid name or size, control tables not installed."""


class ControlTableLeaseLost(ControlTableAirflowError, AirflowFailException):
    """A slot, batch or work item lease expired and was taken over: the work may have overlapped."""


class ControlTableUnavailable(ControlTableAirflowError):
    """The control database could not be reached; retries of the task may succeed."""
