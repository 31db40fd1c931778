"""The DDL variants ``prepare()`` runs per backend: statistics, online indexes, DDL lock timeouts.

Part of :mod:`controltable.dialects`, which re-exports every name here.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import String
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, CreateIndex, DDLElement
from sqlalchemy.sql.schema import Column, Table

from .defaults import DDL_LOCK_TIMEOUT
from .dialect_traits import Traits


class AnalyzeTable(DDLElement):
    """Refresh the optimizer statistics of one table, the right way per backend.

    A table whose claim columns and indexes were just added has no statistics for them until
    the database's own maintenance runs; until then claims can pick bad plans (on PostgreSQL a
    freshly prepared 100,000-row table drained at less than half the speed it reached after
    ``ANALYZE``)."""

    def __init__(self, table: Table, histograms: tuple[str, ...] = ()) -> None:
        self.table = table
        #: Columns whose value distribution is skewed (the claim state: few pending and claimed
        #: rows next to many done ones). Oracle gathers a frequency histogram on them (``SIZE
        #: 254``): without one its optimizer assumes the states equally common.
        self.histograms = tuple(histograms)


@compiles(AnalyzeTable)
def _analyze_default(element: AnalyzeTable, compiler: Any, **kw: Any) -> str:
    return f"ANALYZE {compiler.preparer.format_table(element.table)}"


@compiles(AnalyzeTable, "mysql")
def _analyze_mysql(element: AnalyzeTable, compiler: Any, **kw: Any) -> str:
    return f"ANALYZE TABLE {compiler.preparer.format_table(element.table)}"


@compiles(AnalyzeTable, "mssql")
def _analyze_mssql(element: AnalyzeTable, compiler: Any, **kw: Any) -> str:
    return f"UPDATE STATISTICS {compiler.preparer.format_table(element.table)}"


@compiles(AnalyzeTable, "oracle")
def _analyze_oracle(element: AnalyzeTable, compiler: Any, **kw: Any) -> str:
    dialect = compiler.dialect

    def quoted(name: str) -> str:
        # DBMS_STATS takes names as strings; a double-quoted one is taken exactly as stored.
        return str(compiler.sql_compiler.render_literal_value(f'"{dialect.denormalize_name(name)}"', String()))

    owner = quoted(element.table.schema) if element.table.schema else "USER"
    method = ""
    if element.histograms:
        columns = ", ".join(compiler.preparer.quote(dialect.denormalize_name(c)) for c in element.histograms)
        option = f"FOR ALL COLUMNS SIZE AUTO FOR COLUMNS {columns} SIZE 254"
        method = f", method_opt => {compiler.sql_compiler.render_literal_value(option, String())}"
    return (f"BEGIN DBMS_STATS.GATHER_TABLE_STATS(ownname => {owner}, "
            f"tabname => {quoted(element.table.name)}, cascade => TRUE{method}); END;")


class DisableLockEscalation(DDLElement):
    """SQL Server: ``ALTER TABLE t SET (LOCK_ESCALATION = DISABLE)`` (an option of ``prepare()``)."""

    def __init__(self, table: Table) -> None:
        self.table = table


@compiles(DisableLockEscalation)
def _lock_escalation(element: DisableLockEscalation, compiler: Any, **kw: Any) -> str:
    return f"ALTER TABLE {compiler.preparer.format_table(element.table)} SET (LOCK_ESCALATION = DISABLE)"


#: MySQL/MariaDB: the character set and collation of the text columns ``prepare()`` adds to a
#: user's table (the claim owner and error). utf8mb4 stores every name and reason a caller may
#: pass; the binary collation is the control tables' own.
CLAIM_TEXT_CHARSET, CLAIM_TEXT_COLLATION = "utf8mb4", "utf8mb4_bin"


def own_charset(type_: Any, length: int) -> Any:
    """``type_`` for a text column ``prepare()`` adds to the user's table, with a character set of
    its own where the table's default would otherwise apply.

    MySQL/MariaDB give a column added by ``ALTER TABLE ... ADD`` the table's default character
    set: on a latin1 table ``claim(owner="ü名前🙂")`` was refused. There the column is declared
    ``VARCHAR(n) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin``. SQL Server's claim text columns are
    ``NVARCHAR`` already (Unicode whatever the collation's code page); PostgreSQL and Oracle keep
    one character set per database (nothing to declare per column); SQLite stores any Unicode."""
    own = mysql.VARCHAR(length, charset=CLAIM_TEXT_CHARSET, collation=CLAIM_TEXT_COLLATION)
    return type_.with_variant(own, "mysql").with_variant(own, "mariadb")


def column_charset(traits: Traits, table: Table, column: Column[Any]) -> Optional[str]:
    """MySQL/MariaDB: a reflected text column's character set (its own, else the table's
    default: SQLAlchemy reflects a column's own only where it differs). ``None`` elsewhere."""
    if not traits.utf8mb4_tables:
        return None
    own = getattr(column.type, "charset", None)
    if own:
        return str(own)
    default = table.kwargs.get("mysql_default charset") or table.kwargs.get("mariadb_default charset")
    return str(default) if default else None


class ConvertColumns(DDLElement):
    """MySQL/MariaDB: ``ALTER TABLE t MODIFY <column spec>, MODIFY ...``, giving the claim text
    columns that an earlier ``prepare()`` added in the table's latin1 (or utf8mb3) the character
    set :func:`own_charset` declares. One statement: the server copies the table to change a
    column's character set, once for all of them."""

    def __init__(self, table: Table, columns: list[Column[Any]]) -> None:
        self.table = table
        self.columns = columns


@compiles(ConvertColumns)
def _convert_columns(element: ConvertColumns, compiler: Any, **kw: Any) -> str:
    specs = ", ".join(f"MODIFY {compiler.process(CreateColumn(c), **kw)}" for c in element.columns)
    return f"ALTER TABLE {compiler.preparer.format_table(element.table)} {specs}"


#: SQL Server versions whose ``CREATE INDEX ... WITH (ONLINE = ON (WAIT_AT_LOW_PRIORITY ...))``
#: exists (2022); and how long the build waits in the low-priority queue.
LOW_PRIORITY_INDEX_VERSION = (16,)
LOW_PRIORITY_MINUTES = 1
#: ``SERVERPROPERTY('EngineEdition')`` of Azure SQL Database (5) and Azure SQL Managed Instance (8):
#: they have the 2022 syntax but report major version 12, so the version alone never opens the gate.
AZURE_EDITIONS = (5, 8)
#: SQL Server editions that build indexes online: 3 = Enterprise/Developer/Evaluation, and Azure.
ONLINE_EDITIONS = (3,) + AZURE_EDITIONS
#: Where :func:`online_ddl_available` notes the engine edition it read, on the engine's dialect
#: (like SQLAlchemy's own ``server_version_info``), for :class:`CreateIndexOnline` to compile by.
EDITION_ATTRIBUTE = "controltable_engine_edition"


class CreateIndexOnline(DDLElement):
    """``CREATE INDEX`` that lets writers go on while it builds, where the server offers it:
    ``CONCURRENTLY`` on PostgreSQL (outside a transaction), ``WITH (ONLINE = ON)`` on SQL Server
    and ``ONLINE`` on Oracle (both Enterprise Edition features). InnoDB builds secondary indexes
    online by default; SQLite has one writer anyway."""

    def __init__(self, index: Any) -> None:
        self.index = index


@compiles(CreateIndexOnline)
def _create_index_online(element: CreateIndexOnline, compiler: Any, **kw: Any) -> str:
    text = str(compiler.process(CreateIndex(element.index), **kw)).strip()
    name = compiler.dialect.name
    if name == "postgresql":
        return text.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1)
    if name == "mssql":
        version = tuple(getattr(compiler.dialect, "server_version_info", None) or ())
        azure = getattr(compiler.dialect, EDITION_ATTRIBUTE, None) in AZURE_EDITIONS
        if version >= LOW_PRIORITY_INDEX_VERSION or azure:
            # SQL Server 2022+ by its version, Azure by its engine edition (see AZURE_EDITIONS): the build's
            # schema-lock request waits in a low-priority queue (new readers and writers pass it) and
            # gives up itself, as a lock timeout.
            return (text + f" WITH (ONLINE = ON (WAIT_AT_LOW_PRIORITY (MAX_DURATION = {LOW_PRIORITY_MINUTES} "
                    "MINUTES, ABORT_AFTER_WAIT = SELF)))")
        return text + " WITH (ONLINE = ON)"
    if name == "oracle":
        return text + " ONLINE"
    return text


class RebuildIndex(DDLElement):
    """SQL Server: ``CREATE INDEX ... WITH (DROP_EXISTING = ON[, ONLINE = ON])``, for a claim index
    that exists under its name with another ``INCLUDE`` list (an earlier ``prepare()`` built it
    without the claim predicates). One statement: the old index serves until the new one is built,
    online where the edition offers it (see :class:`CreateIndexOnline`)."""

    def __init__(self, index: Any, online: bool = False) -> None:
        self.index = index
        self.online = online


@compiles(RebuildIndex)
def _rebuild_index(element: RebuildIndex, compiler: Any, **kw: Any) -> str:
    text = str(compiler.process(CreateIndex(element.index), **kw)).strip()
    options = ["DROP_EXISTING = ON"] + (["ONLINE = ON"] if element.online else [])
    return f"{text} WITH ({', '.join(options)})"


def stale_includes(reflected: Sequence[Mapping[str, Any]], wanted: list[Any]) -> list[Any]:
    """SQL Server: the ``wanted`` indexes that exist (in ``reflected``, the inspector's
    ``get_indexes``) under their name with another ``INCLUDE`` list, to rebuild. Pure. A
    reflection that does not report ``INCLUDE`` (SQLAlchemy 1.4) finds none."""
    have = {ix.get("name"): (ix.get("dialect_options") or {}).get("mssql_include") for ix in reflected}
    stale = []
    for ix in wanted:
        want = sorted(str(c) for c in (ix.dialect_options["mssql"]["include"] or []))
        found = have.get(ix.name)
        if ix.name in have and found is not None and sorted(str(c) for c in found) != want:
            stale.append(ix)
    return stale


def online_ddl_available(conn: Any) -> bool:
    """Whether this server builds indexes online (see :class:`CreateIndexOnline`)."""
    name = conn.dialect.name
    if name == "postgresql":
        return True
    try:
        if name == "mssql":
            edition = int(conn.exec_driver_sql("SELECT CAST(SERVERPROPERTY('EngineEdition') AS INT)").scalar())
            setattr(conn.dialect, EDITION_ATTRIBUTE, edition)
            return edition in ONLINE_EDITIONS
        if name == "oracle":
            banner = conn.exec_driver_sql("SELECT banner FROM v$version WHERE ROWNUM = 1").scalar()
            return "enterprise" in str(banner).lower()
    except Exception:  # no right to read the edition: build the ordinary way
        return False
    return False


def ddl_lock_timeout(dialect_name: str, seconds: int = DDL_LOCK_TIMEOUT) -> tuple[list[str], list[str]]:
    """(statements before a DDL statement, statements after it) that bound its wait for the
    table's lock, so ``prepare()`` on a busy table fails after ``seconds`` with a clear error
    instead of queueing (on PostgreSQL every later reader would queue behind it) or failing at
    once (Oracle's ORA-00054). Session settings, reset afterwards: the connection is pooled."""
    n = int(seconds)
    if dialect_name == "oracle":
        return [f"ALTER SESSION SET DDL_LOCK_TIMEOUT = {n}"], ["ALTER SESSION SET DDL_LOCK_TIMEOUT = 0"]
    if dialect_name == "postgresql":
        return [f"SET lock_timeout = '{n}s'"], ["RESET lock_timeout"]
    if dialect_name == "mysql":
        return [f"SET SESSION lock_wait_timeout = {n}"], ["SET SESSION lock_wait_timeout = DEFAULT"]
    if dialect_name == "mssql":
        return [f"SET LOCK_TIMEOUT {n * 1000}"], ["SET LOCK_TIMEOUT -1"]
    return [], []
