"""DDL errors recognised by code: a lock not granted in time (``prepare()`` on a busy table) and a
step a concurrent installer already applied (``migrations``), never by the message's wording.

The live tests provoke the real driver exceptions (SQLite, PostgreSQL, MariaDB); SQL Server and
Oracle, which cannot run here, are covered by the codes their drivers report.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from support.driver_errors import oracle_error, psycopg_error, pyodbc_error

from controltable import dialects, migrations
from controltable.errorcodes import is_already_applied, is_lock_timeout


@pytest.mark.parametrize("number, expected", [(1222, True), (1205, False), (2705, False)])
def test_sql_server_lock_timeout_by_number(number: int, expected: bool) -> None:
    # 1205 on SQL Server is a deadlock victim, not a lock timeout (unlike MySQL's 1205).
    assert is_lock_timeout(pyodbc_error(number, "HY000")) is expected


@pytest.mark.parametrize("code, expected", [
    ("ORA-00054", True), ("ORA-04021", True), ("ORA-30006", True), ("ORA-00060", False), ("ORA-00955", False)])
def test_oracle_lock_timeout_by_code(code: str, expected: bool) -> None:
    assert is_lock_timeout(oracle_error(code)) is expected


@pytest.mark.parametrize("number, expected", [(2705, True), (1913, True), (2714, True), (3701, True), (1222, False)])
def test_sql_server_already_applied_by_number(number: int, expected: bool) -> None:
    assert is_already_applied(pyodbc_error(number)) is expected


@pytest.mark.parametrize("code, expected", [
    ("ORA-01430", True), ("ORA-00955", True), ("ORA-01408", True), ("ORA-01418", True), ("ORA-00942", False)])
def test_oracle_already_applied_by_code(code: str, expected: bool) -> None:
    assert is_already_applied(oracle_error(code)) is expected


@pytest.mark.parametrize("state, expected", [("42701", True), ("42P07", True), ("23505", True), ("42601", False),
                                             ("55P03", False)])
def test_postgresql_already_applied_by_sqlstate(state: str, expected: bool) -> None:
    # 23505: two sessions creating one index at once clash on the catalogue's unique index.
    assert is_already_applied(psycopg_error(state, name="ProgrammingError")) is expected


def test_message_wording_alone_decides_nothing() -> None:
    """A message that merely mentions "exists" or "lock" is not taken for a code."""
    plain = RuntimeError("relation already exists; database is locked; Lock request time out (1222)")
    assert not is_already_applied(plain)
    assert not is_lock_timeout(plain)
    # A PostgreSQL error whose SQLSTATE says otherwise is judged by its SQLSTATE.
    assert not is_already_applied(psycopg_error("42601", 'column "x" already exists', name="ProgrammingError"))


def test_dialects_keeps_its_name_for_the_same_check() -> None:
    assert dialects.is_lock_timeout is is_lock_timeout
    assert migrations._ALREADY is is_already_applied


# -- live: real driver exceptions ---------------------------------------------------------------
def _raised(run: Any) -> BaseException:
    try:
        run()
    except Exception as exc:  # the driver's (or SQLAlchemy's) own exception
        return exc
    raise AssertionError("the statement was expected to fail")


def test_sqlite_real_errors(tmp_path: Path) -> None:
    path = tmp_path / "ddl.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER)")
    holder.execute("CREATE INDEX t_a ON t (a)")
    dup_col = _raised(lambda: holder.execute("ALTER TABLE t ADD COLUMN a INTEGER"))
    dup_ix = _raised(lambda: holder.execute("CREATE INDEX t_a ON t (a)"))
    dup_table = _raised(lambda: holder.execute("CREATE TABLE t (id INTEGER)"))
    gone_ix = _raised(lambda: holder.execute("DROP INDEX nope"))
    syntax = _raised(lambda: holder.execute("CREATE TABLE"))
    assert all(is_already_applied(e) for e in (dup_col, dup_ix, dup_table, gone_ix))
    assert not is_already_applied(syntax) and not is_lock_timeout(syntax)

    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    busy = _raised(lambda: other.execute("ALTER TABLE t ADD COLUMN b INTEGER"))
    holder.execute("ROLLBACK")
    assert is_lock_timeout(busy) and not is_already_applied(busy)
    # Wrapped by SQLAlchemy, the same.
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with engine.begin() as conn:
            wrapped = _raised(lambda: conn.execute(text("ALTER TABLE t ADD COLUMN c INTEGER")))
    finally:
        holder.execute("ROLLBACK")
        engine.dispose()
    assert is_lock_timeout(wrapped)
    holder.close()
    other.close()


def _hold_table_lock(url: str, table: str, lock_sql: str, release: threading.Event, ready: threading.Event) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(text(lock_sql.format(table=table)))
            ready.set()
            release.wait(10)
    finally:
        engine.dispose()


@pytest.mark.backends("postgres", "mysql")
def test_server_real_errors(backend: str, backend_url: str) -> None:
    table = f"ddl_{uuid.uuid4().hex[:10]}"
    engine = create_engine(backend_url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, a INTEGER)"))
        conn.execute(text(f"CREATE INDEX {table}_a ON {table} (a)"))
    try:
        def run(sql: str) -> BaseException:
            def go() -> None:
                with engine.begin() as conn:
                    conn.execute(text(sql))
            return _raised(go)

        drop_missing = (f"DROP INDEX {table}_nope" if backend == "postgres"
                        else f"DROP INDEX {table}_nope ON {table}")
        already = [
            run(f"ALTER TABLE {table} ADD COLUMN a INTEGER"),
            run(f"CREATE INDEX {table}_a ON {table} (a)"),
            run(f"CREATE TABLE {table} (id INTEGER)"),
            run(drop_missing),
        ]
        assert all(is_already_applied(e) for e in already), [str(e) for e in already]
        missing_table = run(f"ALTER TABLE {table}_none ADD COLUMN b INTEGER")
        assert not is_already_applied(missing_table) and not is_lock_timeout(missing_table)

        # A DDL waiting for a table another transaction uses: bounded by the session's lock timeout.
        release, ready = threading.Event(), threading.Event()
        lock_sql = ("LOCK TABLE {table} IN ACCESS SHARE MODE" if backend == "postgres"
                    else "SELECT * FROM {table} FOR UPDATE")
        holder = threading.Thread(target=_hold_table_lock, args=(backend_url, table, lock_sql, release, ready))
        holder.start()
        try:
            assert ready.wait(10)
            before, after = dialects.ddl_lock_timeout(engine.dialect.name, 1)
            with engine.connect() as conn:
                for s in before:
                    with conn.begin():
                        conn.exec_driver_sql(s)
                try:
                    def alter() -> None:
                        with conn.begin():
                            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN b INTEGER"))
                    busy = _raised(alter)
                finally:
                    for s in after:
                        with conn.begin():
                            conn.exec_driver_sql(s)
        finally:
            release.set()
            holder.join(10)
        assert is_lock_timeout(busy), str(busy)
        assert not is_already_applied(busy)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))
        engine.dispose()
