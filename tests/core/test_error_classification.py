"""Driver errors are classified by SQLSTATE / driver code, retried where safe, and reported as controltable errors.

Fake exceptions carry the codes each driver really uses (and the attribute it keeps them in);
the live tests provoke the real ones: an unknown role, a missing database, a user without
privileges, a wrong password, a server that accepts connections and never answers.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from support import pgbouncer
from support.driver_errors import driver_class, oracle_error, psycopg2_error, psycopg_error, pyodbc_error

from controltable import (
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    ControlTable,
    ControlTableError,
    DatabaseBusyError,
    DatabaseMissingError,
    DatabaseUnavailableError,
    NotInstalledError,
    PermissionDeniedError,
    PoolerError,
    ReadOnlyDatabaseError,
    StatementTimeoutError,
    TooManyConnectionsError,
    UnexpectedDatabaseError,
    dialects,
)
from controltable import connect as ct_connect
from controltable.db import Database
from controltable.errorcodes import Kind, classify, is_unique_violation
from controltable.errors import is_retryable, redact, safe_url


# -- fake driver exceptions: support.driver_errors -------------------------------------------------
def wrapped(orig: Exception, invalidated: bool = False) -> sa_exc.DBAPIError:
    return sa_exc.OperationalError("SELECT 1", {}, orig, connection_invalidated=invalidated)  # type: ignore[arg-type]


PG_CASES = [
    ("40001", Kind.TRANSIENT), ("40P01", Kind.TRANSIENT), ("55P03", Kind.TRANSIENT),
    ("57P01", Kind.UNAVAILABLE), ("57P02", Kind.UNAVAILABLE), ("57P03", Kind.UNAVAILABLE),
    ("53300", Kind.TOO_MANY_CONNECTIONS), ("25006", Kind.READ_ONLY),
    ("08006", Kind.UNAVAILABLE), ("08001", Kind.UNAVAILABLE),
    ("08P01", Kind.UNAVAILABLE), ("42P05", Kind.POOLER), ("26000", Kind.POOLER),
    ("28P01", Kind.AUTHENTICATION), ("28000", Kind.AUTHENTICATION), ("3D000", Kind.MISSING_DATABASE),
    ("42501", Kind.PERMISSION), ("42P01", Kind.NOT_INSTALLED), ("42703", Kind.NOT_INSTALLED),
    ("57014", Kind.TIMEOUT), ("23505", Kind.CONFLICT), ("22003", Kind.BAD_VALUE), ("42601", Kind.OTHER),
]


@pytest.mark.parametrize(("state", "kind"), PG_CASES)
def test_postgresql_sqlstates(state: str, kind: Kind) -> None:
    assert classify(wrapped(psycopg_error(state)), "postgresql") is kind
    assert classify(psycopg_error(state)) is kind  # raw, dialect told from the module
    assert classify(psycopg2_error(state), "postgresql") is kind


@pytest.mark.parametrize(("message", "kind"), [
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  role "x" does not exist',
     Kind.AUTHENTICATION),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  password authentication failed '
     'for user "x"', Kind.AUTHENTICATION),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  database "nope" does not exist',
     Kind.MISSING_DATABASE),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  the database system is starting up',
     Kind.UNAVAILABLE),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  too many connections for role "x"',
     Kind.TOO_MANY_CONNECTIONS),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  sorry, too many clients already',
     Kind.TOO_MANY_CONNECTIONS),
    ('connection failed: connection to server at "h", port 6432 failed: FATAL:  unsupported startup parameter: '
     "options", Kind.POOLER),
    ("connection failed: connection to server at \"h\", port 1 failed: Connection refused", Kind.UNAVAILABLE),
    ("consuming input failed: server closed the connection unexpectedly", Kind.UNAVAILABLE),
])
def test_psycopg_connection_failures_without_sqlstate(message: str, kind: Kind) -> None:
    assert classify(wrapped(psycopg_error(None, message)), "postgresql") is kind
    # psycopg's ConnectionTimeout is an OperationalError subclass
    timeout_cls = type("ConnectionTimeout", (driver_class("psycopg"),), {"__module__": "psycopg"})
    assert classify(timeout_cls("connection timeout expired"), "postgresql") is Kind.UNAVAILABLE


def test_a_missing_table_message_without_sqlstate_is_not_a_missing_table() -> None:
    # Message text never decides on a server error that carries a code.
    exc = psycopg_error("42601", 'relation "ct_meta" does not exist', name="ProgrammingError")
    assert classify(exc, "postgresql") is Kind.OTHER


MYSQL_CASES = [
    (1205, Kind.TRANSIENT), (1213, Kind.TRANSIENT),
    (2002, Kind.UNAVAILABLE), (2003, Kind.UNAVAILABLE), (2006, Kind.UNAVAILABLE), (2013, Kind.UNAVAILABLE),
    (2055, Kind.UNAVAILABLE), (1927, Kind.UNAVAILABLE), (1053, Kind.UNAVAILABLE),
    (1290, Kind.READ_ONLY), (1792, Kind.READ_ONLY), (1836, Kind.READ_ONLY),
    (1040, Kind.TOO_MANY_CONNECTIONS), (1203, Kind.TOO_MANY_CONNECTIONS), (1226, Kind.TOO_MANY_CONNECTIONS),
    (1180, Kind.TRANSIENT), (1047, Kind.UNAVAILABLE), (1267, Kind.BAD_VALUE), (1271, Kind.BAD_VALUE),
    (1045, Kind.AUTHENTICATION), (1698, Kind.AUTHENTICATION), (1049, Kind.MISSING_DATABASE),
    (1044, Kind.PERMISSION), (1142, Kind.PERMISSION), (1143, Kind.PERMISSION),
    (1146, Kind.NOT_INSTALLED), (1054, Kind.NOT_INSTALLED), (1969, Kind.TIMEOUT), (3024, Kind.TIMEOUT),
    (1062, Kind.CONFLICT), (1406, Kind.BAD_VALUE), (1264, Kind.BAD_VALUE), (1064, Kind.OTHER),
]


@pytest.mark.parametrize(("code", "kind"), MYSQL_CASES)
def test_mysql_codes(code: int, kind: Kind) -> None:
    pymysql = pytest.importorskip("pymysql")
    raw = pymysql.err.OperationalError(code, "message text that says nothing")
    assert classify(raw) is kind  # e.g. raised bare from a pool checkout hook
    assert classify(wrapped(raw), "mysql") is kind


MSSQL_CASES = [
    ("40001", 1205, Kind.TRANSIENT), ("HY000", 1222, Kind.TRANSIENT), ("08S01", 10054, Kind.UNAVAILABLE),
    ("08001", 0, Kind.UNAVAILABLE), ("42000", 3906, Kind.READ_ONLY),
    ("28000", 18456, Kind.AUTHENTICATION), ("42000", 4060, Kind.MISSING_DATABASE),
    ("42000", 229, Kind.PERMISSION), ("42000", 230, Kind.PERMISSION), ("42S02", 208, Kind.NOT_INSTALLED),
    ("42S22", 207, Kind.NOT_INSTALLED), ("HYT00", 0, Kind.TIMEOUT), ("23000", 2627, Kind.CONFLICT),
    ("22001", 8152, Kind.BAD_VALUE), ("42000", 102, Kind.OTHER),
    # Azure SQL resource limits (workers/sessions reached; server too busy): refused before running.
    ("42000", 10928, Kind.TRANSIENT), ("42000", 10929, Kind.TRANSIENT),
]


@pytest.mark.parametrize(("state", "number", "kind"), MSSQL_CASES)
def test_sql_server_codes(state: str, number: int, kind: Kind) -> None:
    assert classify(wrapped(pyodbc_error(number, state)), "mssql") is kind


ORACLE_CASES = [
    ("ORA-00060", Kind.TRANSIENT), ("ORA-08177", Kind.TRANSIENT), ("ORA-03113", Kind.UNAVAILABLE),
    ("ORA-03114", Kind.UNAVAILABLE), ("ORA-12541", Kind.UNAVAILABLE), ("DPY-4011", Kind.UNAVAILABLE),
    ("ORA-16000", Kind.READ_ONLY),
    ("ORA-00018", Kind.TOO_MANY_CONNECTIONS), ("ORA-00020", Kind.TOO_MANY_CONNECTIONS),
    ("ORA-01017", Kind.AUTHENTICATION), ("ORA-12514", Kind.MISSING_DATABASE), ("ORA-01031", Kind.PERMISSION),
    ("ORA-00942", Kind.NOT_INSTALLED), ("ORA-00904", Kind.NOT_INSTALLED), ("DPY-4024", Kind.TIMEOUT),
    ("ORA-00001", Kind.CONFLICT), ("ORA-12899", Kind.BAD_VALUE), ("ORA-00923", Kind.OTHER),
]


@pytest.mark.parametrize(("code", "kind"), ORACLE_CASES)
def test_oracle_codes(code: str, kind: Kind) -> None:
    assert classify(wrapped(oracle_error(code)), "oracle") is kind


def test_sqlite_real_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    a = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    b = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    a.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    with pytest.raises(sqlite3.Error) as missing:
        a.execute("SELECT * FROM nope")
    assert classify(missing.value) is Kind.NOT_INSTALLED
    a.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.Error) as busy:
        b.execute("BEGIN IMMEDIATE")
    assert classify(busy.value) is Kind.TRANSIENT
    a.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.Error) as dup:
        a.execute("INSERT INTO t VALUES (1)")
    assert classify(dup.value) is Kind.CONFLICT
    assert is_unique_violation(dup.value)
    a.execute("ROLLBACK")
    with pytest.raises(sqlite3.Error) as cant:
        sqlite3.connect(tmp_path / "no" / "such" / "dir.db").execute("SELECT 1")
    assert classify(cant.value) is Kind.MISSING_DATABASE
    a.close()
    b.close()


# -- translation into controltable errors ------------------------------------------------------------
@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'c.db'}")
    yield database
    database.dispose()


@pytest.mark.parametrize(("orig", "error", "fix"), [
    (psycopg_error("28P01"), AuthenticationError, "user name and password"),
    (psycopg_error("3D000"), DatabaseMissingError, "CREATE DATABASE"),
    (psycopg_error("42501"), PermissionDeniedError, "grant"),
    (psycopg_error("42P01"), NotInstalledError, "controltable init"),
    (psycopg_error("57P03"), DatabaseUnavailableError, "server is running"),
    (psycopg_error("53300"), TooManyConnectionsError, "connection limit"),
    (psycopg_error("25006"), ReadOnlyDatabaseError, "target_session_attrs=read-write"),
    (psycopg_error("42P05"), PoolerError, "connection pooler in transaction mode"),
    (psycopg_error("26000"), PoolerError, "listen_url"),
    (psycopg_error("57014"), StatementTimeoutError, "statement_timeout"),
    (psycopg_error("40P01"), DatabaseBusyError, "retry later"),
    (psycopg_error("23505"), ConflictError, "retry"),
    (psycopg_error("22001"), ConfigurationError, "does not fit"),
    (psycopg_error("42601"), UnexpectedDatabaseError, "report it"),
])
def test_every_kind_becomes_a_controltable_error_naming_the_fix(
    db: Database, orig: Exception, error: type[ControlTableError], fix: str
) -> None:
    # Translate as if on PostgreSQL: the dialect's name (instance attribute only) for the classifier,
    # and the traits the Database looked up once when it was built, for the message.
    db.engine.dialect.name = "postgresql"
    db.engine_traits = dialects.traits("postgresql")
    try:
        out = db.translate(wrapped(orig))
    finally:
        del db.engine.dialect.name
    assert type(out) is error
    assert fix in str(out)


class _Flaky:
    """A transaction body that fails with ``orig`` the first ``n`` times."""

    def __init__(self, orig: Exception, n: int) -> None:
        self.orig, self.n, self.calls = orig, n, 0

    def __call__(self, conn: Any) -> str:
        self.calls += 1
        if self.calls <= self.n:
            raise wrapped(self.orig)
        return "ok"


def test_transient_and_lost_connections_are_retried(db: Database) -> None:
    flaky = _Flaky(sqlite3.OperationalError("database is locked"), 2)
    assert db.run(flaky) == "ok" and flaky.calls == 3
    pymysql = pytest.importorskip("pymysql")
    # A bare driver error (as raised from a pool checkout hook after a server restart) is
    # recognised and retried as well.
    calls = []

    def bare(conn: Any) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
        return "ok"

    assert db.run(bare) == "ok" and len(calls) == 3


@pytest.mark.parametrize("number", [10928, 10929])
def test_azure_sql_resource_limits_are_retried(db: Database, number: int) -> None:
    """Azure SQL refuses a request at its tier's worker/session limit (10928) or when too busy
    (10929): nothing ran, the capacity frees as other requests end, so the work is retried."""
    flaky = _Flaky(pyodbc_error(number), 2)
    assert db.run(flaky) == "ok" and flaky.calls == 3
    with pytest.raises(DatabaseBusyError) as caught:  # still refused after every retry
        db.run(_Flaky(pyodbc_error(number), 1000))
    assert is_retryable(caught.value)


def test_a_connection_lost_while_the_dialect_reads_the_server_is_retried(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLAlchemy's first look at a server (``dialect.initialize``) runs on a connection that cannot
    reconnect and swallows some failures; after a server restart the next statement there raised
    ``ResourceClosedError`` ("This Connection is closed"), which reached a fault test's worker
    untranslated. It is a lost connection: retried, and a ControlTableError when retries run out."""
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    original = SQLiteDialect_pysqlite.initialize
    failures = [0]

    def initialize(self: Any, connection: Any) -> None:
        if failures[0] > 0:
            failures[0] -= 1
            raise sa_exc.ResourceClosedError("This Connection is closed")
        original(self, connection)

    monkeypatch.setattr(SQLiteDialect_pysqlite, "initialize", initialize)
    failures[0] = 2
    db = Database(f"sqlite:///{tmp_path / 'a.db'}")
    assert db.run(lambda conn: conn.execute(text("select 7")).scalar()) == 7
    assert failures[0] == 0  # both failed initialisations were retried, on new connections
    db.dispose()
    failures[0] = 100
    once = Database(f"sqlite:///{tmp_path / 'b.db'}", retries=0)
    with pytest.raises(DatabaseUnavailableError, match="read the server's settings"):
        once.run(lambda conn: conn.execute(text("select 7")).scalar())
    once.dispose()


def test_errors_not_safe_to_retry_are_reported_at_once(db: Database) -> None:
    flaky = _Flaky(psycopg_error("42501"), 10)
    with pytest.raises(PermissionDeniedError):
        db.run(flaky)
    assert flaky.calls == 1


def test_retries_stop_at_the_deadline(db: Database) -> None:
    db.retries = 100
    flaky = _Flaky(sqlite3.OperationalError("database is locked"), 1000)
    start = time.monotonic()
    with pytest.raises(DatabaseBusyError):
        db.run(flaky, deadline=time.monotonic() + 0.5)
    # Bounded by the deadline (0.5 s), not by 100 retries of up to 2 s: 5 s (10x) is the hang detector.
    assert time.monotonic() - start < 5, "hang: the retries ran past the deadline"
    assert flaky.calls < 100


def test_bad_values_from_the_driver_are_configuration_errors(db: Database) -> None:
    def encode(conn: Any) -> None:
        conn.execute(text("SELECT :x"), {"x": "\ud800"})

    with pytest.raises(ConfigurationError):
        db.run(encode)

    def overflow(conn: Any) -> None:
        conn.execute(text("SELECT :x"), {"x": 2**70})

    with pytest.raises(ConfigurationError):
        db.run(overflow)


# -- passwords --------------------------------------------------------------------------------------
@pytest.mark.parametrize("textual", [
    "postgresql+psycopg://bob:pw-SECRET-1@host:5432/db",
    "'bob:pw-SECRET-1@host/db' is not a database URL",
    "mssql+pyodbc:///?odbc_connect=DRIVER%3Dx%3BPWD%3Dpw-SECRET-1",
    "Driver={ODBC};Server=h;UID=bob;PWD=pw-SECRET-1;",
    "host=h user=bob password=pw-SECRET-1 dbname=db",
])
def test_redact_masks_passwords(textual: str) -> None:
    assert "pw-SECRET-1" not in redact(textual, ["pw-SECRET-1"])
    assert "SECRET" not in redact(textual.replace("%3D", "="))


def test_safe_url_and_repr_hide_the_password() -> None:
    url = make_url("mysql+pymysql://bob:pw-SECRET-1@127.0.0.1:1/x")
    assert "pw-SECRET-1" not in safe_url(url)
    ct = ControlTable(url.render_as_string(hide_password=False), connect_timeout=1)
    assert "pw-SECRET-1" not in repr(ct)
    with pytest.raises(DatabaseUnavailableError) as info:
        ct.ping()
    assert "pw-SECRET-1" not in str(info.value)


# -- connection settings --------------------------------------------------------------------------
def test_postgres_connect_args_keep_the_urls_own_settings() -> None:
    url = make_url("postgresql+psycopg://u@h/db?options=-c%20search_path%3Dx&keepalives_idle=99")
    args = ct_connect.connect_args(url, connect_timeout=0.5, statement_timeout=30)
    assert args["connect_timeout"] == 2  # libpq's minimum
    assert "keepalives_idle" not in args  # the URL says 99
    # No startup options of our own (a pooler refuses them): the URL's own pass through untouched.
    assert "options" not in args
    assert args["keepalives"] == 1 and args["tcp_user_timeout"] > 0
    assert "prepare_threshold" in args and args["prepare_threshold"] is None  # no server-side prepares
    none = ct_connect.connect_args(make_url("postgresql+psycopg://u@h/db"), connect_timeout=5, statement_timeout=None)
    assert "options" not in none
    own = ct_connect.connect_args(make_url("postgresql+psycopg://u@h/db?prepare_threshold=5"), connect_timeout=5,
                                  statement_timeout=30)
    assert own["prepare_threshold"] == 5  # the URL's choice wins, as the number psycopg needs
    assert "prepare_threshold" not in ct_connect.connect_args(
        make_url("postgresql+psycopg2://u@h/db"), connect_timeout=5, statement_timeout=30)


def test_connect_args_per_driver() -> None:
    my = ct_connect.connect_args(make_url("mysql+pymysql://u@h/db"), connect_timeout=3, statement_timeout=60)
    assert my == {"connect_timeout": 3, "read_timeout": 3, "write_timeout": 3}
    ms = ct_connect.connect_args(make_url("mssql+pyodbc://u@dsn"), connect_timeout=2.5, statement_timeout=60)
    assert ms == {"timeout": 3}
    ora = ct_connect.connect_args(make_url("oracle+oracledb://u@h/?service_name=x"), connect_timeout=4,
                                  statement_timeout=60)
    assert ora["tcp_connect_timeout"] == 4.0 and ora["expire_time"] >= 1
    lite = ct_connect.connect_args(make_url("sqlite:///x.db"), connect_timeout=4, statement_timeout=None)
    assert lite == {"timeout": 60.0}
    # Kept on the Database for connections opened outside the pool (the wake-up listener).
    db = Database("mysql+pymysql://u@127.0.0.1:1/db", connect_timeout=7)
    assert db.connect_args["connect_timeout"] == 7
    assert Database(db.engine).connect_args == {}  # an engine passed in keeps its own settings


def test_timeouts_are_validated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    for bad in (float("nan"), float("inf"), -1, 0, 10**9, "5"):
        with pytest.raises(ConfigurationError, match="connect_timeout"):
            ControlTable(url, connect_timeout=bad)  # type: ignore[arg-type]
    for bad in (float("nan"), float("inf"), -1, 10**9, "5"):
        with pytest.raises(ConfigurationError, match="statement_timeout"):
            ControlTable(url, statement_timeout=bad)  # type: ignore[arg-type]
    ControlTable(url, statement_timeout=None).close()
    ControlTable(url, statement_timeout=0).close()


def test_isolation_is_set_once_per_connection(backend_url: str) -> None:
    ct = ControlTable(backend_url)
    try:
        engine = ct.db.engine
        if engine.dialect.name == "sqlite":
            assert ct.db.run(lambda c: c.exec_driver_sql("PRAGMA busy_timeout").scalar()) == 120_000
            return
        # Not a per-checkout execution option: the dialect sets it when a connection is made.
        assert engine.get_execution_options().get("isolation_level") is None
        dialect = engine.dialect
        assert (getattr(dialect, "_on_connect_isolation_level", None) or dialect.isolation_level) == "READ COMMITTED"
        if engine.dialect.name == "postgresql":
            assert ct.db.run(lambda c: c.exec_driver_sql("SHOW transaction_isolation").scalar()) == "read committed"
            # No session state (a pooler would hand it to someone else, or lose it): the statement
            # timeout is kept by the client (test_connect_deadlines.py).
            assert ct.db.run(lambda c: c.exec_driver_sql("SHOW statement_timeout").scalar()) == ct.db.run(
                lambda c: c.exec_driver_sql("SELECT reset_val FROM pg_settings WHERE name = 'statement_timeout'")
                .scalar())
            return
        assert ct.db.run(lambda c: c.exec_driver_sql("SELECT @@tx_isolation").scalar()) == "READ-COMMITTED"
        assert float(ct.db.run(lambda c: c.exec_driver_sql("SELECT @@max_statement_time").scalar())) == 120.0

        def sets(conn: Any) -> tuple[int, int]:
            row = conn.exec_driver_sql("SHOW SESSION STATUS LIKE 'Com_set_option'").first()
            return int(row[1]), int(conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar())

        before, conn_id = ct.db.run(sets)
        for _ in range(20):
            ct.db.run(lambda c: c.exec_driver_sql("SELECT 1").scalar())
        after, same_id = ct.db.run(sets)
        assert same_id == conn_id  # the pool handed back the same connection
        assert after - before <= 1  # no SET per checkout (was two per transaction)
    finally:
        ct.close()


# -- live diagnosis ---------------------------------------------------------------------------------
def _server(backend: str) -> str:
    url = os.environ.get(f"CONTROLTABLE_TEST_{backend.upper()}_URL")
    if not url:
        pytest.skip(f"{backend} is not configured")
    return url


def test_postgres_unknown_role_missing_database_and_no_privileges() -> None:
    base = make_url(_server("postgres"))
    with pytest.raises(AuthenticationError, match="refused the login.*user name and password"):
        ControlTable(base.set(username=f"nobody_{uuid.uuid4().hex[:8]}")).ping()
    with pytest.raises(DatabaseMissingError, match="does not exist.*CREATE DATABASE"):
        ControlTable(base.set(database=f"missing_{uuid.uuid4().hex[:8]}")).install()

    role = f"ct_noprivs_{uuid.uuid4().hex[:8]}"
    owner = ControlTable(base, namespace=role)
    owner.install()
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        ct = ControlTable(base.set(username=role), namespace=role)
        with pytest.raises(PermissionDeniedError, match="lacks a privilege.*grant"):
            ct.set_capacity("w", 1)
        with pytest.raises(PermissionDeniedError):
            ct.status()
        with pytest.raises(PermissionDeniedError):
            ct.install()
        ct.close()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %(r)s", {"r": role}
            )
            conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')
        admin.dispose()
        owner.close()


def test_mysql_wrong_password_missing_database_and_no_privileges() -> None:
    base = make_url(_server("mysql"))
    user = f"ct_np_{uuid.uuid4().hex[:8]}"
    with pytest.raises(DatabaseMissingError, match="does not exist"):
        ControlTable(base.set(database=f"missing_{uuid.uuid4().hex[:8]}")).ping()
    owner = ControlTable(base, namespace=user)
    owner.install()
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'right-pw-1'")
        conn.exec_driver_sql(f"CREATE USER '{user}'@'localhost' IDENTIFIED BY 'right-pw-1'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{base.database}`.`ct_meta` TO '{user}'@'%%'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{base.database}`.`ct_meta` TO '{user}'@'localhost'")
    try:
        with pytest.raises(AuthenticationError, match="refused the login") as info:
            ControlTable(base.set(username=user, password="wrong-pw-2")).ping()
        assert "wrong-pw-2" not in str(info.value)
        ct = ControlTable(base.set(username=user, password="right-pw-1"), namespace=user)
        ct.ping()
        with pytest.raises(PermissionDeniedError, match="lacks a privilege"):
            ct.set_capacity("w", 1)
        ct.close()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'%%'")
            conn.exec_driver_sql(f"DROP USER IF EXISTS '{user}'@'localhost'")
        admin.dispose()
        owner.close()


# -- a server that accepts connections and never answers ---------------------------------------------
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP listener that accepts every connection and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    thread.join(2)
    for s in held:
        s.close()
    srv.close()


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_a_silent_server_fails_within_the_connect_timeout(silent_port: int, driver: str) -> None:
    pytest.importorskip("psycopg" if "psycopg" in driver else "pymysql")
    connect_timeout = 2.0
    ct = ControlTable(f"{driver}://u:pw-silent-9@127.0.0.1:{silent_port}/db", connect_timeout=connect_timeout)
    calls = {
        "ping": ct.ping,
        "acquire": lambda: ct.acquire("r", timeout=2),
        "set_capacity": lambda: ct.set_capacity("r", 1),
        "claim": lambda: ct.events("t", key="id").claim(1, wait=2),
    }
    for name, call in calls.items():
        start = time.monotonic()
        with pytest.raises(DatabaseUnavailableError) as info:
            call()
        took = time.monotonic() - start
        # Generous for a loaded machine, and far below the minutes a missing timeout costs.
        assert took < connect_timeout * 3 + 10, (name, took)
        assert "pw-silent-9" not in str(info.value)
    ct.close()


def test_connection_settings_the_driver_refuses_are_configuration_errors(tmp_path: Path) -> None:
    exc = psycopg_error(None, 'invalid connection option "bogus"', name="ProgrammingError")
    assert classify(exc, "postgresql") is Kind.CONFIGURATION
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigurationError, match="refused the connection settings"):
        ControlTable("postgresql+psycopg://u:pw@127.0.0.1:1/db?bogus=1", connect_timeout=2).ping()
    with pytest.raises(ConfigurationError, match="refused the connection settings"):
        ControlTable("postgresql+psycopg://u:pw@127.0.0.1:1/db?bogus=1", connect_timeout=2).set_capacity("r", 1)


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_a_deadline_shortens_the_connect_timeout(silent_port: int, driver: str) -> None:
    pytest.importorskip("psycopg" if "psycopg" in driver else "pymysql")
    db = Database(f"{driver}://u@127.0.0.1:{silent_port}/db", connect_timeout=60)
    start = time.monotonic()
    with pytest.raises(DatabaseUnavailableError):
        db.run(lambda c: c.exec_driver_sql("SELECT 1").scalar(), deadline=time.monotonic() + 2)
    assert time.monotonic() - start < 20  # the deadline (2 s, libpq rounds to whole seconds), not 60 s
    db.dispose()


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "mysql+pymysql"])
def test_acquire_timeout_bounds_the_wait_on_a_silent_server(silent_port: int, driver: str) -> None:
    """``acquire(timeout=2)`` answers near its timeout even when the connect timeout is a minute."""
    pytest.importorskip("psycopg" if "psycopg" in driver else "pymysql")
    ct = ControlTable(f"{driver}://u@127.0.0.1:{silent_port}/db", connect_timeout=60)
    start = time.monotonic()
    with pytest.raises(DatabaseUnavailableError):
        ct.acquire("r", timeout=2)
    assert time.monotonic() - start < 20  # the timeout plus a grace (libpq rounds up), not 60 s
    ct.close()


# -- connection limits, connection poolers, Galera (issues 21, 22, 23) -------------------------------
def test_a_protocol_violation_names_the_pooler_only_while_connecting() -> None:
    # 08P01 is what PgBouncer sends when it refuses a startup parameter; drivers that keep the code
    # at connect (asyncpg) show it then. Later on a live connection it is any protocol violation.
    exc = psycopg_error("08P01", "unsupported startup parameter: options")
    assert classify(exc, "postgresql", connecting=True) is Kind.POOLER
    assert classify(exc, "postgresql") is Kind.UNAVAILABLE


def _translated(db: Database, orig: Exception, dialect: str = "postgresql", **kw: Any) -> ControlTableError:
    db.engine.dialect.name = dialect  # translate as if on that backend (instance attribute only)
    try:
        return db.translate(wrapped(orig), **kw)
    finally:
        del db.engine.dialect.name


@pytest.mark.parametrize("orig", [
    psycopg_error("53300", 'FATAL: too many connections for role "x"'),
    psycopg_error(None, 'connection failed: connection to server at "h", port 5432 failed: FATAL:  sorry, too many '
                        "clients already"),
])
def test_a_server_at_its_connection_limit_is_not_reported_as_down(db: Database, orig: Exception) -> None:
    out = _translated(db, orig, retried=5)
    assert type(out) is TooManyConnectionsError and isinstance(out, DatabaseUnavailableError)
    text = str(out)
    assert "connection limit" in text and "max_connections" in text and "CONNECTION LIMIT" in text
    assert "retried 5 times" in text
    assert "check that the server is running" not in text
    assert is_retryable(out)  # connections come and go: a later attempt may get one


def test_mysql_connection_limits_name_the_settings(db: Database) -> None:
    pymysql = pytest.importorskip("pymysql")
    for code in (1040, 1203, 1226):
        out = _translated(db, pymysql.err.OperationalError(code, "Too many connections"), "mysql")
        assert type(out) is TooManyConnectionsError
        assert "max_user_connections" in str(out) and "check that the server is running" not in str(out)


@pytest.mark.parametrize("orig", [
    psycopg_error(None, 'connection failed: connection to server at "h", port 6432 failed: FATAL:  unsupported '
                        "startup parameter: options"),
    psycopg_error("42P05", 'prepared statement "_pg3_0" already exists', name="DuplicatePreparedStatement"),
    psycopg_error("26000", 'prepared statement "_pg3_3" does not exist', name="InvalidSqlStatementName"),
])
def test_pooler_errors_say_pooler_and_what_to_do(db: Database, orig: Exception) -> None:
    out = _translated(db, orig)
    assert type(out) is PoolerError and isinstance(out, ConfigurationError)
    text = str(out)
    assert "this looks like a connection pooler in transaction mode" in text
    assert "plain URL" in text and "listen_url" in text and "session mode" in text
    assert "check that the server is running" not in text and "report it" not in text
    assert not is_retryable(out)  # every connection meets the same pooler: a setting fixes it


def test_pooler_errors_are_not_retried(db: Database) -> None:
    flaky = _Flaky(psycopg_error("42P05", "prepared statement exists", name="DuplicatePreparedStatement"), 10)
    with pytest.raises(PoolerError):
        db.run(flaky)
    assert flaky.calls == 1


def test_a_prepared_statement_clash_on_a_psycopg_url_turns_prepares_off_once_and_retries() -> None:
    """The safety net behind :func:`controltable.connect.same_session`: a clash on an engine made
    from a psycopg URL refuses prepares for that URL and runs the transaction again, once per
    engine; a second clash is a pooler error as before."""
    from support.live import postgres_url

    from controltable import connect

    url = postgres_url("the prepared-statement safety net")
    before = set(connect._PREPARES_REFUSED)
    database = Database(url)
    try:
        flaky = _Flaky(psycopg_error("42P05", "prepared statement exists", name="DuplicatePreparedStatement"), 1)
        assert database.run(flaky) == "ok" and flaky.calls == 2
        assert not connect.prepares_allowed(database.engine.url)
        again = _Flaky(psycopg_error("26000", "prepared statement does not exist", name="InvalidSqlStatementName"), 1)
        with pytest.raises(PoolerError):
            database.run(again)
        assert again.calls == 1
        with database.engine.connect() as conn:  # new connections of the URL no longer prepare
            assert conn.connection.driver_connection.prepare_threshold is None  # type: ignore[union-attr]
    finally:
        database.dispose()
        connect._PREPARES_REFUSED.clear()
        connect._PREPARES_REFUSED.update(before)


def test_too_many_connections_is_retried(db: Database) -> None:
    flaky = _Flaky(psycopg_error("53300", "too many connections"), 2)
    assert db.run(flaky) == "ok" and flaky.calls == 3


class _FailingCommit:
    """A COMMIT the server refused the first ``n`` times: the engine's commit event rolls the
    transaction back (as a Galera node does with a write set that failed certification) and
    raises ``make()``."""

    def __init__(self, make: Any, n: int) -> None:
        self.make, self.n, self.calls = make, n, 0

    def __call__(self, conn: Any) -> None:
        self.calls += 1
        if self.calls <= self.n:
            conn.exec_driver_sql("ROLLBACK")
            raise self.make()


@pytest.mark.parametrize(("code", "retried"), [
    (1213, True),   # Galera certification failure at COMMIT: the write set was applied nowhere
    (1180, True),   # ER_ERROR_DURING_COMMIT (Galera): rolled back
    (1205, True),   # a brute-force abort seen as a lock wait timeout: rolled back
    (2013, False),  # the connection lost during COMMIT: it may have happened, not retried unless idempotent
])
def test_galera_commit_failures_are_retried_where_nothing_was_applied(db: Database, code: int, retried: bool) -> None:
    pymysql = pytest.importorskip("pymysql")
    from sqlalchemy import event

    failing = _FailingCommit(lambda: pymysql.err.OperationalError(code, "Deadlock: wsrep aborted transaction"), 1)
    event.listen(db.engine, "commit", failing)
    runs = []

    def work(conn: Any) -> str:
        runs.append(1)
        conn.execute(text("SELECT 1"))
        return "ok"

    try:
        if retried:
            assert db.run(work, idempotent=False) == "ok"
            assert len(runs) == 2
        else:
            with pytest.raises(DatabaseUnavailableError):
                db.run(work, idempotent=False)
            assert len(runs) == 1
    finally:
        event.remove(db.engine, "commit", failing)


def test_a_galera_node_not_yet_synced_is_retried_then_reported_as_unavailable(db: Database) -> None:
    pymysql = pytest.importorskip("pymysql")
    flaky = _Flaky(pymysql.err.OperationalError(1047, "WSREP has not yet prepared node for application use"), 2)
    assert db.run(flaky) == "ok" and flaky.calls == 3
    db.retries = 1
    stuck = _Flaky(pymysql.err.OperationalError(1047, "WSREP has not yet prepared node for application use"), 10)
    with pytest.raises(DatabaseUnavailableError) as info:
        db.run(stuck)
    assert stuck.calls == 2 and "retried 1 times" in str(info.value)
    assert not isinstance(info.value, (DatabaseBusyError, UnexpectedDatabaseError))


def test_a_role_at_its_connection_limit_live() -> None:
    """PostgreSQL 53300 for real: a role with CONNECTION LIMIT 0 (a throwaway role, dropped after)."""
    base = make_url(_server("postgres"))
    role = f"ct_lim_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        ct = ControlTable(base.set(username=role, password=None))
        ct.db.retries = 2
        with pytest.raises(TooManyConnectionsError) as info:
            ct.status()
        text = str(info.value)
        assert "connection limit" in text and "CONNECTION LIMIT" in text and "retried 2 times" in text
        assert "check that the server is running" not in text
        with pytest.raises(TooManyConnectionsError):
            ct.ping()
        ct.close()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP ROLE IF EXISTS {role}")
        admin.dispose()


# -- behind a real PgBouncer in transaction mode (Debian's package, started by the test) ----------------
@pytest.fixture(scope="module")
def transaction_pooler() -> Iterator[str]:
    """The URL of a throwaway PgBouncer in transaction mode in front of the test PostgreSQL."""
    reason = pgbouncer.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    upstream = pgbouncer.upstream_url()
    assert upstream is not None
    with pgbouncer.PgBouncer("transaction", upstream) as bouncer:
        yield bouncer.url


def test_a_startup_parameter_refused_by_pgbouncer_is_a_pooler_error(
    transaction_pooler: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not retried (the next connection meets the same pooler): asserted by the retry loop's own
    record (no "retrying" warning from this thread's call), not by how long the call took. Only this
    thread's records count: a loaded run once captured another test's leftover background retries."""
    url = transaction_pooler + "?options=-c%20statement_timeout%3D5000"
    ct = ControlTable(url, connect_timeout=5)
    try:
        for call in (ct.ping, ct.install, ct.status):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="controltable"), pytest.raises(PoolerError) as info:
                call()
            retries = [r.getMessage() for r in caplog.records
                       if "retrying" in r.getMessage() and r.thread == threading.get_ident()]
            assert retries == [], f"retried: the next connection meets the same pooler: {retries}"
            text = str(info.value)
            assert "unsupported startup parameter" in text
            assert "this looks like a connection pooler in transaction mode" in text and "listen_url" in text
            assert "check that the server is running" not in text
    finally:
        ct.close()


def test_a_prepared_statement_clash_behind_pgbouncer_is_a_pooler_error(transaction_pooler: str) -> None:
    """psycopg preparing statements on the server (an engine of the caller's with prepare_threshold=0)
    through a transaction-mode pooler: the next transaction runs on another server connection."""
    url = transaction_pooler
    engines = [create_engine(url, connect_args={"prepare_threshold": 0}) for _ in range(2)]
    cts = [ControlTable(e, namespace=f"pool_{uuid.uuid4().hex[:8]}") for e in engines]
    try:
        with pytest.raises(PoolerError) as info:
            cts[0].install()
            for _ in range(50):
                for ct in cts:
                    ct.status()
        text = str(info.value)
        assert "prepared statement" in text and "connection pooler in transaction mode" in text
        assert "report it" not in text
    finally:
        for ct in cts:
            ct.close()
        for engine in engines:
            engine.dispose()


@pytest.mark.backends("postgres", "mysql")
def test_a_server_that_takes_no_writes_is_reported_as_read_only(backend_url: str) -> None:
    """A standby (here: a session the server makes read-only) is named as such, with the fix, and retried."""
    from sqlalchemy.engine import make_url as _make_url

    url = _make_url(backend_url)
    with ControlTable(backend_url) as writable:
        writable.install()
    if url.get_backend_name() == "postgresql":
        # The server refuses writes exactly as a hot standby does (SQLSTATE 25006).
        ro = url.update_query_dict({"options": "-c default_transaction_read_only=on"})
    else:
        ro = url  # MariaDB: made read-only per transaction below (1792)
    ct = ControlTable(ro.render_as_string(hide_password=False), namespace=f"ro{uuid.uuid4().hex[:8]}")
    try:
        if url.get_backend_name() != "postgresql":
            from sqlalchemy import event as _event

            @_event.listens_for(ct.engine, "begin")
            def _read_only(conn: Any) -> None:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
        with pytest.raises(ReadOnlyDatabaseError) as caught:
            ct.set_capacity("warehouse", 2)  # a write (the control tables exist: install() writes nothing)
        text_ = str(caught.value)
        assert "takes no writes" in text_ and "target_session_attrs=read-write" in text_
        assert "report it" not in text_
        assert is_retryable(caught.value)
    finally:
        ct.close()


def test_a_statement_starved_of_its_callers_time_is_not_blamed_on_the_network_alone(tmp_path: Any) -> None:
    """A loaded CI run: ``acquire(timeout=0)`` spent its second of grace before its first statement, which
    the guard then stopped with 0.1 s left; the error blamed a silent network. Below ``SHORT_BUDGET``
    it names both causes and the fix (a longer timeout); with a real budget, the silent path alone."""
    from controltable import ControlTable
    from controltable.db import SHORT_BUDGET

    ct = ControlTable(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        starved = str(ct.db.overran(RuntimeError("server closed the connection"), "closed", 0.1, True))
        assert "did not answer within the call's timeout" in starved and "mostly gone before" in starved
        assert "longer timeout" in starved
        silent = str(ct.db.overran(RuntimeError("server closed the connection"), "closed", SHORT_BUDGET * 5, True))
        assert "is silent" in silent and "mostly gone" not in silent
    finally:
        ct.close()


@pytest.mark.backends("postgres", "mysql")
def test_a_full_connection_pool_is_a_controltable_error_naming_the_fix(backend_url: str, namespace: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """SQLAlchemy's pool timeout (every pooled connection in use past ``pool_timeout``) leaves as a
    controltable error saying how to fix it, not as ``sqlalchemy.exc.TimeoutError``; and it is not
    retried (a second wait would meet the same full pool). A server's engine passed in is used as
    it is, pool included (SQLite's is rebuilt), so the fix the message names is one that works."""
    engine = create_engine(backend_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    ct = ControlTable(engine, namespace=namespace)
    ct.install()
    held = engine.connect()
    try:
        with pytest.raises(DatabaseBusyError) as caught:
            ct.status()
    finally:
        held.close()
        ct.close()
        engine.dispose()
    message = str(caught.value)
    assert "every pooled connection of this process" in message and "pool_size=" in message
    assert isinstance(caught.value.__cause__, sa_exc.TimeoutError)
    # Only this thread's records: a leftover thread of an earlier test in the same process may log its
    # own retries meanwhile (caplog sees every thread's), and this call runs in this thread.
    here = threading.get_ident()
    assert not [r for r in caplog.records if r.thread == here and "retrying" in r.getMessage()], \
        "the pool wait was retried"
