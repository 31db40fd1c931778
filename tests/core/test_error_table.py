"""The one error table (``controltable.errors.ERROR_TABLE``): every error class has a row, and the
retry policy, the CLI's exit statuses and the families the integrations pick exceptions by are the
ones each surface had before the table replaced their own mappings."""

from __future__ import annotations

import inspect

import pytest

import controltable
from controltable import errors
from controltable.errors import (
    EXIT_DATABASE,
    EXIT_ERROR,
    EXIT_LOST,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    FAMILIES,
    ErrorOutcome,
    error_outcome,
    is_retryable,
)


def _error_classes() -> list[type[BaseException]]:
    found = {cls for _, cls in inspect.getmembers(controltable, inspect.isclass)
             if issubclass(cls, controltable.ControlTableError)}
    found |= {cls for _, cls in inspect.getmembers(errors, inspect.isclass)
              if issubclass(cls, errors.ControlTableError)}
    return sorted(found, key=lambda c: c.__name__)


#: class -> (retryable, exit status, family): what is_retryable, the CLI's _exit_code and Airflow's
#: translate said before the table (issue 28), written out so a changed row fails here.
EXPECTED = {
    "AcquireTimeout": (True, EXIT_TIMEOUT, "timeout"),
    "AuthenticationError": (False, EXIT_DATABASE, "connection"),
    "ConfigurationError": (False, EXIT_USAGE, "configuration"),
    "ConflictError": (True, EXIT_ERROR, "conflict"),
    "ControlTableError": (False, EXIT_ERROR, "failure"),
    "DatabaseBusyError": (True, EXIT_DATABASE, "unavailable"),
    "DatabaseMissingError": (False, EXIT_DATABASE, "connection"),
    "DatabaseUnavailableError": (True, EXIT_DATABASE, "unavailable"),
    "LeaseLost": (True, EXIT_LOST, "lease_lost"),
    "LeaseLostInterrupt": (True, EXIT_LOST, "lease_lost"),
    "NotInstalledError": (False, EXIT_DATABASE, "configuration"),
    "PermissionDeniedError": (False, EXIT_DATABASE, "failure"),
    "PoolerError": (False, EXIT_DATABASE, "configuration"),
    "ReadOnlyDatabaseError": (True, EXIT_DATABASE, "unavailable"),
    "StatementTimeoutError": (True, EXIT_DATABASE, "unavailable"),
    "TableBusyError": (False, EXIT_ERROR, "failure"),
    "TooManyConnectionsError": (True, EXIT_DATABASE, "unavailable"),
    "UnexpectedDatabaseError": (False, EXIT_ERROR, "failure"),
    "UnknownResourceError": (False, EXIT_USAGE, "configuration"),
    "WorkListBlocked": (False, EXIT_ERROR, "failure"),
}


def test_every_error_class_has_its_row() -> None:
    classes = _error_classes()
    assert {c.__name__ for c in classes} == set(EXPECTED), "a new error class needs a row here and in ERROR_TABLE"
    for cls in classes:
        outcome = error_outcome(cls("x"))
        assert (outcome.retryable, outcome.exit_code, outcome.family) == EXPECTED[cls.__name__], cls.__name__
        assert is_retryable(cls("x")) is outcome.retryable
        assert outcome.family in FAMILIES and outcome.kind and outcome.fix.strip()


def test_the_most_specific_row_wins() -> None:
    assert error_outcome(controltable.NotInstalledError("event table 'ev' lacks its claim columns")).kind == (
        "event table not prepared")
    missing = controltable.NotInstalledError("control tables missing")
    assert error_outcome(missing).kind == "control tables not installed"
    assert error_outcome(controltable.LeaseLostInterrupt()).kind == "lease lost, work interrupted"
    assert error_outcome(controltable.PoolerError("p")).exit_code == EXIT_DATABASE  # not a usage error


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("k"), OSError("disk")])
def test_a_foreign_exception_is_a_plain_failure(exc: BaseException) -> None:
    outcome = error_outcome(exc)
    assert outcome == ErrorOutcome(type(exc).__name__, "failure", False, EXIT_ERROR, "see the chained exception")


def test_rows_are_ordered_most_specific_first() -> None:
    """A row below one for its own base class could never match: the table would lie."""
    for i, (cls, _test, _) in enumerate(errors.ERROR_TABLE):
        for earlier, earlier_test, _ in errors.ERROR_TABLE[:i]:
            shadowed = issubclass(cls, earlier) and earlier_test is None
            assert not shadowed, f"{cls.__name__} is shadowed by {earlier.__name__}"
