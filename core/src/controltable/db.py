"""The connection to the user's database: engine set-up, transactions, retries and error translation.

Every statement controltable runs goes through :meth:`Database.run` (or :meth:`Database.begin`),
so the rules for which failures are retried, and which controltable error a caller sees
instead of a driver's exception, live here once. What an error *means* is decided by
:mod:`controltable.errorcodes` from SQLSTATEs and driver codes; how connections are opened
(timeouts, keepalives, isolation level) by :mod:`controltable.connect`.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import random
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    NoSuchModuleError,
    OperationalError,
    PendingRollbackError,
    ResourceClosedError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from . import connect, defaults, dialects, errorcodes
from .clock import read_now
from .defaults import CONNECT_TIMEOUT, DEFAULT_URL, RETRIES, STATEMENT_TIMEOUT  # noqa: F401 - re-exported
from .dialect_traits import Traits
from .errorcodes import Kind
from .errors import (
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    ControlTableError,
    DatabaseBusyError,
    DatabaseMissingError,
    DatabaseUnavailableError,
    NotInstalledError,
    PermissionDeniedError,
    PoolerError,
    ReadOnlyDatabaseError,
    StatementTimeoutError,
    TooManyConnectionsError,
    UnexpectedDatabaseError,
    pooler_message,
    redact,
    safe_url,
)
from .validation import check_retries, check_timeout_setting

log = logging.getLogger("controltable")
# A library logs, the application decides where it goes: without a handler of its own, Python prints
# warnings (a retry after a failover) to stderr through its last-resort handler.
log.addHandler(logging.NullHandler())

T = TypeVar("T")
#: A statement stopped by its caller's deadline with less than this left of it (seconds) may have
#: been starved by a busy machine rather than met a silent network: its error says both.
SHORT_BUDGET = 1.0


def make_engine(
    url_or_engine: Union[str, Engine, Any],
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    statement_timeout: Optional[float] = STATEMENT_TIMEOUT,
    deadline: Optional[Callable[[], Optional[float]]] = None,
) -> Engine:
    """Create (or adopt) the engine and configure it for coordination work.

    ``deadline`` (a callable returning a :func:`time.monotonic` deadline or ``None``) lets a
    caller with a ``timeout=`` shorten the connect timeout of connections opened on its behalf.

    An engine created here gets the timeouts, keepalives and READ COMMITTED isolation level on
    every new connection (:mod:`controltable.connect`). An engine passed in is the caller's:
    its connections keep the caller's settings (configure timeouts in its ``connect_args``),
    and READ COMMITTED is applied per checkout unless the engine already sets it.
    """
    if isinstance(url_or_engine, Engine):
        engine = url_or_engine
        if dialects.traits(engine.dialect.name).file_database:
            # Our SQLite set-up changes how transactions begin: give it an engine of its own
            # rather than altering the caller's.
            engine = _sqlite_engine(engine.url, statement_timeout)
    else:
        if not isinstance(url_or_engine, str) and not hasattr(url_or_engine, "render_as_string"):
            raise ConfigurationError(
                f"the database must be a URL or a SQLAlchemy Engine, got {type(url_or_engine).__name__}; "
                "use e.g. postgresql+psycopg://user@host:5432/db or sqlite:///controltable.db"
            )
        try:
            url = make_url(url_or_engine)
        except (ArgumentError, ValueError, TypeError):
            raise ConfigurationError(
                f"{safe_url(str(url_or_engine))!r} is not a database URL; use e.g. "
                "postgresql+psycopg://user@host:5432/db or sqlite:///controltable.db"
            ) from None
        url = connect.typed_url(url)  # postgres://, mysql://, mariadb:// as people type them
        if dialects.traits(url.get_backend_name()).file_database:
            engine = _sqlite_engine(url, statement_timeout)
        else:
            engine = _server_engine(url, connect_timeout, statement_timeout, deadline)
    if engine.dialect.name not in dialects.SUPPORTED_DIALECTS:
        dialects.raise_unsupported(engine.dialect.name)
    return dialects.prepare_engine(engine, busy_timeout=connect.busy_timeout(statement_timeout))


def _new_engine(url: Any, **kw: Any) -> Engine:
    """``create_engine``, or for an asyncio driver's URL (``sqlite+aiosqlite``, ``mysql+aiomysql``,
    ``postgresql+psycopg_async``) the sync face of an async engine: the same statements then run in
    greenlets whose I/O awaits the event loop (:mod:`controltable.aio`)."""
    parsed = make_url(url)
    dialect = parsed.get_dialect()
    is_async = dialects.on_asyncio(dialect)
    default_pool = getattr(dialect, "get_pool_class", None)  # DefaultDialect's, per URL
    if "poolclass" not in kw and default_pool is not None and issubclass(default_pool(parsed), QueuePool):
        # One event loop's tasks share an asyncio engine's pool (SQLite's file databases included):
        # their bursts wait longer for it than threads do (SQLAlchemy 1.4's SQLite has no pool).
        kw.setdefault("pool_timeout", defaults.ASYNC_POOL_TIMEOUT if is_async else defaults.POOL_TIMEOUT)
    if is_async:
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(url, **kw).sync_engine
    return create_engine(url, **kw)


def _server_engine(
    url: Any, connect_timeout: float, statement_timeout: Optional[float],
    deadline: Optional[Callable[[], Optional[float]]] = None,
) -> Engine:
    try:
        args = connect.connect_args(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        engine = _new_engine(
            url, pool_size=5, max_overflow=10, pool_recycle=1800,
            # Set once per new connection by the dialect, not on every checkout.
            isolation_level=connect.READ_COMMITTED, connect_args=args,
            **dialects.typed_binds(url.get_backend_name(), url.get_driver_name()),
        )
    except NoSuchModuleError as exc:
        raise ConfigurationError(f"unknown database in URL {safe_url(url)!r}: {redact(exc)}") from None
    except ImportError as exc:
        known = dialects.known_driver(url.get_backend_name(), url.get_driver_name())
        package = known.package if known else "'controltable[postgres|mysql|mssql|oracle]'"
        raise ConfigurationError(
            f"the driver for {url.drivername!r} is not installed ({exc}); install it with: pip install {package}"
        ) from exc
    except (ArgumentError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"the URL {safe_url(url)!r} cannot be used: {redact(exc, [url.password])}") from None
    hook = functools.partial(connect.on_connect, engine.dialect, statement_timeout=statement_timeout, url=url)
    event.listen(engine, "connect", lambda dbapi_conn, record: hook(dbapi_conn))
    checkout = connect.on_checkout_hook(url)
    if checkout is not None:
        event.listen(engine, "checkout", lambda dbapi_conn, record, proxy: checkout(dbapi_conn))
    if deadline is not None:

        def clamp(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
            until = deadline()
            if until is not None:
                left = until + defaults.DEADLINE_STATEMENT_GRACE - time.monotonic()
                if left <= 0:
                    # A new connection after the caller's time ran out (its grace included) could
                    # only overrun the promise: the call ends now, as a silent network would end it.
                    raise DatabaseUnavailableError(
                        f"no connection to the database at {safe_url(url)} was opened: the call's timeout had "
                        "run out (the connections it had stopped answering or were busy); check the path to "
                        "the server, or retry with a longer timeout"
                    )
                connect.clamp_connect_timeout(url, cparams, left)

        event.listen(engine, "do_connect", clamp)
    return engine


def _sqlite_engine(url: Any, statement_timeout: Optional[float] = STATEMENT_TIMEOUT) -> Engine:
    if dialects.sqlite_path(url) is None:
        raise ConfigurationError(
            "an in-memory SQLite database cannot coordinate anything (every connection sees its own "
            "database); use a file, e.g. sqlite:///controltable.db"
        )
    args = connect.connect_args(url, connect_timeout=CONNECT_TIMEOUT, statement_timeout=statement_timeout)
    return _new_engine(url, connect_args=args)


def _driver_connection(pooled: Any) -> Any:
    """The driver's own connection behind a pool proxy (SQLAlchemy 2: ``dbapi_connection``; 1.4: ``connection``)."""
    for name in ("dbapi_connection", "connection"):
        inner = getattr(pooled, name, None)
        if inner is not None and not isinstance(inner, Connection):
            return inner
    return pooled


class _TaskLocal:
    """Attributes local to the running thread *and* asyncio task (a :mod:`contextvars` context).

    A statement's deadline and guard belong to the caller that runs it. Under :mod:`controltable.aio`
    one thread runs the statements of many tasks in turn (each in a greenlet that shares the
    task's context), where a ``threading.local`` would hand one task's deadline to another. Each
    assignment copies the mapping, so a task or thread started from this one never shares it.
    """

    __slots__ = ("_var",)

    def __init__(self) -> None:
        object.__setattr__(self, "_var", contextvars.ContextVar(f"controltable-db-{id(self)}", default=None))

    def __getattr__(self, name: str) -> Any:
        state = self._var.get()
        if state is None or name not in state:
            raise AttributeError(name)
        return state[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self._var.set({**(self._var.get() or {}), name: value})


class Database:
    """An engine plus the retry policy every operation shares.

    ``connect_timeout`` and ``statement_timeout`` (seconds; ``None`` leaves the server's own
    statement timeout) bound every wait on the database; see :mod:`controltable.connect` for
    what each backend gets, and :mod:`controltable.defaults` for the defaults.
    """

    def __init__(
        self,
        url_or_engine: Union[str, Engine, Any],
        *,
        retries: int = RETRIES,
        connect_timeout: float = CONNECT_TIMEOUT,
        statement_timeout: Optional[float] = STATEMENT_TIMEOUT,
    ) -> None:
        self.retries = check_retries(retries)
        self.connect_timeout = check_timeout_setting("connect_timeout", connect_timeout, allow_none=False)
        self.statement_timeout = check_timeout_setting("statement_timeout", statement_timeout, allow_none=True)
        self._local = _TaskLocal()
        #: How a retry's back-off pauses; :mod:`controltable.aio` awaits the event loop instead.
        self.sleep: Callable[[float], None] = time.sleep
        self.engine = make_engine(
            url_or_engine, connect_timeout=self.connect_timeout, statement_timeout=self.statement_timeout,
            deadline=lambda: getattr(self._local, "deadline", None),
        )
        #: What the running engine's backend offers (:attr:`traits` are the target's, the same but
        #: under ``controltable sql``): error translation and connection set-up ask these.
        self.engine_traits: Traits = dialects.traits(self.engine.dialect.name)
        #: The driver keyword arguments connections get (timeouts, keepalives), for connections
        #: opened outside the pool (the wake-up listener): ``cparams.update(db.connect_args)``.
        self.connect_args: dict[str, Any] = (
            {} if isinstance(url_or_engine, Engine) and not self.engine_traits.file_database
            else connect.connect_args(self.engine.url, connect_timeout=self.connect_timeout,
                                      statement_timeout=self.statement_timeout)
        )
        #: Connections are opened by the engine made here (not one passed in): its connect hook
        #: decides server-side prepared statements (:meth:`_stop_preparing`).
        self._own_engine = not isinstance(url_or_engine, Engine)
        self._prepares_dropped = False
        #: What the backend offers (:class:`~controltable.dialect_traits.Traits`), looked up once here:
        #: the statements and engines ask these instead of the dialect's name. Follows
        #: :attr:`target_dialect` when that is set.
        self.traits: Traits = self.engine_traits
        self._target_dialect: Optional[str] = None
        #: Client-side bounds on every statement and commit (engines created here only: an engine
        #: passed in keeps the caller's settings).
        self._guard: Optional[connect.StatementGuard] = None
        if not isinstance(url_or_engine, Engine):
            self._guard = connect.StatementGuard.for_dialect(
                self.engine.dialect, self.statement_timeout, self.engine.url)
            if self._guard is not None:
                self._install_guard(self._guard)
            self._wrap_initialize(self._guard)
        dbapi = getattr(self.engine.dialect, "loaded_dbapi", None) or getattr(self.engine.dialect, "dbapi", None)
        self._driver_error: Any = getattr(dbapi, "Error", None)

    # -- client-side deadlines -----------------------------------------------------------------
    @contextmanager
    def deadline(self, until: Optional[float]) -> Iterator[None]:
        """Bound every statement run in the block (this thread) by ``until`` (:func:`time.monotonic`).

        A statement still running :data:`~controltable.defaults.DEADLINE_STATEMENT_GRACE` after it
        is cancelled on the client (see :class:`controltable.connect.StatementGuard`), and no retry
        starts after it. Nested deadlines keep the nearest.
        """
        previous = getattr(self._local, "deadline", None)
        if until is not None:
            self._local.deadline = until if previous is None else min(until, previous)
        try:
            yield
        finally:
            self._local.deadline = previous

    def _guard_start(self, guard: connect.StatementGuard, dbapi_conn: Any) -> Optional[connect._Alarm]:
        until = getattr(self._local, "deadline", None)
        left = None if until is None else until + defaults.DEADLINE_STATEMENT_GRACE - time.monotonic()
        budget = guard.budget(self.statement_timeout, left)
        if budget is None:
            return None
        # Under a caller's deadline there is no time to wait for a cancel's answer.
        return guard.start(dbapi_conn, budget, until is not None)

    def _guard_finish(self, guard: Optional[connect.StatementGuard], alarm: Optional[connect._Alarm]) -> None:
        if guard is None or alarm is None:
            return
        fired = guard.finish(alarm)
        if fired:
            until = getattr(self._local, "deadline", None)
            self._local.fired = (fired, alarm.budget, until is not None and time.monotonic() >= until)

    def _running_alarm(self) -> Optional[connect._Alarm]:
        """The guard of the statement this thread is running, taken off (a statement begins and
        ends in one thread, and a thread runs one statement at a time)."""
        alarm: Optional[connect._Alarm] = getattr(self._local, "alarm", None)
        self._local.alarm = None
        return alarm

    def _install_guard(self, guard: connect.StatementGuard) -> None:
        """Every statement, commit and rollback on this engine runs under a budget (see :meth:`deadline`)."""
        engine = self.engine

        def before(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
            self._local.alarm = self._guard_start(guard, _driver_connection(conn.connection))

        def after(conn: Any, cursor: Any, statement: Any, parameters: Any, context: Any, many: Any) -> None:
            self._guard_finish(guard, self._running_alarm())

        def failed(context: Any) -> None:
            self._guard_finish(guard, self._running_alarm())

        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        event.listen(engine, "handle_error", failed)
        dialect = engine.dialect
        for name in ("do_commit", "do_rollback"):
            # COMMIT and ROLLBACK (also the pool's reset on return) are no cursor executions.
            original = getattr(dialect, name)

            def bounded(dbapi_conn: Any, original: Callable[[Any], None] = original) -> None:
                alarm = self._guard_start(guard, _driver_connection(dbapi_conn))
                try:
                    original(dbapi_conn)
                finally:
                    self._guard_finish(guard, alarm)

            setattr(dialect, name, bounded)

    def _wrap_initialize(self, guard: Optional[connect.StatementGuard]) -> None:
        """The dialect's first look at a new server (version, default schema, settings), run by
        SQLAlchemy on the first connection: bounded like every statement, and a connection lost
        during it (a server restarting) reported as the lost connection it is, so that it is retried.

        SQLAlchemy runs these statements on a connection that cannot reconnect; some of them
        swallow a failure, after which the next one meets the invalidated connection and raises
        ``ResourceClosedError`` ("This Connection is closed") or ``PendingRollbackError``: not a
        driver error, so it would leave a call untranslated and unretried. SQLAlchemy runs the
        initialisation again on the next connection when it fails.
        """
        dialect = self.engine.dialect
        initialize = dialect.initialize

        def bounded_initialize(connection: Any) -> None:
            alarm = None if guard is None else self._guard_start(guard, _driver_connection(connection.connection))
            try:
                initialize(connection)
            except Exception as exc:
                self._guard_finish(guard, alarm)
                fired = getattr(self._local, "fired", None)
                if fired is not None:
                    # SQLAlchemy passes whatever a half-read answer left behind (even a
                    # NotImplementedError); the cause is known: no answer within the budget.
                    self._local.fired = None
                    raise self.overran(exc, *fired) from exc
                if isinstance(exc, (ResourceClosedError, PendingRollbackError)):
                    lost = ConnectionError(
                        f"the connection was lost while SQLAlchemy read the server's settings ({exc})")
                    raise OperationalError("(dialect initialize)", None, lost, connection_invalidated=True) from exc
                raise
            self._guard_finish(guard, alarm)

        dialect.initialize = bounded_initialize  # type: ignore[method-assign]

    @property
    def target_dialect(self) -> Optional[str]:
        """Set only by ``controltable sql`` (and tests standing in for a server): build statements
        for this dialect while running on SQLite. Setting it looks up :attr:`traits` again."""
        return self._target_dialect

    @target_dialect.setter
    def target_dialect(self, name: Optional[str]) -> None:
        self._target_dialect = name
        self.traits = dialects.traits(name) if name else self.engine_traits

    @property
    def dialect_name(self) -> str:
        """The backend's dialect name the statements are built for (the target's, when one is set)."""
        return self._target_dialect or str(self.engine.dialect.name)

    @property
    def safe_url(self) -> str:
        return safe_url(self.engine.url)

    def redact(self, text: object) -> str:
        """``text`` without the password of this database's URL (or any URL-shaped password)."""
        return redact(text, [self.engine.url.password])

    def dispose(self) -> None:
        self.engine.dispose()

    def is_database_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` came from the driver (wrapped by SQLAlchemy or raw, e.g. from a pool hook)."""
        if isinstance(exc, ControlTableError):
            return False
        if isinstance(exc, (StatementError, PoolTimeout)):  # DBAPIError, binding values, a full pool
            return True
        if self._driver_error is not None and isinstance(exc, self._driver_error):
            return True
        # A value the driver could not encode (lone surrogates) or store (a huge int on SQLite).
        return isinstance(exc, (UnicodeError, OverflowError)) or errorcodes.is_driver_error(exc)

    @contextmanager
    def translating(self) -> Iterator[None]:
        """Translate database errors raised in the block (for direct engine use: DDL, reflection)."""
        try:
            yield
        except Exception as exc:
            if not self.is_database_error(exc):
                raise
            raise self.translate(exc) from exc

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One transaction, no retries: for work whose effects must not be repeated."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except Exception as exc:
            if not self.is_database_error(exc):
                raise
            raise self.translate(exc) from exc

    def run(
        self, fn: Callable[[Connection], T], *, idempotent: bool = True, deadline: Optional[float] = None
    ) -> T:
        """Run ``fn`` in one transaction, retrying what is safe to retry.

        A failure *before* the commit (a deadlock, a serialization failure, a lock timeout, or a
        connection that dropped, e.g. a pooled connection the server closed or a server
        restarting) leaves nothing behind: the server rolls the transaction back, so running
        ``fn`` again is always safe. Only a connection lost *during* the commit is ambiguous (it
        may or may not have happened); that is retried only when ``idempotent`` says a second
        run of ``fn`` is harmless, and reported otherwise. This is why no pool pre-ping is
        needed: a stale pooled connection fails on the first statement, before anything could
        commit.

        ``deadline`` (a :func:`time.monotonic` value) bounds the retries: no new attempt starts
        after it, and back-off sleeps end at it, so a caller with a ``timeout=`` gets its answer
        (the error) in time. One attempt is itself bounded by the connect and statement
        timeouts, and a connection opened for it waits at most until the deadline (the connect
        timeout is shortened). A connection attempt that used up the whole connect timeout (a
        server that accepts and never answers) is not retried: the caller hears after one
        connect timeout.

        Every failure leaves as a :class:`~controltable.errors.ControlTableError`.
        """
        with self.deadline(deadline):
            return self._run(fn, idempotent, getattr(self._local, "deadline", None))

    def _run(self, fn: Callable[[Connection], T], idempotent: bool, deadline: Optional[float]) -> T:
        delay = 0.05
        attempt = 0
        while True:
            committing = False
            connected = False
            started = time.monotonic()
            self._local.fired = None
            try:
                with self.engine.connect() as conn:
                    connected = True
                    trans = conn.begin()
                    try:
                        result = fn(conn)
                    except BaseException:
                        # End the guard of a statement that failed without SQLAlchemy's handle_error
                        # event, so that the budget which stopped it is known (overran, not "server
                        # down"): MySQL's reflection runs SHOW CREATE TABLE with skip_user_error_events.
                        self._guard_finish(self._guard, self._running_alarm())
                        if trans.is_active:
                            trans.rollback()
                        raise
                    committing = True
                    trans.commit()
                    return result
            except Exception as exc:
                if not connected and isinstance(exc, (TypeError, ValueError)) and not isinstance(exc, UnicodeError):
                    raise self.bad_settings(exc) from exc
                if not self.is_database_error(exc):
                    raise
                kind = errorcodes.classify(exc, self.engine.dialect.name, connecting=not connected)
                lost = bool(getattr(exc, "connection_invalidated", False)) or kind in (
                    Kind.UNAVAILABLE, Kind.TOO_MANY_CONNECTIONS, Kind.READ_ONLY)
                if kind is Kind.READ_ONLY:
                    # Pooled connections lead to a server that takes no writes (a standby, or a
                    # demoted primary): new ones let a multi-host URL find the primary.
                    self.engine.dispose()
                retry = kind is Kind.TRANSIENT or (lost and (idempotent or not committing))
                if kind is Kind.POOLER:
                    # The next connection meets the same pooler: only a setting fixes it - unless
                    # it is a prepared statement of ours, on a connection that looked direct.
                    retry = not committing and self._stop_preparing(exc)
                elif errorcodes.is_stale_prepared_plan(exc) and not committing:
                    self.engine.dispose()  # every pooled connection may hold the stale plan
                    retry = True
                now = time.monotonic()
                if lost and not connected and now - started >= min(
                    self.connect_timeout, (deadline - started) if deadline is not None else math.inf
                ) * 0.9:
                    retry = False  # a server that does not answer: one connect timeout is the answer
                if deadline is not None and now + delay * 0.5 >= deadline:
                    retry = False
                fired = getattr(self._local, "fired", None)
                if fired is not None:
                    # Our own client-side bound stopped the attempt: its budget was all there was.
                    self._local.fired = None
                    raise self.overran(exc, *fired) from exc
                if not retry or attempt >= self.retries:
                    raise self.translate(exc, retried=attempt, connecting=not connected) from exc
                log.warning("controltable: retrying after %s (attempt %d)", self.short(exc), attempt + 1)
                pause = delay * (0.5 + random.random())
                if deadline is not None:
                    pause = min(pause, max(deadline - time.monotonic(), 0.0))
                self.sleep(pause)
                delay = min(delay * 2, 2.0)
                attempt += 1

    def _stop_preparing(self, exc: BaseException) -> bool:
        """A server-side prepared statement met a pooler (SQLSTATE 42P05 or 26000) although the new
        connection's check (:func:`controltable.connect.same_session`) saw the server's own session:
        new connections to this URL prepare nothing from now on, and the transaction (rolled back
        by the error) can run again. False when that was already done or the URL decides itself."""
        url = self.engine.url
        if (not self._own_engine or self._prepares_dropped or connect.on_checkout_hook(url) is None
                or errorcodes.sqlstate(exc) not in ("42P05", "26000")):
            return False
        self._prepares_dropped = True
        # For every engine of this process that opens a new connection to it; said once per URL.
        first = connect.refuse_prepares(url)
        self.engine.dispose()  # this engine's pooled connections prepared: none is used again
        log.log(logging.WARNING if first else logging.DEBUG,
                "controltable: a prepared statement met a connection pooler at %s; server-side prepared "
                "statements are off for it from now on (retrying)", self.safe_url)
        return True

    def overran(self, exc: BaseException, how: str, budget: float, past_deadline: bool) -> ControlTableError:
        """The error for a statement the client stopped (see :class:`controltable.connect.StatementGuard`)."""
        url, short = self.safe_url, self.short(exc)
        limit = "the call's timeout" if past_deadline or not self.statement_timeout or budget < (
            self.statement_timeout * 0.99) else f"the statement timeout ({self.statement_timeout:g} s)"
        if how == "cancelled" and errorcodes.classify(exc, self.engine.dialect.name) is Kind.TIMEOUT:
            return StatementTimeoutError(
                f"a statement at {url} was still running when {limit} ran out ({budget:.1f} s) and was "
                f"cancelled: {short}; look for a long transaction holding locks on the control or event "
                "tables, or raise the timeout (ControlTable(..., statement_timeout=...) / "
                "`controltable --statement-timeout`)"
            )
        if past_deadline and budget < SHORT_BUDGET:
            # Little of the call's time was left for this statement: a busy machine or server (or a
            # slow connect) may have spent the rest, so a silent path is only one of two causes.
            return DatabaseUnavailableError(
                f"the database at {url} did not answer within the call's timeout (the {budget:.1f} s left "
                f"of it for this statement), so the connection was closed: {short}; either the network "
                "path or a pooler/proxy in between is silent, or the call's time had mostly gone before "
                "this statement (a busy machine or server, a slow connect). Check the path to the server, "
                "or give the call a longer timeout; the call can be retried"
            )
        return DatabaseUnavailableError(
            f"the database at {url} did not answer within {limit} ({budget:.1f} s), so the connection was "
            f"closed: {short}; the network path or a pooler/proxy in between is silent (it accepts and "
            "never answers, or packets are dropped). Check the path to the server; the call can be retried"
        )

    def bad_settings(self, exc: BaseException) -> ConfigurationError:
        """The driver refused the connection settings before reaching the server."""
        return ConfigurationError(
            f"the driver refused the connection settings of {self.safe_url}: {self.short(exc)}; check the "
            "options in the URL's query string (and connect_args of an engine passed in)"
        )

    def short(self, exc: BaseException) -> str:
        """The first line of the driver's message, password masked."""
        orig = errorcodes.driver_error(exc)
        text = str(orig).strip().splitlines()
        return self.redact(text[0] if text else type(orig).__name__)

    def translate(
        self, exc: BaseException, *, retried: int = 0, default: Kind = Kind.OTHER, connecting: bool = False
    ) -> ControlTableError:
        """Turn a driver error into the controltable error that names the problem and the fix.

        ``connecting``: the error came while a connection was being opened (see
        :func:`errorcodes.classify`)."""
        if isinstance(exc, ControlTableError):
            return exc
        if isinstance(exc, PoolTimeout):  # not retried: another wait for the same full pool
            # A server's engine passed in is used with its own pool; SQLite's is rebuilt (see make_engine).
            larger = "" if self.engine_traits.file_database else (
                ", or pass an engine with a larger pool (ControlTable(create_engine(url, pool_size=..., "
                "max_overflow=...)))")
            return DatabaseBusyError(
                f"every pooled connection of this process to {self.safe_url} stayed in use: {self.short(exc)}. "
                "More threads or tasks call this ControlTable at once than its pool holds (a call holds a "
                "connection only while its statements run); call it from fewer at once, or give each group "
                f"of threads a ControlTable of its own{larger}")
        kind = errorcodes.classify(exc, self.engine.dialect.name, connecting=connecting)
        if kind is Kind.OTHER and getattr(exc, "connection_invalidated", False):
            kind = Kind.UNAVAILABLE
        if kind is Kind.OTHER:
            kind = default
        url, short = self.safe_url, self.short(exc)
        user = self.engine.url.username or ""
        dbname = self.engine.url.database or ""
        sqlite = self.engine_traits.file_database
        if kind is Kind.UNAVAILABLE:
            return DatabaseUnavailableError(
                f"cannot reach the database at {url}: {short}; check that the server is running and "
                f"reachable from here (waited up to {self.connect_timeout:g} s to connect"
                f"{f', retried {retried} times' if retried else ''})"
            )
        if kind is Kind.TOO_MANY_CONNECTIONS:
            return TooManyConnectionsError(
                f"the database at {url} is at its connection limit: {short}; the server is running but "
                f"accepts no more connections for this user or role{f' (retried {retried} times)' if retried else ''}. "
                "Each controltable process keeps a pool of connections: run fewer processes, close "
                "idle sessions, raise the limit (PostgreSQL max_connections or the role's CONNECTION LIMIT; "
                "MySQL/MariaDB max_connections or max_user_connections), or put a connection pooler in front; "
                "retrying later may succeed"
            )
        if kind is Kind.READ_ONLY:
            return ReadOnlyDatabaseError(
                f"the database at {url} takes no writes: {short}; it is a standby (or a primary that a "
                "failover demoted). Point the URL at the primary: with several hosts in a PostgreSQL URL add "
                "target_session_attrs=read-write so that the next connection finds the new primary; on "
                "MySQL/MariaDB use the writer's address (read_only=OFF); "
                "`controltable doctor` shows which server the URL reaches"
                f"{f' (retried {retried} times)' if retried else ''}"
            )
        if kind is Kind.POOLER:
            return PoolerError(pooler_message(f"the connection was refused or lost its session state ({short})", url))
        if kind is Kind.AUTHENTICATION:
            return AuthenticationError(
                f"the database at {url} refused the login of user {user!r}: {short}; check the user name "
                "and password in the URL (or CONTROLTABLE_URL), and that the user exists and may log in"
            )
        if kind is Kind.MISSING_DATABASE:
            if sqlite:
                return DatabaseMissingError(
                    f"cannot open the SQLite database {dbname!r}: {short}; check that its directory "
                    "exists and is writable by this user"
                )
            return DatabaseMissingError(
                f"the database {dbname!r} does not exist at {url}: {short}; create it "
                f"(e.g. CREATE DATABASE {dbname}) or fix the database name in the URL"
            )
        if kind is Kind.PERMISSION:
            return PermissionDeniedError(
                f"the database user {user!r} lacks a privilege controltable needs at {url}: {short}; grant "
                "SELECT, INSERT, UPDATE, DELETE on the control tables and the event tables (`controltable "
                "sql` prints the DDL a DBA runs once; `controltable init` and `events prepare` need DDL "
                "rights), or connect as a user who has them"
            )
        if kind is Kind.NOT_INSTALLED:
            return NotInstalledError(
                f"the control tables (or an event table's claim columns) are missing or out of date in {url} "
                f"({short}); run `controltable init` (or ControlTable.install()) first, and "
                "`controltable events prepare` (EventTable.prepare()) for an event table"
            )
        if kind is Kind.TIMEOUT:
            limit = f"{self.statement_timeout:g} s" if self.statement_timeout else "the server's limit"
            return StatementTimeoutError(
                f"a statement ran longer than the statement timeout ({limit}) at {url} and was cancelled: "
                f"{short}; look for a long transaction holding locks on the control or event tables, or "
                "raise ControlTable(..., statement_timeout=...) / `controltable --statement-timeout`"
            )
        if kind is Kind.TRANSIENT:
            return DatabaseBusyError(
                f"the database at {url} kept rolling the transaction back ({short}) through {retried} "
                "retries; the control tables are heavily contended: retry later, or look for long "
                "transactions holding locks"
            )
        if kind is Kind.BAD_VALUE:
            mysql = self.engine_traits.utf8mb4_tables
            return ConfigurationError(
                f"the database rejected a value: {short}; a name, number or text passed in does not fit "
                "its column (too long, out of range, or characters the database cannot store)"
                + ("; control tables created in a latin1 database are converted to utf8mb4 by "
                   "`controltable init` (ControlTable.install())" if mysql else "")
            )
        if kind is Kind.CONFIGURATION:
            return self.bad_settings(exc)
        if kind is Kind.CONFLICT:
            return ConflictError(
                f"a concurrent change made the same row first: {short}; retry the call"
            )
        return UnexpectedDatabaseError(
            f"the database at {url} rejected a statement: {short} ({type(errorcodes.driver_error(exc)).__name__}); "
            "if it persists, report it to controltable with this message"
        )

    def now(self) -> float:
        """The database clock, as UTC epoch seconds."""
        return self.run(read_now)

    def ping(self) -> None:
        """Connect once, turning any failure into a :class:`DatabaseUnavailableError` (or subclass).

        Uses the raw driver connection so that no transaction is begun: on SQLite every
        SQLAlchemy transaction starts with BEGIN IMMEDIATE, which would wait for a writer.
        """
        try:
            raw = self.engine.raw_connection()
        except Exception as exc:  # raw_connection() passes the driver's own errors through unwrapped
            if isinstance(exc, (TypeError, ValueError)) and not isinstance(exc, UnicodeError):
                raise self.bad_settings(exc) from exc
            raise self.translate(exc, default=Kind.UNAVAILABLE, connecting=True) from exc
        alarm = None
        try:
            if self._guard is not None:
                alarm = self._guard_start(self._guard, _driver_connection(raw))
            cursor = raw.cursor()
            cursor.execute(self.engine_traits.ping_sql)
            cursor.fetchall()
            cursor.close()
        except Exception as exc:
            raw.invalidate()
            raise self.translate(exc, default=Kind.UNAVAILABLE) from exc
        finally:
            if self._guard is not None:
                self._guard_finish(self._guard, alarm)
            raw.close()
