"""Airflow-side errors, each saying what to fix; whether the task is retried follows the core's policy.

:func:`airflow_controltable.utils.translate` picks the exception by the family the core's one error
table gives the error (:func:`controltable.error_outcome`), so retries follow ``is_retryable``:

* retryable errors (:class:`ControlTableRetryableError` and its subclasses: the database
  unreachable or busy, a slot not granted within ``wait_timeout``, a lost lease) are plain
  :class:`AirflowException`\\ s, so the task's ``retries`` apply; a new try gets a new fencing token;
* everything only a person can fix (a connection that is not SQL or refuses the login, a resource
  that does not exist, control tables not installed, bad arguments) subclasses
  :class:`AirflowFailException` and fails at once instead of burning retries;
* a missing connection subclasses :class:`AirflowNotFoundException` (it may appear later, e.g.
  from a secrets backend).
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException


class ControlTableAirflowError(AirflowException):
    """Base class of the provider's own errors."""


class ControlTableConnectionNotFound(ControlTableAirflowError, AirflowNotFoundException):
    """The connection id is not defined in Airflow."""


class ControlTableConnectionError(ControlTableAirflowError, AirflowFailException):
    """The connection exists but cannot be used as a control table (not SQL, bad URL or extras, login refused)."""


class ControlTableConfigError(ControlTableAirflowError, AirflowFailException):
    """Bad task input: a missing resource, an invalid name or size, control tables not installed."""


class ControlTableFailure(ControlTableAirflowError, AirflowFailException):
    """Any other error the core does not call retryable: fails the task without retries."""


class ControlTableRetryableError(ControlTableAirflowError):
    """An error the core calls retryable: the task's retries apply."""


class ControlTableUnavailable(ControlTableRetryableError):
    """The control database could not be reached (or was busy); retries of the task may succeed."""


class ControlTableAcquireTimeout(ControlTableRetryableError):
    """The slot was not granted within the task's wait timeout; a retry waits in line again."""


class ControlTableLeaseLost(ControlTableRetryableError):
    """A slot, batch or work item lease expired and was taken over: the work may have overlapped.

    Retryable (as in the Dagster integration): a new try re-acquires with a new, higher fencing
    token, so a storage that checks tokens rejects the old try's late writes.
    """
