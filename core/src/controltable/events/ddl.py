"""The event table's shape: reflection, the checks on it, and the DDL ``prepare()`` runs (claim columns, indexes).

Reflection and the DDL statements are separate from claiming: the workflow reflects once per
``EventTable`` object and then only sends DML. Statement builders here are pure; the functions
that read the catalogue or run DDL take the database layer explicitly.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Optional, Sequence

from sqlalchemy import Column, Index, MetaData, SmallInteger, String, Table, and_, inspect, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, NoSuchTableError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, CreateIndex, DDLElement, DropIndex

from .. import dialects
from ..db import Database
from ..defaults import DDL_BACKFILL_BATCH, DDL_LOCK_RETRY_WAIT
from ..errorcodes import is_lock_timeout
from ..errors import ConfigurationError, ControlTableError, NotInstalledError, UnexpectedDatabaseError
from ..schema import build_schema
from .statements import CLAIMED, PENDING, ClaimColumns, any_unset, backfill_batch, invalid_indexes


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


class BackfillClaimColumns(DDLElement):
    """SQL Server, after a metadata-only ``prepare()`` (see :meth:`ClaimColumns.ddl`): set the
    rows the nullable counters left NULL to pending, in batches of ``size`` rows, each batch a
    transaction of its own (row locks only, below lock escalation), until none is left.

    Not one statement: :func:`run_ddl` runs :func:`statements.backfill_batch` and
    :func:`statements.any_unset` in a loop. Compiled, it prints the batch statement (what a
    DBA would see repeated)."""

    def __init__(self, table: Table, cols: ClaimColumns, key: str, size: int) -> None:
        self.table = table
        self.cols = cols
        self.key = key
        self.size = size

    def batch(self) -> Any:
        return backfill_batch(self.table, self.cols, self.key, self.size)


@compiles(BackfillClaimColumns)
def _backfill(element: BackfillClaimColumns, compiler: Any, **kw: Any) -> str:
    text = compiler.sql_compiler.process(element.batch(), literal_binds=True)
    return f"{text}  -- repeated, one transaction per batch, until no row has {element.cols.state} NULL"


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
      writers would break if any of them runs with old session settings. The filtered layout
      adds ``(key) WHERE ct_state IS NULL`` (normally empty), through which claims find rows a
      producer inserted with explicit NULL claim columns (see ``EventTable``).
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
    facts = dialects.traits(dialect)
    layout = facts.claim_indexes
    if layout == "partial":
        return [
            Index(index_name(f"{p}pending_{name}"), order,
                  **dialects.index_where_kwargs(facts, state == pending_literal)),
            Index(index_name(f"{p}claimed_{name}"), order,
                  **dialects.index_where_kwargs(facts, state == claimed_literal)),
        ]
    token = cols.of(table, "token")
    if layout == "included":
        if filtered_indexes:
            return [
                Index(index_name(f"{p}pending_{name}"), state, *ordered, mssql_where=state == pending_literal,
                      mssql_include=[cols.name("available_at")]),
                Index(index_name(f"{p}claimed_{name}"), state, *ordered, mssql_where=state == claimed_literal,
                      mssql_include=[cols.expires_at]),
                Index(index_name(f"{p}token_{name}"), token, mssql_where=state == claimed_literal),
                # Rows inserted with an explicit NULL state, which claims set pending: found by a seek.
                Index(index_name(f"{p}unset_{name}"), k, mssql_where=state.is_(None)),
            ]
        # INCLUDE the claim's other predicates: a backed-off row or a live claim the walk passes
        # is rejected from the index leaf, with no key lookup (and no U lock held to commit).
        include = [cols.name("available_at"), cols.expires_at]
        return [Index(index_name(f"{p}claim_{name}"), state, *ordered, mssql_include=include),
                Index(index_name(f"{p}token_{name}"), token)]
    if layout == "token":
        # The token index: completion and the lost-commit look find a batch's rows by token.
        return [Index(index_name(f"{p}claim_{name}"), state, *ordered), Index(index_name(f"{p}token_{name}"), token)]
    return [Index(index_name(f"{p}claim_{name}"), state, order)]


def qualified(name: str, schema: Optional[str]) -> str:
    return f"{schema}.{name}" if schema else name


def reflect(db: Database, name: str, schema: Optional[str], *, deadline: Optional[float] = None) -> Table:
    """The user's table as the database has it now: one read transaction through ``Database.run``,
    so its statements, connections and retries are bounded by ``deadline`` like any other call's."""
    return db.run(lambda conn: reflect_in(conn, db, name, schema), deadline=deadline)


def reflect_in(conn: Connection, db: Database, name: str, schema: Optional[str]) -> Table:
    """:func:`reflect` inside the caller's transaction."""
    try:
        return Table(name, MetaData(schema=schema), autoload_with=conn)
    except NoSuchTableError:
        raise ConfigurationError(
            f"event table {qualified(name, schema)!r} does not exist in {db.safe_url}; "
            "check the table name and schema, or create the table first (controltable adds only its "
            "claim columns and indexes to an existing table)"
        ) from None  # the reflection error adds nothing: one message, not a chained traceback


def key_is_unique(bind: Any, table: Table, name: str, schema: Optional[str], key: str) -> bool:
    """Whether ``key`` alone is the primary key or a unique constraint or index (``bind``: the
    connection of the caller's transaction, or an engine)."""
    pk = [c.name for c in table.primary_key.columns]
    if pk == [key]:
        return True
    insp = inspect(bind)
    for uq in insp.get_unique_constraints(name, schema=schema):
        if list(uq.get("column_names") or []) == [key]:
            return True
    for ix in insp.get_indexes(name, schema=schema):
        if ix.get("unique") and list(ix.get("column_names") or []) == [key]:
            return True
    return False


#: Per control-table name suffix (``meta``, ``request``, ...): the columns every installed version of
#: that table has (declared NOT NULL without a server default: the columns later versions added all
#: have a default or allow NULL).
_CONTROL_TABLES = {t.name: frozenset(c.name.lower() for c in t.columns if not c.nullable and c.server_default is None)
                   for t in build_schema("").tables}


def control_table_kind(table: Table) -> Optional[str]:
    """Which control table ``table`` is (``"request"``, ``"meta"``...), whatever its prefix, or None.

    Pure: told from the reflected table's name (one of the control tables' names after any
    prefix) and shape (every column that table has had in every schema version), so a user table
    merely called ``orders_request`` is not mistaken for one.
    """
    name = table.name.lower()
    columns = {c.name.lower() for c in table.columns}
    for suffix, required in _CONTROL_TABLES.items():
        if name.endswith(suffix) and required <= columns:
            return suffix
    return None


def refuse_control_table(table: Table, name: str, schema: Optional[str]) -> None:
    """A control table is never an event table: ``prepare()`` would add claim columns and indexes
    to controltable's own bookkeeping, and claims would hand its rows out as events."""
    kind = control_table_kind(table)
    if kind is not None:
        raise ConfigurationError(
            f"{qualified(name, schema)!r} is one of controltable's own control tables (its {kind!r} table), "
            "not an event table; pass the name of your own table that holds the events "
            "(controltable adds claim columns to that table)"
        )


def check_columns(bind: Any, table: Table, name: str, schema: Optional[str], key: str, order_by: str,
                  time_column: Optional[str]) -> None:
    """The named columns exist and the key is unique; else a :class:`ConfigurationError` saying how to fix it.

    A control table (any prefix) is refused first (:func:`refuse_control_table`). ``bind``: the
    connection of the caller's transaction (or an engine), for the catalogue's unique indexes."""
    refuse_control_table(table, name, schema)
    where = qualified(name, schema)
    for kind, col in (("key", key), ("order_by", order_by), ("time_column", time_column)):
        if col is not None and col not in table.c:
            raise ConfigurationError(
                f"{kind} column {col!r} is not a column of {where!r}; "
                f"its columns are {', '.join(c.name for c in table.c)}"
            )
    if not key_is_unique(bind, table, name, schema, key):
        raise ConfigurationError(
            f"key column {key!r} of {where!r} is not unique; claiming needs a primary key "
            f"or unique index on it (e.g. CREATE UNIQUE INDEX ... ON {name} ({key}))"
        )


def check_filter(db: Database, table: Table, conditions: Sequence[Any]) -> None:
    """Raise a :class:`ConfigurationError` if the caller's ``where=`` filter alone is refused by the database.

    Called when a claim that used a filter failed as "not installed" or with an error
    controltable has no diagnosis for: ``text("junk")`` names no column (SQLite says "no such
    column", PostgreSQL 42703) or is no SQL at all (a syntax error), which would otherwise read as
    missing control tables. The filter is run on its own (one row at most, nothing locked); if it
    runs, the claim's error stands and the caller re-raises it.
    """
    if not conditions:
        return
    probe = select(literal(1)).select_from(table).where(and_(*conditions)).limit(1)
    try:
        db.run(lambda conn: conn.execute(probe).first())
    except (NotInstalledError, UnexpectedDatabaseError, ConfigurationError) as exc:
        raise ConfigurationError(
            f"the where= filter on {table.name!r} was refused by the database: {db.short(exc.__cause__ or exc)}; "
            f"fix the filter (its SQL and column names: the table's columns are "
            f"{', '.join(c.name for c in table.columns)}), or build it from columns, e.g. "
            "where=lambda t: t.c.region == 'eu'"
        ) from exc


def check_prepared(table: Table, cols: ClaimColumns, name: str, schema: Optional[str], key: str) -> None:
    missing = [c for c in cols.names() if c not in table.c]
    if missing:
        raise NotInstalledError(
            f"event table {qualified(name, schema)!r} has no claim columns ({', '.join(missing)}); run "
            f"events.prepare() or `controltable events prepare {name} --key {key}` first"
        )


def has_seek_index(bind: Any, cols: ClaimColumns, name: str, schema: Optional[str]) -> bool:
    """SQL Server: whether an index leads with the state column, so claims may demand a seek."""
    return any(list(ix.get("column_names") or [])[:1] == [cols.state]
               for ix in inspect(bind).get_indexes(name, schema=schema))


def load(db: Database, cols: ClaimColumns, name: str, schema: Optional[str], key: str, order_by: str,
         time_column: Optional[str], *, prepared: bool, deadline: Optional[float]) -> tuple[Table, bool]:
    """The event table reflected and checked, and whether claims may demand a seek (SQL Server).

    One read transaction through ``Database.run`` under ``deadline``: the first call on an
    ``EventTable`` reflects, and its wait (``claim(wait=3)``) must bound that too, connections,
    catalogue queries and retries included; a silent network ends it like any other statement.
    ``prepared``: the claim columns must exist (claims), or not yet (``prepare()``).
    """
    seeks = db.traits.seek_hints

    def fn(conn: Connection) -> tuple[Table, bool]:
        table = reflect_in(conn, db, name, schema)
        check_columns(conn, table, name, schema, key, order_by, time_column)
        if not prepared:
            return table, False
        check_prepared(table, cols, name, schema, key)
        return table, bool(seeks and has_seek_index(conn, cols, name, schema))

    return db.run(fn, deadline=deadline)


def invalid_index_names(conn: Connection, name: str, schema: Optional[str]) -> set[str]:
    """PostgreSQL: indexes of this table that an interrupted ``CREATE INDEX CONCURRENTLY``
    left invalid. ``prepare()`` drops and rebuilds them rather than take them for done."""
    if not dialects.traits(conn.dialect.name).concurrent_index:
        return set()
    return {str(r[0]) for r in conn.execute(invalid_indexes(name, schema))}


def missing_ddl(
    db: Database, table: Table, cols: ClaimColumns, name: str, schema: Optional[str], key: str, order_by: str,
    *, filtered_indexes: bool = False, disable_lock_escalation: bool = False,
) -> list[Any]:
    """The DDL that would bring ``table`` (freshly reflected) to a prepared event table."""
    stmts: list[Any] = []
    metadata_only = db.traits.adds_columns_nullable
    unset = metadata_only and cols.state in table.c and bool(table.c[cols.state].nullable)
    convert: list[Column[Any]] = []
    for col in cols.ddl(metadata_only=metadata_only):
        if col.name not in table.c:
            stmts.append(AddColumn(table, col))
            table.append_column(col)
            unset = unset or (metadata_only and col.name == cols.state)
        elif needs_own_charset(db, table, col.name):
            convert.append(col)
    if convert:
        stmts.append(dialects.ConvertColumns(table, convert))
    reflected = inspect(db.engine).get_indexes(name, schema=schema)
    existing = {ix["name"] for ix in reflected}
    if dialects.traits(db.engine.dialect.name).concurrent_index:
        with db.engine.connect() as conn:
            existing -= invalid_index_names(conn, name, schema)
    wanted = claim_indexes(table, cols, name, key, order_by, db.dialect_name, filtered_indexes=filtered_indexes)
    stmts.extend(ix for ix in wanted if ix.name not in existing)
    if db.traits.claim_indexes == "included":
        # Indexes an earlier prepare() built without the INCLUDE list claims now rely on.
        stmts.extend(dialects.RebuildIndex(ix) for ix in dialects.stale_includes(reflected, wanted))
    if disable_lock_escalation and db.traits.lock_escalation:
        stmts.append(dialects.DisableLockEscalation(table))
    # Without other DDL: whether an interrupted metadata-only prepare() left rows to set (it is then resumed).
    if unset and (stmts or db.run(lambda conn: conn.scalar(any_unset(table, cols)))):
        # After the indexes: each batch then seeks the claim index (state leading) for NULLs.
        cap = db.traits.rows_per_statement or DDL_BACKFILL_BATCH
        stmts.append(BackfillClaimColumns(table, cols, key, min(cap, DDL_BACKFILL_BATCH)))
    return stmts


def needs_own_charset(db: Database, table: Table, name: str) -> bool:
    """MySQL/MariaDB: whether the existing claim text column ``name`` lacks the character set
    :func:`dialects.own_charset` declares (an earlier ``prepare()`` added it in the table's
    latin1). ``prepare()`` then converts it; until then, values it cannot store are stored
    escaped (see ``EventTable``), never refused."""
    col = table.c[name]
    if not isinstance(col.type, String):
        return False
    have = dialects.column_charset(db.traits, table, col)
    return have is not None and have.lower() != dialects.CLAIM_TEXT_CHARSET


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

    Indexes are built online where ``online`` (``None``: detected). Each statement's lock
    request waits at most ``DDL_LOCK_RETRY_WAIT`` seconds and is then withdrawn and retried,
    for ``lock_timeout`` seconds in all: a DDL statement waiting for its lock blocks every new
    reader and writer queued behind it, so it never waits there long. A statement whose lock is
    not granted in time raises :class:`TableBusyError` listing the DDL still to run.
    """
    engine = db.engine
    running = engine.dialect.name
    if online is None and any(isinstance(s, (Index, dialects.RebuildIndex)) for s in stmts):
        with engine.connect() as conn:
            online = dialects.online_ddl_available(conn)
    wait = max(1, min(int(lock_timeout), DDL_LOCK_RETRY_WAIT))
    before, after = dialects.ddl_lock_timeout(running, wait)
    done: list[str] = []
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, BackfillClaimColumns):
            _backfill_rows(db, stmt)
            done.append(str(stmt.compile(dialect=engine.dialect)).strip())
            continue
        if isinstance(stmt, Index):
            ddl: Any = dialects.CreateIndexOnline(stmt) if online else CreateIndex(stmt)
        elif isinstance(stmt, dialects.RebuildIndex):
            ddl = dialects.RebuildIndex(stmt.index, online=bool(online))
        else:
            ddl = stmt
        text = str(ddl.compile(dialect=engine.dialect)).strip()
        # CREATE INDEX CONCURRENTLY cannot run inside a transaction block.
        autocommit = bool(online) and dialects.traits(running).concurrent_index and isinstance(stmt, Index)
        give_up = time.monotonic() + lock_timeout
        while True:
            try:
                _run_one(engine, stmt, ddl, before, after, autocommit, name, schema)
                break
            except DBAPIError as exc:
                if is_lock_timeout(exc) and time.monotonic() + wait <= give_up:
                    time.sleep(min(0.5, max(0.0, give_up - time.monotonic())))  # let the queue behind it drain
                    continue
                if is_lock_timeout(exc):
                    rest = [text] + [str((CreateIndex(s) if isinstance(s, Index) else s).compile(
                        dialect=engine.dialect)).strip() for s in stmts[i + 1:]]
                    raise TableBusyError(
                        f"prepare() could not lock {qualified(name, schema)!r} within {lock_timeout} s: other "
                        f"sessions kept it busy ({_first_line(exc)}). Retry later, or run this DDL in a quiet "
                        "moment (each statement on its own):\n" + ";\n".join(rest) + ";"
                    ) from exc
                raise db.translate(exc) from exc
        done.append(text)
    return done


def _run_one(engine: Any, stmt: Any, ddl: Any, before: list[str], after: list[str], autocommit: bool,
             name: str, schema: Optional[str]) -> None:
    """One DDL statement on a connection of its own, between the lock-timeout settings."""
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


def _backfill_rows(db: Database, step: BackfillClaimColumns) -> None:
    """Set a metadata-only ``prepare()``'s NULL counters batch by batch, each batch a short
    transaction, until none is left (asked with a select, never a row count)."""
    while True:
        db.run(lambda conn: conn.execute(step.batch()))
        if not db.run(lambda conn: conn.scalar(any_unset(step.table, step.cols))):
            return
