"""The fault suite's marker (``-m faults`` selects it) and its throwaway servers.

``server`` is one throwaway PostgreSQL and one throwaway MariaDB per module (own data directory and
port, stopped by PID), for the tests that restart servers under load. CI requires the servers
(``CONTROLTABLE_TEST_REQUIRE``), so it requires their binaries too: a missing one fails there and
skips elsewhere.
"""

from __future__ import annotations

from typing import Iterator, Optional

import pytest
from support.required import fail_or_skip

from .servers import ThrowawayMariaDB, ThrowawayPostgres, ThrowawayServer, mariadb_bin, postgres_bin


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault injection against throwaway servers (restarts, cut COMMITs)")


def _available(kind: str) -> Optional[str]:
    if kind == "postgres" and postgres_bin() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if kind == "mariadb" and mariadb_bin() is None:
        return "mariadbd / mariadb-install-db are not installed"
    return None


@pytest.fixture(scope="module", params=["postgres", "mariadb"])
def server(request: pytest.FixtureRequest) -> Iterator[ThrowawayServer]:
    kind = str(request.param)
    missing = _available(kind)
    if missing:
        fail_or_skip(missing, {"postgres": "postgres", "mariadb": "mysql"}[kind])
    srv: ThrowawayServer = ThrowawayPostgres() if kind == "postgres" else ThrowawayMariaDB()
    try:
        srv.start()
        yield srv
    finally:
        srv.close()
