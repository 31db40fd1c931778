"""How controltable opens connections per dialect: timeouts, keepalives and the isolation level, once per connection.

``connect_args`` is a pure function (URL + timeouts -> driver keyword arguments) so what each
driver receives can be unit-tested without a server; ``on_connect`` applies the settings that
drivers only take on an open connection. Both run once per new DBAPI connection, never per
checkout: a pooled connection keeps its settings, so a transaction costs no extra round trips.
:class:`StatementGuard` bounds each statement (and commit) on the client, from the statement
timeout and the deadline of the caller's ``timeout=``: a silent network (a peer that ACKs and
never answers, a dropped path) cannot hold a call past its deadline.

What each backend gets (every key the URL's query string already sets is left alone, so a user
can override any of them there):

=============  ===========================================================================
PostgreSQL     ``connect_timeout`` (libpq: whole seconds, at least 2; covers the login),
(psycopg,      ``keepalives*``, ``tcp_user_timeout``; psycopg 3: ``prepare_threshold=None``,
psycopg2)      raised to psycopg's 5 once the new connection proves it reaches the server itself
               (:func:`same_session`), not a pooler. No startup ``options`` and no session
               ``SET``: a connection pooler (PgBouncer in transaction or session mode) refuses
               startup options, and hands the next transaction another server connection, where
               prepared statements and session settings do not exist. The statement timeout is
               kept by the client instead (:class:`StatementGuard`): a cancel request when a
               statement overruns, then the socket closed if even that is not answered.
MySQL/MariaDB  ``connect_timeout``; ``read_timeout``/``write_timeout`` = statement timeout +
(PyMySQL,      a margin (the client gives up on a silent server); during the handshake the read
mysqlclient)   timeout is the connect timeout; PyMySQL's are shortened per statement to the
               caller's deadline (:class:`StatementGuard`). Server side, once per connection:
               MariaDB ``max_statement_time``, MySQL ``max_execution_time`` (SELECTs only).
SQL Server     ``timeout`` (login timeout); the connection's query ``timeout`` = statement
(pyodbc)       timeout. TCP keepalive is the ODBC driver's (``KeepAlive``, 30 s by default).
Oracle         ``tcp_connect_timeout``, ``expire_time`` (keepalive probes, minutes); the
(oracledb)     connection's ``call_timeout`` = statement timeout.
SQLite         ``timeout`` and ``PRAGMA busy_timeout`` = statement timeout (or 60 s).
=============  ===========================================================================
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
import logging
import math
import os
import socket
import threading
import time
from typing import Any, Callable, Optional

import sqlalchemy

from . import defaults, dialects, threads
from .dialect_traits import URL_BACKENDS, backend_drivers
from .errors import ConfigurationError, safe_url

log = logging.getLogger("controltable")

READ_COMMITTED = "READ COMMITTED"

#: psycopg 3 prepares a statement on the server after its 5th execution on a connection; behind a
#: pooler in transaction mode the next transaction may run on another server connection, where
#: the name is unknown or taken (``DuplicatePreparedStatement``), or - worse - names another
#: client's statement. So a new connection starts with them off, and :func:`on_connect` turns
#: them on (:data:`PREPARE_THRESHOLD`) only once the connection proves it is the server's own
#: session (:func:`same_session`): an uncontended acquire+release runs 1.4x faster with them.
#: A URL's ``?prepare_threshold=`` (``off``: never, a number: psycopg's threshold) decides instead.
#: False would leave psycopg's default (prepare at the 5th execution) on every connection, unchecked.
CHECK_BEFORE_PREPARING = True
#: psycopg's own default: a statement is prepared on the server at its 5th execution.
PREPARE_THRESHOLD = 5
#: The server's process id of this session, compared with the one the connection was handed.
SERVER_PID = "SELECT pg_backend_pid()"

#: URLs (without password) on which a prepared statement met a pooler although the connection
#: looked direct (:func:`refuse_prepares`): new connections to them never prepare again.
_PREPARES_REFUSED: set[str] = set()


# -- URL spellings people type (the drivers are the dialect layer's one table, DRIVERS) -----------
#: Whether the running SQLAlchemy is 2.x (it has the psycopg-3 dialect).
SQLALCHEMY_2 = int(sqlalchemy.__version__.split(".")[0]) >= 2


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def typed_url(url: Any, have: Callable[[str], bool] = _importable, *, sqlalchemy_2: bool = SQLALCHEMY_2) -> Any:
    """``url`` (a SQLAlchemy ``URL``) with the common spellings people type made explicit.

    ``postgres://`` and ``postgresql://`` become ``postgresql+psycopg://`` (psycopg 3, what the
    ``postgres`` extra installs; ``+psycopg2`` when only that is installed, and on SQLAlchemy 1.4,
    which has no psycopg-3 dialect: there psycopg 3 alone is refused, naming the conflict); ``mysql://`` and
    ``mariadb://`` become ``mysql+pymysql://`` when PyMySQL is installed and mysqlclient is not
    (SQLAlchemy would otherwise ask for ``MySQLdb``). A URL naming its driver keeps it (only the
    backend's spelling is made explicit). When no driver for the backend is installed, a
    :class:`ConfigurationError` says what to install and what to type. Messages mask the password.
    """
    name = str(url.drivername)
    spelled, _, named = name.partition("+")
    backend = URL_BACKENDS.get(spelled.lower())
    if backend is None:
        return url
    if named:
        return url if spelled == backend else url.set(drivername=f"{backend}+{named}")
    major = 2 if sqlalchemy_2 else 1
    usable = [d for d in backend_drivers(backend) if d.sqlalchemy <= major]
    for found in usable:
        if have(found.module):
            return url.set(drivername=f"{backend}+{found.name}")
    # What to install: the extra's driver if this SQLAlchemy has its dialect, else one it has.
    advice = next((d for d in usable if d.package.startswith("'controltable[")), usable[0])
    newer = [d for d in backend_drivers(backend) if d.sqlalchemy > major and have(d.module)]
    conflict = "".join(
        f"{d.module} is installed, but SQLAlchemy {sqlalchemy.__version__} has no dialect for it "
        f"({backend}+{d.name} needs SQLAlchemy {d.sqlalchemy}); " for d in newer)
    raise ConfigurationError(
        f"no driver for {safe_url(url)!r} is installed{' that this SQLAlchemy can use' if newer else ''}; "
        f"{conflict}install one with: pip install {advice.package}, and use a URL that names it, "
        f"e.g. {advice.example}{' (or upgrade SQLAlchemy to 2)' if newer else ''}"
    )


def _ms(seconds: float) -> int:
    return max(1, int(math.ceil(seconds * 1000)))


def _query_keys(url: Any) -> set[str]:
    return {str(k) for k in (getattr(url, "query", None) or {})}


def busy_timeout(statement_timeout: Optional[float]) -> float:
    """SQLite's busy timeout (seconds) for a statement timeout."""
    return statement_timeout if statement_timeout else defaults.SQLITE_BUSY_TIMEOUT


def connect_args(url: Any, *, connect_timeout: float, statement_timeout: Optional[float]) -> dict[str, Any]:
    """Driver keyword arguments for ``url`` (a SQLAlchemy URL); nothing the URL already sets."""
    backend = url.get_backend_name()
    driver = url.get_driver_name()
    taken = _query_keys(url)
    out: dict[str, Any] = {}
    if backend == "postgresql" and driver in ("psycopg", "psycopg2", "psycopg2cffi"):
        out.update(
            connect_timeout=max(2, int(math.ceil(connect_timeout))),
            keepalives=1,
            keepalives_idle=defaults.KEEPALIVE_IDLE,
            keepalives_interval=defaults.KEEPALIVE_INTERVAL,
            keepalives_count=defaults.KEEPALIVE_COUNT,
            tcp_user_timeout=defaults.TCP_USER_TIMEOUT_MS,
        )
        if driver == "psycopg":
            own = url.query.get("prepare_threshold") if "prepare_threshold" in taken else None
            if own is not None:
                # The URL's choice, as the number psycopg needs (a query string holds text).
                text = str(own[-1] if isinstance(own, (tuple, list)) else own).strip().lower()
                out["prepare_threshold"] = None if text in ("", "none", "null", "off") else int(text)
            elif CHECK_BEFORE_PREPARING:
                out["prepare_threshold"] = None
    elif backend == "mysql" and driver == "aiomysql":
        out["connect_timeout"] = connect_timeout  # statements are bounded by max_statement_time
    elif backend == "mysql" and driver in ("pymysql", "mysqldb"):
        out["connect_timeout"] = connect_timeout if driver == "pymysql" else max(1, int(math.ceil(connect_timeout)))
        if driver == "pymysql":
            # The handshake is read with read_timeout: bound it by the connect timeout, and
            # raise it to the statement timeout once connected (on_connect).
            out["read_timeout"] = connect_timeout
            out["write_timeout"] = connect_timeout
        elif statement_timeout:
            out["read_timeout"] = int(math.ceil(statement_timeout + defaults.CLIENT_TIMEOUT_MARGIN))
            out["write_timeout"] = int(math.ceil(statement_timeout + defaults.CLIENT_TIMEOUT_MARGIN))
    elif backend == "mssql" and driver == "pyodbc":
        out["timeout"] = max(1, int(math.ceil(connect_timeout)))
    elif backend == "oracle" and driver in ("oracledb", "cx_oracle"):
        if driver == "oracledb":
            out["tcp_connect_timeout"] = float(connect_timeout)
            out["expire_time"] = max(1, int(math.ceil(defaults.KEEPALIVE_IDLE / 60)))
    elif backend == "sqlite":
        out["timeout"] = busy_timeout(statement_timeout)
    # The URL's own settings win (prepare_threshold was read from the URL above).
    return {k: v for k, v in out.items() if k not in taken or k == "prepare_threshold"}


def same_session(handed_pid: Optional[int], server_pid: Optional[int]) -> bool:
    """Whether a PostgreSQL connection talks to the server's own session, so that statements it
    prepares on the server stay its own.

    libpq learns a process id from the server's first message (``BackendKeyData``); a direct
    connection, or one through a proxy that only forwards bytes (a port mapping, an SSH tunnel, a
    TCP load balancer), is handed the id of the server process serving it, which
    ``pg_backend_pid()`` reports. A pooler answers the login itself and hands out an id of its own
    (PgBouncer: a random cancel key, in either pool mode), because the server process behind the
    client changes. A mismatch, or either id unknown, means a pooler or something unknown: the
    safe side (no prepared statements)."""
    return handed_pid is not None and server_pid is not None and int(handed_pid) == int(server_pid)


def prepares_allowed(url: Any) -> bool:
    """False once :func:`refuse_prepares` was called for this URL in this process."""
    return _url_key(url) not in _PREPARES_REFUSED


def refuse_prepares(url: Any) -> bool:
    """No server-side prepared statements on new connections to ``url`` (a pooler was met where the
    connection check saw none); returns False if they were already refused."""
    key = _url_key(url)
    if key in _PREPARES_REFUSED:
        return False
    _PREPARES_REFUSED.add(key)
    return True


def on_checkout_hook(url: Any) -> Optional[Callable[[Any], None]]:
    """For a psycopg URL that leaves prepared statements to controltable: a function run on every
    pool checkout that stops a connection preparing once its URL was refused (in any engine of the
    process), so pooled connections opened before a clash do not prepare again. None elsewhere."""
    if url.get_backend_name() != "postgresql" or url.get_driver_name() != "psycopg" or "prepare_threshold" in url.query:
        return None
    key = _url_key(url)

    def checkout(dbapi_conn: Any) -> None:
        if key in _PREPARES_REFUSED and getattr(dbapi_conn, "prepare_threshold", None) is not None:
            dbapi_conn.prepare_threshold = None  # psycopg then runs even a prepared query unprepared

    return checkout


def _url_key(url: Any) -> str:
    render = getattr(url, "render_as_string", None)
    return str(render(hide_password=True) if render is not None else url)


def _prepare_when_direct(dbapi_conn: Any, url: Any, budget: float) -> None:
    """Turn psycopg's server-side prepared statements on for a connection that is the server's own
    session (:func:`same_session`); a connection that cannot tell stays without them."""
    if not prepares_allowed(url):
        return
    handed = getattr(getattr(dbapi_conn, "info", None), "backend_pid", None)
    alarm = StatementGuard("cancel", None).start(dbapi_conn, budget)
    try:
        try:
            row = dbapi_conn.execute(SERVER_PID).fetchone()
        finally:
            dbapi_conn.rollback()  # no transaction left open on a new pooled connection
    except Exception as exc:  # a connection that cannot answer fails its first real statement too
        log.debug("controltable: could not compare the session's process id: %s", exc)
        return
    finally:
        alarm.finish()
    if same_session(handed, None if row is None else row[0]):
        dbapi_conn.prepare_threshold = PREPARE_THRESHOLD


def on_connect(dialect: Any, dbapi_conn: Any, *, statement_timeout: Optional[float], url: Any) -> None:
    """Settings only an open connection takes; runs once per new DBAPI connection."""
    name = dialect.name
    driver = getattr(dialect, "driver", "")
    taken = _query_keys(url)
    # An asyncio connection is not asked (its adapter runs no sync query here): it never prepares.
    if (name == "postgresql" and driver == "psycopg" and "prepare_threshold" not in taken and CHECK_BEFORE_PREPARING
            and not dialects.on_asyncio(dialect)):
        _prepare_when_direct(dbapi_conn, url, statement_timeout or defaults.CONNECT_TIMEOUT)
    if name == "mysql" and statement_timeout:
        mariadb = "mariadb" in str(getattr(dbapi_conn, "get_server_info", lambda: "")()).lower()
        sql = (
            f"SET SESSION max_statement_time = {float(statement_timeout):.3f}"
            if mariadb
            else f"SET SESSION max_execution_time = {_ms(statement_timeout)}"
        )
        cur = dbapi_conn.cursor()
        try:
            cur.execute(sql)  # numbers formatted from a validated float, not user text
        except Exception as exc:  # an old server without the variable: the client timeout remains
            log.debug("controltable: %s failed: %s", sql, exc)
        finally:
            cur.close()
    if name == "mysql" and driver == "pymysql":
        # Raised only now: the SET above still ran under the (deadline-clamped) connect timeout.
        client = statement_timeout + defaults.CLIENT_TIMEOUT_MARGIN if statement_timeout else None
        # PyMySQL reads its read/write timeouts from these attributes on every socket operation.
        if "read_timeout" not in taken and hasattr(dbapi_conn, "_read_timeout"):
            dbapi_conn._read_timeout = client
        if "write_timeout" not in taken and hasattr(dbapi_conn, "_write_timeout"):
            dbapi_conn._write_timeout = client
    elif name == "mssql" and statement_timeout and hasattr(dbapi_conn, "timeout"):
        dbapi_conn.timeout = max(1, int(math.ceil(statement_timeout)))
    elif name == "oracle" and statement_timeout and hasattr(dbapi_conn, "call_timeout"):
        dbapi_conn.call_timeout = _ms(statement_timeout)


def clamp_connect_timeout(url: Any, cparams: dict[str, Any], seconds: float) -> None:
    """Shorten the connect timeout in ``cparams`` to ``seconds`` (a caller's deadline is nearer)."""
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "postgresql" and "connect_timeout" in cparams:
        # Rounded down (libpq takes whole seconds): a deadline is a promise, the floor is libpq's 2.
        cparams["connect_timeout"] = min(int(cparams["connect_timeout"]), max(2, int(seconds)))
    elif backend == "mysql" and driver == "pymysql":
        for key in ("connect_timeout", "read_timeout", "write_timeout"):
            if cparams.get(key):
                cparams[key] = min(float(cparams[key]), max(seconds, 0.5))
    elif backend == "mssql" and "timeout" in cparams:
        cparams["timeout"] = min(int(cparams["timeout"]), max(1, int(math.ceil(seconds))))
    elif backend == "oracle" and "tcp_connect_timeout" in cparams:
        cparams["tcp_connect_timeout"] = min(float(cparams["tcp_connect_timeout"]), max(seconds, 0.5))


# -- client-side statement deadlines ---------------------------------------------------------------
#: The shortest budget a statement gets (seconds), even past its caller's deadline.
MIN_STATEMENT_BUDGET = 0.05


class _Alarm:
    """One guarded statement: cancel it when its budget is spent, close its socket if that goes unanswered."""

    __slots__ = ("conn", "kind", "budget", "hurry", "started", "armed", "stage", "fired", "lock", "canceller")

    def __init__(self, conn: Any, kind: str, budget: float, hurry: bool) -> None:
        self.conn = conn
        self.kind = kind
        self.budget = budget
        #: The caller's deadline set the budget: no time is left to wait for the cancel's answer.
        self.hurry = hurry
        self.started = time.monotonic()
        self.armed = True
        self.stage = 0
        self.fired = ""  # "", "cancelled" (a cancel request was sent) or "closed" (the socket was shut)
        self.lock = threading.Lock()
        self.canceller: Optional[threading.Thread] = None

    def ring(self) -> None:
        with self.lock:
            if not self.armed:
                return
            if self.stage == 0 and self.kind == "cancel":
                # First the polite way: the server aborts the statement and says so (57014). The
                # cancel request travels on a connection of its own, so it runs in a thread of its own.
                self.stage = 1
                self.fired = "cancelled"
                self.canceller = threading.Thread(target=self._cancel, name="controltable-cancel", daemon=True)
                threads.start(self.canceller)
                if not self.hurry:
                    _WATCHDOG.schedule(time.monotonic() + defaults.CANCEL_GRACE, self)
                    return
            # The cancel went unanswered (or the driver has none): a silent network. Shutting the
            # socket down wakes the driver's blocked read at once with "connection closed".
            self.stage = 2
            self.fired = "closed"
            _shutdown(self.conn)

    def _cancel(self) -> None:
        try:
            cancel_safe = getattr(self.conn, "cancel_safe", None)
            if cancel_safe is not None:
                cancel_safe(timeout=defaults.CANCEL_GRACE)
            else:
                self.conn.cancel()
        except Exception as exc:  # the network is what failed: the socket close follows
            log.debug("controltable: cancel request failed: %s", exc)

    def finish(self) -> str:
        """Disarm (the statement returned or failed); what the alarm did, if anything."""
        with self.lock:
            self.armed = False
        canceller = self.canceller
        if canceller is not None:
            # A cancel that arrives after its statement ended must not hit the next one on this
            # connection: wait until the server has taken it (the connection is discarded anyway).
            canceller.join(defaults.CANCEL_GRACE)
        return self.fired


def _shutdown(conn: Any) -> None:
    try:
        fd = int(conn.fileno())
        if fd < 0:
            return
        dup = socket.socket(fileno=os.dup(fd))
    except Exception as exc:  # already closed
        log.debug("controltable: no socket to close: %s", exc)
        return
    try:
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()


class _Watchdog:
    """One daemon thread per process that rings the alarms of statements that overran their budget.

    Arming and disarming cost a lock and a heap push: no thread or timer per statement.
    """

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None

    def schedule(self, when: float, alarm: _Alarm) -> None:
        with self._cond:
            heap = self._heap
            while heap and not heap[0][2].armed:
                heapq.heappop(heap)
            if len(heap) > 4096:  # disarmed alarms behind a long one: drop them now and then
                heap[:] = [entry for entry in heap if entry[2].armed]
                heapq.heapify(heap)
            heapq.heappush(heap, (when, next(self._seq), alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="controltable-watchdog", daemon=True)
                threads.start(self._thread)
            elif heap[0][2] is alarm:
                self._cond.notify()

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                if cond is not self._cond:
                    return  # forked
                due: list[_Alarm] = []
                now = time.monotonic()
                heap = self._heap
                while heap and (heap[0][0] <= now or not heap[0][2].armed):
                    alarm = heapq.heappop(heap)[2]
                    if alarm.armed:
                        due.append(alarm)
                if not due:
                    cond.wait(heap[0][0] - now if heap else 60.0)
                    continue
            for alarm in due:
                try:
                    alarm.ring()
                except Exception:  # pragma: no cover - never let the watchdog die
                    log.exception("controltable: statement watchdog")


_WATCHDOG = _Watchdog()


class StatementGuard:
    """Bounds each statement and commit on the client, so no wait outlives its budget.

    PostgreSQL (psycopg, psycopg2): when the budget is spent, a cancel request (the server aborts
    the statement: a lock wait ends, its locks are freed); :data:`~controltable.defaults.CANCEL_GRACE`
    later, if the statement still has not returned, the socket is shut down (a silent network
    answers no cancel either). PyMySQL: the read and write timeouts of the socket are set to the
    budget for the statement (PyMySQL closes the connection when one expires). Either way the
    connection is discarded by the pool afterwards. Other drivers are not guarded (their own
    timeouts apply, see the table above).
    """

    def __init__(self, kind: str, base_timeout: Optional[float]) -> None:
        self.kind = kind  # "cancel" or "pymysql"
        self.base_timeout = base_timeout

    @classmethod
    def for_dialect(cls, dialect: Any, statement_timeout: Optional[float], url: Any) -> Optional[StatementGuard]:
        name, driver = dialect.name, getattr(dialect, "driver", "")
        if dialects.on_asyncio(dialect):
            return None  # asyncio drivers: the caller's task is cancelled instead (controltable.aio)
        if name == "postgresql" and driver in ("psycopg", "psycopg2"):
            return cls("cancel", None)
        if name == "mysql" and driver == "pymysql":
            taken = _query_keys(url)
            if "read_timeout" in taken or "write_timeout" in taken:
                return None  # the user's own socket timeouts stand
            base = statement_timeout + defaults.CLIENT_TIMEOUT_MARGIN if statement_timeout else None
            return cls("pymysql", base)
        return None

    def budget(self, statement_timeout: Optional[float], left: Optional[float]) -> Optional[float]:
        """A statement's budget: the statement timeout, or less when the caller's deadline is
        ``left`` seconds away (already including its grace); ``None``: unguarded. The caller's
        deadline is the nearer one when the budget is below the statement timeout."""
        if self.kind == "pymysql":
            # The server's own max_statement_time comes first when it can (a clear error).
            limit = statement_timeout + 2 * defaults.CANCEL_GRACE if statement_timeout else None
        else:
            limit = statement_timeout or None
        if left is None:
            return limit
        return left if limit is None else min(limit, left)

    def start(self, dbapi_conn: Any, budget: float, hurry: bool = False) -> _Alarm:
        """Guard one statement for ``budget`` seconds; ``hurry``: the caller's deadline set it (the
        socket is closed together with the cancel request, not after it)."""
        budget = max(budget, MIN_STATEMENT_BUDGET)
        alarm = _Alarm(dbapi_conn, self.kind, budget, hurry)
        if self.kind == "pymysql":
            # PyMySQL re-reads these before each socket read and write; a timeout closes the connection.
            dbapi_conn._read_timeout = budget
            dbapi_conn._write_timeout = budget
        else:
            _WATCHDOG.schedule(alarm.started + budget, alarm)
        return alarm

    def finish(self, alarm: _Alarm) -> str:
        """End the statement's guard: "" (in time), "cancelled" or "closed" (the budget ran out)."""
        fired = alarm.finish()
        if self.kind == "pymysql":
            conn = alarm.conn
            if getattr(conn, "_sock", None) is None and time.monotonic() - alarm.started >= alarm.budget * 0.95:
                fired = "closed"  # PyMySQL's socket timeout expired and it closed the connection
            conn._read_timeout = self.base_timeout
            conn._write_timeout = self.base_timeout
        return fired
