"""Client-side statement bounds on a healthy network: the statement timeout, and a caller's deadline.

PostgreSQL's statement timeout is no longer a startup option (a pooler refuses it): the client
cancels an overrunning statement, and the caller hears :class:`StatementTimeoutError` naming the
limit. A caller's deadline (``Database.run(deadline=)``, what every ``timeout=`` passes) stops a
statement shortly after it, lock waits included. The silent-network cases are in
``tests/faults/test_silent_network.py``.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from controltable import ControlTable, DatabaseUnavailableError, StatementTimeoutError, defaults

#: How long the stopped statements would run (the hang detector: over 5x the goal of the deadline
#: plus its grace and the cancel's, measured by ``benchmarks/run --only goals``).
STATEMENT = 5 * (1 + defaults.DEADLINE_STATEMENT_GRACE + 2 * defaults.CANCEL_GRACE + 0.5)


def _sleep(backend: str, seconds: float) -> str:
    return f"SELECT pg_sleep({seconds})" if backend == "postgres" else f"SELECT SLEEP({seconds})"


@pytest.mark.backends("postgres", "mysql")
def test_statement_timeout_is_kept_without_session_state(backend: str, backend_url: str) -> None:
    ct = ControlTable(backend_url, statement_timeout=1)
    try:
        started = time.monotonic()
        with pytest.raises(StatementTimeoutError, match="statement timeout"):
            ct.db.run(lambda c: c.execute(text(_sleep(backend, STATEMENT))).all())
        took = time.monotonic() - started
        # By cause: the error names the statement timeout, not before it (a lower bound), and the
        # statement did not run to its end. The goal (1 s + cancel grace) is the benchmarks'.
        assert took >= 0.9, f"stopped after {took:.2f} s, before the 1 s statement timeout"
        assert took < STATEMENT, f"hang: the {STATEMENT:g} s statement ran to its end ({took:.1f} s)"
        assert ct.db.run(lambda c: c.execute(text("SELECT 1")).scalar()) == 1  # the next call works
    finally:
        ct.close()


@pytest.mark.backends("postgres", "mysql")
def test_a_callers_deadline_stops_a_statement(backend: str, backend_url: str) -> None:
    ct = ControlTable(backend_url)  # statement timeout 120 s: only the deadline can stop it
    try:
        ct.ping()
        started = time.monotonic()
        with pytest.raises((StatementTimeoutError, DatabaseUnavailableError), match="call's timeout"):
            ct.db.run(lambda c: c.execute(text(_sleep(backend, STATEMENT))).all(), deadline=started + 1)
        took = time.monotonic() - started
        # By cause: the error names the call's timeout and the statement did not run to its end.
        assert took < STATEMENT, f"hang: the {STATEMENT:g} s statement ran to its end ({took:.1f} s)"
        assert ct.db.run(lambda c: c.execute(text("SELECT 1")).scalar()) == 1
    finally:
        ct.close()
