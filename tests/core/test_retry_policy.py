"""``controltable.errors.is_retryable``: the one retry policy both plugins follow."""

import pytest

from controltable import errors as e


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (e.DatabaseUnavailableError("down"), True),
        (e.DatabaseBusyError("deadlocks"), True),
        (e.StatementTimeoutError("slow"), True),
        (e.AcquireTimeout("busy"), True),
        (e.LeaseLost("lost"), True),
        (e.ConflictError("clash"), True),
        (e.AuthenticationError("login"), False),
        (e.DatabaseMissingError("no db"), False),
        (e.PermissionDeniedError("grant"), False),
        (e.NotInstalledError("init"), False),
        (e.UnknownResourceError("r"), False),
        (e.ConfigurationError("bad"), False),
        (e.UnexpectedDatabaseError("?"), False),
        (ValueError("not ours"), False),
    ],
)
def test_retry_policy(exc: BaseException, expected: bool) -> None:
    assert e.is_retryable(exc) is expected
