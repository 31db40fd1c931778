"""Every per-dialect difference, in one place: the database clock, row locking, engine set-up.

The business logic (slots, events, work lists) builds portable SQLAlchemy Core statements and
passes them through the helpers here. What a backend offers is data, its :class:`Traits` (see
:func:`traits`, in :mod:`controltable.dialect_traits`): other modules ask those and never compare
dialect names. Only this module, its two parts (:mod:`controltable.dialect_traits`,
:mod:`controltable.dialect_ddl`, re-exported here), :mod:`controltable.errorcodes` and
:mod:`controltable.connect` name dialects (enforced by tests/core/test_dialect_rule.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, TypeVar

from sqlalchemy import BigInteger, Boolean, Float, Integer, String, Text, bindparam, event, select, type_coerce
from sqlalchemy.dialects import mssql, oracle
from sqlalchemy.engine import Engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement, Select, operators
from sqlalchemy.sql.dml import Delete, Update
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.sql.schema import Table
from sqlalchemy.sql.visitors import InternalTraversal
from sqlalchemy.types import CHAR, TypeDecorator, Unicode, UnicodeText

from .defaults import TOKEN_EPOCH_BITS
from .dialect_ddl import (  # noqa: F401 - re-exported: the DDL half of this module
    CLAIM_TEXT_CHARSET,
    CLAIM_TEXT_COLLATION,
    LOW_PRIORITY_INDEX_VERSION,
    LOW_PRIORITY_MINUTES,
    AnalyzeTable,
    ConvertColumns,
    CreateIndexOnline,
    DisableLockEscalation,
    RebuildIndex,
    column_charset,
    ddl_lock_timeout,
    online_ddl_available,
    own_charset,
    stale_includes,
)
from .dialect_traits import (  # noqa: F401 - re-exported: the traits of each backend
    DRIVERS,
    SQL_SERVER_VERSIONS,
    SUPPORTED_DIALECTS,
    URL_BACKENDS,
    Driver,
    Traits,
    backend_drivers,
    is_sqlite_url,
    known_driver,
    offline_dialect,
    server_label,
    traits,
)
from .errorcodes import is_lock_timeout  # noqa: F401 - re-exported: by error code, one place

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
    # Exact interval arithmetic from the epoch: subtracting two TIMESTAMPs gives an INTERVAL DAY
    # TO SECOND whose fields are exact to the microsecond. (CAST(... AS DATE) rounds to whole
    # seconds, so adding the fraction back stepped the clock back by up to a second whenever the
    # cast rounded up.) SYSTIMESTAMP is one value per statement, so the four fields agree.
    d = "(SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')"
    return (
        f"(EXTRACT(DAY FROM {d}) * 86400 + EXTRACT(HOUR FROM {d}) * 3600"
        f" + EXTRACT(MINUTE FROM {d}) * 60 + EXTRACT(SECOND FROM {d}))"
    )


class lock_time(FunctionElement):  # type: ignore[type-arg]
    """The database clock as UTC epoch seconds, read when the expression is evaluated, not when the
    statement started (see :func:`with_lock_clock`; elsewhere :class:`db_now` is the clock)."""

    type = Float()
    inherit_cache = True
    name = "lock_time"


@compiles(lock_time)
def _lock_time_default(element: Any, compiler: Any, **kw: Any) -> str:
    return _db_now_default(element, compiler, **kw)


@compiles(lock_time, "postgresql")
def _lock_time_pg(element: Any, compiler: Any, **kw: Any) -> str:
    # clock_timestamp(): the time of the evaluation itself (statement_timestamp() is the start).
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(lock_time, "sqlite")
def _lock_time_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return _db_now_sqlite(element, compiler, **kw)


def with_lock_clock(stmt: Select[Any], traits: Traits) -> Optional[Select[Any]]:
    """``stmt`` (a locking select, see :func:`lock_rows`) reading the database time as column
    ``now`` once its locks are held, or None where one statement cannot (the time is then read by
    a statement of its own after the locks: a clock taken when the locking statement starts would
    come from before its lock wait).

    PostgreSQL: the locking select becomes a subquery (never pulled up: it has ``FOR UPDATE``)
    and ``clock_timestamp()`` is in the outer select list, which is evaluated for each row the
    subquery's LockRows node returns, i.e. after that row's lock is granted (a select list beside
    ``FOR UPDATE`` is evaluated below the lock, before a wait). SQLite: the transaction took the
    database's write lock at ``BEGIN IMMEDIATE``, before any statement. MySQL/MariaDB, SQL Server
    and Oracle: every clock is the statement's start (``UTC_TIMESTAMP``, ``SYSUTCDATETIME``,
    ``SYSTIMESTAMP``), so they keep the separate read."""
    how = traits.lock_clock
    if how == "subquery":
        locked = stmt.subquery("locked")
        return select(*locked.c, lock_time().label("now"))
    if how == "column":
        return stmt.add_columns(lock_time().label("now"))
    return None


class token_epoch(FunctionElement):  # type: ignore[type-arg]
    """The server's failover epoch: a number that only grows when another server takes over writes.

    Read in the transaction that advances a fencing counter (the locked resource or work-list row):
    a token is ``next_token(last, epoch)``, so a token issued after a promotion is greater than every
    token issued before it, including those in commits the promoted server never received. The
    transaction that reads it also writes, so it runs on the primary; a transaction begun on a
    standby stays read-only after that standby is promoted, so no token carries a standby's epoch.

    PostgreSQL: the timeline ID, which every promotion (and point-in-time recovery) raises; read
    from the name of the current WAL file, which any user may call (``pg_control_checkpoint()``
    lags until the first checkpoint after a promotion). Other backends expose no such number
    cheaply and compile to ``1``: a MariaDB Galera cluster certifies every commit on all nodes
    before it returns, a single SQLite file has no failover, and the limits of asynchronous
    MySQL/MariaDB replication, SQL Server availability groups and Oracle Data Guard are in
    docs/production-databases.md.
    """

    type = BigInteger()
    inherit_cache = True
    name = "token_epoch"


@compiles(token_epoch)
def _token_epoch_default(element: Any, compiler: Any, **kw: Any) -> str:
    return "1"


@compiles(token_epoch, "postgresql")
def _token_epoch_pg(element: Any, compiler: Any, **kw: Any) -> str:
    # The first 8 hex digits of a WAL file name are its timeline; pg_current_wal_lsn() raises on
    # a server in recovery, which is right: no token is issued there.
    return "CAST(CAST('x' || SUBSTR(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS BIT(32)) AS BIGINT)"


def next_token(last: int, epoch: int) -> int:
    """The fencing token after ``last`` in server epoch ``epoch`` (see :class:`token_epoch`).

    ``max(last + 1, (epoch - 1) * 2**TOKEN_EPOCH_BITS + 1)``: on epoch 1 (every installation that
    never failed over, and every backend without an epoch) tokens count on unchanged; the first
    token on a later epoch jumps above every token an earlier epoch could have issued.
    """
    return max(int(last) + 1, ((max(int(epoch), 1) - 1) << TOKEN_EPOCH_BITS) + 1)


def epoch_begins(last: int, epoch: int) -> bool:
    """True while a resource whose counter stands at ``last`` has issued no token of ``epoch``.

    On a later epoch that is the state right after a promotion, until the first grant on the
    promoted server: what its queue holds was inherited from the old primary, and some entries
    may belong to callers that moved on (see ``slots.passes.GrantPasses._after_promotion``, run by
    each grant pass). Never true on epoch 1.
    """
    return int(epoch) > 1 and int(last) < ((int(epoch) - 1) << TOKEN_EPOCH_BITS)


#: The asyncio driver of each sync one people put in URLs (the same server, the same settings), for
#: :mod:`controltable.aio`; SQL Server and Oracle have none SQLAlchemy supports.
ASYNC_DRIVERS = {
    ("sqlite", "pysqlite"): "sqlite+aiosqlite",
    ("postgresql", "psycopg"): "postgresql+psycopg_async",
    ("postgresql", "psycopg2"): "postgresql+psycopg_async",
    ("mysql", "pymysql"): "mysql+aiomysql",
    ("mysql", "mysqldb"): "mysql+aiomysql",
}


def on_asyncio(dialect: Any) -> bool:
    """Whether ``dialect`` (a SQLAlchemy dialect, class or instance) is an asyncio driver's: its engine
    runs statements in greenlets that await an event loop, so a thread with no loop must not use it and
    an event loop's tasks share its pool (:mod:`controltable.aio`)."""
    return bool(getattr(dialect, "is_async", False))


def async_driver(backend: str, driver: str) -> Optional[str]:
    """The ``backend+driver`` name of the asyncio driver for a sync URL's, or None if there is none."""
    return ASYNC_DRIVERS.get((backend, driver))


def lock_rows(stmt: S, table: Table, *, skip_locked: bool = False, seek: bool = False) -> S:
    """Make ``stmt`` take row locks on ``table``'s rows that it returns.

    ``FOR UPDATE [SKIP LOCKED]`` on PostgreSQL, MySQL/MariaDB and Oracle. SQLAlchemy's mssql
    dialect silently drops ``with_for_update()``, so SQL Server gets table hints instead:
    ``UPDLOCK, ROWLOCK`` and ``READPAST`` to skip rows other sessions hold; ``seek`` adds
    ``FORCESEEK`` (only where an index makes a seek possible: a scan under UPDLOCK would walk
    into, and wait behind, rows other workers and producers hold). SQLite has no row locks: its
    transactions start with ``BEGIN IMMEDIATE`` (see :func:`prepare_engine`), so a writer holds
    the whole database and nothing needs skipping.
    """
    hints = ["UPDLOCK", "ROWLOCK"] + (["READPAST"] if skip_locked else []) + (["FORCESEEK"] if seek else [])
    return stmt.with_for_update(skip_locked=skip_locked).with_hint(  # type: ignore[return-value]
        table, f"WITH ({', '.join(hints)})", dialect_name="mssql")


class _key_cast(ColumnElement[Any]):
    """A key parameter cast to its column's own type on SQL Server (see :func:`key_column`)."""

    inherit_cache = True

    def __init__(self, bind: Any, kind: str, length: Optional[int]) -> None:
        self.bind = bind
        self.kind = kind
        self.length = length
        self.type = bind.type


@compiles(_key_cast)
def _key_cast_default(element: _key_cast, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.bind, **kw))


@compiles(_key_cast, "mssql")
def _key_cast_mssql(element: _key_cast, compiler: Any, **kw: Any) -> str:
    # The column's type without its collation (COLLATE is no part of a CAST's target type): the
    # comparison then takes the column's collation, which outranks a cast's.
    length = element.length if element.length else 8000
    return f"CAST({compiler.process(element.bind, **kw)} AS {element.kind}({int(length)}))"


class KeyBind(TypeDecorator):  # type: ignore[type-arg]
    """The type of a key parameter compared with a single-byte string key (``VARCHAR``/``CHAR``):
    on SQL Server the parameter is cast to the column's type in the SQL text itself."""

    impl = String
    cache_ok = True

    def __init__(self, kind: str, length: Optional[int]) -> None:
        super().__init__(length)
        self.kind = kind
        self.length = length

    def bind_expression(self, bindvalue: Any) -> Any:
        return _key_cast(bindvalue, self.kind, self.length)


def key_column(column: Any) -> Any:
    """``column`` for comparisons with key values the client sends (``IN`` lists, ``=``, ``>``).

    SQL Server: a driver that sends a Python ``str`` as ``NVARCHAR`` whatever its bound type
    (pymssql; pyodbc without ``use_setinputsizes``, SQLAlchemy 1.4's default; an engine passed in
    with it off) makes the server convert a ``VARCHAR``/``CHAR`` key column to the parameter's
    type (``NVARCHAR`` ranks higher): the index seek is gone, and with ``FORCESEEK`` (claims, key
    lookups) the statement fails with error 8622. So every key parameter against such a column is
    ``CAST(@p AS VARCHAR(n))`` in the SQL text: the parameter is converted, never the column,
    whatever the driver sends. Other key types, and other backends, are unchanged."""
    t = column.type
    if not isinstance(t, String) or isinstance(t, (Unicode, UnicodeText)):
        return column
    length = getattr(t, "length", None)
    return type_coerce(column, KeyBind("CHAR" if isinstance(t, CHAR) else "VARCHAR", length))


#: The pseudo dialect name under which :func:`seek_keyed` records a seek demand on an UPDATE or
#: DELETE (in the statement's cache key, rendered only by the SQL Server compile hook below).
_SEEK_OPTION = "controltable_mssql_seek"


def seek_keyed(stmt: Any, table: Table) -> Any:
    """SQL Server: make a statement that finds ``table``'s rows by an indexed key seek them.

    Without ``FORCESEEK`` a small table, or a parameter typed unlike the key, gets a scan; a
    scan under UPDLOCK (and an UPDATE's own U locks) walks into rows other workers hold, without
    READPAST, and concurrent claimers deadlock (1205). A SELECT gets the table hint
    ``WITH (FORCESEEK)``. An UPDATE or DELETE target takes only the limited table hints, so it
    gets the query hint ``OPTION (TABLE HINT(<table>, FORCESEEK))`` instead. Only for
    statements whose WHERE leads with an indexed column (the key, always unique-indexed, or the
    token with its index): otherwise the server raises error 8622. Other backends ignore it."""
    if isinstance(stmt, Select):
        return stmt.with_hint(table, "WITH (FORCESEEK)", dialect_name="mssql")
    return stmt.with_hint("FORCESEEK", selectable=table, dialect_name=_SEEK_OPTION)


def _seek_option(element: Any, compiler: Any, text: str) -> str:
    tables = [t for (t, name) in getattr(element, "_hints", {}) if name == _SEEK_OPTION]
    if not tables:
        return text
    hints = ", ".join(f"TABLE HINT({compiler.preparer.format_table(t)}, FORCESEEK)" for t in tables)
    return f"{text} OPTION ({hints})"


@compiles(Update, "mssql")
def _update_mssql(element: Any, compiler: Any, **kw: Any) -> str:
    return _seek_option(element, compiler, compiler.visit_update(element, **kw))


@compiles(Delete, "mssql")
def _delete_mssql(element: Any, compiler: Any, **kw: Any) -> str:
    return _seek_option(element, compiler, compiler.visit_delete(element, **kw))


def first_rows_hint(stmt: S, table: Table, n: int) -> S:
    """Oracle: ``/*+ FIRST_ROWS(n) */`` on a claim, so the optimizer reads the claim index in
    order and stops, instead of sorting every candidate row (which it would then lock as the
    cursor fetches). Other backends ignore the hint."""
    return stmt.with_hint(table, f"FIRST_ROWS({int(n)})", dialect_name="oracle")  # type: ignore[return-value]


#: The execution option that carries a claim's row count to the cursor (see :func:`limit_fetch`).
FETCH_ROWS_OPTION = "controltable_fetch_rows"


def limit_fetch(stmt: S, n: int) -> S:
    """Make the driver fetch (and so, with ``FOR UPDATE SKIP LOCKED``, lock) no more than ``n``
    rows of ``stmt`` per round trip. python-oracledb prefetches ``prefetchrows`` and then reads
    ``arraysize`` (100) rows at a time, and Oracle locks a skip-locked row when it is fetched: a
    ``claim(5)`` would lock about 100 rows. Needs :func:`enable_fetch_limits` on the engine."""
    return stmt.execution_options(**{FETCH_ROWS_OPTION: int(n)})  # type: ignore[return-value]


_FETCH_LIMITS = "_controltable_fetch_limits"


def enable_fetch_limits(engine: Engine) -> None:
    """Honour :func:`limit_fetch` on ``engine`` (idempotent; only Oracle's cursors need it)."""
    if not traits(engine.dialect.name).fetch_limits or getattr(engine, _FETCH_LIMITS, False):
        return

    @event.listens_for(engine, "before_cursor_execute")
    def _limit(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, executemany: bool) -> None:
        apply_fetch_limit(cursor, context)

    setattr(engine, _FETCH_LIMITS, True)


def apply_fetch_limit(cursor: Any, context: Any) -> None:
    """Set the cursor's ``arraysize`` and ``prefetchrows`` from :func:`limit_fetch`'s option."""
    n = context.execution_options.get(FETCH_ROWS_OPTION) if context is not None else None
    if n:
        cursor.arraysize = n
        if hasattr(cursor, "prefetchrows"):
            cursor.prefetchrows = n


def confirmed_count(conn: Any, update_stmt: Any, confirm: Any, traits: Traits) -> int:
    """Run a fenced ``UPDATE`` and return how many rows it changed, without trusting ``rowcount``
    where the driver may misreport it (see :attr:`Traits.trusts_rowcount`).

    ``confirm`` is a ``SELECT count(*)`` of the rows as the update leaves them (for example
    ``token = :t AND expires_at = :new_expiry``); on SQL Server it runs in the same transaction
    and its answer is the count. Elsewhere the update's own ``rowcount`` is the answer.
    """
    result = conn.execute(update_stmt)
    if traits.trusts_rowcount:
        return int(result.rowcount)
    return int(conn.scalar(confirm) or 0)


def changed_rows(conn: Any, stmt: Any, id_column: Any, traits: Traits,
                 params: Optional[Mapping[str, Any]] = None) -> int:
    """Run a ``DELETE`` or ``UPDATE`` of a control table and return how many rows it changed.

    Where the row count is trusted, the count; on SQL Server (:attr:`Traits.trusts_rowcount`
    false: NOCOUNT set server-wide reports -1) the statement returns ``id_column`` of each changed
    row (``OUTPUT deleted.id``) and those rows are counted. A running dialect that cannot return
    rows at all (SQLite on SQLAlchemy 1.4, standing in for SQL Server in tests and in
    ``controltable sql``) gives its own count, which is faithful there; every SQL Server dialect
    returns rows."""
    if not traits.trusts_rowcount:
        kind = "delete_returning" if getattr(stmt, "is_delete", False) else "update_returning"
        running = conn.dialect
        if getattr(running, kind, None) or getattr(running, "full_returning", False):
            return len(conn.execute(stmt.returning(id_column), *_bound(params)).all())
    return int(conn.execute(stmt, *_bound(params)).rowcount)


def _bound(params: Optional[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    """``execute``'s positional parameters: none at all when there are none (SQLAlchemy 1.4 takes an
    explicit ``None`` for a parameter set and fails to compile the statement)."""
    return () if params is None else (params,)


def writes_in_one_statement(conn: Any, traits: Traits) -> bool:
    """Whether several writes of one transaction can be sent as one statement of data-modifying
    common table expressions (``WITH w0 AS (UPDATE ...), w1 AS (INSERT ...) SELECT ...``): one
    round trip instead of one per write.

    PostgreSQL only, as the target and the running dialect (the scripted session of
    ``controltable sql`` runs on SQLite, which has no data-modifying CTEs). Every sub-statement
    sees the same snapshot, so only independent writes are combined (different rows; none reads
    what another writes), which the callers guarantee; MySQL/MariaDB, SQLite, SQL Server and
    Oracle send them one by one."""
    return traits.cte_writes and getattr(getattr(conn, "dialect", None), "name", None) == traits.name


def deletes_returning(conn: Any, traits: Traits) -> bool:
    """Whether a ``DELETE`` of control-table rows can return them (``DELETE ... RETURNING``), saving
    the read before it: SQLite 3.35+ and MariaDB 10.5+ (PostgreSQL combines more, see
    :func:`writes_in_one_statement`), as the target and the running dialect, where SQLAlchemy
    supports it (not on 1.4). Not MySQL (no ``RETURNING``); SQL Server and Oracle keep the read."""
    running = getattr(conn, "dialect", None)
    return (traits.delete_returning and getattr(running, "name", None) == traits.name
            and bool(getattr(running, "delete_returning", False)))


def state_literal(value: Any, type_: Any = None) -> ColumnElement[Any]:
    """A state constant rendered into the SQL text (``ct_state = 0``), never a bound parameter.

    A filtered (partial) index matches only a literal: SQL Server caches one plan per statement
    text, and a plan compiled for ``ct_state = @p`` must work for any value, so it can never use
    an index filtered on ``ct_state = 0``. Literals also give every backend's optimizer the
    state's real selectivity (pending and claimed rows are few next to done ones)."""
    return bindparam(None, value, type_=type_, literal_execute=True)


class StateString(TypeDecorator):  # type: ignore[type-arg]
    """A short state column (``waiting``, ``granted``, ``new``...) whose comparisons with plain
    Python strings render the string as a literal (see :func:`state_literal`)."""

    impl = String
    cache_ok = True

    class comparator_factory(TypeDecorator.Comparator):  # type: ignore[type-arg]  # noqa: N801
        def operate(self, op: Any, *other: Any, **kwargs: Any) -> Any:
            if other and op in (operators.eq, operators.ne) and isinstance(other[0], str):
                other = (state_literal(other[0], String()),) + other[1:]
            elif other and op in (operators.in_op, operators.not_in_op) and isinstance(other[0], (list, tuple)) \
                    and all(isinstance(v, str) for v in other[0]):
                other = ([state_literal(v, String()) for v in other[0]],) + other[1:]
            return super().operate(op, *other, **kwargs)


#: The escape character of literal LIKE patterns (SQLAlchemy's ``autoescape`` uses it too).
LIKE_ESCAPE = "/"


def like_literal(text: str, dialect_name: str) -> str:
    """``text`` escaped to match itself in a LIKE pattern with ``ESCAPE '/'`` on ``dialect_name``.

    ``%``, ``_`` and the escape character are wildcards or special everywhere. SQL Server's LIKE
    also reads ``[...]`` as a character class (``job[1]`` matches ``job1``, not ``job[1]``), so
    ``[`` is escaped there; only there, because Oracle refuses an escape character before anything
    but ``%``, ``_`` and itself (ORA-01424)."""
    specials = (LIKE_ESCAPE, "%", "_") + (("[",) if dialect_name == "mssql" else ())
    return "".join(LIKE_ESCAPE + ch if ch in specials else ch for ch in text)


def glob_literal(text: str) -> str:
    """``text`` escaped to match itself in a SQLite GLOB pattern (``*``, ``?`` and ``[`` as classes)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text)


class starts_with(ColumnElement):  # type: ignore[type-arg]  # noqa: N801 - reads as a SQL construct
    """``column`` starts with ``prefix``, matched literally and case-sensitively on every backend.

    LIKE with the prefix escaped for the dialect (see :func:`like_literal`), but on SQLite a GLOB:
    SQLite's LIKE ignores ASCII case (``release_holders("ETL")`` would release ``etl...``), its
    GLOB compares exactly, as name columns do everywhere. Every form is built here and the
    compiler picks the dialect's: the prefix stays an ordinary bound parameter of the statement,
    so the compiled-statement cache extracts it like any other."""

    inherit_cache = True
    type = Boolean()  # noqa: A003 - SQLAlchemy's attribute name
    #: A predicate itself: rendered as it is in a WHERE, never as ``... = 1``.
    _is_implicitly_boolean = True

    def __init__(self, column: Any, prefix: str) -> None:
        self.portable = column.like(like_literal(prefix, "") + "%", escape=LIKE_ESCAPE)
        self.bracketed = column.like(like_literal(prefix, "mssql") + "%", escape=LIKE_ESCAPE)
        self.globbed = column.op("GLOB", is_comparison=True)(glob_literal(prefix) + "*")

    _traverse_internals = [("portable", InternalTraversal.dp_clauseelement),
                           ("bracketed", InternalTraversal.dp_clauseelement),
                           ("globbed", InternalTraversal.dp_clauseelement)]


@compiles(starts_with)
def _starts_with_default(element: Any, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.portable, **kw))


@compiles(starts_with, "mssql")
def _starts_with_mssql(element: Any, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.bracketed, **kw))


@compiles(starts_with, "sqlite")
def _starts_with_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.globbed, **kw))


#: SQL Server collation of name columns: compared by code point, like Python (and PostgreSQL's
#: and SQLite's defaults): ``Warehouse`` and ``warehouse`` are two resources.
MSSQL_NAME_COLLATION = "Latin1_General_100_BIN2"


def name_type(length: int) -> Any:
    """A name column (resource, holder, namespace, owner...), and any string column looked up by a
    bound string (request keys, meta keys).

    SQL Server gets ``NVARCHAR(n) COLLATE Latin1_General_100_BIN2``: Unicode, so no name loses
    characters to a code page, and of the type drivers send Python strings as (an NVARCHAR
    parameter against a VARCHAR column converts the column and turns an index seek into a scan);
    the binary collation compares names exactly. Elsewhere ``VARCHAR(n)`` (``VARCHAR2(n CHAR)``
    on Oracle)."""
    return String(length).with_variant(mssql.NVARCHAR(length, collation=MSSQL_NAME_COLLATION), "mssql")


def text_type() -> Any:
    """Long text (work-item payloads, errors): ``NVARCHAR(max)`` on SQL Server, whose ``TEXT`` is
    deprecated and whose ``VARCHAR(max)`` would lose characters outside its code page."""
    return Text().with_variant(mssql.NVARCHAR(), "mssql")


class _EpochFloat(Float):  # type: ignore[type-arg]
    """``Float`` with a compiler dispatch of its own, so that another library's process-wide
    ``@compiles(Float, "mysql")`` leaves controltable's DDL as the golden files print it (Dagster's
    storage module, imported in every Dagster process, prints each MySQL float as ``FLOAT(32)``)."""

    __visit_name__ = "float"


def epoch_seconds_type() -> Any:
    """Epoch seconds: ``FLOAT(53)``, a double on every backend (MySQL's plain FLOAT is single
    precision), and ``BINARY_DOUBLE`` on Oracle."""
    return _EpochFloat(precision=53).with_variant(oracle.BINARY_DOUBLE(), "oracle")


def id_type() -> Any:
    """A row id: ``BIGINT``, but ``INTEGER`` on SQLite, which only makes INTEGER PRIMARY KEY
    columns auto-increment."""
    return BigInteger().with_variant(Integer(), "sqlite")


def utf8mb4_table_options(charset: str, collation: str) -> dict[str, Any]:
    """The ``Table`` keyword arguments that give a MySQL/MariaDB table ``charset`` and
    ``collation`` (the MariaDB dialect of SQLAlchemy 2 reads its own prefix only)."""
    return {f"{dialect}_{option}": value for dialect in ("mysql", "mariadb")
            for option, value in (("charset", charset), ("collate", collation))}


class ByteVarchar2(oracle.VARCHAR2):
    """Oracle ``VARCHAR2(n BYTE)``: a length in bytes, so a column can never exceed the 4,000
    byte limit of ``VARCHAR2`` (``n CHAR`` is up to 4 bytes per character)."""

    __visit_name__ = "BYTE_VARCHAR2"


@compiles(ByteVarchar2, "oracle")
def _byte_varchar2(type_: Any, compiler: Any, **kw: Any) -> str:
    return f"VARCHAR2({int(type_.length)} BYTE)"


def message_type(chars: int) -> Any:
    """An error message column of up to ``chars`` characters (which :func:`fit_message` keeps to
    ``2 * chars`` UTF-8 bytes, the Oracle column's size in bytes, at most 4,000)."""
    return String(chars).with_variant(ByteVarchar2(min(2 * chars, 4000)), "oracle").with_variant(
        mssql.NVARCHAR(chars), "mssql")


def fit_message(text: str, chars: int) -> str:
    """``text`` cut to ``chars`` characters and ``min(2 * chars, 4000)`` UTF-8 bytes (whole characters)."""
    text = text[:chars]
    limit = min(2 * chars, 4000)
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def update_returning(running: Any, target: Traits) -> bool:
    """Whether a claim can be one ``UPDATE ... WHERE key IN (locking subquery) RETURNING``.

    PostgreSQL, and SQLite (3.35+ with SQLAlchemy 2). Checked on the dialect actually running
    (``running``) and the one the statements are built for (``target``, which differs only
    when ``controltable sql`` prints statements for another backend).
    """
    able = getattr(running, "update_returning", getattr(running, "full_returning", False))
    return bool(able) and target.update_returning


#: The lengths key lists are padded to (see :func:`padded_keys`); the last is the most keys one
#: statement takes (``events.statements.CHUNK``).
IN_LIST_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900)


def padded_keys(keys: Sequence[Any]) -> list[Any]:
    """``keys`` padded to the next of :data:`IN_LIST_SIZES` by repeating the last key.

    SQL Server and Oracle cache one plan per statement text, and an ``IN`` list of n bound
    keys is its own text for every n: lists of 1 to 900 keys would fill the plan cache with up to
    900 plans of each statement. Padded, a statement has at most 11 texts. A repeated key changes
    nothing an ``IN`` selects, so every backend gets the same lists."""
    out = list(keys)
    if not out:
        return out
    size = next((n for n in IN_LIST_SIZES if n >= len(out)), len(out))
    return out + [out[-1]] * (size - len(out))


def index_where_kwargs(traits: Traits, predicate: Any) -> dict[str, Any]:
    """Keyword arguments that make an ``Index`` partial on the backends that support it."""
    keyword = traits.partial_index
    return {keyword: predicate} if keyword else {}


def typed_binds(backend: str, driver: str) -> dict[str, Any]:
    """``create_engine`` arguments that send every bound parameter typed like its column.

    SQL Server: pyodbc sends a Python ``str`` as NVARCHAR unless told otherwise, and an
    NVARCHAR parameter compared with a VARCHAR column (an event table's VARCHAR key, the
    control tables' ``request_key VARCHAR(64)``) converts the column: the seek becomes a scan
    that takes U locks on every row it reads. With ``use_setinputsizes`` (SQLAlchemy 2's
    default for pyodbc, opt-in on 1.4) a parameter bound with a ``String`` type goes as
    SQL_VARCHAR and a ``Unicode``/``NVARCHAR`` one as SQL_WVARCHAR; the statements bind every
    key with its column's type (``column == value``, ``column.in_(values)``)."""
    if backend == "mssql" and driver == "pyodbc":
        return {"use_setinputsizes": True}
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
    if traits(name).file_database:
        _configure_sqlite(engine, busy_timeout)
        return engine
    if name in SUPPORTED_DIALECTS:
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
