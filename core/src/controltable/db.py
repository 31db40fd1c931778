"""The connection to the user's database: engine set-up, transactions, retries and error translation.

Every statement controltable runs goes through :meth:`Database.run`, so the rules for which
failures are retried (and which are reported) live here once.
"""

from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

from sqlalchemy import create_engine, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from . import dialects
from .defaults import DEFAULT_URL  # noqa: F401 - re-exported
from .errors import ConfigurationError, DatabaseUnavailableError, NotInstalledError

log = logging.getLogger("controltable")

T = TypeVar("T")


_DRIVER_EXTRAS = {
    "psycopg": "postgres",
    "psycopg2": "postgres",
    "pymysql": "mysql",
    "pyodbc": "mssql",
    "oracledb": "oracle",
}

# Backend error codes meaning "the transaction was rolled back, run it again".
_TRANSIENT_MARKERS = (
    "deadlock",
    "could not serialize",
    "lock wait timeout",
    "database is locked",
    "40001",
    "40p01",
)
_MISSING_TABLE_MARKERS = (
    "no such table",
    "doesn't exist",
    "does not exist",
    "undefinedtable",
    "invalid object name",
    "ora-00942",
    "no such column",
    "unknown column",
    "invalid column name",
    "ora-00904",
)


def make_engine(url_or_engine: Union[str, Engine, Any]) -> Engine:
    """Create (or adopt) the engine and configure it for coordination work."""
    if isinstance(url_or_engine, Engine):
        engine = url_or_engine
        if engine.dialect.name == "sqlite":
            # Our SQLite set-up changes how transactions begin: give it an engine of its own
            # rather than altering the caller's.
            engine = _sqlite_engine(engine.url)
    else:
        try:
            url = make_url(str(url_or_engine))
        except ArgumentError as exc:
            raise ConfigurationError(
                f"{url_or_engine!r} is not a database URL; use e.g. "
                "postgresql+psycopg://user@host:5432/db or sqlite:///controltable.db"
            ) from exc
        if url.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url)
        else:
            try:
                engine = create_engine(url, pool_size=5, max_overflow=10, pool_recycle=1800)
            except NoSuchModuleError as exc:
                raise ConfigurationError(
                    f"unknown database in URL {url.render_as_string(hide_password=True)!r}: {exc}"
                ) from exc
            except ImportError as exc:
                extra = _DRIVER_EXTRAS.get(url.get_driver_name(), "postgres|mysql|mssql|oracle")
                raise ConfigurationError(
                    f"the driver for {url.drivername!r} is not installed ({exc}); "
                    f"install it with: pip install 'controltable[{extra}]'"
                ) from exc
    if engine.dialect.name not in dialects.SUPPORTED_DIALECTS:
        dialects.raise_unsupported(engine.dialect.name)
    return dialects.prepare_engine(engine)


def _sqlite_engine(url: Any) -> Engine:
    if dialects.sqlite_path(url) is None:
        raise ConfigurationError(
            "an in-memory SQLite database cannot coordinate anything (every connection sees its own "
            "database); use a file, e.g. sqlite:///controltable.db"
        )
    return dialects.prepare_engine(create_engine(url, connect_args={"timeout": 60}))


class Database:
    """An engine plus the retry policy every operation shares."""

    def __init__(self, url_or_engine: Union[str, Engine, Any], *, retries: int = 5) -> None:
        self.engine = make_engine(url_or_engine)
        self.retries = retries
        #: Set only by ``controltable sql``: build statements for this dialect while running on SQLite.
        self.target_dialect: Optional[str] = None

    @property
    def dialect_name(self) -> str:
        return self.target_dialect or str(self.engine.dialect.name)

    @property
    def safe_url(self) -> str:
        return str(self.engine.url.render_as_string(hide_password=True))

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One transaction, no retries: for work whose effects must not be repeated."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise self.translate(exc) from exc

    def run(self, fn: Callable[[Connection], T], *, idempotent: bool = True) -> T:
        """Run ``fn`` in one transaction, retrying what is safe to retry.

        A failure *before* the commit (a deadlock, a serialization failure, a lock timeout, or a
        connection that dropped, e.g. a pooled connection the server closed) leaves nothing
        behind: the server rolls the transaction back, so running ``fn`` again is always safe.
        Only a connection lost *during* the commit is ambiguous (it may or may not have
        happened); that is retried only when ``idempotent`` says a second run of ``fn`` is
        harmless, and reported otherwise. This is why no pool pre-ping is needed: a stale pooled
        connection fails on the first statement, before anything could commit.
        """
        delay = 0.05
        for attempt in range(self.retries + 1):
            committing = False
            try:
                with self.engine.connect() as conn:
                    trans = conn.begin()
                    try:
                        result = fn(conn)
                    except BaseException:
                        if trans.is_active:
                            trans.rollback()
                        raise
                    committing = True
                    trans.commit()
                    return result
            except DBAPIError as exc:
                disconnect = bool(exc.connection_invalidated) or _is_connect_error(exc)
                transient = _is_transient(exc)
                retry = transient or (disconnect and (idempotent or not committing))
                if not retry or attempt == self.retries:
                    raise self.translate(exc) from exc
                log.warning("controltable: retrying after %s (attempt %d)", _short(exc), attempt + 1)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover

    def translate(self, exc: DBAPIError) -> Exception:
        """Turn a driver error into a controltable error that says what to do."""
        text = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
        if exc.connection_invalidated or _is_connect_error(exc):
            return DatabaseUnavailableError(f"cannot reach the database at {self.safe_url}: {_short(exc)}")
        if any(m in text for m in _MISSING_TABLE_MARKERS):
            return NotInstalledError(
                f"the control tables are missing or out of date in {self.safe_url} ({_short(exc)}); "
                "run `controltable init` (or ControlTable.install()) first"
            )
        return exc

    def now(self) -> float:
        """The database clock, as UTC epoch seconds."""
        return self.run(lambda c: float(c.scalar(select(dialects.db_now())) or 0.0))

    def ping(self) -> None:
        """Connect once, turning any failure into :class:`DatabaseUnavailableError`.

        Uses the raw driver connection so that no transaction is begun: on SQLite every
        SQLAlchemy transaction starts with BEGIN IMMEDIATE, which would wait for a writer.
        """
        try:
            raw = self.engine.raw_connection()
        except Exception as exc:  # raw_connection() passes the driver's own errors through unwrapped
            raise DatabaseUnavailableError(f"cannot reach the database at {self.safe_url}: {_short(exc)}") from exc
        try:
            cursor = raw.cursor()
            cursor.execute("SELECT 1 FROM DUAL" if self.engine.dialect.name == "oracle" else "SELECT 1")
            cursor.fetchall()
            cursor.close()
        except Exception as exc:
            raw.invalidate()
            raise DatabaseUnavailableError(f"cannot use the database at {self.safe_url}: {_short(exc)}") from exc
        finally:
            raw.close()


def _short(exc: BaseException) -> str:
    orig: Optional[BaseException] = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _is_transient(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    code = str(getattr(exc.orig, "sqlstate", "") or "").lower()
    args = getattr(exc.orig, "args", ())
    mysql_code = args[0] if args and isinstance(args[0], int) else None
    return mysql_code in (1205, 1213) or code in ("40001", "40p01") or any(m in text for m in _TRANSIENT_MARKERS)


def _is_connect_error(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    args = getattr(exc.orig, "args", ())
    mysql_code = args[0] if args and isinstance(args[0], int) else None
    if mysql_code in (2002, 2003, 2006, 2013, 2055):
        return True
    return any(
        m in text
        for m in (
            "connection refused",
            "could not connect",
            "server closed the connection",
            "connection is closed",
            "terminating connection",
            "unable to open database file",
            "connection timed out",
            "lost connection",
            "consuming input failed",
        )
    )
