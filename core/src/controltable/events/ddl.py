"""The event table's shape: reflection, the checks on it, and the DDL ``prepare()`` runs (claim columns, indexes).

Reflection and the DDL statements are separate from claiming: the workflow reflects once per
``EventTable`` object and then only sends DML. Statement builders here are pure; the functions
that read the catalogue or run DDL take the database layer explicitly.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from sqlalchemy import Column, Index, MetaData, SmallInteger, Table, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, NoSuchTableError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, CreateIndex, DDLElement, DropIndex

from .. import dialects
from ..db import Database
from ..errorcodes import is_lock_timeout
from ..errors import ConfigurationError, ControlTableError, NotInstalledError
from .statements import CLAIMED, PENDING, ClaimColumns, invalid_indexes


class TableBusyError(ControlTableError):
    """``prepare()`` could not get the lock its DDL needs: the table was busy throughout."""


class AddColumn(DDLElement):
    """``ALTER TABLE t ADD <column spec>``: the one DDL statement SQLAlchemy Core lacks."""

    def __init__(self, table: Table, column: Column[Any]) -> None:
        self.table = table
        self.column = column


@compiles(AddColumn)
def _add_column(element: AddColumn, compiler: Any, **kw: Any) -> str:
    spec = compiler.process(CreateColumn(element.column), **kw)
    return f"ALTER TABLE {compiler.preparer.format_table(element.table)} ADD {spec}"


def index_name(base: str) -> str:
    """An index name within every backend's limit: long names keep their start and a hash."""
    if len(base) <= 60:
        return base
    return f"{base[:50]}_{hashlib.sha1(base.encode()).hexdigest()[:8]}"


def claim_indexes(
    table: Table, cols: ClaimColumns, name: str, key: str, order_by: str, dialect: str, *,
    filtered_indexes: bool = False,
) -> list[Index]:
    """The claim indexes, covering the rows a claim looks at in claim order.

    * PostgreSQL and SQLite: two partial indexes on ``order_by``, one over pending rows and
      one over claimed rows, so neither the claim of pending rows nor the search for expired
      claims ever reads done rows: claim cost does not grow with table history.
    * SQL Server: ``(ct_state, order_by, key)``, the claim order with the state leading so a
      claim is an ordered seek (``FORCESEEK`` then holds: no scan under UPDLOCK walks into
      rows other workers hold), and ``ct_token`` for completion and the lost-commit look.
      Filtered (``WHERE ct_state = 0`` / ``= 1``) only with ``filtered_indexes=True``: with a
      filtered index on a table, every INSERT, UPDATE and DELETE on it fails (error 1934) in
      a session whose ``QUOTED_IDENTIFIER`` or ``ANSI_NULLS`` is OFF, i.e. the user's own
      writers would break if any of them runs with old session settings.
    * Oracle: ``(ct_state, order_by, key)``, read in order under the claim's FIRST_ROWS hint.
    * MySQL/MariaDB: ``(ct_state, order_by)`` (InnoDB appends the primary key itself).
    """
    p = cols.prefix
    state = cols.of(table, "state")
    order = table.c[order_by]
    k = table.c[key]
    ordered = [order] if order is k else [order, k]
    pending_literal = dialects.state_literal(PENDING, SmallInteger())
    claimed_literal = dialects.state_literal(CLAIMED, SmallInteger())
    if dialect in ("postgresql", "sqlite"):
        return [
            Index(index_name(f"{p}pending_{name}"), order,
                  **dialects.index_where_kwargs(dialect, state == pending_literal)),
            Index(index_name(f"{p}claimed_{name}"), order,
                  **dialects.index_where_kwargs(dialect, state == claimed_literal)),
        ]
    token = cols.of(table, "token")
    if dialect == "mssql":
        if filtered_indexes:
            return [
                Index(index_name(f"{p}pending_{name}"), state, *ordered, mssql_where=state == pending_literal),
                Index(index_name(f"{p}claimed_{name}"), state, *ordered, mssql_where=state == claimed_literal),
                Index(index_name(f"{p}token_{name}"), token, mssql_where=state == claimed_literal),
            ]
        return [Index(index_name(f"{p}claim_{name}"), state, *ordered),
                Index(index_name(f"{p}token_{name}"), token)]
    if dialect == "oracle":
        return [Index(index_name(f"{p}claim_{name}"), state, *ordered)]
    return [Index(index_name(f"{p}claim_{name}"), state, order)]


def qualified(name: str, schema: Optional[str]) -> str:
    return f"{schema}.{name}" if schema else name


def reflect(db: Database, name: str, schema: Optional[str]) -> Table:
    """The user's table as the database has it now."""
    db.ping()
    try:
        with db.translating():
            return Table(name, MetaData(schema=schema), autoload_with=db.engine)
    except NoSuchTableError:
        raise ConfigurationError(
            f"event table {qualified(name, schema)!r} does not exist in {db.safe_url}; "
            "check the table name and schema, or create the table first (controltable adds only its "
            "claim columns and indexes to an existing table)"
        ) from None  # the reflection error adds nothing: one message, not a chained traceback


def key_is_unique(db: Database, table: Table, name: str, schema: Optional[str], key: str) -> bool:
    pk = [c.name for c in table.primary_key.columns]
    if pk == [key]:
        return True
    insp = inspect(db.engine)
    for uq in insp.get_unique_constraints(name, schema=schema):
        if list(uq.get("column_names") or []) == [key]:
            return True
    for ix in insp.get_indexes(name, schema=schema):
        if ix.get("unique") and list(ix.get("column_names") or []) == [key]:
            return True
    return False


def check_columns(db: Database, table: Table, name: str, schema: Optional[str], key: str, order_by: str,
                  time_column: Optional[str]) -> None:
    """The named columns exist and the key is unique; else a :class:`ConfigurationError` saying how to fix it."""
    where = qualified(name, schema)
    for kind, col in (("key", key), ("order_by", order_by), ("time_column", time_column)):
        if col is not None and col not in table.c:
            raise ConfigurationError(
                f"{kind} column {col!r} is not a column of {where!r}; "
                f"its columns are {', '.join(c.name for c in table.c)}"
            )
    if not key_is_unique(db, table, name, schema, key):
        raise ConfigurationError(
            f"key column {key!r} of {where!r} is not unique; claiming needs a primary key "
            f"or unique index on it (e.g. CREATE UNIQUE INDEX ... ON {name} ({key}))"
        )


def check_prepared(table: Table, cols: ClaimColumns, name: str, schema: Optional[str], key: str) -> None:
    missing = [c for c in cols.names() if c not in table.c]
    if missing:
        raise NotInstalledError(
            f"event table {qualified(name, schema)!r} has no claim columns ({', '.join(missing)}); run "
            f"events.prepare() or `controltable events prepare {name} --key {key}` first"
        )


def has_seek_index(db: Database, cols: ClaimColumns, name: str, schema: Optional[str]) -> bool:
    """SQL Server: whether an index leads with the state column, so claims may demand a seek."""
    return any(list(ix.get("column_names") or [])[:1] == [cols.state]
               for ix in inspect(db.engine).get_indexes(name, schema=schema))


def invalid_index_names(conn: Connection, name: str, schema: Optional[str]) -> set[str]:
    """PostgreSQL: indexes of this table that an interrupted ``CREATE INDEX CONCURRENTLY``
    left invalid. ``prepare()`` drops and rebuilds them rather than take them for done."""
    if conn.dialect.name != "postgresql":
        return set()
    query, params = invalid_indexes(name, schema)
    return {str(r[0]) for r in conn.execute(query, params)}


def missing_ddl(
    db: Database, table: Table, cols: ClaimColumns, name: str, schema: Optional[str], key: str, order_by: str,
    *, filtered_indexes: bool = False, disable_lock_escalation: bool = False,
) -> list[Any]:
    """The DDL that would bring ``table`` (freshly reflected) to a prepared event table."""
    stmts: list[Any] = []
    for col in cols.ddl():
        if col.name not in table.c:
            stmts.append(AddColumn(table, col))
            table.append_column(col)
    existing = {ix["name"] for ix in inspect(db.engine).get_indexes(name, schema=schema)}
    if db.engine.dialect.name == "postgresql":
        with db.engine.connect() as conn:
            existing -= invalid_index_names(conn, name, schema)
    stmts.extend(ix for ix in claim_indexes(table, cols, name, key, order_by, db.dialect_name,
                                            filtered_indexes=filtered_indexes) if ix.name not in existing)
    if disable_lock_escalation and db.dialect_name == "mssql":
        stmts.append(dialects.DisableLockEscalation(table))
    return stmts


def _run_each(conn: Connection, statements: list[str], autocommit: bool) -> None:
    """Session settings around a DDL statement, each in its own transaction (SQLAlchemy 1.4 too)."""
    for statement in statements:
        if autocommit:
            conn.exec_driver_sql(statement)
        else:
            with conn.begin():
                conn.exec_driver_sql(statement)


def _first_line(exc: BaseException) -> str:
    orig: Optional[BaseException] = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def run_ddl(db: Database, stmts: list[Any], name: str, schema: Optional[str], *, online: Optional[bool],
            lock_timeout: int) -> list[str]:
    """Run ``stmts`` one transaction each, bounded by ``lock_timeout``; returns the SQL run.

    Indexes are built online where ``online`` (``None``: detected). A statement whose table lock
    is not granted in time raises :class:`TableBusyError` listing the DDL still to run.
    """
    engine = db.engine
    running = engine.dialect.name
    if online is None and any(isinstance(s, Index) for s in stmts):
        with engine.connect() as conn:
            online = dialects.online_ddl_available(conn)
    before, after = dialects.ddl_lock_timeout(running, lock_timeout)
    done: list[str] = []
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, Index):
            ddl: Any = dialects.CreateIndexOnline(stmt) if online else CreateIndex(stmt)
        else:
            ddl = stmt
        text = str(ddl.compile(dialect=engine.dialect)).strip()
        # CREATE INDEX CONCURRENTLY cannot run inside a transaction block.
        autocommit = bool(online) and running == "postgresql" and isinstance(stmt, Index)
        try:
            with engine.connect() as conn:
                if autocommit:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                _run_each(conn, before, autocommit)
                try:
                    if autocommit:
                        if stmt.name in invalid_index_names(conn, name, schema):
                            conn.execute(DropIndex(stmt))
                        conn.execute(ddl)
                    else:
                        with conn.begin():
                            conn.execute(ddl)
                finally:
                    _run_each(conn, after, autocommit)
        except DBAPIError as exc:
            if is_lock_timeout(exc):
                rest = [text] + [str((CreateIndex(s) if isinstance(s, Index) else s).compile(
                    dialect=engine.dialect)).strip() for s in stmts[i + 1:]]
                raise TableBusyError(
                    f"prepare() could not lock {qualified(name, schema)!r} within {lock_timeout} s: other sessions "
                    f"kept it busy ({_first_line(exc)}). Retry later, or run this DDL in a quiet moment "
                    "(each statement on its own):\n" + ";\n".join(rest) + ";"
                ) from exc
            raise db.translate(exc) from exc
        done.append(text)
    return done
