"""The event table's SQL: :class:`EventStatements`, every statement of one event table, bound once; nothing run here.

Every statement the event engine sends is built by a method of the :class:`EventStatements` it made
once from the reflected table, the :class:`ClaimColumns` naming the claim columns, the key, the
claim order and the backend's traits; a call passes plain values only. The workflow
(:mod:`controltable.events.workflow`) decides when to run them and in which transaction. Each
builder returns one statement, run with ``conn.execute(stmt)``; its name is the statement's name
in the golden SQL files (``core/sql/<dialect>.sql``), and a ``@sql_notes`` line next to it says
why the statement is shaped so on a backend. The values a change writes that need no table, and
``prepare()``'s own statements (run before the table is loaded), are module functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    SmallInteger,
    Table,
    and_,
    case,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.sql.elements import ColumnElement, TextClause

from .. import dialects
from ..clock import clock
from ..defaults import NAME_LENGTH
from ..schema import EpochSeconds
from ..sqlnotes import sql_notes
from ..validation import where_clause

PENDING, CLAIMED, DONE, ERROR = 0, 1, 2, 3
STATE_NAMES = {PENDING: "pending", CLAIMED: "claimed", DONE: "done", ERROR: "error"}
#: Keys per ``IN (...)`` list: under Oracle's 1000 items and SQL Server's 2100 parameters.
CHUNK = 900
#: The longest error message kept per row (characters; bytes on Oracle, see dialects.message_type).
ERROR_LENGTH = 2000
#: The message a claim stores on a row whose lease ran out ``max_attempts`` times.
POISONED = "lease expired max_attempts times (worker crashed or hung)"

#: A filter on the event table: an expression over its columns or a callable receiving the table.
Where = Union[ColumnElement[Any], Callable[[Table], ColumnElement[Any]], None]

#: The claim columns' short names, in the order ``prepare()`` adds them.
FIELDS = ("state", "owner", "token", "expires_at", "available_at", "attempts", "error", "done_at")


@dataclass(frozen=True)
class ClaimColumns:
    """The names of the claim columns an event table carries: ``<prefix><field>`` for each field.

    One object per event table, so no statement spells a claim column by hand: ``cols.state``
    is the column name, ``cols.of(table, "state")`` the reflected column, and
    ``cols.values(state=DONE)`` a ``{column name: value}`` mapping for an UPDATE.
    """

    prefix: str = "ct_"

    def name(self, field: str) -> str:
        if field not in FIELDS:
            raise KeyError(f"{field!r} is not a claim column (one of {', '.join(FIELDS)})")
        return f"{self.prefix}{field}"

    @property
    def state(self) -> str:
        return self.name("state")

    @property
    def token(self) -> str:
        return self.name("token")

    @property
    def attempts(self) -> str:
        return self.name("attempts")

    @property
    def expires_at(self) -> str:
        return self.name("expires_at")

    def names(self) -> list[str]:
        return [self.name(f) for f in FIELDS]

    def of(self, table: Table, field: str) -> Column[Any]:
        """The reflected claim column ``field`` of ``table``."""
        return table.c[self.name(field)]  # type: ignore[no-any-return]

    def values(self, **by_field: Any) -> dict[str, Any]:
        """``{column name: value}`` for an UPDATE, from values given by short field name."""
        return {self.name(f): v for f, v in by_field.items()}

    def is_claim_column(self, name: str) -> bool:
        """Whether a column of the table is one of controltable's (else it is the user's)."""
        return name.startswith(self.prefix)

    def ddl(self, *, metadata_only: bool = False) -> list[Column[Any]]:
        """The columns ``prepare()`` adds to an event table, in order.

        ``metadata_only`` (SQL Server): the two counters are added nullable, with their default.
        ``ADD ... NOT NULL DEFAULT 0`` is a metadata-only change on Enterprise and Azure only;
        on Standard it rewrites the whole table under a schema lock. A nullable column with a
        default (without ``WITH VALUES``) is metadata-only on every edition: existing rows read
        NULL, new rows get 0, and ``prepare()`` then sets the NULLs to 0 in short batches
        (:func:`backfill_batch`); until a row is set no claim takes it. The text columns carry
        their own character set where the table's default would apply (:func:`dialects.own_charset`).
        """
        return [
            Column(self.state, SmallInteger, nullable=metadata_only, server_default="0"),
            Column(self.name("owner"), dialects.own_charset(dialects.name_type(NAME_LENGTH), NAME_LENGTH),
                   nullable=True),
            Column(self.token, BigInteger, nullable=True),
            Column(self.expires_at, EpochSeconds, nullable=True),
            Column(self.name("available_at"), EpochSeconds, nullable=True),
            Column(self.attempts, Integer, nullable=metadata_only, server_default="0"),
            Column(self.name("error"), dialects.own_charset(dialects.message_type(ERROR_LENGTH), ERROR_LENGTH),
                   nullable=True),
            Column(self.name("done_at"), EpochSeconds, nullable=True),
        ]


def claim_columns(prefix: str = "ct_") -> list[Column[Any]]:
    """The columns ``prepare()`` adds to an event table, in order."""
    return ClaimColumns(prefix).ddl()


# -- values (what a change writes; no statement) --------------------------------------------------
def poisoned_values(cols: ClaimColumns) -> dict[str, Any]:
    """Expired claims abandoned ``max_attempts`` times are a crash loop, not a retry: to error."""
    return cols.values(state=ERROR, owner=None, token=None, expires_at=None, error=POISONED)


def done_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=DONE, done_at=clock(), expires_at=None, error=None)


def renew_values(cols: ClaimColumns, expires_at: float) -> dict[str, Any]:
    return cols.values(expires_at=expires_at)


def retry_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, attempts=0, available_at=None, error=None)


def reap_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, owner=None, token=None, expires_at=None)


def reset_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, owner=None, token=None, expires_at=None, available_at=None, attempts=0,
                       error=None, done_at=None)


# -- the statements of prepare() (a table not loaded yet) ------------------------------------------
def unset_claim_columns(table: Table, cols: ClaimColumns) -> ColumnElement[bool]:
    """Rows whose claim columns a metadata-only ``prepare()`` has not set yet (SQL Server)."""
    return cols.of(table, "state").is_(None)


_BACKFILL = ("the claim counters were added nullable (a metadata-only ADD on every edition): NULLs are set in "
             "batches under the lock-escalation threshold, the target repeating IS NULL for RCSI")


@sql_notes(mssql=_BACKFILL)
def backfill_batch(table: Table, cols: ClaimColumns, key: str, size: int, *, skip_locked: bool = False) -> Any:
    """Set up to ``size`` unset rows pending with no attempts: ``UPDATE ... WHERE key IN (SELECT
    TOP n key ... WHERE ct_state IS NULL)``, a seek of the claim index (state leading; with
    filtered indexes, of the ``ct_unset`` one), each batch its own short transaction under the
    lock-escalation threshold. ``skip_locked``: inside a claim, which passes over rows a producer
    is still inserting rather than wait for its commit."""
    k = table.c[key]
    found = select(k).where(unset_claim_columns(table, cols)).limit(size)
    if skip_locked:
        found = dialects.lock_rows(found, table, skip_locked=True)
    chosen = found.scalar_subquery()
    # The target repeats ``ct_state IS NULL``: under read committed snapshot (RCSI) the subquery
    # reads row versions from the statement's start, so a row another prepare()'s batch set (and a
    # claim then took) may still look unset there; the target's own predicate is evaluated on the
    # locked current row, so a live claim is never reset to pending.
    return update(table).where(k.in_(chosen), unset_claim_columns(table, cols)).values(
        cols.values(state=PENDING, attempts=0))


def any_unset(table: Table, cols: ClaimColumns) -> Any:
    """One key of a row a metadata-only ``prepare()`` has not set yet, if any."""
    return select(func.count()).select_from(
        select(cols.of(table, "state")).where(unset_claim_columns(table, cols)).limit(1).subquery())


@sql_notes(postgresql="an interrupted CREATE INDEX CONCURRENTLY leaves an invalid index behind, which "
                      "prepare() drops and builds again")
def invalid_indexes(name: str, schema: Optional[str]) -> TextClause:
    """PostgreSQL: the indexes of a table that an interrupted ``CREATE INDEX CONCURRENTLY`` left
    invalid (a catalogue query; the names are bound parameters)."""
    return text(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE NOT i.indisvalid AND t.relname = :name AND n.nspname = COALESCE(:schema, current_schema())"
    ).bindparams(name=name, schema=schema)


def chunks(keys: Sequence[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    """``keys`` in lists of at most ``size``."""
    keys = list(keys)
    for i in range(0, len(keys), size):
        yield keys[i:i + size]


_SEEK = ("table hint FORCESEEK: a scan under UPDLOCK would walk into rows other workers hold and deadlock "
         "(1205); a VARCHAR key's parameters are cast to the column's type")
_UPDATE_SEEK = ("OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers "
                "hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache")
_CONFIRM = "rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count"


class EventStatements:
    """Every statement of one event table, bound once: the reflected table, its claim columns, the
    key, the claim order, the table's own filter and the backend's :class:`~controltable.dialects.Traits`.

    Made by :class:`~controltable.events.EventTable` when it loads the table (again after
    ``prepare()``), so a call passes only what varies (keys, a token, the time). Each method that
    returns a statement is that statement's name in the golden SQL files; the conditions and the
    values a statement writes are methods too, returning expressions and ``{column: value}``.
    """

    def __init__(self, table: Table, cols: ClaimColumns, key: str, order_by: str, traits: dialects.Traits, *,
                 where: Where = None, time_column: Optional[str] = None, seekable: bool = False) -> None:
        self.table = table
        self.cols = cols
        self.key = key
        self.order_by = order_by
        self.traits = traits
        self.time_column = time_column
        #: SQL Server: whether the claim index exists, so claims may demand an index seek.
        self.seekable = seekable
        self._where = where
        #: Keys per statement: short enough for one ``IN (...)`` and, on SQL Server, for one
        #: statement's row cap (lock escalation).
        self.key_chunk = min(traits.max_in_list, traits.rows_per_statement or CHUNK, CHUNK)

    def col(self, field: str) -> Column[Any]:
        """The claim column ``field`` (``"state"``, ``"token"``...)."""
        return self.cols.of(self.table, field)

    def _key(self) -> Any:
        return dialects.key_column(self.table.c[self.key])

    # -- conditions ------------------------------------------------------------------------------
    def is_state(self, state: int) -> ColumnElement[bool]:
        """``ct_state = <state>`` with the state as a literal (see :func:`dialects.state_literal`)."""
        return self.col("state") == dialects.state_literal(state, SmallInteger())

    def fenced(self, token: int) -> ColumnElement[bool]:
        """Rows still claimed under ``token``: the fence every finishing statement carries."""
        return and_(self.col("token") == token, self.is_state(CLAIMED))

    def expired_claims(self, now: Any) -> ColumnElement[bool]:
        """Rows claimed under a lease that has run out (their worker crashed or hung)."""
        return and_(self.is_state(CLAIMED), self.col("expires_at") < now)

    def due_pending(self, now: Any) -> ColumnElement[bool]:
        """Pending rows whose back-off (after a failure) has passed."""
        avail = self.col("available_at")
        return and_(self.is_state(PENDING), or_(avail.is_(None), avail <= now))

    def claimable(self, now: Any) -> ColumnElement[bool]:
        """Rows a claim may take: pending and due, or claimed under an expired lease."""
        return or_(self.due_pending(now), self.expired_claims(now))

    def where_clauses(self, where: Where = None) -> list[ColumnElement[Any]]:
        """The table's own filter and a call's filter, as conditions (``None`` ones left out)."""
        return [where_clause(w, self.table) for w in (self._where, where) if w is not None]

    def claim_order(self) -> list[Any]:
        """The claim order: ``order_by`` then the key (once if they are the same column)."""
        return list({self.table.c[self.order_by]: None, self.table.c[self.key]: None})

    # -- claiming --------------------------------------------------------------------------------
    def claim_values(self, owner: str, token: int, now: Any, lease: float) -> dict[str, Any]:
        """What a claim writes: claimed by ``owner`` under ``token`` until ``now + lease``, one more attempt.

        Where ``prepare()`` added the counters nullable (SQL Server, see :meth:`ClaimColumns.ddl`)
        a producer may have inserted an explicit NULL attempt count, which counts as 0 (NULL + 1
        would stay NULL)."""
        attempts: Any = self.col("attempts")
        if self.traits.adds_columns_nullable:
            attempts = func.coalesce(attempts, 0)
        return self.cols.values(state=CLAIMED, owner=owner, token=token, attempts=attempts + 1,
                                expires_at=now + lease)

    @sql_notes(
        mssql="table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the "
              "claim index exists, TOP capped under the 5,000-lock escalation threshold",
        oracle="FOR UPDATE SKIP LOCKED without FETCH FIRST (ORA-02014): FIRST_ROWS(n) and a fetch size of n "
               "make the cursor lock n rows",
        mysql="no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per "
              "select, or MariaDB sorts and locks every candidate",
        postgresql="expired claims only (pending rows go through claim_returning); one state per select keeps "
                   "the partial index's order",
        sqlite="no FOR UPDATE: the transaction's BEGIN IMMEDIATE already made it the only writer",
    )
    def claim_select(self, size: int, condition: ColumnElement[bool], where: Where = None) -> Any:
        """A locking select of up to ``size`` rows meeting ``condition``, skipping rows others hold.

        Each claim runs this once per state (expired claims, then due pending rows) rather than
        once with an OR of both: with one equality on the state column the claim index returns
        rows already in claim order, so the database reads and locks only the rows it returns.
        (With the OR, MariaDB sorted every candidate and locked them all, so a concurrent claim
        found nothing to take.) The backends' own shapes are in the ``@sql_notes`` above.
        """
        cap = self.traits.rows_per_statement
        if cap is not None:
            size = min(size, cap)
        t = self.table
        stmt = select(t).where(condition, *self.where_clauses(where)).order_by(*self.claim_order())
        stmt = dialects.lock_rows(stmt, t, skip_locked=True, seek=self.seekable)
        stmt = dialects.first_rows_hint(stmt, t, size)
        stmt = dialects.limit_fetch(stmt, size)
        return stmt.limit(size) if self.traits.limit_under_lock else stmt

    @sql_notes(
        postgresql="one round trip: the locking subquery skips rows other workers hold, RETURNING gives the rows",
        sqlite="no SKIP LOCKED: the transaction's BEGIN IMMEDIATE already made it the only writer",
    )
    def claim_returning(self, size: int, condition: ColumnElement[bool], where: Where,
                        values: dict[str, Any]) -> Any:
        """Claim in one statement where the backend can: ``UPDATE ... WHERE key IN (SELECT ...
        FOR UPDATE SKIP LOCKED LIMIT n) RETURNING *`` (PostgreSQL; SQLite, whose single writer
        needs no skipping). One round trip instead of a select plus updates by key list."""
        t, k = self.table, self.table.c[self.key]
        chosen = dialects.lock_rows(
            select(k).where(condition, *self.where_clauses(where)).order_by(*self.claim_order()).limit(size),
            t, skip_locked=True,
        )
        return update(t).where(k.in_(chosen)).values(values).returning(*t.c)

    @sql_notes(mssql=_UPDATE_SEEK, oracle="key lists padded to 1, 2, 4 ... 900 keys: one cached plan per list "
                                          "length, under the 1,000-item limit of IN")
    def update_keys(self, keys: Sequence[Any], values: dict[str, Any], *conditions: ColumnElement[Any]) -> Any:
        """``UPDATE <table> SET values WHERE key IN (keys) AND conditions``: a seek of the key's
        index on SQL Server (:func:`dialects.seek_keyed`), the keys bound with the key column's type
        and padded to a few list lengths (:func:`dialects.padded_keys`)."""
        stmt = update(self.table).where(self._key().in_(dialects.padded_keys(keys)), *conditions).values(values)
        return dialects.seek_keyed(stmt, self.table)

    @sql_notes(mssql=_SEEK)
    def expires_of(self, first_key: Any) -> Any:
        """The expiry a claim stamped (read back when it was a database-clock expression)."""
        return dialects.seek_keyed(select(self.col("expires_at")).where(self._key() == first_key), self.table)

    def with_token(self, token: int) -> Any:
        """Rows claimed under ``token``: what an earlier, committed attempt of the same claim took."""
        return select(self.table).where(self.is_state(CLAIMED), self.col("token") == token)

    @sql_notes(mssql=_SEEK)
    def rows_by_keys(self, keys: Sequence[Any]) -> Any:
        """The user columns and the claim history (attempts, expiry, token) of ``keys``."""
        user = [c for c in self.table.c if not self.cols.is_claim_column(c.name)]
        stmt = select(*user, self.col("attempts"), self.col("expires_at"), self.col("token"))
        return dialects.seek_keyed(stmt.where(self._key().in_(dialects.padded_keys(keys))), self.table)

    @sql_notes(mssql=_BACKFILL + "; READPAST passes over rows a producer is still inserting")
    def backfill_batch(self, size: int) -> Any:
        """Inside a claim (SQL Server): set up to ``size`` rows a producer inserted with NULL claim
        columns pending, passing over rows it is still inserting (see :func:`backfill_batch`)."""
        return backfill_batch(self.table, self.cols, self.key, size, skip_locked=True)

    # -- finishing (all fenced on the batch token) -------------------------------------------------
    @sql_notes(mssql="UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: " + _CONFIRM)
    def keys_where(self, keys: Sequence[Any], conditions: Sequence[ColumnElement[Any]], *,
                   lock: bool = False) -> Any:
        """Which of ``keys`` meet ``conditions`` now: with row locks if ``lock``, else (SQL Server)
        looked up through the key's index, never by scanning past other workers' locked rows."""
        stmt = select(self.table.c[self.key]).where(self._key().in_(dialects.padded_keys(keys)), *conditions)
        if lock:
            return dialects.lock_rows(stmt, self.table, seek=True)
        return dialects.seek_keyed(stmt, self.table)

    def fail_values(self, message: str, *, max_attempts: int, schedule: Sequence[tuple[int, float]],
                    max_backoff: float) -> dict[str, Any]:
        """Back to pending after the delay ``schedule`` gives for the row's stored attempts (see
        :func:`controltable.events.decisions.backoff_schedule`; ``max_backoff`` past its end), or to
        error once ``attempts >= max_attempts``: decided in SQL, row by row."""
        now = clock()
        attempts = self.col("attempts")
        final = attempts >= max_attempts
        delays = [(attempts <= attempt, now + delay) for attempt, delay in schedule]
        available = case((final, None), *delays, else_=now + max_backoff)
        return self.cols.values(state=case((final, ERROR), else_=PENDING), owner=None, token=None, expires_at=None,
                                available_at=available, error=message)

    def release_values(self) -> dict[str, Any]:
        """Back to pending untouched: the attempt the claim counted is taken back."""
        attempts = self.col("attempts")
        return self.cols.values(state=PENDING, owner=None, token=None, expires_at=None,
                                attempts=case((attempts > 0, attempts - 1), else_=0))

    def update_where(self, conditions: Sequence[ColumnElement[Any]], values: dict[str, Any]) -> Any:
        """``UPDATE <table> SET values WHERE conditions``: a whole batch by its token, or a bulk reset."""
        return update(self.table).where(*conditions).values(values)

    # -- administration ----------------------------------------------------------------------------
    @sql_notes(mssql="COALESCE: a row a metadata-only prepare() has not set yet (state NULL) counts as pending")
    def counts_by_state(self) -> Any:
        """Rows per state; a row a metadata-only ``prepare()`` has not set yet (NULL, SQL Server
        only, while ``prepare()`` runs) counts as pending, which it becomes."""
        state = func.coalesce(self.col("state"), dialects.state_literal(PENDING, SmallInteger()))
        return select(state, func.count()).group_by(state)

    def count_expired(self, now: Any) -> Any:
        return select(func.count()).select_from(self.table).where(self.expired_claims(now))

    def oldest_pending(self) -> Any:
        t = self.table
        extra = [t.c[self.time_column]] if self.time_column else []
        return select(t.c[self.key], *extra).where(self.is_state(PENDING)).order_by(t.c[self.order_by]).limit(1)

    def error_rows(self, limit: int) -> Any:
        """Rows in the error state (key, attempts, last error), in the claim index's order."""
        t = self.table
        order = [t.c[self.order_by]] + ([t.c[self.key]] if self.order_by != self.key else [])
        return (select(t.c[self.key], self.col("attempts"), self.col("error"))
                .where(self.is_state(ERROR)).order_by(*order).limit(limit))

    def backlog(self, now: Any, where: Where = None) -> Any:
        """(rows a claim could take now, the largest ``order_by`` value among them) in one query."""
        return (select(func.count(), func.max(self.table.c[self.order_by]))
                .select_from(self.table).where(self.claimable(now), *self.where_clauses(where)))

    def pending_count(self, now: Any, where: Where = None) -> Any:
        return select(func.count()).select_from(self.table).where(self.claimable(now), *self.where_clauses(where))

    @sql_notes(mssql="paged by key under the lock-escalation threshold; FORCESEEK from the second page on (the "
                     "first has no seek predicate: error 8622)")
    def page_keys(self, conditions: Sequence[ColumnElement[Any]], after: Any, cap: int) -> Any:
        """The next ``cap`` keys meeting ``conditions`` after ``after``, locked (SQL Server paging).

        The first page has no predicate every layout can seek (``reset()`` has none, and
        ``retry_errors()``'s ``ct_state = 3`` is in no filtered claim index), and SQL Server refuses
        ``FORCESEEK`` without one (error 8622), so that page is left to the optimizer."""
        k = self.table.c[self.key]
        stmt = select(k).where(*conditions, *([self._key() > after] if after is not None else []))
        return dialects.lock_rows(stmt.order_by(k).limit(cap), self.table, seek=after is not None)
