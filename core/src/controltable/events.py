"""Event batch claiming on the user's own table (seed 001 with its races fixed).

controltable adds claim columns to the event table, never a copy of the data. A claim is one
short transaction that skips rows other workers are claiming (``FOR UPDATE SKIP LOCKED`` or
SQL Server's ``READPAST``) and marks the batch with a random token and a lease; no lock is held
while the batch is processed (seed 001's "soft lock"). Completion is fenced on that token in one
statement, so a worker whose lease ran out can never mark rows another worker re-claimed.
"""

from __future__ import annotations

import logging
import random
import secrets
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
    String,
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
from .defaults import DEFAULT_BATCH_LEASE  # noqa: F401 - re-exported
from .errors import ConfigurationError, LeaseLost, NotInstalledError, describe_keys
from .renewal import BackgroundRenewal
from .schema import EpochSeconds
from .slots import default_holder, utc
from .validation import check_identifier, check_name, check_positive_int, check_seconds

if TYPE_CHECKING:  # pragma: no cover
    from .control import ControlTable

log = logging.getLogger("controltable")

PENDING, CLAIMED, DONE, ERROR = 0, 1, 2, 3
STATE_NAMES = {PENDING: "pending", CLAIMED: "claimed", DONE: "done", ERROR: "error"}
_CHUNK = 900
#: After a claim found no expired claims, the same EventTable object looks again only after this.
EXPIRED_CHECK_INTERVAL = 1.0  # stay under Oracle's 1000-item IN lists and SQL Server's 2100 parameters

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
        Column(f"{prefix}owner", String(200), nullable=True),
        Column(f"{prefix}token", BigInteger, nullable=True),
        Column(f"{prefix}expires_at", EpochSeconds, nullable=True),
        Column(f"{prefix}available_at", EpochSeconds, nullable=True),
        Column(f"{prefix}attempts", Integer, nullable=False, server_default="0"),
        Column(f"{prefix}error", String(2000), nullable=True),
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
    """Rows claimed by one worker under one token. Finish it with complete, fail or release."""

    events: EventTable
    owner: str
    token: int
    rows: list[dict[str, Any]]
    attempts: dict[Any, int]
    claimed_at: float
    _expires_at: float
    _settled: set[Any] = field(default_factory=set)

    @property
    def finished(self) -> bool:
        """Whether every row of the batch was completed, failed or released (in one call or several)."""
        return self._settled >= set(self.keys)

    def _settle(self, keys: Optional[Sequence[Any]]) -> None:
        self._settled.update(self.keys if keys is None else keys)
        if self.finished:
            self.stop_renewing()

    def _renew_interval(self) -> float:
        return max(self._expires_at - self.claimed_at, 0.3) / 3.0

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
        """A JSON-serialisable reference (for XCom or Dagster metadata): table, key column, keys, token.

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
            "expires_at": self._expires_at,
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
        """Mark the batch (or ``keys`` of it) done. Raises :class:`LeaseLost` naming rows taken over."""
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self._unsettled()
        # A deadlock rolls back and is retried; a dropped connection is reported, since a second
        # attempt after an unseen commit would wrongly report the rows as lost.
        n = self.events.ct.db.run(
            lambda conn: self.events._complete(conn, self.token, todo, whole=keys is None), idempotent=False
        )
        self._settle(keys)
        return n

    def complete_and_claim(
        self, size: Optional[int] = None, *, lease: Optional[float] = None, where: Where = None
    ) -> Optional[Batch]:
        """Complete this batch and claim the next one for the same owner, in one transaction.

        For drain loops: one commit per batch instead of two. The completion is fenced exactly as
        :meth:`complete`; if it raises :class:`LeaseLost`, nothing is claimed. Returns the next
        batch, or ``None`` when nothing is claimable (this batch is completed either way).
        """
        events = self.events
        n = check_positive_int("size", size) if size is not None else max(len(self.rows), 1)
        lease_s = check_seconds("lease", lease) if lease is not None else max(self._expires_at - self.claimed_at, 0.001)
        assert lease_s is not None
        todo = self._unsettled()
        self.stop_renewing()

        def fn(conn: Connection) -> Optional[Batch]:
            events._complete(conn, self.token, todo, whole=True)
            return events._claim_in(conn, n, self.owner, lease_s, where)

        following = events.ct.db.run(fn, idempotent=False)
        self._settle(None)
        return following

    def fail(self, reason: str, keys: Optional[Sequence[Any]] = None) -> int:
        """Give rows back for a retry after a back-off; after ``max_attempts`` they go to error."""
        if keys is None:
            self.stop_renewing()
        todo = list(keys) if keys is not None else self.keys
        n = self.events._fail(self.token, todo, {k: self.attempts.get(k, 1) for k in todo}, str(reason))
        self._settle(keys)
        return n

    def release(self) -> int:
        """Give the rows back untouched (the attempt is not counted). Lost rows are ignored."""
        self.stop_renewing()
        n = self.events._release(self.token, self.keys)
        self._settle(None)
        return n

    def renew(self, lease: Optional[float] = None) -> Batch:
        """Extend the claim to ``lease`` seconds from now; :class:`LeaseLost` names rows taken over."""
        seconds = check_seconds("lease", lease) if lease is not None else self.events.lease
        assert seconds is not None
        self._expires_at = self.events._renew(self.token, self.keys, seconds)
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
        max_attempts: int = 5,
        backoff: float = 30.0,
        max_backoff: float = 3600.0,
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
        self._where = where
        self._table: Optional[Table] = None
        self._next_expired_check = 0.0

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
            table = self._reflect()
            self._check_columns(table)
            missing = [c.name for c in claim_columns(self.prefix) if c.name not in table.c]
            if missing:
                raise NotInstalledError(
                    f"event table {self.qualified_name!r} has no claim columns ({', '.join(missing)}); run "
                    f"events.prepare() or `controltable events prepare {self.name} --key {self.key}` first"
                )
            self._table = table
        return self._table

    @property
    def c(self) -> Any:
        """The table's columns, for ``where=`` expressions."""
        return self.table.c

    def _col(self, name: str) -> Column[Any]:
        return self.table.c[f"{self.prefix}{name}"]  # type: ignore[no-any-return]

    def indexes(self, table: Table) -> list[Index]:
        """The claim indexes, in claim order, covering only the rows a claim looks at.

        Where the backend has partial indexes (PostgreSQL, SQLite, SQL Server): one over pending
        rows and one over claimed rows, so neither the claim of pending rows nor the search for
        expired claims ever reads done rows: claim cost does not grow with table history.
        Elsewhere (MySQL/MariaDB, Oracle): one index on ``(ct_state, order_by)``, where each of
        the claim's two queries is an equality on the state and so reads rows already in order.
        """
        dialect = self.ct.db.dialect_name
        state = table.c[f"{self.prefix}state"]
        order = table.c[self.order_by]
        if dialects.supports_partial_index(dialect):
            return [
                Index(_index_name(f"{self.prefix}pending_{self.name}"), order,
                      **dialects.index_where_kwargs(dialect, state == PENDING)),
                Index(_index_name(f"{self.prefix}claimed_{self.name}"), order,
                      **dialects.index_where_kwargs(dialect, state == CLAIMED)),
            ]
        return [Index(_index_name(f"{self.prefix}claim_{self.name}"), state, order)]

    def prepare_statements(self) -> list[Any]:
        """The DDL ``prepare()`` would run now (only what is missing)."""
        table = self._reflect()
        self._check_columns(table)
        stmts: list[Any] = []
        for col in claim_columns(self.prefix):
            if col.name not in table.c:
                stmts.append(AddColumn(table, col))
                table.append_column(col)
        existing = {ix["name"] for ix in inspect(self.ct.db.engine).get_indexes(self.name, schema=self.schema)}
        stmts.extend(ix for ix in self.indexes(table) if ix.name not in existing)
        return stmts

    def prepare(self) -> list[str]:
        """Add the claim columns and the claim index if missing. Idempotent; returns what it ran."""
        from sqlalchemy.schema import CreateIndex

        done = []
        stmts = self.prepare_statements()
        with self.ct.db.begin() as conn:
            for stmt in stmts:
                ddl = CreateIndex(stmt) if isinstance(stmt, Index) else stmt
                conn.execute(ddl)
                done.append(str(ddl.compile(dialect=self.ct.db.engine.dialect)).strip())
        self._table = None
        return done

    # -- claiming ----------------------------------------------------------------------------
    def _where_clause(self, where: Where) -> list[ColumnElement[Any]]:
        out = []
        for w in (self._where, where):
            if w is None:
                continue
            out.append(w(self.table) if callable(w) else w)
        return out

    def expired_claims(self, now: Any) -> ColumnElement[bool]:
        """Rows claimed under a lease that has run out (their worker crashed or hung)."""
        return and_(self._col("state") == CLAIMED, self._col("expires_at") < now)

    def due_pending(self, now: Any) -> ColumnElement[bool]:
        """Pending rows whose back-off (after a failure) has passed."""
        avail = self._col("available_at")
        return and_(self._col("state") == PENDING, or_(avail.is_(None), avail <= now))

    def claimable(self, now: Any) -> ColumnElement[bool]:
        """Rows a claim may take: pending and due, or claimed under an expired lease."""
        return or_(self.due_pending(now), self.expired_claims(now))

    def claim_statement(self, size: int, condition: ColumnElement[bool], where: Where = None) -> Any:
        """A locking select of up to ``size`` rows meeting ``condition``, skipping rows others hold.

        Each claim runs this once per state (expired claims, then due pending rows) rather than
        once with an OR of both: with one equality on the state column the claim index returns
        rows already in claim order, so the database reads and locks only the rows it returns.
        (With the OR, MariaDB sorted every candidate and locked them all, so a concurrent claim
        found nothing to take.)
        """
        t = self.table
        stmt = (
            select(t)
            .where(condition, *self._where_clause(where))
            .order_by(*{t.c[self.order_by]: None, t.c[self.key]: None})
        )
        stmt = dialects.lock_rows(stmt, t, skip_locked=True)
        return dialects.limit_locked(stmt, self.ct.db.dialect_name, size)

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
        if wait is None:
            return self._claim_once(size, owner, lease, where)
        budget = check_seconds("wait", wait, allow_zero=True)
        assert budget is not None
        deadline = time.monotonic() + budget
        delay = poll_interval
        while True:
            since = self.ct._wakeups.mark([self.wakeup_key])
            batch = self._claim_once(size, owner, lease, where)
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
        self, size: int, owner: Optional[str], lease: Optional[float], where: Where
    ) -> Optional[Batch]:
        size = check_positive_int("size", size)
        owner = check_name("owner", owner) if owner is not None else default_holder()
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease
        assert lease_s is not None
        self.table  # noqa: B018 - reflect (and check) the table before the transaction, not inside it
        return self.ct.db.run(lambda conn: self._claim_in(conn, size, owner, lease_s, where))

    def _claim_in(self, conn: Connection, size: int, owner: str, lease_s: float, where: Where) -> Optional[Batch]:
        """The claim itself, inside the caller's transaction."""
        t = self.table
        user_cols = [c.name for c in t.c if not c.name.startswith(self.prefix)]
        token = secrets.randbits(62) + 1
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
        claimed.sort(key=lambda r: (r[self.order_by], r[self.key]))
        expires = max(float(r[f"{self.prefix}expires_at"] or 0) for r in claimed) if one_statement \
            else float(now) + lease_s
        return Batch(
            self, owner, token,
            rows=[{c: r[c] for c in user_cols} for r in claimed],
            attempts={r[self.key]: int(r[attempts_col]) for r in claimed},
            claimed_at=expires - lease_s, _expires_at=expires,
        )

    def _claim_by_keys(
        self, conn: Connection, condition: ColumnElement[bool], size: int, values: dict[str, Any], where: Where
    ) -> list[dict[str, Any]]:
        """Lock up to ``size`` rows with a skip-locked select, then mark them by key (every backend).

        Returns the rows as they are after marking. Expired claims that were abandoned
        ``max_attempts`` times are a crash loop, not a retry: they go to the error state instead.
        """
        t = self.table
        key = t.c[self.key]
        result = conn.execute(self.claim_statement(size, condition, where))
        rows = [dict(r._mapping) for r in result.fetchmany(size)]
        result.close()
        attempts_col, state_col = f"{self.prefix}attempts", f"{self.prefix}state"
        poisoned = [r[self.key] for r in rows if r[state_col] == CLAIMED and r[attempts_col] >= self.max_attempts]
        for chunk in _chunks(poisoned, dialects.max_in_list(self.ct.db.dialect_name)):
            conn.execute(update(t).where(key.in_(chunk)).values({
                f"{self.prefix}state": ERROR, f"{self.prefix}owner": None, f"{self.prefix}token": None,
                f"{self.prefix}expires_at": None,
                f"{self.prefix}error": "lease expired max_attempts times (worker crashed or hung)"}))
        rows = [r for r in rows if r[self.key] not in set(poisoned)]
        for chunk in _chunks([r[self.key] for r in rows], dialects.max_in_list(self.ct.db.dialect_name)):
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
        """Rebuild a :class:`Batch` from :meth:`Batch.handle` (e.g. in another Airflow task)."""
        try:
            keys, token, owner = list(handle["keys"]), int(handle["token"]), str(handle["owner"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"not a batch handle (needs keys, token, owner): {handle!r}") from exc
        t = self.table
        rows: list[dict[str, Any]] = []
        user_cols = [c for c in t.c if not c.name.startswith(self.prefix)]

        def fn(conn: Connection) -> None:
            for chunk in _chunks(keys):
                for r in conn.execute(select(*user_cols).where(t.c[self.key].in_(chunk))):
                    rows.append(dict(r._mapping))

        self.ct.db.run(fn)
        order = {k: i for i, k in enumerate(keys)}
        rows.sort(key=lambda r: order.get(r[self.key], 0))
        return Batch(self, owner, token, rows, {k: 1 for k in keys}, 0.0, float(handle.get("expires_at") or 0.0))

    # -- finishing (all fenced on the batch token) -----------------------------------------------
    def _fenced(self, token: int, keys: Sequence[Any]) -> ColumnElement[bool]:
        return and_(self._col("token") == token, self._col("state") == CLAIMED)

    def _raise_lost(self, missing: int, keys: Sequence[Any], lost: list[Any]) -> None:
        raise LeaseLost(
            f"{missing} of {len(set(keys))} rows of {self.qualified_name!r} are no longer held by this "
            f"batch (lease expired and they were re-claimed or reaped): {describe_keys(lost)}; nothing was "
            "completed and the transaction was rolled back",
            keys=lost,
        )

    def _without_token(self, conn: Connection, token: int, keys: Sequence[Any]) -> list[Any]:
        """Keys that no longer carry ``token`` (someone else re-claimed or reset them)."""
        t = self.table
        held: set[Any] = set()
        for chunk in _chunks(keys):
            held.update(r[0] for r in conn.execute(
                select(t.c[self.key]).where(t.c[self.key].in_(chunk), self._col("token") == token)))
        return [k for k in keys if k not in held]

    def _held_lost(self, conn: Connection, token: int, keys: Sequence[Any]) -> list[Any]:
        """Keys not claimed under ``token`` right now (done already, re-claimed or reset)."""
        t = self.table
        held: set[Any] = set()
        for chunk in _chunks(keys):
            held.update(
                r[0] for r in conn.execute(
                    select(t.c[self.key]).where(t.c[self.key].in_(chunk), self._fenced(token, chunk))
                )
            )
        return [k for k in keys if k not in held]

    def _complete(self, conn: Connection, token: int, keys: Sequence[Any], *, whole: bool = False) -> int:
        """Mark ``keys`` done if, and only if, every one is still claimed under ``token``.

        ``whole``: ``keys`` are all the batch's unsettled rows, so one ``UPDATE ... WHERE token``
        marks them without sending the keys. Rows of the batch that lost the token (re-claimed,
        reaped) are then exactly the keys that no longer carry it. For part of a batch the keys
        are named, in a savepoint, so that on a mismatch the rows this call marked are put back
        before the held rows are told apart from the lost ones. Either way a mismatch raises
        LeaseLost and the caller's transaction rolls back.
        """
        t = self.table
        if whole:
            n = int(conn.execute(update(t).where(self._fenced(token, keys)).values({
                f"{self.prefix}state": DONE, f"{self.prefix}done_at": dialects.db_now(),
                f"{self.prefix}expires_at": None, f"{self.prefix}error": None})).rowcount)
            if n != len(set(keys)):
                self._raise_lost(len(set(keys)) - n, keys, self._without_token(conn, token, keys))
            return n
        n = 0
        savepoint = conn.begin_nested()
        for chunk in _chunks(keys):
            n += conn.execute(
                update(t).where(t.c[self.key].in_(chunk), self._fenced(token, chunk)).values({
                    f"{self.prefix}state": DONE, f"{self.prefix}done_at": dialects.db_now(),
                    f"{self.prefix}expires_at": None, f"{self.prefix}error": None})
            ).rowcount
        if n == len(set(keys)):
            savepoint.commit()
        else:
            savepoint.rollback()
            self._raise_lost(len(set(keys)) - n, keys, self._held_lost(conn, token, keys))
        return n

    def _fail(self, token: int, keys: Sequence[Any], attempts: dict[Any, int], reason: str) -> int:
        t = self.table
        by_attempts: dict[int, list[Any]] = {}
        for k in keys:
            by_attempts.setdefault(attempts.get(k, 1), []).append(k)

        def fn(conn: Connection) -> int:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            n = 0
            lost = self._held_lost(conn, token, keys)
            if lost:
                raise LeaseLost(f"cannot fail rows no longer held by this batch: {describe_keys(lost)}", keys=lost)
            for attempt, group in by_attempts.items():
                final = attempt >= self.max_attempts
                delay = min(self.backoff * (2 ** max(attempt - 1, 0)), self.max_backoff)
                values: dict[str, Any] = {
                    f"{self.prefix}state": ERROR if final else PENDING, f"{self.prefix}owner": None,
                    f"{self.prefix}token": None, f"{self.prefix}expires_at": None,
                    f"{self.prefix}available_at": None if final else now + delay,
                    f"{self.prefix}error": reason[:2000],
                }
                for chunk in _chunks(group):
                    n += conn.execute(
                        update(t).where(t.c[self.key].in_(chunk), self._fenced(token, chunk)).values(values)
                    ).rowcount
            if n != len(set(keys)):  # changed between the check and the update: a concurrent reset
                raise LeaseLost(f"rows of this batch changed while failing them: {describe_keys(keys)}", keys=keys)
            self.ct._notify(conn, [self.wakeup_key])
            return n

        return self.ct.db.run(fn, idempotent=False)

    def _release(self, token: int, keys: Sequence[Any]) -> int:
        t = self.table

        def fn(conn: Connection) -> int:
            n = 0
            for chunk in _chunks(keys):
                n += conn.execute(
                    update(t).where(t.c[self.key].in_(chunk), self._fenced(token, chunk)).values({
                        f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
                        f"{self.prefix}expires_at": None,
                        f"{self.prefix}attempts": case(
                            (t.c[f"{self.prefix}attempts"] > 0, t.c[f"{self.prefix}attempts"] - 1), else_=0)})
                ).rowcount
            self.ct._notify(conn, [self.wakeup_key])
            return n

        return self.ct.db.run(fn)

    def _renew(self, token: int, keys: Sequence[Any], seconds: float) -> float:
        t = self.table

        def fn(conn: Connection) -> float:
            now = float(conn.scalar(select(dialects.db_now())) or 0.0)
            n = 0
            for chunk in _chunks(keys):
                n += conn.execute(
                    update(t).where(t.c[self.key].in_(chunk), self._fenced(token, chunk),
                                    self._col("expires_at") >= now)
                    .values({f"{self.prefix}expires_at": now + seconds})
                ).rowcount
            if n != len(set(keys)):
                lost = self._held_lost(conn, token, keys)
                raise LeaseLost(f"cannot renew rows no longer held by this batch: {describe_keys(lost)}", keys=lost)
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
                select(func.count()).select_from(t).where(state == CLAIMED, expires < now)) or 0)
            first = conn.execute(
                select(t.c[self.key], *( [t.c[self.time_column]] if self.time_column else []))
                .where(state == PENDING).order_by(t.c[self.order_by]).limit(1)
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

    def retry_errors(self, where: Where = None) -> int:
        """Put error rows back to pending with their attempts reset (seed 004's clear_all_errors)."""
        t = self.table
        return self.ct.db.run(lambda c: int(c.execute(
            update(t).where(self._col("state") == ERROR, *self._where_clause(where)).values({
                f"{self.prefix}state": PENDING, f"{self.prefix}attempts": 0,
                f"{self.prefix}available_at": None, f"{self.prefix}error": None})
        ).rowcount))

    def reap(self) -> int:
        """Return expired claims to pending now (claims would take them anyway); returns how many."""
        t = self.table
        return self.ct.db.run(lambda c: int(c.execute(
            update(t).where(self._col("state") == CLAIMED, self._col("expires_at") < dialects.db_now()).values({
                f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
                f"{self.prefix}expires_at": None})
        ).rowcount))

    def reset(self) -> int:
        """Every row back to pending, attempts cleared (for reprocessing a table from scratch)."""
        t = self.table
        return self.ct.db.run(lambda c: int(c.execute(update(t).values({
            f"{self.prefix}state": PENDING, f"{self.prefix}owner": None, f"{self.prefix}token": None,
            f"{self.prefix}expires_at": None, f"{self.prefix}available_at": None, f"{self.prefix}attempts": 0,
            f"{self.prefix}error": None, f"{self.prefix}done_at": None})).rowcount))


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

