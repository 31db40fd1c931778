"""The event engine's workflow: ``EventTable`` runs claims and fenced finishes through ``Database.run``.

Statements come from :mod:`controltable.events.statements`, DDL and reflection from
:mod:`controltable.events.ddl`, the administration methods (stats, resets) from
:mod:`controltable.events.admin`; this module decides transactions, retries across lost COMMIT
replies, waiting (bounded, woken by the runtime's wake-ups), leases and fencing.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

from sqlalchemy import Table
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from .. import dialects, errorcodes, tracing
from ..clock import clock, read_now
from ..db import Database
from ..defaults import (
    DDL_BACKFILL_BATCH,
    DDL_LOCK_TIMEOUT,
    DEADLINE_STATEMENT_GRACE,
    DEFAULT_BATCH_LEASE,
    NAME_LENGTH,
    STATEMENT_TIMEOUT,
)
from ..errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    LeaseLost,
    NotInstalledError,
    UnexpectedDatabaseError,
    describe_keys,
)
from ..holders import process_holder_id
from ..runtime import Runtime, check_runtime
from ..validation import (
    check_batch_size,
    check_identifier,
    check_name,
    check_poll_interval,
    check_positive_int,
    check_seconds,
    check_where,
    fail_reason,
)
from . import ddl
from .admin import EventAdministration
from .decisions import backoff_schedule, poisoned_keys, read_handle, storable_text
from .statements import (
    DONE,
    ERROR_LENGTH,
    ClaimColumns,
    EventStatements,
    Where,
    chunks,
    done_values,
    poisoned_values,
    renew_values,
)
from .values import Batch

log = logging.getLogger("controltable")
T = TypeVar("T")

#: After a claim found no expired claims, the same EventTable object looks again only after this.
EXPIRED_CHECK_INTERVAL = 1.0
#: The defaults of ``max_attempts``, ``backoff`` and ``max_backoff``.
DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF, DEFAULT_MAX_BACKOFF = 5, 30.0, 3600.0


class EventTable(EventAdministration):
    """Batch claiming over one of the user's tables.

    ``key`` must be unique (primary key or unique index). ``order_by`` (default: ``key``) sets
    claim order. ``table_schema`` is the event table's schema (not the control tables').
    ``where`` narrows what is claimable: an expression over ``events.table`` or a callable that
    receives the table. ``time_column`` (optional) is the column holding each event's time, used
    by ``stats()`` for the oldest pending age. The first argument is the ``ControlTable``'s
    :class:`Runtime` (``ct.events(...)`` passes it).
    """

    def __init__(
        self,
        runtime: Runtime,
        table: str,
        *,
        key: str,
        order_by: Optional[str] = None,
        table_schema: Optional[str] = None,
        where: Where = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: float = DEFAULT_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        lease: float = DEFAULT_BATCH_LEASE,
        time_column: Optional[str] = None,
        column_prefix: str = "ct_",
    ) -> None:
        self.runtime: Runtime = check_runtime(runtime)
        self.db: Database = self.runtime.db
        self.name = check_identifier("table", table)
        self.key = check_identifier("key column", key)
        self.order_by = check_identifier("order_by column", order_by) if order_by else self.key
        self.table_schema = check_identifier("table_schema", table_schema) if table_schema else None
        self.time_column = check_identifier("time_column", time_column) if time_column else None
        self.max_attempts = check_positive_int("max_attempts", max_attempts)
        self.backoff = check_seconds("backoff", backoff, allow_zero=True) or 0.0
        self.max_backoff = check_seconds("max_backoff", max_backoff, allow_zero=True) or 0.0
        self.lease = check_seconds("lease", lease) or DEFAULT_BATCH_LEASE
        self.prefix = check_identifier("column_prefix", column_prefix + "x")[:-1]
        #: The claim columns' names (see :class:`~controltable.events.statements.ClaimColumns`).
        self.cols = ClaimColumns(self.prefix)
        self._where = check_where(where)
        #: The table's statements, bound once when the table is loaded (again after ``prepare()``).
        self._sql: Optional[EventStatements] = None
        # One reflection at a time: threads sharing this object (claimers in a pool) would
        # otherwise reflect concurrently through one engine, which SQLAlchemy does not support.
        self._reflect_lock = threading.Lock()
        self._next_expired_check = 0.0
        dialects.enable_fetch_limits(self.db.engine)

    def __repr__(self) -> str:
        return f"EventTable({self.qualified_name!r}, key={self.key!r}, order_by={self.order_by!r})"

    @property
    def engine(self) -> Any:
        """The SQLAlchemy engine of the database the event table lives in."""
        return self.db.engine

    @property
    def wakeup_key(self) -> str:
        """Wake-up key for claimers of this table (rows given back by release or fail)."""
        return f"events:{self.qualified_name}"

    def wakeup_keys(self) -> list[str]:
        """The wake-up keys pushed when rows may be claimable again (see ``ControlTable.add_wakeup_listener``)."""
        return [self.wakeup_key]

    @property
    def qualified_name(self) -> str:
        return ddl.qualified(self.name, self.table_schema)

    # -- the table ---------------------------------------------------------------------------
    def reflect(self) -> Table:
        """The event table as the database describes it now, prepared or not (what ``prepare``
        and ``controltable events prepare --dry-run`` inspect); :attr:`table` is the checked one."""
        return ddl.reflect(self.db, self.name, self.table_schema, deadline=self._reflect_deadline(None))

    def _reflect_deadline(self, deadline: Optional[float]) -> float:
        """A reflection's deadline: the call's own, else one statement timeout for all its
        statements (several catalogue queries must not add up to several timeouts)."""
        return deadline if deadline is not None else time.monotonic() + (self.db.statement_timeout or STATEMENT_TIMEOUT)

    @property
    def table(self) -> Table:
        """The reflected table; raises :class:`NotInstalledError` if ``prepare()`` was not run."""
        return self.sql.table

    @property
    def sql(self) -> EventStatements:
        """The table's statements (:class:`~controltable.events.statements.EventStatements`), bound
        once to the reflected table; raises :class:`NotInstalledError` if ``prepare()`` was not run."""
        return self._sql if self._sql is not None else self._load(None)

    def _load(self, deadline: Optional[float]) -> EventStatements:
        """Reflect and check the table once per object and bind its statements, within ``deadline``
        (the caller's, else one statement timeout): waiting for another thread's reflection included."""
        if self._sql is not None:
            return self._sql
        until = self._reflect_deadline(deadline)
        # The grace every statement gets past a deadline (Database.deadline): a claim(wait=0) still
        # waits the few milliseconds another thread's reflection needs.
        if not self._reflect_lock.acquire(timeout=max(until + DEADLINE_STATEMENT_GRACE - time.monotonic(), 0.0)):
            raise DatabaseUnavailableError(
                f"event table {self.qualified_name!r}: another thread of this process is still reading the "
                "table's description from the database and did not finish within this call's timeout; the "
                "database answers slowly or not at all: check the path to the server, or retry"
            )
        try:
            if self._sql is None:
                table, seekable = ddl.load(
                    self.db, self.cols, self.name, self.table_schema, self.key, self.order_by, self.time_column,
                    prepared=True, deadline=until)
                self._sql = EventStatements(table, self.cols, self.key, self.order_by,
                                            self.db.traits, where=self._where,
                                            time_column=self.time_column, seekable=seekable)
            return self._sql
        finally:
            self._reflect_lock.release()

    @property
    def c(self) -> Any:
        """The table's columns, for ``where=`` expressions."""
        return self.table.c

    def indexes(self, table: Table, *, filtered_indexes: bool = False) -> list[Any]:
        """The claim indexes (see :func:`controltable.events.ddl.claim_indexes`)."""
        return ddl.claim_indexes(table, self.cols, self.name, self.key, self.order_by, self.db.dialect_name,
                                 filtered_indexes=filtered_indexes)

    def prepare_statements(
        self, *, filtered_indexes: bool = False, disable_lock_escalation: bool = False
    ) -> list[Any]:
        """The DDL ``prepare()`` would run now (only what is missing), one statement per entry.

        ``disable_lock_escalation`` (SQL Server) adds ``ALTER TABLE ... SET (LOCK_ESCALATION =
        DISABLE)``, for tables where even chunked statements of many workers should never
        escalate. Statistics are refreshed after these (see :class:`dialects.AnalyzeTable`).
        """
        table, _ = ddl.load(self.db, self.cols, self.name, self.table_schema, self.key, self.order_by,
                            self.time_column, prepared=False, deadline=self._reflect_deadline(None))
        return ddl.missing_ddl(self.db, table, self.cols, self.name, self.table_schema, self.key, self.order_by,
                               filtered_indexes=filtered_indexes, disable_lock_escalation=disable_lock_escalation)

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
        lock_timeout = check_positive_int("lock_timeout", lock_timeout)
        stmts = self.prepare_statements(
            filtered_indexes=filtered_indexes, disable_lock_escalation=disable_lock_escalation)
        if stmts and analyze:
            stmts.append(dialects.AnalyzeTable(self.reflect(), histograms=(self.cols.state,)))
        done = ddl.run_ddl(self.db, stmts, self.name, self.table_schema, online=online, lock_timeout=lock_timeout)
        self._sql = None
        return done

    # -- claiming ----------------------------------------------------------------------------
    @tracing.claims
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
        keys = [self.wakeup_key]
        while True:
            since = self.runtime.mark(keys)
            batch = self._claim_once(size, owner, lease, where, deadline=deadline)
            left = deadline - time.monotonic()
            if batch is not None or left <= 0:
                return batch
            self.runtime.wait(keys, min(delay * (0.5 + random.random()), left), since)
            delay = min(delay * 1.5, max_poll_interval)

    def notify(self) -> None:
        """Tell waiting claimers that new rows arrived (PostgreSQL; elsewhere they poll).

        For producers, after inserting events: ``claim(wait=...)`` then wakes at once, not at its next poll."""
        self.db.run(lambda conn: self.runtime.notify(conn, [self.wakeup_key]))

    def _claim_once(
        self, size: int, owner: Optional[str], lease: Optional[float], where: Where,
        deadline: Optional[float] = None,
    ) -> Optional[Batch]:
        size = check_batch_size(size)
        owner = check_name("owner", owner) if owner is not None else process_holder_id()
        lease_s = check_seconds("lease", lease) if lease is not None else self.lease
        assert lease_s is not None
        self._load(deadline)  # reflect (and check) before the transaction, within the call's deadline
        try:
            return self._claim_run(size, owner, lease_s, where, deadline=deadline)
        except (NotInstalledError, UnexpectedDatabaseError):
            if self._where is not None or where is not None:  # the caller's filter may be at fault: say so
                ddl.check_filter(self.db, self.table, self.sql.where_clauses(where))
            raise

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

        def run(stored_owner: str) -> Optional[Batch]:
            def fn(conn: Connection) -> Optional[Batch]:
                attempt[0] += 1
                if attempt[0] > 1:  # the batch an earlier, committed attempt of this claim made, if any
                    already = [dict(r._mapping) for r in conn.execute(self.sql.with_token(token))]
                    if already:
                        return self._make_batch(already, owner, token, lease_s)
                if complete is not None:
                    self._complete(conn, complete[0], complete[1], whole=True)
                return self._claim_in(conn, size, owner, lease_s, where, token=token, stored_owner=stored_owner)

            return self.db.run(fn, deadline=deadline)

        return self._storing("owner", owner, NAME_LENGTH, run)

    def _storing(self, what: str, text: str, limit: int, run: Callable[[str], T]) -> T:
        """``run(text)``; if the database refused ``text`` (a claim column whose character set
        cannot hold it: a table an earlier ``prepare()`` left in latin1), ``run`` again with it
        escaped to ASCII (:func:`~controltable.events.decisions.storable_text`). A refused attempt
        changed nothing (its transaction rolled back), so running again is safe."""
        try:
            return run(text)
        except ConfigurationError as exc:
            safe = storable_text(text, limit)
            cause = exc.__cause__
            if safe == text or cause is None or errorcodes.classify(
                    cause, self.db.engine.dialect.name) is not errorcodes.Kind.BAD_VALUE:
                raise
            log.warning("controltable: the claim columns of %r cannot store the %s %r, stored as %r; run "
                        "prepare() (`controltable events prepare`) again to give them a Unicode character set",
                        self.qualified_name, what, text, safe)
            return run(safe)

    def _make_batch(self, claimed: list[dict[str, Any]], owner: str, token: int, lease_s: float) -> Batch:
        user_cols = [c.name for c in self.table.c if not self.cols.is_claim_column(c.name)]
        claimed.sort(key=lambda r: (r[self.order_by], r[self.key]))
        expires = max(float(r[self.cols.expires_at] or 0) for r in claimed)
        return Batch(
            self, owner, token,
            rows=[{c: r[c] for c in user_cols} for r in claimed],
            attempts={r[self.key]: int(r[self.cols.attempts]) for r in claimed},
            claimed_at=expires - lease_s, _expires_at=expires, lease_seconds=lease_s,
        )

    def _claim_in(
        self, conn: Connection, size: int, owner: str, lease_s: float, where: Where, *, token: Optional[int] = None,
        stored_owner: Optional[str] = None,
    ) -> Optional[Batch]:
        """The claim itself, inside the caller's transaction (``stored_owner``: what the owner
        column gets, when it cannot store ``owner`` itself)."""
        q = self.sql
        token = token if token is not None else secrets.randbits(62) + 1
        # The database clock goes into the statements as an expression (one value per
        # statement), except on the key-list path, which needs the value for its second step.
        one_statement = dialects.update_returning(conn.dialect, q.traits)
        now: Any = clock() if one_statement else read_now(conn)
        values = q.claim_values(stored_owner or owner, token, now, lease_s)
        # Expired claims first: they are older work, and must not starve behind new events.
        # Finding none is the normal case, so after an empty look this object skips the
        # look for EXPIRED_CHECK_INTERVAL: an abandoned claim waits at most that much longer.
        claimed: list[dict[str, Any]] = []
        if time.monotonic() >= self._next_expired_check:
            if q.traits.adds_columns_nullable:
                # SQL Server's claim columns are nullable (a metadata-only prepare()): rows a producer
                # inserted with explicit NULLs in them become pending here, or no claim would take them.
                conn.execute(q.backfill_batch(q.traits.rows_per_statement or DDL_BACKFILL_BATCH))
            claimed = self._claim_by_keys(conn, q.expired_claims(now), size, values, where)
            if not claimed:
                self._next_expired_check = time.monotonic() + EXPIRED_CHECK_INTERVAL
        need = size - len(claimed)
        if need > 0:
            if one_statement:  # see EventStatements.claim_returning
                claimed += [dict(r._mapping)
                            for r in conn.execute(q.claim_returning(need, q.due_pending(now), where, values))]
            else:
                claimed += self._claim_by_keys(conn, q.due_pending(now), need, values, where)
        if not claimed:
            return None
        return self._make_batch(claimed, owner, token, lease_s)

    def _claim_by_keys(
        self, conn: Connection, condition: ColumnElement[bool], size: int, values: dict[str, Any], where: Where
    ) -> list[dict[str, Any]]:
        """Lock up to ``size`` rows with a skip-locked select, then mark them by key (every backend).

        Returns the rows as they are after marking. Expired claims that were abandoned
        ``max_attempts`` times are a crash loop, not a retry: they go to the error state instead.
        On SQL Server this runs in chunks of ``Traits.rows_per_statement`` rows, so no
        statement escalates to a table lock.
        """
        cap = self.sql.traits.rows_per_statement or size
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
        q, cols = self.sql, self.cols
        result = conn.execute(q.claim_select(size, condition, where))
        rows = [dict(r._mapping) for r in result.fetchmany(size)]
        result.close()
        poisoned = poisoned_keys(rows, self.key, cols.state, cols.attempts, self.max_attempts)
        in_list = q.traits.max_in_list
        # Every update by key repeats the select's condition (state, expiry or back-off): a row is
        # marked only if it still is what the select read. The select's row locks already make it
        # so; the fence holds even where a lock did not (Oracle locks a skip-locked row only when
        # the cursor fetches it), and the count below says which rows this claim really took.
        for chunk in chunks(poisoned, in_list):
            conn.execute(q.update_keys(chunk, poisoned_values(cols), condition))
        rows = [r for r in rows if r[self.key] not in set(poisoned)]
        keys = [r[self.key] for r in rows]
        marked = 0
        for chunk in chunks(keys, in_list):
            marked += int(conn.execute(q.update_keys(chunk, values, condition)).rowcount)
        if keys and (marked != len(keys) or not q.traits.trusts_rowcount):
            mine = self._keys_where(conn, keys, q.fenced(values[cols.token]))
            rows = [r for r in rows if r[self.key] in mine]
        expires = values[cols.expires_at]
        if rows and not isinstance(expires, (int, float)):  # an expression of the database clock
            expires = conn.scalar(q.expires_of(rows[0][self.key]))
        for r in rows:
            r[cols.attempts] = int(r[cols.attempts] or 0) + 1
            r[cols.expires_at] = expires
        return rows

    def batch(self, handle: dict[str, Any]) -> Batch:
        """Rebuild a :class:`Batch` from :meth:`Batch.handle` (e.g. in another Airflow task).

        The rows, their attempts and the expiry are read from the table (the truth, whatever
        the handle's age); the lease length comes from the handle (older handles without it:
        from ``expires_at - claimed_at``, else the table's default lease).
        """
        h = read_handle(handle, self.lease)
        keys, token, lease, claimed_at, expires_at = h.keys, h.token, h.lease, h.claimed_at, h.expires_at
        t, cols = self.table, self.cols
        rows: list[dict[str, Any]] = []

        def fn(conn: Connection) -> None:
            rows.clear()
            for chunk in chunks(keys):
                for r in conn.execute(self.sql.rows_by_keys(chunk)):
                    rows.append(dict(r._mapping))

        self.db.run(fn)
        order = {k: i for i, k in enumerate(keys)}
        rows.sort(key=lambda r: order.get(r[self.key], 0))
        held = [r for r in rows if r[cols.token] == token]
        attempts = {k: 1 for k in keys}
        attempts.update({r[self.key]: int(r[cols.attempts] or 1) for r in held})
        if held:
            expires_at = max(float(r[cols.expires_at] or 0) for r in held) or expires_at
        if claimed_at <= 0:
            claimed_at = expires_at - lease
        user_names = [c.name for c in t.c if not cols.is_claim_column(c.name)]
        return Batch(self, h.owner, token, [{c: r[c] for c in user_names} for r in rows], attempts,
                     claimed_at, expires_at, lease_seconds=lease)

    # -- finishing (all fenced on the batch token) -----------------------------------------------
    def _key_chunks(self, keys: Sequence[Any]) -> Iterator[list[Any]]:
        """``keys`` in lists short enough for one ``IN (...)`` and one statement's row cap."""
        return chunks(keys, self.sql.key_chunk)

    def _keys_where(self, conn: Connection, keys: Sequence[Any], *conditions: ColumnElement[bool],
                    lock: bool = False) -> set[Any]:
        """Which of ``keys`` meet ``conditions`` now (with row locks if ``lock``)."""
        found: set[Any] = set()
        for chunk in self._key_chunks(keys):
            found.update(r[0] for r in conn.execute(self.sql.keys_where(chunk, conditions, lock=lock)))
        return found

    def _done_under(self, conn: Connection, token: int, keys: Sequence[Any]) -> set[Any]:
        """Keys that are done under ``token``: completed by this call or by an earlier one of
        the same batch whose commit went through (a retry after a lost reply)."""
        return self._keys_where(conn, keys, self.sql.col("token") == token, self.sql.is_state(DONE))

    def _complete(self, conn: Connection, token: int, keys: Sequence[Any], *, whole: bool = False) -> int:
        """Mark ``keys`` done if, and only if, every one is claimed (or already done) under ``token``.

        ``whole``: ``keys`` are all the batch's unsettled rows, so one ``UPDATE ... WHERE token``
        marks them without sending the keys (not on SQL Server, where statements go by key
        chunks under the row cap). The update's row count is trusted only where the driver
        reports it faithfully (``Traits.trusts_rowcount``); otherwise, and whenever the
        count falls short, a select in the same transaction confirms which keys are done under
        the token. Rows already done under it count as completed, so a retry after a lost COMMIT
        reply succeeds. For part of a batch the update runs in a savepoint, so that on a
        mismatch the rows this call marked are put back. Either way a mismatch raises LeaseLost
        and the caller's transaction rolls back.
        """
        unique = set(keys)
        if not unique:
            return 0
        q = self.sql
        values = done_values(self.cols)
        trusted = q.traits.trusts_rowcount
        by_token = whole and q.traits.rows_per_statement is None
        savepoint = None if whole else conn.begin_nested()
        n = 0
        if by_token:
            n = int(conn.execute(q.update_where([q.fenced(token)], values)).rowcount)
        else:
            for chunk in self._key_chunks(keys):
                n += int(conn.execute(q.update_keys(chunk, values, q.fenced(token))).rowcount)
        if not trusted or n != len(unique):
            n = len(self._done_under(conn, token, keys) & unique)
        if n == len(unique):
            if savepoint is not None:
                savepoint.commit()
            return n
        if savepoint is not None:
            savepoint.rollback()
        done = self._done_under(conn, token, keys)
        lost = [k for k in keys if k not in done and k not in self._keys_where(conn, keys, q.fenced(token))]
        lost = lost or [k for k in keys if k not in done]
        raise LeaseLost(
            f"{len(unique) - n} of {len(set(keys))} rows of {self.qualified_name!r} are no longer held by this "
            f"batch (lease expired and they were re-claimed or reaped): {describe_keys(lost)}; nothing was "
            "completed and the transaction was rolled back", keys=lost)

    def _fail(self, token: int, keys: Sequence[Any], reason: str) -> int:
        """Give ``keys`` back for a retry, or to the error state, deciding in SQL from each row's
        stored attempts (see :meth:`~controltable.events.statements.EventStatements.fail_values`). The rows are
        locked and checked first, so the outcome never depends on a reported row count."""
        q = self.sql
        message = dialects.fit_message(fail_reason(reason), ERROR_LENGTH)  # one rule with Item.fail()
        schedule = backoff_schedule(self.max_attempts, self.backoff, self.max_backoff)

        def run(stored: str) -> int:
            def fn(conn: Connection) -> int:
                held = self._keys_where(conn, keys, q.fenced(token), lock=True)
                lost = [k for k in keys if k not in held]
                if lost:
                    raise LeaseLost(f"cannot fail rows no longer held by this batch: {describe_keys(lost)}",
                                    keys=lost)
                values = q.fail_values(stored, max_attempts=self.max_attempts, schedule=schedule,
                                       max_backoff=self.max_backoff)
                for chunk in self._key_chunks(list(held)):
                    conn.execute(q.update_keys(chunk, values, q.fenced(token)))
                self.runtime.notify(conn, [self.wakeup_key])
                return len(held)

            return self.db.run(fn, idempotent=False)

        # A reason the error column cannot store is stored escaped: a refused fail() would leave
        # the rows claimed until their lease ran out.
        return self._storing("reason", message, ERROR_LENGTH, lambda text: run(dialects.fit_message(
            text, ERROR_LENGTH)))

    def _release(self, token: int, keys: Sequence[Any]) -> int:
        q = self.sql

        def fn(conn: Connection) -> int:
            held = self._keys_where(conn, keys, q.fenced(token), lock=True)
            for chunk in self._key_chunks(list(held)):
                conn.execute(q.update_keys(chunk, q.release_values(), q.fenced(token)))
            self.runtime.notify(conn, [self.wakeup_key])
            return len(held)

        return self.db.run(fn)

    def _renew(self, token: int, keys: Sequence[Any], seconds: float) -> float:
        q = self.sql

        def fn(conn: Connection) -> float:
            now = read_now(conn)
            held = self._keys_where(conn, keys, q.fenced(token), q.col("expires_at") >= now, lock=True)
            if len(held) != len(set(keys)):
                fenced = self._keys_where(conn, keys, q.fenced(token))  # else done, re-claimed or reset
                lost = [k for k in keys if k not in fenced]
                if lost:
                    raise LeaseLost(f"cannot renew rows no longer held by this batch: {describe_keys(lost)}",
                                    keys=lost)
                # Still under this token but past their expiry: free for any worker to claim from
                # then on, so this claim is over even though nobody has taken them yet.
                expired = [k for k in keys if k not in held]
                raise LeaseLost(
                    f"cannot renew rows of this batch whose claim had already expired when the renewal "
                    f"reached the database: {describe_keys(expired)}; another worker may claim them. Renew "
                    "more often than the lease (a third of it, as start_renewing() does) or ask for a longer "
                    "lease", keys=expired)
            for chunk in self._key_chunks(list(held)):
                conn.execute(q.update_keys(chunk, renew_values(self.cols, now + seconds), q.fenced(token)))
            return now + seconds

        return self.db.run(fn)
