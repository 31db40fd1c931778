"""Every per-dialect difference, in one place: the database clock, row locking, engine set-up.

The business logic (slots, events, work lists) builds portable SQLAlchemy Core statements and
passes them through the helpers here; nothing else in the package looks at the dialect name.
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from sqlalchemy import Float, event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import Select
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.sql.schema import Table

SUPPORTED_DIALECTS = ("postgresql", "mssql", "mysql", "oracle", "sqlite")

S = TypeVar("S", bound=Select)  # type: ignore[type-arg]


class db_now(FunctionElement):  # type: ignore[type-arg]
    """The database server's clock as UTC epoch seconds (a float).

    Leases are measured on this clock only, so clients with skewed clocks still agree. Epoch
    seconds keep lease arithmetic (``db_now() + lease``) identical on every backend.
    """

    type = Float()
    inherit_cache = True
    name = "db_now"


@compiles(db_now)
def _db_now_default(element: Any, compiler: Any, **kw: Any) -> str:
    raise NotImplementedError(f"controltable has no database clock for dialect {compiler.dialect.name!r}")


@compiles(db_now, "postgresql")
def _db_now_pg(element: Any, compiler: Any, **kw: Any) -> str:
    # statement_timestamp(): one value per statement (cheap, and usable in an index condition),
    # and, unlike now(), taken when the statement starts, so a statement that follows a row lock
    # sees the time after the lock was granted. Every backend's clock here behaves that way.
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "mysql")
def _db_now_mysql(element: Any, compiler: Any, **kw: Any) -> str:
    # Pure arithmetic on UTC_TIMESTAMP: no session time zone, no DST ambiguity.
    return "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0)"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "mssql")
def _db_now_mssql(element: Any, compiler: Any, **kw: Any) -> str:
    return "(DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0)"


@compiles(db_now, "oracle")
def _db_now_oracle(element: Any, compiler: Any, **kw: Any) -> str:
    return (
        "((CAST(SYS_EXTRACT_UTC(SYSTIMESTAMP) AS DATE) - DATE '1970-01-01') * 86400"
        " + MOD(EXTRACT(SECOND FROM SYS_EXTRACT_UTC(SYSTIMESTAMP)), 1))"
    )


def lock_rows(stmt: S, table: Table, *, skip_locked: bool = False) -> S:
    """Make ``stmt`` take row locks on ``table``'s rows that it returns.

    ``FOR UPDATE [SKIP LOCKED]`` on PostgreSQL, MySQL/MariaDB and Oracle. SQLAlchemy's mssql
    dialect silently drops ``with_for_update()``, so SQL Server gets table hints instead:
    ``UPDLOCK, ROWLOCK`` and ``READPAST`` to skip rows other sessions hold. SQLite has no row
    locks: its transactions start with ``BEGIN IMMEDIATE`` (see :func:`prepare_engine`), so a
    writer holds the whole database and nothing needs skipping.
    """
    hint = "WITH (UPDLOCK, ROWLOCK, READPAST)" if skip_locked else "WITH (UPDLOCK, ROWLOCK)"
    return stmt.with_for_update(skip_locked=skip_locked).with_hint(table, hint, dialect_name="mssql")  # type: ignore[return-value]


def limit_locked(stmt: S, dialect_name: str, n: int) -> S:
    """Limit a locking select to ``n`` rows where the backend allows it.

    Oracle rejects ``FETCH FIRST`` together with ``FOR UPDATE`` (ORA-02014); there the caller
    fetches ``n`` rows from the cursor, and SKIP LOCKED locks rows as they are fetched.
    """
    if dialect_name == "oracle":
        return stmt
    return stmt.limit(n)  # type: ignore[return-value]


def update_returning(running: Any, target_name: str) -> bool:
    """Whether a claim can be one ``UPDATE ... WHERE key IN (locking subquery) RETURNING``.

    PostgreSQL, and SQLite (3.35+ with SQLAlchemy 2). Checked on the dialect actually running
    (``running``) and the one the statements are built for (``target_name``, which differs only
    when ``controltable sql`` prints statements for another backend).
    """
    able = getattr(running, "update_returning", getattr(running, "full_returning", False))
    return bool(able) and target_name in ("postgresql", "sqlite")


def max_in_list(dialect_name: str) -> int:
    """The most keys to put in one ``IN (...)`` list: Oracle allows 1000 items and SQL Server
    2100 parameters per statement; the others take far more, and fewer statements is faster."""
    return 900 if dialect_name in ("oracle", "mssql", "sqlite") else 5000


def supports_partial_index(dialect_name: str) -> bool:
    """Whether ``CREATE INDEX ... WHERE`` (a partial or filtered index) exists on the backend."""
    return dialect_name in ("postgresql", "sqlite", "mssql")


def index_where_kwargs(dialect_name: str, predicate: Any) -> dict[str, Any]:
    """Keyword arguments that make an ``Index`` partial on the backends that support it."""
    if dialect_name == "postgresql":
        return {"postgresql_where": predicate}
    if dialect_name == "sqlite":
        return {"sqlite_where": predicate}
    if dialect_name == "mssql":
        return {"mssql_where": predicate}
    return {}


def prepare_engine(engine: Engine, *, busy_timeout: float = 60.0) -> Engine:
    """Return an engine configured the way the coordination logic needs.

    * Server backends run at READ COMMITTED, so a statement run after a row lock was granted sees
      every change committed by the previous lock holder (MySQL's default REPEATABLE READ would
      show a stale snapshot). Engines controltable creates set it once per new connection
      (``create_engine(isolation_level=...)``, see :mod:`controltable.connect`); for an engine
      passed in by the caller that does not already use it, ``execution_options`` makes a view
      that shares the caller's pool without changing the caller's engine (SQLAlchemy then sets
      it on each checkout).
    * SQLite starts every transaction with ``BEGIN IMMEDIATE`` so that two processes never both
      read the queue and then fight over the upgrade to a write lock, and waits up to
      ``busy_timeout`` seconds for the lock instead of failing at once.
    """
    name = engine.dialect.name
    if name == "sqlite":
        _configure_sqlite(engine, busy_timeout)
        return engine
    if name in ("postgresql", "mysql", "mssql", "oracle"):
        dialect = engine.dialect
        # SQLAlchemy 2 keeps create_engine(isolation_level=...) here, 1.4 on the dialect itself.
        on_connect = getattr(dialect, "_on_connect_isolation_level", None) or getattr(dialect, "isolation_level", None)
        if str(on_connect or "").upper() == "READ COMMITTED":
            return engine
        return engine.execution_options(isolation_level="READ COMMITTED")
    raise_unsupported(name)
    return engine  # pragma: no cover


def raise_unsupported(name: str) -> None:
    from .errors import ConfigurationError

    raise ConfigurationError(
        f"database dialect {name!r} is not supported; use one of {', '.join(SUPPORTED_DIALECTS)}"
    )


_SQLITE_CONFIGURED = "_controltable_sqlite_configured"


def _configure_sqlite(engine: Engine, busy_timeout: float = 60.0) -> None:
    if getattr(engine, _SQLITE_CONFIGURED, False):
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        # Let SQLAlchemy, not the driver, emit BEGIN; wait up to busy_timeout for the write lock.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {max(1, int(busy_timeout * 1000))}")  # a validated number
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    setattr(engine, _SQLITE_CONFIGURED, True)


def sqlite_path(url: Any) -> Optional[str]:
    """The file of a SQLite URL, or None for an in-memory database."""
    db = url.database
    if not db or db == ":memory:" or str(db).startswith("file::memory:"):
        return None
    return str(db)
