"""The event table's SQL: pure SQLAlchemy builders over a claim-columns object, nothing run here.

Every statement the event engine sends is built by a function of this module from the reflected
table, the :class:`ClaimColumns` naming the claim columns and plain values; the workflow
(:mod:`controltable.events.workflow`) decides when to run them and in which transaction. Per-dialect
differences are asked of :mod:`controltable.dialects`, never decided here.
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
from ..dialect_traits import Traits
from ..schema import EpochSeconds
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


# -- conditions ------------------------------------------------------------------------------------
def is_state(table: Table, cols: ClaimColumns, state: int) -> ColumnElement[bool]:
    """``ct_state = <state>`` with the state as a literal (see :func:`dialects.state_literal`)."""
    return cols.of(table, "state") == dialects.state_literal(state, SmallInteger())


def fenced(table: Table, cols: ClaimColumns, token: int) -> ColumnElement[bool]:
    """Rows still claimed under ``token``: the fence every finishing statement carries."""
    return and_(cols.of(table, "token") == token, is_state(table, cols, CLAIMED))


def expired_claims(table: Table, cols: ClaimColumns, now: Any) -> ColumnElement[bool]:
    """Rows claimed under a lease that has run out (their worker crashed or hung)."""
    return and_(is_state(table, cols, CLAIMED), cols.of(table, "expires_at") < now)


def due_pending(table: Table, cols: ClaimColumns, now: Any) -> ColumnElement[bool]:
    """Pending rows whose back-off (after a failure) has passed."""
    avail = cols.of(table, "available_at")
    return and_(is_state(table, cols, PENDING), or_(avail.is_(None), avail <= now))


def claimable(table: Table, cols: ClaimColumns, now: Any) -> ColumnElement[bool]:
    """Rows a claim may take: pending and due, or claimed under an expired lease."""
    return or_(due_pending(table, cols, now), expired_claims(table, cols, now))


def where_clauses(table: Table, *filters: Where) -> list[ColumnElement[Any]]:
    """The table's own filter and a call's filter, as conditions (``None`` ones left out)."""
    return [where_clause(w, table) for w in filters if w is not None]


def claim_order(table: Table, key: str, order_by: str) -> list[Any]:
    """The claim order: ``order_by`` then the key (once if they are the same column)."""
    return list({table.c[order_by]: None, table.c[key]: None})


# -- claiming --------------------------------------------------------------------------------------
def claim_values(table: Table, cols: ClaimColumns, owner: str, token: int, now: Any, lease: float, *,
                 nullable_counters: bool = False) -> dict[str, Any]:
    """What a claim writes: claimed by ``owner`` under ``token`` until ``now + lease``, one more attempt.

    ``nullable_counters`` (SQL Server, see :meth:`ClaimColumns.ddl`): a producer may have inserted
    an explicit NULL attempt count, which counts as 0 (NULL + 1 would stay NULL)."""
    attempts: Any = cols.of(table, "attempts")
    if nullable_counters:
        attempts = func.coalesce(attempts, 0)
    return cols.values(state=CLAIMED, owner=owner, token=token, attempts=attempts + 1, expires_at=now + lease)


def claim_select(
    table: Table, key: str, order_by: str, traits: Traits, size: int, condition: ColumnElement[bool],
    conditions: Sequence[ColumnElement[Any]] = (), *, seekable: bool = False,
) -> Any:
    """A locking select of up to ``size`` rows meeting ``condition``, skipping rows others hold.

    Each claim runs this once per state (expired claims, then due pending rows) rather than
    once with an OR of both: with one equality on the state column the claim index returns
    rows already in claim order, so the database reads and locks only the rows it returns.
    (With the OR, MariaDB sorted every candidate and locked them all, so a concurrent claim
    found nothing to take.) On SQL Server the select seeks the claim index (``FORCESEEK``,
    once ``prepare()`` made it) and is capped at ``Traits.rows_per_statement``; on
    Oracle it carries ``FIRST_ROWS(size)`` and the cursor fetches (and so locks) ``size``
    rows at most.
    """
    cap = traits.rows_per_statement
    if cap is not None:
        size = min(size, cap)
    stmt = select(table).where(condition, *conditions).order_by(*claim_order(table, key, order_by))
    stmt = dialects.lock_rows(stmt, table, skip_locked=True, seek=seekable)
    stmt = dialects.first_rows_hint(stmt, table, size)
    stmt = dialects.limit_fetch(stmt, size)
    return dialects.limit_locked(stmt, traits, size)


def claim_returning(
    table: Table, key: str, order_by: str, size: int, condition: ColumnElement[bool],
    conditions: Sequence[ColumnElement[Any]], values: dict[str, Any],
) -> Any:
    """Claim in one statement where the backend can: ``UPDATE ... WHERE key IN (SELECT ...
    FOR UPDATE SKIP LOCKED LIMIT n) RETURNING *`` (PostgreSQL; SQLite, whose single writer
    needs no skipping). One round trip instead of a select plus updates by key list."""
    k = table.c[key]
    chosen = dialects.lock_rows(
        select(k).where(condition, *conditions).order_by(*claim_order(table, key, order_by)).limit(size),
        table, skip_locked=True,
    )
    return update(table).where(k.in_(chosen)).values(values).returning(*table.c)


def update_keys(table: Table, key: str, keys: Sequence[Any], values: dict[str, Any],
                *conditions: ColumnElement[Any]) -> Any:
    """``UPDATE <table> SET values WHERE key IN (keys) AND conditions``: a seek of the key's
    index on SQL Server (:func:`dialects.seek_keyed`), the keys bound with the key column's type
    and padded to a few list lengths (:func:`dialects.padded_keys`)."""
    stmt = update(table).where(dialects.key_column(table.c[key]).in_(dialects.padded_keys(keys)),
                               *conditions).values(values)
    return dialects.seek_keyed(stmt, table)


def poisoned_values(cols: ClaimColumns) -> dict[str, Any]:
    """Expired claims abandoned ``max_attempts`` times are a crash loop, not a retry: to error."""
    return cols.values(state=ERROR, owner=None, token=None, expires_at=None, error=POISONED)


def expires_of(table: Table, cols: ClaimColumns, key: str, first_key: Any) -> Any:
    """The expiry a claim stamped (read back when it was a database-clock expression)."""
    return dialects.seek_keyed(select(cols.of(table, "expires_at")).where(
        dialects.key_column(table.c[key]) == first_key), table)


def with_token(table: Table, cols: ClaimColumns, token: int) -> Any:
    """Rows claimed under ``token``: what an earlier, committed attempt of the same claim took."""
    return select(table).where(is_state(table, cols, CLAIMED), cols.of(table, "token") == token)


def rows_by_keys(table: Table, cols: ClaimColumns, key: str, keys: Sequence[Any]) -> Any:
    """The user columns and the claim history (attempts, expiry, token) of ``keys``."""
    user = [c for c in table.c if not cols.is_claim_column(c.name)]
    stmt = select(*user, cols.of(table, "attempts"), cols.of(table, "expires_at"), cols.of(table, "token"))
    return dialects.seek_keyed(stmt.where(dialects.key_column(table.c[key]).in_(dialects.padded_keys(keys))), table)


# -- finishing (all fenced on the batch token) ---------------------------------------------------
def keys_where(table: Table, key: str, keys: Sequence[Any], conditions: Sequence[ColumnElement[Any]],
               *, lock: bool = False) -> Any:
    """Which of ``keys`` meet ``conditions`` now: with row locks if ``lock``, else (SQL Server)
    looked up through the key's index, never by scanning past other workers' locked rows."""
    stmt = select(table.c[key]).where(dialects.key_column(table.c[key]).in_(dialects.padded_keys(keys)), *conditions)
    if lock:
        return dialects.lock_rows(stmt, table, seek=True)
    return dialects.seek_keyed(stmt, table)


def done_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=DONE, done_at=clock(), expires_at=None, error=None)


def fail_values(table: Table, cols: ClaimColumns, message: str, *, max_attempts: int,
                schedule: Sequence[tuple[int, float]], max_backoff: float) -> dict[str, Any]:
    """Back to pending after the delay ``schedule`` gives for the row's stored attempts (see
    :func:`controltable.events.decisions.backoff_schedule`; ``max_backoff`` past its end), or to
    error once ``attempts >= max_attempts``: decided in SQL, row by row."""
    now = clock()
    attempts = cols.of(table, "attempts")
    final = attempts >= max_attempts
    delays = [(attempts <= attempt, now + delay) for attempt, delay in schedule]
    available = case((final, None), *delays, else_=now + max_backoff)
    return cols.values(state=case((final, ERROR), else_=PENDING), owner=None, token=None, expires_at=None,
                       available_at=available, error=message)


def release_values(table: Table, cols: ClaimColumns) -> dict[str, Any]:
    """Back to pending untouched: the attempt the claim counted is taken back."""
    attempts = cols.of(table, "attempts")
    return cols.values(state=PENDING, owner=None, token=None, expires_at=None,
                       attempts=case((attempts > 0, attempts - 1), else_=0))


def renew_values(cols: ClaimColumns, expires_at: float) -> dict[str, Any]:
    return cols.values(expires_at=expires_at)


# -- administration --------------------------------------------------------------------------------
def counts_by_state(table: Table, cols: ClaimColumns) -> Any:
    """Rows per state; a row a metadata-only ``prepare()`` has not set yet (NULL, SQL Server
    only, while ``prepare()`` runs) counts as pending, which it becomes."""
    state = func.coalesce(cols.of(table, "state"), dialects.state_literal(PENDING, SmallInteger()))
    return select(state, func.count()).group_by(state)


def count_expired(table: Table, cols: ClaimColumns, now: Any) -> Any:
    return select(func.count()).select_from(table).where(expired_claims(table, cols, now))


def oldest_pending(table: Table, cols: ClaimColumns, key: str, order_by: str, time_column: Optional[str]) -> Any:
    extra = [table.c[time_column]] if time_column else []
    return (select(table.c[key], *extra).where(is_state(table, cols, PENDING))
            .order_by(table.c[order_by]).limit(1))


def error_rows(table: Table, cols: ClaimColumns, key: str, order_by: str, limit: int) -> Any:
    """Rows in the error state (key, attempts, last error), in the claim index's order."""
    order = [table.c[order_by]] + ([table.c[key]] if order_by != key else [])
    return (select(table.c[key], cols.of(table, "attempts"), cols.of(table, "error"))
            .where(is_state(table, cols, ERROR)).order_by(*order).limit(limit))


def backlog(table: Table, cols: ClaimColumns, order_by: str, now: Any,
            conditions: Sequence[ColumnElement[Any]]) -> Any:
    """(rows a claim could take now, the largest ``order_by`` value among them) in one query."""
    return (select(func.count(), func.max(table.c[order_by]))
            .select_from(table).where(claimable(table, cols, now), *conditions))


def pending_count(table: Table, cols: ClaimColumns, now: Any, conditions: Sequence[ColumnElement[Any]]) -> Any:
    return select(func.count()).select_from(table).where(claimable(table, cols, now), *conditions)


def retry_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, attempts=0, available_at=None, error=None)


def reap_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, owner=None, token=None, expires_at=None)


def reset_values(cols: ClaimColumns) -> dict[str, Any]:
    return cols.values(state=PENDING, owner=None, token=None, expires_at=None, available_at=None, attempts=0,
                       error=None, done_at=None)


def page_keys(table: Table, key: str, conditions: Sequence[ColumnElement[Any]], after: Any, cap: int) -> Any:
    """The next ``cap`` keys meeting ``conditions`` after ``after``, locked (SQL Server paging).

    A seek (``FORCESEEK``) is demanded from the second page on, where ``key > after`` seeks the
    key's unique index. The first page has no predicate every layout can seek: ``reset()`` has none
    at all, and ``retry_errors()``'s ``ct_state = 3`` is in no index when the claim indexes are
    filtered (they hold states 0 and 1); SQL Server refuses ``FORCESEEK`` without a seek predicate
    (error 8622), so that page is left to the optimizer (a key-ordered read that stops after
    ``cap`` rows)."""
    k = table.c[key]
    stmt = select(k).where(*conditions, *([dialects.key_column(k) > after] if after is not None else []))
    return dialects.lock_rows(stmt.order_by(k).limit(cap), table, seek=after is not None)


def unset_claim_columns(table: Table, cols: ClaimColumns) -> ColumnElement[bool]:
    """Rows whose claim columns a metadata-only ``prepare()`` has not set yet (SQL Server)."""
    return cols.of(table, "state").is_(None)


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


def update_where(table: Table, conditions: Sequence[ColumnElement[Any]], values: dict[str, Any]) -> Any:
    return update(table).where(*conditions).values(values)


def invalid_indexes(name: str, schema: Optional[str]) -> tuple[TextClause, dict[str, Any]]:
    """PostgreSQL: the indexes of a table that an interrupted ``CREATE INDEX CONCURRENTLY`` left
    invalid (a catalogue query; names are bound parameters)."""
    return text(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE NOT i.indisvalid AND t.relname = :name AND n.nspname = COALESCE(:schema, current_schema())"
    ), {"name": name, "schema": schema}


def chunks(keys: Sequence[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    """``keys`` in lists of at most ``size``."""
    keys = list(keys)
    for i in range(0, len(keys), size):
        yield keys[i:i + size]


def key_chunk_size(traits: Traits) -> int:
    """Keys per statement: short enough for one ``IN (...)`` and, on SQL Server, for one
    statement's row cap (``Traits.rows_per_statement``)."""
    return min(traits.max_in_list, traits.rows_per_statement or CHUNK, CHUNK)
