"""How controltable opens connections per dialect: timeouts, keepalives and the isolation level, once per connection.

``connect_args`` is a pure function (URL + timeouts -> driver keyword arguments) so what each
driver receives can be unit-tested without a server; ``on_connect`` applies the settings that
drivers only take on an open connection. Both run once per new DBAPI connection, never per
checkout: a pooled connection keeps its settings, so a transaction costs no extra round trips.

What each backend gets (every key the URL's query string already sets is left alone, so a user
can override any of them there):

=============  ===========================================================================
PostgreSQL     ``connect_timeout`` (libpq: whole seconds, at least 2; covers the login),
(psycopg,      ``keepalives*``, ``tcp_user_timeout``, ``options=-c statement_timeout=<ms>``
psycopg2)      (appended to the URL's own ``options``). Behind PgBouncer in transaction mode,
               which refuses startup options, pass ``statement_timeout=None``.
MySQL/MariaDB  ``connect_timeout``; ``read_timeout``/``write_timeout`` = statement timeout +
(PyMySQL,      a margin (the client gives up on a silent server); during the handshake the read
mysqlclient)   timeout is the connect timeout. Server side, once per connection: MariaDB
               ``max_statement_time``, MySQL ``max_execution_time`` (SELECTs only).
SQL Server     ``timeout`` (login timeout); the connection's query ``timeout`` = statement
(pyodbc)       timeout. TCP keepalive is the ODBC driver's (``KeepAlive``, 30 s by default).
Oracle         ``tcp_connect_timeout``, ``expire_time`` (keepalive probes, minutes); the
(oracledb)     connection's ``call_timeout`` = statement timeout.
SQLite         ``timeout`` and ``PRAGMA busy_timeout`` = statement timeout (or 60 s).
=============  ===========================================================================
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from . import defaults

log = logging.getLogger("controltable")

READ_COMMITTED = "READ COMMITTED"


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
        if statement_timeout:
            setting = f"-c statement_timeout={_ms(statement_timeout)}"
            own = url.query.get("options") if "options" in taken else None
            if isinstance(own, (tuple, list)):
                own = " ".join(own)
            if own is None or "statement_timeout" not in str(own):
                out["options"] = f"{own} {setting}" if own else setting
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
    # The URL's own settings win; ``options`` was merged with the URL's above.
    return {k: v for k, v in out.items() if k not in taken or k == "options"}


def on_connect(dialect: Any, dbapi_conn: Any, *, statement_timeout: Optional[float], url: Any) -> None:
    """Settings only an open connection takes; runs once per new DBAPI connection."""
    name = dialect.name
    driver = getattr(dialect, "driver", "")
    taken = _query_keys(url)
    if name == "mysql" and driver == "pymysql":
        client = statement_timeout + defaults.CLIENT_TIMEOUT_MARGIN if statement_timeout else None
        # PyMySQL reads its read/write timeouts from these attributes on every socket operation.
        if "read_timeout" not in taken and hasattr(dbapi_conn, "_read_timeout"):
            dbapi_conn._read_timeout = client
        if "write_timeout" not in taken and hasattr(dbapi_conn, "_write_timeout"):
            dbapi_conn._write_timeout = client
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
    elif name == "mssql" and statement_timeout and hasattr(dbapi_conn, "timeout"):
        dbapi_conn.timeout = max(1, int(math.ceil(statement_timeout)))
    elif name == "oracle" and statement_timeout and hasattr(dbapi_conn, "call_timeout"):
        dbapi_conn.call_timeout = _ms(statement_timeout)


def clamp_connect_timeout(url: Any, cparams: dict[str, Any], seconds: float) -> None:
    """Shorten the connect timeout in ``cparams`` to ``seconds`` (a caller's deadline is nearer)."""
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "postgresql" and "connect_timeout" in cparams:
        cparams["connect_timeout"] = min(int(cparams["connect_timeout"]), max(2, int(math.ceil(seconds))))
    elif backend == "mysql" and driver == "pymysql":
        for key in ("connect_timeout", "read_timeout", "write_timeout"):
            if cparams.get(key):
                cparams[key] = min(float(cparams[key]), max(seconds, 0.5))
    elif backend == "mssql" and "timeout" in cparams:
        cparams["timeout"] = min(int(cparams["timeout"]), max(1, int(math.ceil(seconds))))
    elif backend == "oracle" and "tcp_connect_timeout" in cparams:
        cparams["tcp_connect_timeout"] = min(float(cparams["tcp_connect_timeout"]), max(seconds, 0.5))
