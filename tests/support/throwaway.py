"""Throwaway database servers for the tests that hold more connections than the shared servers can spare.

The shared PostgreSQL and MariaDB allow 100 connections for everybody on the machine and the suite
keeps to 40 (``support/footprint.py`` measures it). A test that holds more, or holds many for long,
runs on a server of its own, as the fault tests do (``faults/servers.py``: own data directory and
port, stopped by PID): the multi-process stress tests (a fleet of 4 processes x 50 threads was
measured at 72 connections, the others at 8 to 25) and the running Airflow and Dagster deployments
(15 to 18 for their whole module). One PostgreSQL and one MariaDB per pytest process, each started at its first
use and stopped when the session ends (the root conftest calls :func:`close`); each gets a ``test``
database, so its URL looks like the shared one.
"""

from __future__ import annotations

from typing import Any

from support.required import fail_or_skip

_SERVERS: dict[str, Any] = {}
_URLS: dict[str, str] = {}


def url(backend: str, purpose: str = "this test") -> str:
    """The URL of this session's throwaway ``backend`` ("postgres" or "mysql"), started if need be.

    A missing server binary fails when CI requires the backend (``CONTROLTABLE_TEST_REQUIRE``), else
    skips; the message names ``purpose``.
    """
    if backend not in _URLS:
        _URLS[backend] = _start(backend, purpose)
    return _URLS[backend]


def _start(backend: str, purpose: str) -> str:
    from faults.servers import ThrowawayMariaDB, ThrowawayPostgres, mariadb_bin, postgres_bin
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    if backend == "postgres" and postgres_bin() is None:
        fail_or_skip(f"{purpose} need a throwaway PostgreSQL: its server binaries (initdb, pg_ctl) are missing",
                     "postgres")
    if backend == "mysql" and mariadb_bin() is None:
        fail_or_skip(f"{purpose} need a throwaway MariaDB: mariadbd or mariadb-install-db is missing", "mysql")
    server = ThrowawayPostgres() if backend == "postgres" else ThrowawayMariaDB()
    _SERVERS[backend] = server
    server.start()
    engine = create_engine(server.url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE DATABASE test"))
    finally:
        engine.dispose()
    return str(make_url(server.url()).set(database="test").render_as_string(hide_password=False))


def close() -> None:
    """Stop every server this process started (by PID) and remove their directories."""
    while _SERVERS:
        _, server = _SERVERS.popitem()
        server.close()
    _URLS.clear()
