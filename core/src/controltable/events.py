"""Event batch claiming on the user's own table: many workers, never the same row twice.

controltable adds claim columns to the event table, never a copy of the data. A claim is one
short transaction that skips rows other workers are claiming (``FOR UPDATE SKIP LOCKED`` or
SQL Server's ``READPAST``) and marks the batch with a random token and a lease; no lock is held
while the batch is processed (a "soft lock"). Completion is fenced on that token in one
statement, so a worker whose lease ran out can never mark rows another worker re-claimed.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    and_,
    case,
    func,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoSuchTableError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, DDLElement
from sqlalchemy.sql.elements import ColumnElement

from . import dialects
from .defaults import DDL_LOCK_TIMEOUT, DEFAULT_BATCH_LEASE, NAME_LENGTH
from .errors import ConfigurationError, ControlTableError, LeaseLost, NotInstalledError, describe_keys
from .renewal import BackgroundRenewal
from .schema import EpochSeconds
from .slots import default_holder, utc
from .validation import (
    check_batch_size,
    check_identifier,
    check_name,
    check_poll_interval,
    check_positive_int,
    check_seconds,
    check_where,
    where_clause,
)

if TYPE_CHECKING:  # pragma: no cover
    from .control import ControlTable

log = logging.getLogger("controltable")

PENDING, CLAIMED, DONE, ERROR = 0, 1, 2, 3
STATE_NAMES = {PENDING: "pending", CLAIMED: "claimed", DONE: "done", ERROR: "error"}
#: Keys per ``IN (...)`` list: under Oracle's 1000 items and SQL Server's 2100 parameters.
_CHUNK = 900
#: After a claim found no expired claims, the same EventTable object looks again only after this.
EXPIRED_CHECK_INTERVAL = 1.0
#: The longest error message kept per row (characters; bytes on Oracle, see dialects.message_type).
ERROR_LENGTH = 2000
#: The defaults of ``max_attempts``, ``backoff`` and ``max_backoff``.
DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF, DEFAULT_MAX_BACKOFF = 5, 30.0, 3600.0


class TableBusyError(ControlTableError):
    """``prepare()`` could not get the lock its DDL needs: the table was busy throughout."""

Where = Union[ColumnElement[Any], Callable[[Table], ColumnElement[Any]], None]


class AddColumn(DDLElement):
    """``ALTER TABLE t ADD <column spec>``: the one DDL statement SQLAlchemy Core lacks."""

    def __init__(self, table: Table, column: Column[Any]) -> None:
        self.table = table
        self.column = column


@compiles(AddColumn)
def _add_column(element: AddColumn, compiler: Any, **kw: Any) -> str:
    spec = compiler.process(CreateColumn(element.column), **kw)
    return f"ALTER TABLE {compiler.preparer.format_table(element.table)} ADD {spec}"


def claim_columns(prefix: str = "ct_") -> list[Column[Any]]:
    """The columns ``prepare()`` adds to an event table, in order."""
    return [
        Column(f"{prefix}state", SmallInteger, nullable=False, server_default="0"),
        Column(f"{prefix}owner", dialects.name_type(NAME_LENGTH), nullable=True),
        Column(f"{prefix}token", BigInteger, nullable=True),
        Column(f"{prefix}expires_at", EpochSeconds, nullable=True),
        Column(f"{prefix}available_at", EpochSeconds, nullable=True),
        Column(f"{prefix}attempts", Integer, nullable=False, server_default="0"),
        Column(f"{prefix}error", dialects.message_type(ERROR_LENGTH), nullable=True),
        Column(f"{prefix}done_at", EpochSeconds, nullable=True),
    ]


@dataclass
class EventStats:
    """Counts per claim state of an event table."""

    table: str
    pending: int = 0
    claimed: int = 0
    expired: int = 0
    done: int = 0
    error: int = 0
    oldest_pending_key: Any = None
    oldest_pending_age: Optional[float] = None

    @property
    def total(self) -> int:
        return self.pending + self.claimed + self.done + self.error

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "table", "pending", "claimed", "expired", "done", "error", "total",
            "oldest_pending_key", "oldest_pending_age")}


@dataclass
class Batch(BackgroundRenewal):
    """Rows claimed by one worker under one token. Finish it with complete, fail or release.

    ``attempts`` (per key, this claim included), ``claimed_at`` and ``lease_seconds`` are the
    batch's history: :meth:`handle` carries them and :meth:`EventTable.batch` rebuilds them, so
    a batch finished in another process renews, fails and hands on with its own numbers.
    """

    events: EventTable
    owner: str
    token: int
    rows: list[dict[str, Any]]
    attempts: dict[Any, int]
    claimed_at: float
    _expires_at: float
    _settled: set[Any] = field(default_factory=set)
    #: The batch's lease length (seconds): renewals without an argument, the renewal interval
    #: and the batch ``complete_and_claim`` hands on all keep it.
    lease_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            self.lease_seconds = max(self._expires_at - self.claimed_at, 0.0) or self.events.lease

    @property
    def finished(self) -> bool:
        """Whether every row of the batch was completed, failed or released (in one call or several)."""
        return self._settled >= set(self.keys)

    def _settle(self, keys: Optional[Sequence[Any]]) -> None:
        self._settled.update(self.keys if keys is None else keys)
        if self.finished:
            self.stop_renewing()

    def _renew_interval(self) -> float:
        return max(self.lease_seconds, 0.3) / 3.0

    def _unsettled(self) -> list[Any]:
        return [k for k in self.keys if k not in self._settled]

    def check(self) -> None:
        """Raise :class:`LeaseLost` if background renewal found the batch taken over."""
        if self.lost is not None:
            raise self.lost

    @property
    def keys(self) -> list[Any]:
        return [row[self.events.key] for row in self.rows]

    @property
    def expires_at(self) -> datetime:
        value = utc(self._expires_at)
        assert value is not None
        return value

    def __len__(self) -> int:
        return len(self.rows)

    def handle(self) -> dict[str, Any]:
        """A JSON-serialisable reference (for XCom or Dagster metadata).

        Table, key column, keys, token and owner, plus the batch's history: ``attempts`` (a list
        parallel to ``keys``, as JSON object keys would turn integer keys into strings),
        ``claimed_at``, ``expires_at`` and ``lease`` (seconds).
        ``ControlTable.events(h["table"], key=h["key"], ...).batch(h)`` rebuilds the batch elsewhere.
        """
        return {
            "table": self.events.name,
            "schema": self.events.schema,
            "key": self.events.key,
            "order_by": self.events.order_by,
            "keys": self.keys,
            "token": self.token,
            "owner": self.owner,
            "attempts": [self.attempts.get(k, 1) for k in self.keys],
            "claimed_at": self.claimed_at,
            "expires_at": self._expires_at,
            "lease": self.lease_seconds,
        }

    @contextmanager
    def transaction(self, keys: Optional[Sequence[Any]] = None) -> Iterator[Connection]:
        """A transaction for the caller's own writes that commits together with the completion.

        On exit the batch (or ``keys``) is completed in the same transaction; if the lease was
        lost, :class:`LeaseLost` is raised and the caller's writes roll back with it.
        """
        with self.events.ct.db.begin() as conn:
            yield conn
            if keys is None:
                self.events._complete(conn, self.token, self._unsettled(), whole=True)
            else:
                self.events._complete(conn, self.token, list(keys))
        self._settle(keys)

    def complete(self, keys: Optional[Sequence[Any]] = None) -> int:
        """Mark the batch (or ``keys`` of it) done. Raises :class:`LeaseLost` naming rows taken over.

        Safe to retry: rows already done under this batch's token count as completed, so a retry
        after a commit whose reply was lost succeeds instead of reporting the lease lost.
        """
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self._unsettled()
        n = self.events.ct.db.run(lambda conn: self.events._complete(conn, self.token, todo, whole=keys is None))
        self._settle(keys)
        return n

    def complete_and_claim(
        self, size: Optional[int] = None, *, lease: Optional[float] = None, where: Where = None
    ) -> Optional[Batch]:
        """Complete this batch and claim the next one for the same owner, in one transaction.

        For drain loops: one commit per batch instead of two. The completion is fenced exactly as
        :meth:`complete`; if it raises :class:`LeaseLost`, nothing is claimed. Returns the next
        batch, or ``None`` when nothing is claimable (this batch is completed either way). The
        next batch gets ``lease`` or, by default, this batch's own lease length.
        """
        events = self.events
        n = check_batch_size(size) if size is not None else max(len(self.rows), 1)
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert lease_s is not None
        todo = self._unsettled()
        self.stop_renewing()
        following = events._claim_run(n, self.owner, lease_s, where, complete=(self.token, todo))
        self._settle(None)
        return following

    def fail(self, reason: str, keys: Optional[Sequence[Any]] = None) -> int:
        """Give rows back for a retry after a back-off; after ``max_attempts`` they go to error.

        The decision is made in SQL from the attempts stored in each row, so a batch rebuilt
        from a handle (another task, another process) counts exactly like the original.
        """
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self.keys
        n = self.events._fail(self.token, todo, str(reason))
        self._settle(keys)
        return n

    def release(self) -> int:
        """Give the rows back untouched (the attempt is not counted). Lost rows are ignored."""
        self.stop_renewing()
        n = self.events._release(self.token, self.keys)
        self._settle(None)
        return n

    def renew(self, lease: Optional[float] = None) -> Batch:
        """Extend the claim to ``lease`` seconds from now (default: the batch's own lease length).

        :class:`LeaseLost` names rows taken over. A given ``lease`` becomes the batch's lease.
        """
        seconds = check_seconds("lease", lease) if lease is not None else self.lease_seconds
        assert seconds is not None
        self._expires_at = self.events._renew(self.token, self.keys, seconds)
        self.lease_seconds = seconds
        return self


class EventTable:
    """Batch claiming over one of the user's tables.

    ``key`` must be unique (primary key or unique index). ``order_by`` (default: ``key``) sets
    claim order. ``where`` narrows what is claimable: an expression over ``events.table`` or a
    callable that receives the table. ``time_column`` (optional) is the column holding each
    event's time, used by ``stats()`` for the oldest pending age.
    """

    def __init__(
        self,
        ct: ControlTable,
        table: str,
        *,
        key: str,
        order_by: Optional[str] = None,
        schema: Optional[str] = None,
        where: Where = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: float = DEFAULT_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        lease: float = DEFAULT_BATCH_LEASE,
        time_column: Optional[str] = None,
        column_prefix: str = "ct_",
    ) -> None:
        self.ct = ct
        self.name = check_identifier("table", table)
        self.key = check_identifier("key column", key)
        self.order_by = check_identifier("order_by column", order_by) if order_by else self.key
        self.schema = check_identifier("schema", schema) if schema else None
        self.time_column = check_identifier("time_column", time_column) if time_column else None
        self.max_attempts = check_positive_int("max_attempts", max_attempts)
        self.backoff = check_seconds("backoff", backoff, allow_zero=True) or 0.0
        self.max_backoff = check_seconds("max_backoff", max_backoff, allow_zero=True) or 0.0
        self.lease = check_seconds("lease", lease) or DEFAULT_BATCH_LEASE
        self.prefix = check_identifier("column_prefix", column_prefix + "x")[:-1]
        self._where = check_where(where)
        self._table: Optional[Table] = None
        # One reflection at a time: threads sharing this object (claimers in a pool) would
        # otherwise reflect concurrently through one engine, which SQLAlchemy does not support.
        self._reflect_lock = threading.Lock()
        #: SQL Server: whether the claim index exists, so claims may demand an index seek.
        self._seekable = False
        self._next_expired_check = 0.0
        dialects.enable_fetch_limits(ct.db.engine)

    def __repr__(self) -> str:
        return f"EventTable({self.qualified_name!r}, key={self.key!r}, order_by={self.order_by!r})"

    @property
    def wakeup_key(self) -> str:
        """Wake-up key for claimers of this table (rows given back by release or fail)."""
        return f"events:{self.qualified_name}"

    def wakeup_keys(self) -> list[str]:
        """The wake-up keys pushed when rows may be claimable again (see ``ControlTable.add_wakeup_listener``)."""
        return [self.wakeup_key]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    # -- the table ---------------------------------------------------------------------------
    def _reflect(self) -> Table:
        self.ct.db.ping()
        try:
            with self.ct.db.translating():
                return Table(self.name, MetaData(schema=self.schema), autoload_with=self.ct.db.engine)
        except NoSuchTableError as exc:
            raise ConfigurationError(
                f"event table {self.qualified_name!r} does not exist in {self.ct.db.safe_url}; "
                "check the table name and schema"
            ) from exc

    def _check_columns(self, table: Table) -> None:
        for kind, col in (("key", self.key), ("order_by", self.order_by), ("time_column", self.time_column)):
            if col is not None and col not in table.c:
                raise ConfigurationError(
                    f"{kind} column {col!r} is not a column of {self.qualified_name!r}; "
                    f"its columns are {', '.join(c.name for c in table.c)}"
                )
        if not self._key_is_unique(table):
            raise ConfigurationError(
                f"key column {self.key!r} of {self.qualified_name!r} is not unique; claiming needs a primary key "
                f"or unique index on it (e.g. CREATE UNIQUE INDEX ... ON {self.name} ({self.key}))"
            )

    def _key_is_unique(self, table: Table) -> bool:
        pk = [c.name for c in table.primary_key.columns]
        if pk == [self.key]:
            return True
        insp = inspect(self.ct.db.engine)
        for uq in insp.get_unique_constraints(self.name, schema=self.schema):
            if list(uq.get("column_names") or []) == [self.key]:
                return True
        for ix in insp.get_indexes(self.name, schema=self.schema):
            if ix.get("unique") and list(ix.get("column_names") or []) == [self.key]:
                return True
        return False

    @property
    def table(self) -> Table:
        """The reflected table; raises :class:`NotInstalledError` if ``prepare()`` was not run."""
        if self._table is None:
            with self._reflect_lock:
                return self._load_table()
        return self._table

    def _load_table(self) -> Table:
        if self._table is None:
            table = self._reflect()
            self._check_columns(table)
            missing = [c.name for c in claim_columns(self.prefix) if c.name not in table.c]
            if missing:
                raise NotInstalledError(
                    f"event table {self.qualified_name!r} has no claim columns ({', '.join(missing)}); run "
                    f"events.prepare() or `controltable events prepare {self.name} --key {self.key}` first"
                )
            if self.ct.db.dialect_name == "mssql":
                state = f"{self.prefix}state"
                self._seekable = any(
                    list(ix.get("column_names") or [])[:1] == [state]
                    for ix in inspect(self.ct.db.engine).get_indexes(self.name, schema=self.schema))
            self._table = table
        return self._table

    @property
    def c(self) -> Any:
        """The table's columns, for ``where=`` expressions."""
        return self.table.c

    def _col(self, name: str) -> Column[Any]:
        return self.table.c[f"{self.prefix}{name}"]  # type: ignore[no-any-return]

    def _is(self, state: int) -> ColumnElement[bool]:
        """``ct_state = <state>`` with the state as a literal (see :func:`dialects.state_literal`)."""
        return self._col("state") == dialects.state_literal(state, SmallInteger())

    def indexes(self, table: Table, *, filtered_indexes: bool = False) -> list[Index]:
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
        dialect = self.ct.db.dialect_name
        state = table.c[f"{self.prefix}state"]
        order = table.c[self.order_by]
        key = table.c[self.key]
        ordered = [order] if order is key else [order, key]
        pending_literal = dialects.state_literal(PENDING, SmallInteger())
        claimed_literal = dialects.state_literal(CLAIMED, SmallInteger())
        if dialect in ("postgresql", "sqlite"):
            return [
                Index(_index_name(f"{self.prefix}pending_{self.name}"), order,
                      **dialects.index_where_kwargs(dialect, state == pending_literal)),
                Index(_index_name(f"{self.prefix}claimed_{self.name}"), order,
                      **dialects.index_where_kwargs(dialect, state == claimed_literal)),
            ]
        token = table.c[f"{self.prefix}token"]
        if dialect == "mssql":
            if filtered_indexes:
                return [
                    Index(_index_name(f"{self.prefix}pending_{self.name}"), state, *ordered,
                          mssql_where=state == pending_literal),
                    Index(_index_name(f"{self.prefix}claimed_{self.name}"), state, *ordered,
                          mssql_where=state == claimed_literal),
                    Index(_index_name(f"{self.prefix}token_{self.name}"), token,
                          mssql_where=state == claimed_literal),
                ]
            return [Index(_index_name(f"{self.prefix}claim_{self.name}"), state, *ordered),
                    Index(_index_name(f"{self.prefix}token_{self.name}"), token)]
        if dialect == "oracle":
            return [Index(_index_name(f"{self.prefix}claim_{self.name}"), state, *ordered)]
        return [Index(_index_name(f"{self.prefix}claim_{self.name}"), state, order)]

    def prepare_statements(
        self, *, filtered_indexes: bool = False, disable_lock_escalation: bool = False
    ) -> list[Any]:
        """The DDL ``prepare()`` would run now (only what is missing), one statement per entry.

        ``disable_lock_escalation`` (SQL Server) adds ``ALTER TABLE ... SET (LOCK_ESCALATION =
        DISABLE)``, for tables where even chunked statements of many workers should never
        escalate. Statistics are refreshed after these (see :class:`dialects.AnalyzeTable`).
        """
        table = self._reflect()
        self._check_columns(table)
        stmts: list[Any] = []
        for col in claim_columns(self.prefix):
            if col.name not in table.c:
                stmts.append(AddColumn(table, col))
                table.append_column(col)
        existing = {ix["name"] for ix in inspect(self.ct.db.engine).get_indexes(self.name, schema=self.schema)}
        if self.ct.db.engine.dialect.name == "postgresql":
            with self.ct.db.engine.connect() as conn:
                existing -= self._invalid_indexes(conn)
        stmts.extend(ix for ix in self.indexes(table, filtered_indexes=filtered_indexes) if ix.name not in existing)
        if disable_lock_escalation and self.ct.db.dialect_name == "mssql":
            stmts.append(dialects.DisableLockEscalation(table))
        return stmts

    def prepare(
        self,
        *,
        filtered_indexes: bool = False,
        disable_lock_escalation: bool = False,
        online: Optional[bool] = None,
        analyze: bool = True,
        lock_timeout: int = DDL_LOCK_TIMEOUT,
    ) -> list[str]:
        """Add the claim columns and the claim indexes if missing. Idempotent; returns what it ran.

        Each DDL statement runs in a transaction of its own, so no lock on the table outlives
        the statement that needs it. Indexes are built online where the server offers it
        (``online=None``: detected; PostgreSQL ``CONCURRENTLY``, SQL Server and Oracle
        Enterprise ``ONLINE``). Each statement waits at most ``lock_timeout`` seconds for the
        table's lock; a table busy throughout raises :class:`TableBusyError` with the DDL still
        to run. After any change the table's statistics are refreshed (``analyze``), so the
        first claims get the plans later ones will. ``filtered_indexes`` and
        ``disable_lock_escalation`` concern SQL Server only (see :meth:`indexes`).
        """
        from sqlalchemy.exc import DBAPIError
        from sqlalchemy.schema import CreateIndex, DropIndex

        lock_timeout = check_positive_int("lock_timeout", lock_timeout)
        stmts = self.prepare_statements(
            filtered_indexes=filtered_indexes, disable_lock_escalation=disable_lock_escalation)
        engine = self.ct.db.engine
        running = engine.dialect.name
        if online is None and any(isinstance(s, Index) for s in stmts):
            with engine.connect() as conn:
                online = dialects.online_ddl_available(conn)
        before, after = dialects.ddl_lock_timeout(running, lock_timeout)
        done: list[str] = []
        if stmts and analyze:
            stmts.append(dialects.AnalyzeTable(self._reflect()))
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
                            if stmt.name in self._invalid_indexes(conn):
                                conn.execute(DropIndex(stmt))
                            conn.execute(ddl)
                        else:
                            with conn.begin():
                                conn.execute(ddl)
                    finally:
                        _run_each(conn, after, autocommit)
            except DBAPIError as exc:
                if dialects.is_lock_timeout(exc):
                    rest = [text] + [str((CreateIndex(s) if isinstance(s, Index) else s).compile(
                        dialect=engine.dialect)).strip() for s in stmts[i + 1:]]
                    raise TableBusyError(
                        f"prepare() could not lock {self.qualified_name!r} within {lock_timeout} s: other sessions "
                        f"kept it busy ({_first_line(exc)}). Retry later, or run this DDL in a quiet moment "
                        "(each statement on its own):\n" + ";\n".join(rest) + ";"
                    ) from exc
                raise self.ct.db.translate(exc) from exc
            done.append(text)
        self._table = None
        return done

    def _invalid_indexes(self, conn: Connection) -> set[str]:
        """PostgreSQL: indexes of this table that an interrupted ``CREATE INDEX CONCURRENTLY``
        left invalid. ``prepare()`` drops and rebuilds them rather than take them for done."""
        if conn.dialect.name != "postgresql":
            return set()
        from sqlalchemy import text

        rows = conn.execute(text(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE NOT i.indisvalid AND t.relname = :name AND n.nspname = COALESCE(:schema, current_schema())"
        ), {"name": self.name, "schema": self.schema})
        return {str(r[0]) for r in rows}

    # -- claiming ----------------------------------------------------------------------------
    def _where_clause(self, where: Where) -> list[ColumnElement[Any]]:
        out = []
        for w in (self._where, where):
            if w is None:
                continue
            out.append(where_clause(w, self.table))
        return out

    def expired_claims(self, now: Any) -> ColumnElement[bool]:
        """Rows claimed under a lease that has run out (their worker crashed or hung)."""
        return and_(self._is(CLAIMED), self._col("expires_at") < now)

    def due_pending(self, now: Any) -> ColumnElement[bool]:
        """Pending rows whose back-off (after a failure) has passed."""
        avail = self._col("available_at")
        return and_(self._is(PENDING), or_(avail.is_(None), avail <= now))

    def claimable(self, now: Any) -> ColumnElement[bool]:
        """Rows a claim may take: pending and due, or claimed under an expired lease."""
        return or_(self.due_pending(now), self.expired_claims(now))

    def claim_statement(self, size: int, condition: ColumnElement[bool], where: Where = None) -> Any:
        """A locking select of up to ``size`` rows meeting ``condition``, skipping rows others hold.

        Each claim runs this once per state (expired claims, then due pending rows) rather than
        once with an OR of both: with one equality on the state column the claim index returns
        rows already in claim order, so the database reads and locks only the rows it returns.
        (With the OR, MariaDB sorted every candidate and locked them all, so a concurrent claim
        found nothing to take.) On SQL Server the select seeks the claim index (``FORCESEEK``,
        once ``prepare()`` made it) and is capped at :func:`dialects.rows_per_statement`; on
        Oracle it carries ``FIRST_ROWS(size)`` and the cursor fetches (and so locks) ``size``
        rows at most.
        """
        t = self.table
        dialect = self.ct.db.dialect_name
        cap = dialects.rows_per_statement(dialect)
        if cap is not None:
            size = min(size, cap)
        stmt = (
            select(t)
            .where(condition, *self._where_clause(where))
            .order_by(*{t.c[self.order_by]: None, t.c[self.key]: None})
        )
        stmt = dialects.lock_rows(stmt, t, skip_locked=True, seek=self._seekable)
        stmt = dialects.first_rows_hint(stmt, t, size)
        stmt = dialects.limit_fetch(stmt, size)
        return dialects.limit_locked(stmt, dialect, size)

    def claim(
        self,
        size: int = 100,
        *,
        owner: Optional[str] = None,
        lease: Optional[float] = None,
        where: Where = None,
        wait: Optional[float] = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 5.0,
    ) -> Optional[Batch]:
        """Claim up to ``size`` claimable rows for ``owner``; ``None`` when nothing is claimable.

        ``wait`` (seconds) keeps trying until rows are claimable or the time is up, backing off
        from ``poll_interval`` to ``max_poll_interval`` between attempts, and waking early on
        PostgreSQL when rows are given back (release, fail) or a producer calls :meth:`notify`.
        """
        check_where(where)
        if wait is None:
            return self._claim_once(size, owner, lease, where)
        budget = check_seconds("wait", wait, allow_zero=True)
        poll_interval = check_poll_interval("poll_interval", poll_interval)
        max_poll_interval = check_poll_interval("max_poll_interval", max_poll_interval)
        assert budget is not None
        deadline = time.monotonic() + budget
        delay = poll_interval
        while True:
            since = self.ct._wakeups.mark([self.wakeup_key])
            batch = self._claim_once(size, owner, lease, where, deadline=deadline)
            left = deadline - time.monotonic()
            if batch is not None or left <= 0:
                return batch
            self.ct._wait_for_wakeup([self.wakeup_key], min(delay * (0.5 + random.random()), left), since)
            delay = min(delay * 1.5, max_poll_interval)

    def notify(self) -> None:
        """Tell waiting claimers that new rows arrived (PostgreSQL; elsewhere they poll).

        For producers: call after inserting events, so that ``claim(wait=...)`` wakes at once
        instead of at its next poll.
        """
        self.ct.db.run(lambda conn: self.ct._notify(conn, [self.wakeup_key]))

    def _claim_once(
        self, size: int, owner: Optional[str], lease: Optional[float], where: Where,
        deadline: Optional[float] = None,
    ) -> Optional[Batch]:
        size = check_batch_size(size)
        owner = check_name("owner", owner) if owner is not None else default_holder()
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease
        assert lease_s is not None
        self.table  # noqa: B018 - reflect (and check) the table before the transaction, not inside it
        return self._claim_run(size, owner, lease_s, where, deadline=deadline)

    def _claim_run(
        self, size: int, owner: str, lease_s: float, where: Where,
        complete: Optional[tuple[int, list[Any]]] = None, deadline: Optional[float] = None,
    ) -> Optional[Batch]:
        """Run a claim (after completing ``complete = (token, keys)`` in the same transaction).

        The batch token is chosen here, once, by the client, so the claim is safe to retry: when
        the reply to its COMMIT is lost, the retry first looks for rows already carrying the
        token and, if the first attempt did commit, returns them instead of claiming a second
        batch (which would sit orphaned for a whole lease).
        """
        token = secrets.randbits(62) + 1
        attempt = [0]

        def fn(conn: Connection) -> Optional[Batch]:
            attempt[0] += 1
            if attempt[0] > 1:
                already = self._batch_with_token(conn, token, owner, lease_s)
                if already is not None:
                    return already
            if complete is not None:
                self._complete(conn, complete[0], complete[1], whole=True)
            return self._claim_in(conn, size, owner, lease_s, where, token=token)

        return self.ct.db.run(fn, deadline=deadline)

    def _batch_with_token(self, conn: Connection, token: int, owner: str, lease_s: float) -> Optional[Batch]:
        """The batch an earlier, committed attempt of this claim made, or None if none did."""
        t = self.table
        rows = [dict(r._mapping) for r in conn.execute(
            select(t).where(self._is(CLAIMED), self._col("token") == token))]
        if not rows:
            return None
        return self._make_batch(rows, owner, token, lease_s)

    def _make_batch(self, claimed: list[dict[str, Any]], owner: str, token: int, lease_s: float) -> Batch:
        user_cols = [c.name for c in self.table.c if not c.name.startswith(self.prefix)]
        claimed.sort(key=lambda r: (r[self.order_by], r[self.key]))
        expires = max(float(r[f"{self.prefix}expires_at"] or 0) for r in claimed)
        return Batch(
            self, owner, token,
            rows=[{c: r[c] for c in user_cols} for r in claimed],
            attempts={r[self.key]: int(r[f"{self.prefix}attempts"]) for r in claimed},
            claimed_at=expires - lease_s, _expires_at=expires, lease_seconds=lease_s,
        )

    def _claim_in(
        self, conn: Connection, size: int, owner: str, lease_s: float, where: Where, *, token: Optional[int] = None
    ) -> Optional[Batch]:
        """The claim itself, inside the caller's transaction."""
        t = self.table
        token = token if token is not None else secrets.randbits(62) + 1
        attempts_col = f"{self.prefix}attempts"
        # The database clock goes into the statements as an expression (one value per
        # statement), except on the key-list path, which needs the value for its second step.
        one_statement = dialects.update_returning(conn.dialect, self.ct.db.dialect_name)
        now: Any = dialects.db_now() if one_statement else float(conn.scalar(select(dialects.db_now())) or 0)
        values = {
            f"{self.prefix}state": CLAIMED, f"{self.prefix}owner": owner, f"{self.prefix}token": token,
            f"{self.prefix}attempts": t.c[attempts_col] + 1, f"{self.prefix}expires_at": now + lease_s,
        }
        # Expired claims first: they are older work, and must not starve behind new events.
        # Finding none is the normal case, so after an empty look this object skips the
        # look for EXPIRED_CHECK_INTERVAL: an abandoned claim waits at most that much longer.
        claimed: list[dict[str, Any]] = []
        if time.monotonic() >= self._next_expired_check:
            claimed = self._claim_by_keys(conn, self.expired_claims(now), size, values, where)
            if not claimed:
                self._next_expired_check = time.monotonic() + EXPIRED_CHECK_INTERVAL
        need = size - len(claimed)
        if need > 0:
            if one_statement:
                claimed += self._claim_returning(conn, self.due_pending(now), need, values, where)
            else:
                claimed += self._claim_by_keys(conn, self.due_pending(now), need, values, where)
        if not claimed:
            return None
        return self._make_batch(claimed, owner, token, lease_s)

    def _claim_by_keys(
        self, conn: Connection, condition: ColumnElement[bool], size: int, values: dict[str, Any], where: Where
    ) -> list[dict[str, Any]]:
        """Lock up to ``size`` rows with a skip-locked select, then mark them by key (every backend).

        Returns the rows as they are after marking. Expired claims that were abandoned
        ``max_attempts`` times are a crash loop, not a retry: they go to the error state instead.
        On SQL Server this runs in chunks of :func:`dialects.rows_per_statement` rows, so no
        statement escalates to a table lock.
        """
        cap = dialects.rows_per_statement(self.ct.db.dialect_name) or size
        claimed: list[dict[str, Any]] = []
        while len(claimed) < size:
            chunk = min(size - len(claimed), cap)
            got = self._claim_chunk(conn, condition, chunk, values, where)
            claimed += got
            if len(got) < chunk or not got:
                break
        return claimed

    def _claim_chunk(
        self, conn: Connection, condition: ColumnElement[bool], size: int, values: dict[str, Any], where: Where
    ) -> list[dict[str, Any]]:
        t = self.table
        key = t.c[self.key]
        result = conn.execute(self.claim_statement(size, condition, where))
        rows = [dict(r._mapping) for r in result.fetchmany(size)]
        result.close()
        attempts_col, state_col = f"{self.prefix}attempts", f"{self.prefix}state"
        poisoned = [r[self.key] for r in rows if r[state_col] == CLAIMED and r[attempts_col] >= self.max_attempts]
        in_list = dialects.max_in_list(self.ct.db.dialect_name)
        for chunk in _chunks(poisoned, in_list):
            conn.execute(update(t).where(key.in_(chunk)).values({
                f"{self.prefix}state": ERROR, f"{self.prefix}owner": None, f"{self.prefix}token": None,
                f"{self.prefix}expires_at": None,
                f"{self.prefix}error": "lease expired max_attempts times (worker crashed or hung)"}))
        rows = [r for r in rows if r[self.key] not in set(poisoned)]
        for chunk in _chunks([r[self.key] for r in rows], in_list):
            conn.execute(update(t).where(key.in_(chunk)).values(values))
        expires_col = f"{self.prefix}expires_at"
        expires = values[expires_col]
        if rows and not isinstance(expires, (int, float)):  # an expression of the database clock
            expires = conn.scalar(select(t.c[expires_col]).where(key == rows[0][self.key]))
        for r in rows:
            r[attempts_col] = int(r[attempts_col]) + 1
            r[expires_col] = expires
        return rows

    def _claim_returning(
        self, conn: Connection, condition: ColumnElement[bool], size: int, values: dict[str, Any], where: Where
    ) -> list[dict[str, Any]]:
        """Claim in one statement where the backend can: ``UPDATE ... WHERE key IN (SELECT ...
        FOR UPDATE SKIP LOCKED LIMIT n) RETURNING *`` (PostgreSQL; SQLite, whose single writer
        needs no skipping). One round trip instead of a select plus updates by key list."""
        t = self.table
        key = t.c[self.key]
        chosen = dialects.lock_rows(
            select(key).where(condition, *self._where_clause(where))
            .order_by(*{t.c[self.order_by]: None, key: None}).limit(size),
            t, skip_locked=True,
        )
        result = conn.execute(update(t).where(key.in_(chosen)).values(values).returning(*t.c))
        return [dict(r._mapping) for r in result]

    def batch(self, handle: dict[str, Any]) -> Batch:
        """Rebuild a :class:`Batch` from :meth:`Batch.handle` (e.g. in another Airflow task).

        The rows, their attempts and the expiry are read from the table (the truth, whatever
        the handle's age); the lease length comes from the handle (older handles without it:
        from ``expires_at - claimed_at``, else the table's default lease).
        """
        try:
            keys, token, owner = list(handle["keys"]), int(handle["token"]), str(handle["owner"])
            lease = float(handle.get("lease") or 0.0)
            claimed_at = float(handle.get("claimed_at") or 0.0)
            expires_at = float(handle.get("expires_at") or 0.0)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"not a batch handle (needs keys, token, owner): {handle!r}") from exc
        if lease <= 0:
            lease = expires_at - claimed_at if 0 < claimed_at < expires_at else self.lease
        t = self.table
        rows: list[dict[str, Any]] = []
        user_cols = [c for c in t.c if not c.name.startswith(self.prefix)]
        attempts_col, expires_col, token_col = (
            self._col("attempts"), self._col("expires_at"), self._col("token"))

        def fn(conn: Connection) -> None:
            rows.clear()
            for chunk in _chunks(keys):
                for r in conn.execute(select(*user_cols, attempts_col, expires_col, token_col)
                                      .where(t.c[self.key].in_(chunk))):
                    rows.append(dict(r._mapping))

        self.ct.db.run(fn)
        order = {k: i for i, k in enumerate(keys)}
        rows.sort(key=lambda r: order.get(r[self.key], 0))
        held = [r for r in rows if r[token_col.name] == token]
        attempts = {k: 1 for k in keys}
        attempts.update({r[self.key]: int(r[attempts_col.name] or 1) for r in held})
        if held:
            expires_at = max(float(r[expires_col.name] or 0) for r in held) or expires_at
        if claimed_at <= 0:
            claimed_at = expires_at - lease
        user_names = [c.name for c in user_cols]
        return Batch(self, owner, token, [{c: r[c] for c in user_names} for r in rows], attempts,
                     claimed_at, expires_at, lease_seconds=lease)

    # -- finishing (all fenced on the batch token) -----------------------------------------------
    def _fenced(self, token: int, keys: Sequence[Any] = ()) -> ColumnElement[bool]:
        return and_(self._col("token") == token, self._is(CLAIMED))

    def _key_chunks(self, keys: Sequence[Any]) -> Iterator[list[Any]]:
        """``keys`` in lists short enough for one ``IN (...)`` and, on SQL Server, for one
        statement's row cap (:func:`dialects.rows_per_statement`)."""
        dialect = self.ct.db.dialect_name
        size = min(dialects.max_in_list(dialect), dialects.rows_per_statement(dialect) or _CHUNK, _CHUNK)
        return _chunks(keys, size)

    def _seek_hint(self, stmt: Any) -> Any:
        """SQL Server: look rows up through the key's index, never by scanning past other
        workers' locked rows (a select by key list and token)."""
        return stmt.with_hint(self.table, "WITH (FORCESEEK)", dialect_name="mssql")

    def _raise_lost(self, missing: int, keys: Sequence[Any], lost: list[Any]) -> None:
        raise LeaseLost(
            f"{missing} of {len(set(keys))} rows of {self.qualified_name!r} are no longer held by this "
            f"batch (lease expired and they were re-claimed or reaped): {describe_keys(lost)}; nothing was "
            "completed and the transaction was rolled back",
            keys=lost,
        )

    def _keys_where(self, conn: Connection, keys: Sequence[Any], *conditions: ColumnElement[bool],
                    lock: bool = False) -> set[Any]:
        """Which of ``keys`` meet ``conditions`` now (with row locks if ``lock``)."""
        t = self.table
        found: set[Any] = set()
        for chunk in self._key_chunks(keys):
            stmt = select(t.c[self.key]).where(t.c[self.key].in_(chunk), *conditions)
            stmt = dialects.lock_rows(stmt, t) if lock else self._seek_hint(stmt)
            found.update(r[0] for r in conn.execute(stmt))
        return found

    def _done_under(self, conn: Connection, token: int, keys: Sequence[Any]) -> set[Any]:
        """Keys that are done under ``token``: completed by this call or by an earlier one of
        the same batch whose commit went through (a retry after a lost reply)."""
        return self._keys_where(conn, keys, self._col("token") == token, self._is(DONE))

    def _held_lost(self, conn: Connection, token: int, keys: Sequence[Any]) -> list[Any]:
        """Keys not claimed under ``token`` right now (done already, re-claimed or reset)."""
        held = self._keys_where(conn, keys, self._fenced(token))
        return [k for k in keys if k not in held]

    def _complete(self, conn: Connection, token: int, keys: Sequence[Any], *, whole: bool = False) -> int:
        """Mark ``keys`` done if, and only if, every one is claimed (or already done) under ``token``.

        ``whole``: ``keys`` are all the batch's unsettled rows, so one ``UPDATE ... WHERE token``
        marks them without sending the keys (not on SQL Server, where statements go by key
        chunks under the row cap). The update's row count is trusted only where the driver
        reports it faithfully (:func:`dialects.trusts_rowcount`); otherwise, and whenever the
        count falls short, a select in the same transaction confirms which keys are done under
        the token. Rows already done under it count as completed, so a retry after a lost COMMIT
        reply succeeds. For part of a batch the update runs in a savepoint, so that on a
        mismatch the rows this call marked are put back. Either way a mismatch raises LeaseLost
        and the caller's transaction rolls back.
        """
        t = self.table
        unique = set(keys)
        if not unique:
            return 0
        values = {f"{self.prefix}state": DONE, f"{self.prefix}done_at": dialects.db_now(),
                  f"{self.prefix}expires_at": None, f"{self.prefix}error": None}
        dialect = self.ct.db.dialect_name
        trusted = dialects.trusts_rowcount(dialect)
        by_token = whole and dialects.rows_per_statement(dialect) is None
        savepoint = None if whole else conn.begin_nested()
        n = 0
        if by_token:
            n = int(conn.execute(update(t).where(self._fenced(token)).values(values)).rowcount)
        else:
            for chunk in self._key_chunks(keys):
                n += int(conn.execute(
                    update(t).where(t.c[self.key].in_(chunk), self._fenced(token)).values(values)).rowcount)
        if not trusted or n != len(unique):
            n = len(self._done_under(conn, token, keys) & unique)
        if n == len(unique):
            if savepoint is not None:
                savepoint.commit()
            return n
        if savepoint is not None:
            savepoint.rollback()
        done = self._done_under(conn, token, keys)
        lost = [k for k in keys if k not in done and k not in self._keys_where(conn, keys, self._fenced(token))]
        self._raise_lost(len(unique) - n, keys, lost or [k for k in keys if k not in done])
        return n  # pragma: no cover - _raise_lost raises

    def _fail(self, token: int, keys: Sequence[Any], reason: str) -> int:
        """Give ``keys`` back for a retry, or to the error state, deciding in SQL from each row's
        stored attempts: ``attempts >= max_attempts`` goes to error, otherwise the row becomes
        pending again after ``min(backoff * 2**(attempts - 1), max_backoff)`` seconds. The rows
        are locked and checked first, so the outcome never depends on a reported row count."""
        t = self.table
        attempts = self._col("attempts")
        message = dialects.fit_message(reason, ERROR_LENGTH)

        def fn(conn: Connection) -> int:
            now = dialects.db_now()
            held = self._keys_where(conn, keys, self._fenced(token), lock=True)
            lost = [k for k in keys if k not in held]
            if lost:
                raise LeaseLost(f"cannot fail rows no longer held by this batch: {describe_keys(lost)}", keys=lost)
            final = attempts >= self.max_attempts
            delays = []
            for attempt in range(1, self.max_attempts):
                delay = min(self.backoff * (2 ** (attempt - 1)), self.max_backoff)
                delays.append((attempts <= attempt, now + delay))
                if delay >= self.max_backoff:
                    break
            available = case((final, None), *delays, else_=now + self.max_backoff)
            values: dict[str, Any] = {
                f"{self.prefix}state": case((final, ERROR), else_=PENDING), f"{self.prefix}owner": None,
                f"{self.prefix}token": None, f"{self.prefix}expires_at": None,
                f"{self.prefix}available_at": available, f"{self.prefix}error": message,
            }
            for chunk in self._key_chunks(list(held)):
                conn.execute(update(t).where(t.c[self.key].in_(chunk), self._fenced(token)).values(values))
            self.ct._notify(conn, [self.wakeup_key])
            return len(held)

        return self.ct.db.run(fn, idempotent=False)

    def _release(self, token: int, keys: Sequence[Any]) -> int:
        t = self.table

        def fn(conn: Connection) -> int:
            held = self._keys_where(conn, keys, self._fenced(token), lock=True)
            for chunk in self._key_chunks(list(held)):
                conn.execute(
                    update(t).where(t.c[self.key].in_(chunk), self._fenced(token)).values({
                        f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
                        f"{self.prefix}expires_at": None,
                        f"{self.prefix}attempts": case(
                            (t.c[f"{self.prefix}attempts"] > 0, t.c[f"{self.prefix}attempts"] - 1), else_=0)}))
            self.ct._notify(conn, [self.wakeup_key])
            return len(held)

        return self.ct.db.run(fn)

    def _renew(self, token: int, keys: Sequence[Any], seconds: float) -> float:
        t = self.table

        def fn(conn: Connection) -> float:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            held = self._keys_where(conn, keys, self._fenced(token), self._col("expires_at") >= now, lock=True)
            if len(held) != len(set(keys)):
                lost = self._held_lost(conn, token, keys)
                raise LeaseLost(f"cannot renew rows no longer held by this batch: {describe_keys(lost)}", keys=lost)
            for chunk in self._key_chunks(list(held)):
                conn.execute(update(t).where(t.c[self.key].in_(chunk), self._fenced(token))
                             .values({f"{self.prefix}expires_at": now + seconds}))
            return now + seconds

        return self.ct.db.run(fn)

    # -- administration ----------------------------------------------------------------------------
    def stats(self) -> EventStats:
        """Counts per state (claimed rows whose lease ran out count as ``expired`` too)."""
        t = self.table
        state, expires = self._col("state"), self._col("expires_at")

        def fn(conn: Connection) -> EventStats:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            st = EventStats(self.qualified_name)
            for row in conn.execute(select(state, func.count()).group_by(state)):
                setattr(st, STATE_NAMES.get(int(row[0]), "error"), int(row[1]))
            st.expired = int(conn.scalar(
                select(func.count()).select_from(t).where(self._is(CLAIMED), expires < now)) or 0)
            first = conn.execute(
                select(t.c[self.key], *( [t.c[self.time_column]] if self.time_column else []))
                .where(self._is(PENDING)).order_by(t.c[self.order_by]).limit(1)
            ).first()
            if first is not None:
                st.oldest_pending_key = first[0]
                if self.time_column is not None and first[1] is not None:
                    st.oldest_pending_age = _age(first[1], now)
            return st

        return self.ct.db.run(fn)

    def backlog(self, where: Where = None) -> tuple[int, Any]:
        """(rows a claim could take now, the largest ``order_by`` value among them) in one query.

        Sensors use the pair as a run key: a new key means new work arrived.
        """
        t = self.table

        def fn(conn: Connection) -> tuple[int, Any]:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            row = conn.execute(
                select(func.count(), func.max(t.c[self.order_by]))
                .select_from(t).where(self.claimable(now), *self._where_clause(where))
            ).one()
            return int(row[0] or 0), row[1]

        return self.ct.db.run(fn)

    def pending_count(self, where: Where = None) -> int:
        """How many rows a claim could take right now."""
        t = self.table

        def fn(conn: Connection) -> int:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            return int(conn.scalar(
                select(func.count()).select_from(t).where(self.claimable(now), *self._where_clause(where))) or 0)

        return self.ct.db.run(fn)

    def _update_where(self, conditions: list[ColumnElement[Any]], values: dict[str, Any]) -> int:
        """``UPDATE <table> SET values WHERE conditions``; returns how many rows it changed.

        One statement where the backend allows it. On SQL Server, which escalates a statement
        taking about 5,000 row locks to a table lock and whose reported row counts are not
        trusted, the rows are paged by key: each transaction locks at most
        :func:`dialects.rows_per_statement` rows, updates them by key and counts them itself.
        """
        t = self.table
        cap = dialects.rows_per_statement(self.ct.db.dialect_name)
        if cap is None:
            return self.ct.db.run(lambda c: int(c.execute(update(t).where(*conditions).values(values)).rowcount))
        key = t.c[self.key]
        total, last = 0, None
        while True:
            def page(conn: Connection, after: Any = last) -> list[Any]:
                stmt = select(key).where(*conditions, *([key > after] if after is not None else []))
                found = [r[0] for r in conn.execute(dialects.lock_rows(stmt.order_by(key).limit(cap), t))]
                for chunk in self._key_chunks(found):
                    conn.execute(update(t).where(key.in_(chunk), *conditions).values(values))
                return found

            keys = self.ct.db.run(page)
            total += len(keys)
            if len(keys) < cap:
                return total
            last = keys[-1]

    def retry_errors(self, where: Where = None) -> int:
        """Put error rows back to pending with their attempts reset (after the cause was fixed)."""
        return self._update_where([self._is(ERROR), *self._where_clause(where)], {
            f"{self.prefix}state": PENDING, f"{self.prefix}attempts": 0,
            f"{self.prefix}available_at": None, f"{self.prefix}error": None})

    def reap(self) -> int:
        """Return expired claims to pending now (claims would take them anyway); returns how many."""
        return self._update_where([self._is(CLAIMED), self._col("expires_at") < dialects.db_now()], {
            f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
            f"{self.prefix}expires_at": None})

    def reset(self) -> int:
        """Every row back to pending, attempts cleared (for reprocessing a table from scratch)."""
        return self._update_where([], {
            f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
            f"{self.prefix}expires_at": None, f"{self.prefix}available_at": None, f"{self.prefix}attempts": 0,
            f"{self.prefix}error": None, f"{self.prefix}done_at": None})


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


def _chunks(keys: Sequence[Any], size: int = _CHUNK) -> Iterator[list[Any]]:
    keys = list(keys)
    for i in range(0, len(keys), size):
        yield keys[i:i + size]


def _index_name(base: str) -> str:
    if len(base) <= 60:
        return base
    import hashlib

    return f"{base[:50]}_{hashlib.sha1(base.encode()).hexdigest()[:8]}"


def _age(value: Any, now: float) -> Optional[float]:
    """Seconds between an event time (datetime or epoch number) and the database clock."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            from datetime import timezone

            value = value.replace(tzinfo=timezone.utc)
        return max(now - value.timestamp(), 0.0)
    if isinstance(value, (int, float)):
        return max(now - float(value), 0.0)
    return None

