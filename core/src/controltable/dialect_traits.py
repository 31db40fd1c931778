"""What each database backend offers, as data: the :class:`Traits` per dialect name.

Part of :mod:`controltable.dialects`, which re-exports every name here. Modules outside the
dialect layer ask a :class:`Traits` instead of comparing dialect names (the ``Database`` holds its
backend's, ``db.traits``, looked up once; :func:`traits` looks one up by name): whether LISTEN/NOTIFY
exists, how claims index, what doctor reads, what ``controltable sql`` compiles for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from sqlalchemy.dialects import mssql, oracle
from sqlalchemy.engine import make_url

from .defaults import MSSQL_ROWS_PER_STATEMENT

SUPPORTED_DIALECTS = ("postgresql", "mssql", "mysql", "oracle", "sqlite")

@dataclass(frozen=True)
class Traits:
    """What one backend offers, as data (as SQLAlchemy's dialect classes carry
    ``supports_sane_rowcount`` or ``update_returning``): the rest of the package asks these
    instead of comparing dialect names. Look one up with :func:`traits`; a name controltable does
    not support gets the defaults (a server backend with none of the optional features)."""

    name: str
    #: The server's name in doctor's report (None: the dialect name).
    label: Optional[str] = None
    #: One database file, not a server (SQLite): its own engine set-up, ``BEGIN IMMEDIATE``, no
    #: replicas, no connect-time driver settings.
    file_database: bool = False
    #: The statement a fresh connection's liveness probe runs.
    ping_sql: str = "SELECT 1"
    #: The isolation level transactions run at (SQLite's only one is SERIALIZABLE).
    isolation_level: str = "READ COMMITTED"
    #: What ``controltable sql`` compiles for when no server version is given (what a connected
    #: engine would detect: SQL Server 2019, Oracle 19c).
    script_version: tuple[int, ...] = ()
    #: Push wake-ups (LISTEN/NOTIFY) exist; the pooler probe and a ``listen_url`` apply.
    listen_notify: bool = False
    #: A running statement is cancelled by ``KILL QUERY <thread id>`` from another connection.
    kill_query: bool = False
    #: Control tables declare utf8mb4 with the binary collation.
    utf8mb4_tables: bool = False
    #: ``ALTER TABLE t <keyword> c ...``.
    add_column_keyword: str = "ADD COLUMN"
    #: The claim indexes ``prepare()`` builds: ``"partial"`` (one partial index per claim state),
    #: ``"included"`` (state-led with INCLUDE columns, or filtered, plus a token index),
    #: ``"token"`` (state-led plus a token index) or ``"state"`` (state-led only).
    claim_indexes: str = "state"
    #: Statements find rows by indexed seeks only where an index makes one possible (FORCESEEK).
    seek_hints: bool = False
    #: ``prepare(disable_lock_escalation=True)`` applies.
    lock_escalation: bool = False
    #: Indexes build ``CONCURRENTLY``: outside a transaction, and an interrupted build leaves an
    #: invalid index behind.
    concurrent_index: bool = False
    #: Doctor: the server's version string, and whether it is read-only (a standby, see
    #: ``standby``), by a query; None: what the dialect read when it connected / not checked.
    version_sql: Optional[str] = None
    read_only_sql: Optional[str] = None
    #: A read-only server is a standby in recovery; doctor checks its streaming replication.
    standby: bool = False
    #: Doctor looks for a Galera cluster.
    galera: bool = False
    #: How doctor tells the event table's statistics: ``"pg_stats"``, ``"table_rows"``
    #: (information_schema) or ``"sqlite_stat1"``; and the statement its fix names.
    table_stats: Optional[str] = None
    analyze_keyword: str = "ANALYZE"
    #: The most rows one claim or completion statement may touch, or None for no cap: SQL Server
    #: escalates a statement's row locks to a table lock at about 5,000 locks, which would block
    #: every other worker and producer; its statements stay below that.
    rows_per_statement: Optional[int] = None
    #: An UPDATE's ``rowcount`` says how many rows it changed. Not on SQL Server: a trigger on the
    #: table without ``SET NOCOUNT ON``, or a server with NOCOUNT on (-1, which is truthy), changes
    #: the count the driver reports. There a fenced update of the user's table is confirmed by a
    #: follow-up select in the same transaction (``dialects.confirmed_count``: ``OUTPUT`` without
    #: ``INTO`` is refused on a table with an enabled trigger, error 334), and a control table's
    #: rows are counted by ``OUTPUT deleted.id`` (``dialects.changed_rows``: no triggers there).
    trusts_rowcount: bool = True
    #: ``CREATE INDEX ... WHERE`` (a partial or filtered index) exists: the ``Index`` keyword that
    #: makes one (None: no partial indexes; see ``dialects.index_where_kwargs``).
    partial_index: Optional[str] = None
    #: ``prepare()`` adds the claim counters nullable and then sets them in batches. SQL Server:
    #: ``ADD c SMALLINT NOT NULL DEFAULT 0`` is metadata-only on Enterprise and Azure only; Standard
    #: rewrites the whole table under a schema lock, while a nullable column with a default is
    #: metadata-only on every edition. Elsewhere the NOT NULL form is already metadata-only
    #: (PostgreSQL 11+, MariaDB 10.3+ and MySQL 8.0.12+ instant ADD COLUMN, Oracle 11g+, SQLite),
    #: so the claim predicates there never meet a NULL.
    adds_columns_nullable: bool = False
    #: ``FETCH FIRST`` may go with ``FOR UPDATE`` (not on Oracle).
    limit_under_lock: bool = True
    #: The most keys in one ``IN (...)`` list: Oracle allows 1000 items and SQL Server 2100
    #: parameters per statement; the others take far more, and fewer statements is faster.
    max_in_list: int = 5000
    #: A claim may be one ``UPDATE ... RETURNING``; a ``DELETE`` may return its rows; several
    #: writes may go as one statement of data-modifying CTEs.
    update_returning: bool = False
    delete_returning: bool = False
    cte_writes: bool = False
    #: How a locking select reads the clock after its locks: ``"subquery"``, ``"column"`` or None.
    lock_clock: Optional[str] = None
    #: The driver must be told to fetch no more rows than a claim locks (see :func:`limit_fetch`).
    fetch_limits: bool = False


_MYSQL = Traits(
    "mysql", label="MySQL", script_version=(8, 0), kill_query=True, utf8mb4_tables=True,
    version_sql="SELECT VERSION()", read_only_sql="SELECT @@GLOBAL.read_only", galera=True,
    table_stats="table_rows", analyze_keyword="ANALYZE TABLE", delete_returning=True)

_TRAITS = {t.name: t for t in (
    Traits("postgresql", label="PostgreSQL", script_version=(15, 0), listen_notify=True, claim_indexes="partial",
           concurrent_index=True, version_sql="SELECT current_setting('server_version')",
           read_only_sql="SELECT pg_is_in_recovery()", standby=True, table_stats="pg_stats",
           partial_index="postgresql_where", update_returning=True, cte_writes=True, lock_clock="subquery"),
    Traits("mssql", script_version=(15, 0), add_column_keyword="ADD", claim_indexes="included", seek_hints=True,
           lock_escalation=True, rows_per_statement=MSSQL_ROWS_PER_STATEMENT, trusts_rowcount=False,
           partial_index="mssql_where", adds_columns_nullable=True, max_in_list=900),
    _MYSQL,
    replace(_MYSQL, name="mariadb"),  # SQLAlchemy's MariaDB dialect: the MySQL family
    Traits("oracle", ping_sql="SELECT 1 FROM DUAL", script_version=(19, 0), add_column_keyword="ADD",
           claim_indexes="token", limit_under_lock=False, max_in_list=900, fetch_limits=True),
    Traits("sqlite", label="SQLite", file_database=True, isolation_level="SERIALIZABLE", script_version=(3, 40),
           claim_indexes="partial", version_sql="SELECT sqlite_version()", table_stats="sqlite_stat1",
           partial_index="sqlite_where", max_in_list=900, update_returning=True, delete_returning=True,
           lock_clock="column"),
)}


def traits(name: Optional[str]) -> Traits:
    """The :class:`Traits` of dialect ``name`` (defaults for a name controltable does not support)."""
    found = _TRAITS.get(name or "")
    return found if found is not None else Traits(str(name or ""))


def server_label(name: str, version: str) -> str:
    """The server's name in doctor's report: MariaDB is told from MySQL by its version string."""
    if traits(name).utf8mb4_tables and "mariadb" in version.lower():
        return "MariaDB"
    return traits(name).label or name


def offline_dialect(name: str, version: tuple[int, ...]) -> Any:
    """Dialect ``name`` (supported) set up as a connected engine sets it up for server ``version``.

    An unconnected SQLAlchemy dialect does not know the server: its mssql dialect prints
    ``TEXT`` for long text (a connected one to SQL Server 2012+ prints ``VARCHAR(max)``) and its
    Oracle dialect leaves out what 12c+ servers offer. The attributes a connection's
    ``initialize()`` would set from the server version are set here instead."""
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    d: Any = {"postgresql": postgresql.dialect, "mssql": mssql.dialect, "mysql": mysql.dialect,
              "oracle": oracle.dialect, "sqlite": sqlite.dialect}[name]()
    d.server_version_info = version
    if name == "mssql":
        d._setup_version_attributes()  # deprecate_large_types (2012+), multi-row VALUES, OFFSET/FETCH
        d._supports_nvarchar_max = version >= (9,)
    elif name == "oracle":
        d.supports_identity_columns = version >= (12,)
        d._supports_offset_fetch = getattr(d, "enable_offset_fetch", True) and version >= (12,)
        d.supports_native_boolean = version >= (23,)
    elif name == "postgresql":
        d.supports_identity_columns = version >= (10,)
    return d


def is_sqlite_url(url: Any) -> bool:
    """Whether a URL (a string or a SQLAlchemy ``URL``) is a SQLite database's (False for a
    string that is no URL)."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except Exception:
            return False
    return str(getattr(url, "drivername", "")).startswith("sqlite")


@dataclass(frozen=True)
class Driver:
    """A DBAPI driver as a URL names it (``<dialect>+<name>://``): the module it needs, what
    installs it, and which SQLAlchemy has its dialect. The one table behind the URL spellings
    people type (:func:`controltable.connect.typed_url`) and the "driver not installed" advice."""

    dialect: str
    name: str
    #: The module that must import.
    module: str
    #: What ``pip install`` takes: a controltable extra, or the driver's own package.
    package: str
    #: The first SQLAlchemy major version with its dialect (psycopg 3's came with 2.0).
    sqlalchemy: int = 1

    @property
    def example(self) -> str:
        """A URL to type with this driver."""
        return f"{self.dialect}+{self.name}://user:password@host/db"


#: Every driver controltable knows, per dialect in the order a URL that names none prefers them:
#: psycopg 3 and PyMySQL are what the extras install; psycopg2 and mysqlclient (SQLAlchemy's own
#: defaults) are used when they are what is installed, and psycopg2 always on SQLAlchemy 1.4,
#: which has no psycopg-3 dialect (Airflow 2 pins 1.4).
DRIVERS = (
    Driver("postgresql", "psycopg", "psycopg", "'controltable[postgres]'", sqlalchemy=2),
    Driver("postgresql", "psycopg2", "psycopg2", "psycopg2-binary"),
    Driver("mysql", "mysqldb", "MySQLdb", "mysqlclient"),
    Driver("mysql", "pymysql", "pymysql", "'controltable[mysql]'"),
    Driver("mssql", "pyodbc", "pyodbc", "'controltable[mssql]'"),
    Driver("oracle", "oracledb", "oracledb", "'controltable[oracle]'"),
)

#: The backend each common spelling of a URL's scheme means: ``postgres://`` (libpq, Heroku, most
#: PaaS) is PostgreSQL; ``mariadb://`` is the MySQL dialect, which detects MariaDB on connecting.
URL_BACKENDS = {"postgres": "postgresql", "postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}


def backend_drivers(dialect: str) -> tuple[Driver, ...]:
    """The drivers of ``dialect``, preferred first (none for SQLite or an unknown dialect)."""
    return tuple(d for d in DRIVERS if d.dialect == dialect)


def known_driver(dialect: str, name: str) -> Optional[Driver]:
    """The driver ``<dialect>+<name>`` names, if controltable knows it."""
    return next((d for d in DRIVERS if d.dialect == dialect and d.name == name), None)

#: The server versions ``controltable sql`` compiles for when none is given, per dialect.
SQL_SERVER_VERSIONS = {name: traits(name).script_version for name in SUPPORTED_DIALECTS}
