"""What a database error means, decided from SQLSTATEs and driver error codes per dialect, in one place.

Every error a driver raises is classified into a :class:`Kind` here, by code and never by the
wording of the message, so translated server messages and new driver versions do not change the
diagnosis. The one exception is an error raised while a connection is being opened by libpq
(psycopg 3 says ``connection failed: ...``): libpq does not expose the server's SQLSTATE for
those, so the standard server wording of the few cases that need a different fix (unknown role,
wrong password, missing database, too many connections, a startup parameter a connection pooler
refuses) is matched there, and anything else seen while connecting is simply "unavailable".
SQLite's "no such table" is likewise only told by its (never translated) message, since SQLite
gives every SQL error the same code.

The module is pure: it looks at exception objects and returns a kind; :mod:`controltable.db`
decides what is retried and which controltable error a caller sees.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional


class Kind(enum.Enum):
    """What went wrong, as far as retrying and the fix are concerned."""

    #: The transaction was rolled back by a deadlock, serialization failure or lock timeout (or
    #: SQLite was busy): running it again is safe and usually succeeds.
    TRANSIENT = "transient"
    #: The server could not be reached or the connection broke (restart, network, shutting down,
    #: starting up, a Galera node not yet synced). Safe to retry before COMMIT.
    UNAVAILABLE = "unavailable"
    #: The server (or the role, or the user) is at its connection limit. Nothing ran; retried
    #: like UNAVAILABLE (other processes' connections come and go), with its own fix.
    TOO_MANY_CONNECTIONS = "too many connections"
    #: The server takes no writes: a standby, a primary demoted by a failover, or a database set
    #: read-only. Nothing was written; retried like UNAVAILABLE before COMMIT (with the pool's
    #: connections dropped, a multi-host URL's next connection finds the new primary), with its own fix.
    READ_ONLY = "read only"
    #: A connection pooler in transaction mode is in the way: it refused a startup parameter
    #: (PgBouncer's "unsupported startup parameter", 08P01 at connect), or a server-side prepared
    #: statement met another session's (42P05) or was gone (26000) because consecutive
    #: transactions ran on different server connections. Not retried: only a setting fixes it.
    POOLER = "pooler"
    #: Unknown user or wrong password.
    AUTHENTICATION = "authentication"
    #: The database named in the URL does not exist.
    MISSING_DATABASE = "missing database"
    #: The user lacks a privilege on a table or schema.
    PERMISSION = "permission"
    #: A table or column is missing: control tables not installed, event table not prepared.
    NOT_INSTALLED = "not installed"
    #: A statement ran longer than the statement timeout (and was cancelled).
    TIMEOUT = "timeout"
    #: A value did not fit its column (too long, out of range, not encodable).
    BAD_VALUE = "bad value"
    #: A unique constraint was violated (usually a concurrent insert of the same row).
    CONFLICT = "conflict"
    #: The driver refused the connection settings (an unknown option in the URL's query string,
    #: a malformed value): nothing reached the server.
    CONFIGURATION = "configuration"
    #: Anything else.
    OTHER = "other"


# -- PostgreSQL (psycopg 3, psycopg2): SQLSTATE ---------------------------------------------------
_PG_EXACT = {
    "40001": Kind.TRANSIENT,  # serialization_failure
    "40P01": Kind.TRANSIENT,  # deadlock_detected
    "55P03": Kind.TRANSIENT,  # lock_not_available (lock_timeout)
    "57P01": Kind.UNAVAILABLE,  # admin_shutdown
    "57P02": Kind.UNAVAILABLE,  # crash_shutdown
    "57P03": Kind.UNAVAILABLE,  # cannot_connect_now (starting up / shutting down)
    "57P05": Kind.UNAVAILABLE,  # idle_session_timeout
    "25006": Kind.READ_ONLY,  # read_only_sql_transaction (a hot standby, default_transaction_read_only)
    "53300": Kind.TOO_MANY_CONNECTIONS,  # too_many_connections (server max_connections or the role's limit)
    # A prepared statement of "this session" already exists / is unknown: the pooler handed this
    # transaction another server connection than the one the statement was prepared on. No
    # statement controltable runs names a prepared statement itself, so only the driver's
    # automatic preparation across a transaction-mode pooler produces these.
    "42P05": Kind.POOLER,  # duplicate_prepared_statement
    "26000": Kind.POOLER,  # invalid_sql_statement_name
    "25P03": Kind.UNAVAILABLE,  # idle_in_transaction_session_timeout: the session is gone
    "28P01": Kind.AUTHENTICATION,  # invalid_password
    "28000": Kind.AUTHENTICATION,  # invalid_authorization_specification (unknown role, pg_hba)
    "3D000": Kind.MISSING_DATABASE,  # invalid_catalog_name
    "42501": Kind.PERMISSION,  # insufficient_privilege
    "42P01": Kind.NOT_INSTALLED,  # undefined_table
    "42703": Kind.NOT_INSTALLED,  # undefined_column
    "3F000": Kind.NOT_INSTALLED,  # invalid_schema_name
    "57014": Kind.TIMEOUT,  # query_canceled (statement_timeout)
    "23505": Kind.CONFLICT,  # unique_violation
}
_PG_CLASS = {
    "08": Kind.UNAVAILABLE,  # connection exception
    "22": Kind.BAD_VALUE,  # data exception
}

# Servers' wording of connection-time failures, which libpq reports without a SQLSTATE.
_PG_CONNECT_TEXT = (
    (re.compile(r'password authentication failed|role "[^"]*" does not exist|no pg_hba\.conf entry'
                r"|authentication failed", re.I), Kind.AUTHENTICATION),
    (re.compile(r'database "[^"]*" does not exist', re.I), Kind.MISSING_DATABASE),
    (re.compile(r"permission denied for database|must have (?:the )?connect privilege", re.I), Kind.PERMISSION),
    # 53300 at connect: the server's max_connections, the slots reserved for superusers, or a
    # role's / database's CONNECTION LIMIT.
    (re.compile(r"too many connections for (?:role|database)|sorry, too many clients already"
                r"|remaining connection slots are reserved", re.I), Kind.TOO_MANY_CONNECTIONS),
    # PgBouncer (and pgcat, Supavisor: same wording) refuses startup parameters it does not know,
    # such as ``options``. It sends SQLSTATE 08P01, which libpq drops at connect; 08P01 alone is
    # any protocol violation, so it names the pooler only together with "while connecting" (see
    # _PG_CONNECT_CODES), and the wording is what libpq-based drivers leave us.
    (re.compile(r"unsupported startup parameter", re.I), Kind.POOLER),
)
#: SQLSTATEs that mean something specific when they arrive while a connection is being opened
#: (drivers that keep the code at connect, e.g. asyncpg): a protocol violation at startup is a
#: pooler refusing a startup parameter; later it is a broken connection (class 08).
_PG_CONNECT_CODES = {"08P01": Kind.POOLER}

# -- MySQL / MariaDB (PyMySQL, mysqlclient): the server or client error number -------------------
_MYSQL = {
    1205: Kind.TRANSIENT,  # ER_LOCK_WAIT_TIMEOUT
    1213: Kind.TRANSIENT,  # ER_LOCK_DEADLOCK
    1040: Kind.TOO_MANY_CONNECTIONS,  # ER_CON_COUNT_ERROR (max_connections)
    1203: Kind.TOO_MANY_CONNECTIONS,  # ER_TOO_MANY_USER_CONNECTIONS (max_user_connections)
    1226: Kind.TOO_MANY_CONNECTIONS,  # ER_USER_LIMIT_REACHED (MAX_USER_CONNECTIONS of the account)
    1053: Kind.UNAVAILABLE,  # ER_SERVER_SHUTDOWN
    1290: Kind.READ_ONLY,  # ER_OPTION_PREVENTS_STATEMENT (--read-only / super_read_only: a replica)
    1792: Kind.READ_ONLY,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
    1836: Kind.READ_ONLY,  # ER_READ_ONLY_MODE
    # Galera (MariaDB Galera Cluster, Percona XtraDB Cluster). Row locks are local to a node: the
    # loser of a write conflict between nodes learns it at COMMIT, as 1213 (ER_LOCK_DEADLOCK, a
    # certification failure: the write set was not applied anywhere, so the transaction is
    # retried like any deadlock, above) or, from some versions and statements, 1180
    # (ER_ERROR_DURING_COMMIT, "Got error 149/35 ... during COMMIT": rolled back, not applied);
    # a brute-force abort of a local transaction by a replicated one is 1213 or 1205 before the
    # COMMIT. 1047 (ER_UNKNOWN_COM_ERROR) is what a node that is not synced (joining, donor,
    # non-primary component) answers every statement with: "WSREP has not yet prepared node for
    # application use"; nothing ran, and the node (or the next connection, on another node) takes
    # statements again once it has synced, so it is retried as the server being unavailable.
    1180: Kind.TRANSIENT,  # ER_ERROR_DURING_COMMIT (Galera certification failure at COMMIT)
    1047: Kind.UNAVAILABLE,  # ER_UNKNOWN_COM_ERROR (Galera: WSREP has not yet prepared node)
    1927: Kind.UNAVAILABLE,  # ER_CONNECTION_KILLED (MariaDB)
    4031: Kind.UNAVAILABLE,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: session closed while idle)
    2002: Kind.UNAVAILABLE,  # CR_CONNECTION_ERROR (socket)
    2003: Kind.UNAVAILABLE,  # CR_CONN_HOST_ERROR
    2005: Kind.UNAVAILABLE,  # CR_UNKNOWN_HOST
    2006: Kind.UNAVAILABLE,  # CR_SERVER_GONE_ERROR
    2013: Kind.UNAVAILABLE,  # CR_SERVER_LOST (also a client read timeout)
    2014: Kind.UNAVAILABLE,  # CR_COMMANDS_OUT_OF_SYNC: the connection is unusable
    2055: Kind.UNAVAILABLE,  # CR_SERVER_LOST_EXTENDED
    1045: Kind.AUTHENTICATION,  # ER_ACCESS_DENIED_ERROR (user/password)
    1698: Kind.AUTHENTICATION,  # ER_ACCESS_DENIED_NO_PASSWORD_ERROR (MariaDB unix_socket users)
    1251: Kind.AUTHENTICATION,  # ER_NOT_SUPPORTED_AUTH_MODE
    1049: Kind.MISSING_DATABASE,  # ER_BAD_DB_ERROR
    1044: Kind.PERMISSION,  # ER_DBACCESS_DENIED_ERROR
    1142: Kind.PERMISSION,  # ER_TABLEACCESS_DENIED_ERROR
    1143: Kind.PERMISSION,  # ER_COLUMNACCESS_DENIED_ERROR
    1227: Kind.PERMISSION,  # ER_SPECIFIC_ACCESS_DENIED_ERROR
    1146: Kind.NOT_INSTALLED,  # ER_NO_SUCH_TABLE
    1054: Kind.NOT_INSTALLED,  # ER_BAD_FIELD_ERROR
    1969: Kind.TIMEOUT,  # ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
    3024: Kind.TIMEOUT,  # ER_QUERY_TIMEOUT (MySQL max_execution_time)
    1062: Kind.CONFLICT,  # ER_DUP_ENTRY
    1264: Kind.BAD_VALUE,  # ER_WARN_DATA_OUT_OF_RANGE
    1265: Kind.BAD_VALUE,  # WARN_DATA_TRUNCATED
    1292: Kind.BAD_VALUE,  # ER_TRUNCATED_WRONG_VALUE
    1366: Kind.BAD_VALUE,  # ER_TRUNCATED_WRONG_VALUE_FOR_FIELD (e.g. 4-byte UTF-8 in utf8mb3)
    1406: Kind.BAD_VALUE,  # ER_DATA_TOO_LONG
    1690: Kind.BAD_VALUE,  # ER_DATA_OUT_OF_RANGE
    # Illegal mix of collations: a name compared with a column in another character set (a table
    # created in a latin1 database, not by install(), which declares utf8mb4).
    1267: Kind.BAD_VALUE,  # ER_CANT_AGGREGATE_2COLLATIONS
    1270: Kind.BAD_VALUE,  # ER_CANT_AGGREGATE_3COLLATIONS
    1271: Kind.BAD_VALUE,  # ER_CANT_AGGREGATE_NCOLLATIONS
}

# -- SQL Server (pyodbc): native error number, else the ODBC SQLSTATE ------------------------------
_MSSQL_NUMBER = {
    1205: Kind.TRANSIENT,  # chosen as deadlock victim
    1222: Kind.TRANSIENT,  # lock request time out period exceeded
    3960: Kind.TRANSIENT,  # snapshot isolation update conflict
    # (Azure SQL) a resource limit of the database's service tier: 10928 the worker or session limit
    # reached, 10929 the minimum guarantee met and the server too busy for more. The request was
    # refused before it ran, and capacity frees as other requests end: Microsoft lists both as
    # transient, to be retried after a back-off.
    10928: Kind.TRANSIENT,
    10929: Kind.TRANSIENT,
    233: Kind.UNAVAILABLE,  # no process is on the other end of the pipe
    10053: Kind.UNAVAILABLE,  # transport-level error
    10054: Kind.UNAVAILABLE,  # connection reset by peer
    10060: Kind.UNAVAILABLE,  # connection timed out
    10061: Kind.UNAVAILABLE,  # connection refused
    3906: Kind.READ_ONLY,  # the database is read-only (an availability group's secondary)
    40613: Kind.UNAVAILABLE,  # (Azure) database not currently available
    40197: Kind.UNAVAILABLE,  # (Azure) service error processing the request
    40501: Kind.UNAVAILABLE,  # (Azure) service busy
    49918: Kind.UNAVAILABLE,  # (Azure) not enough resources
    18456: Kind.AUTHENTICATION,  # login failed for user
    18452: Kind.AUTHENTICATION,  # login from an untrusted domain
    4060: Kind.MISSING_DATABASE,  # cannot open database requested by the login
    911: Kind.MISSING_DATABASE,  # database does not exist (USE)
    229: Kind.PERMISSION,  # permission denied on object
    230: Kind.PERMISSION,  # permission denied on column
    262: Kind.PERMISSION,  # permission denied in database (CREATE TABLE...)
    300: Kind.PERMISSION,  # permission was denied
    208: Kind.NOT_INSTALLED,  # invalid object name
    207: Kind.NOT_INSTALLED,  # invalid column name
    2627: Kind.CONFLICT,  # violation of a PRIMARY KEY / UNIQUE constraint
    2601: Kind.CONFLICT,  # duplicate key row in a unique index
    8115: Kind.BAD_VALUE,  # arithmetic overflow
    8152: Kind.BAD_VALUE,  # string or binary data would be truncated
    2628: Kind.BAD_VALUE,  # string or binary data would be truncated (2019+)
}
_MSSQL_STATE = {
    "40001": Kind.TRANSIENT,
    "HYT00": Kind.TIMEOUT,  # query timeout (the login timeout says 08001 / HYT00 at connect)
    "HYT01": Kind.TIMEOUT,
    "28000": Kind.AUTHENTICATION,
    "42S02": Kind.NOT_INSTALLED,
    "42S22": Kind.NOT_INSTALLED,
    "23000": Kind.CONFLICT,
}
_MSSQL_NUMBER_RE = re.compile(r"\((-?\d+)\)\s*\(SQL\w*\)")
_MSSQL_STATE_RE = re.compile(r"^[0-9A-Z]{5}$")

# -- Oracle (python-oracledb, cx_Oracle): ORA-nnnnn / DPY-nnnn --------------------------------------
_ORACLE = {
    "ORA-00060": Kind.TRANSIENT,  # deadlock detected
    "ORA-08177": Kind.TRANSIENT,  # can't serialize access
    "ORA-00054": Kind.TRANSIENT,  # resource busy (NOWAIT / DDL lock timeout)
    "ORA-30006": Kind.TRANSIENT,  # resource busy; acquire with WAIT timeout expired
    "ORA-03113": Kind.UNAVAILABLE,  # end-of-file on communication channel
    "ORA-03114": Kind.UNAVAILABLE,  # not connected to ORACLE
    "ORA-03135": Kind.UNAVAILABLE,  # connection lost contact
    "ORA-01033": Kind.UNAVAILABLE,  # initialization or shutdown in progress
    "ORA-01034": Kind.UNAVAILABLE,  # ORACLE not available
    "ORA-01089": Kind.UNAVAILABLE,  # immediate shutdown in progress
    "ORA-01090": Kind.UNAVAILABLE,  # shutdown in progress
    "ORA-00028": Kind.UNAVAILABLE,  # your session has been killed
    "ORA-12170": Kind.UNAVAILABLE,  # connect timeout occurred
    "ORA-12537": Kind.UNAVAILABLE,  # connection closed
    "ORA-12541": Kind.UNAVAILABLE,  # no listener
    "ORA-12547": Kind.UNAVAILABLE,  # lost contact
    "ORA-12520": Kind.UNAVAILABLE,  # listener could not find an available handler
    "ORA-12516": Kind.UNAVAILABLE,  # listener could not find an available handler
    "ORA-12519": Kind.UNAVAILABLE,  # no appropriate service handler found
    "ORA-16000": Kind.READ_ONLY,  # database or pluggable database open for read-only access (a standby)
    "ORA-00020": Kind.TOO_MANY_CONNECTIONS,  # maximum number of processes exceeded
    "ORA-00018": Kind.TOO_MANY_CONNECTIONS,  # maximum number of sessions exceeded
    "DPY-4011": Kind.UNAVAILABLE,  # the database or network closed the connection
    "DPY-6005": Kind.UNAVAILABLE,  # cannot connect to database
    "DPY-6000": Kind.UNAVAILABLE,  # listener refused connection
    "DPY-1001": Kind.UNAVAILABLE,  # not connected to database
    "ORA-01017": Kind.AUTHENTICATION,  # invalid username/password
    "ORA-28000": Kind.AUTHENTICATION,  # the account is locked
    "ORA-28001": Kind.AUTHENTICATION,  # the password has expired
    "ORA-01005": Kind.AUTHENTICATION,  # null password given
    "ORA-12514": Kind.MISSING_DATABASE,  # listener does not know of the service
    "ORA-12505": Kind.MISSING_DATABASE,  # listener does not know of the SID
    "DPY-6001": Kind.MISSING_DATABASE,  # service name not registered with the listener
    "ORA-01031": Kind.PERMISSION,  # insufficient privileges
    "ORA-01045": Kind.PERMISSION,  # user lacks CREATE SESSION privilege
    "ORA-01950": Kind.PERMISSION,  # no privileges on tablespace
    "ORA-01536": Kind.PERMISSION,  # space quota exceeded
    "ORA-00942": Kind.NOT_INSTALLED,  # table or view does not exist
    "ORA-00904": Kind.NOT_INSTALLED,  # invalid identifier (column)
    "ORA-01013": Kind.TIMEOUT,  # user requested cancel (call_timeout)
    "DPY-4024": Kind.TIMEOUT,  # call timeout exceeded
    "ORA-03156": Kind.TIMEOUT,  # OCI call timed out
    "ORA-00001": Kind.CONFLICT,  # unique constraint violated
    "ORA-01438": Kind.BAD_VALUE,  # value larger than specified precision
    "ORA-12899": Kind.BAD_VALUE,  # value too large for column
    "ORA-01426": Kind.BAD_VALUE,  # numeric overflow
    "ORA-01461": Kind.BAD_VALUE,  # can bind a LONG value only for insert into a LONG column
}
_ORACLE_CODE_RE = re.compile(r"\b((?:ORA|DPY|DPI)-\d{4,5})\b")

# -- SQLite (sqlite3): primary result code (extended code & 0xff) ------------------------------------
_SQLITE = {
    5: Kind.TRANSIENT,  # SQLITE_BUSY
    6: Kind.TRANSIENT,  # SQLITE_LOCKED
    3: Kind.PERMISSION,  # SQLITE_PERM
    8: Kind.PERMISSION,  # SQLITE_READONLY
    23: Kind.PERMISSION,  # SQLITE_AUTH
    14: Kind.MISSING_DATABASE,  # SQLITE_CANTOPEN (the directory is missing or not writable)
    18: Kind.BAD_VALUE,  # SQLITE_TOOBIG
    20: Kind.BAD_VALUE,  # SQLITE_MISMATCH
}
_SQLITE_CONSTRAINT_UNIQUE = (2067, 1555)  # SQLITE_CONSTRAINT_UNIQUE, SQLITE_CONSTRAINT_PRIMARYKEY
# SQLite gives every SQL error SQLITE_ERROR (1); its messages are fixed English text.
_SQLITE_MISSING = re.compile(r"^no such (?:table|column)\b|has no column named", re.I)


def driver_error(exc: BaseException) -> BaseException:
    """The driver's own exception inside a SQLAlchemy wrapper (or ``exc`` itself)."""
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, BaseException) else exc


def sqlstate(exc: BaseException) -> Optional[str]:
    """The SQLSTATE a PostgreSQL driver attached (psycopg 3 ``sqlstate``, psycopg2 ``pgcode``)."""
    orig = driver_error(exc)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code).upper() if code else None


def mysql_code(exc: BaseException) -> Optional[int]:
    """PyMySQL / mysqlclient put the error number in ``args[0]``."""
    args = getattr(driver_error(exc), "args", ())
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return args[0]
    return None


def oracle_code(exc: BaseException) -> Optional[str]:
    """python-oracledb's ``args[0].full_code`` (``ORA-00060``, ``DPY-4011``), or the code in the text."""
    orig = driver_error(exc)
    args = getattr(orig, "args", ())
    full = getattr(args[0], "full_code", None) if args else None
    if isinstance(full, str) and full:
        return full.upper()
    code = getattr(args[0], "code", None) if args else None
    if isinstance(code, int) and code > 0:  # cx_Oracle's _Error.code
        return f"ORA-{code:05d}"
    found = _ORACLE_CODE_RE.search(str(orig))
    return found.group(1).upper() if found else None


def mssql_codes(exc: BaseException) -> tuple[Optional[str], Optional[int]]:
    """pyodbc: ``args == (sqlstate, "[Microsoft]... message (number) (SQLExecDirectW)")``."""
    args: tuple[Any, ...] = tuple(getattr(driver_error(exc), "args", ()))
    state = args[0] if args and isinstance(args[0], str) and _MSSQL_STATE_RE.match(args[0]) else None
    number = None
    if len(args) > 1 and isinstance(args[1], str):
        found = _MSSQL_NUMBER_RE.search(args[1])
        if found:
            number = int(found.group(1))
    return state, number


def _is_psycopg_connect_failure(orig: BaseException) -> bool:
    return type(orig).__module__.startswith("psycopg") and str(orig).startswith("connection failed:")


def _is_a(orig: BaseException, names: tuple[str, ...]) -> bool:
    """Whether a DB-API class of that name is among ``orig``'s bases (psycopg's ConnectionTimeout
    is an OperationalError)."""
    return any(cls.__name__ in names for cls in type(orig).__mro__)


def classify_postgresql(exc: BaseException, connecting: bool = False) -> Kind:
    code = sqlstate(exc)
    if code is not None:
        if connecting and code in _PG_CONNECT_CODES:
            return _PG_CONNECT_CODES[code]
        return _PG_EXACT.get(code) or _PG_CLASS.get(code[:2], Kind.OTHER)
    orig = driver_error(exc)
    # No SQLSTATE: libpq failed to connect ("connection failed: ..." in psycopg 3) or lost the
    # connection; psycopg2 says so with an OperationalError / InterfaceError without a pgcode.
    if _is_psycopg_connect_failure(orig) or _is_a(orig, ("OperationalError", "InterfaceError")):
        text = str(orig)
        for pattern, kind in _PG_CONNECT_TEXT:
            if pattern.search(text):
                return kind
        return Kind.UNAVAILABLE
    if _is_a(orig, ("ProgrammingError",)):  # libpq refused the conninfo before connecting
        return Kind.CONFIGURATION
    return Kind.OTHER


def classify_mysql(exc: BaseException) -> Kind:
    code = mysql_code(exc)
    if code is None:
        return Kind.OTHER
    return _MYSQL.get(code, Kind.OTHER)


def classify_mssql(exc: BaseException) -> Kind:
    state, number = mssql_codes(exc)
    if number is not None and number in _MSSQL_NUMBER:
        return _MSSQL_NUMBER[number]
    if state is None:
        return Kind.OTHER
    if state in _MSSQL_STATE:
        return _MSSQL_STATE[state]
    if state.startswith("08"):
        return Kind.UNAVAILABLE
    if state.startswith("22"):
        return Kind.BAD_VALUE
    if state.startswith("28"):
        return Kind.AUTHENTICATION
    return Kind.OTHER


def classify_oracle(exc: BaseException) -> Kind:
    code = oracle_code(exc)
    return _ORACLE.get(code, Kind.OTHER) if code else Kind.OTHER


def classify_sqlite(exc: BaseException) -> Kind:
    orig = driver_error(exc)
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        if code in _SQLITE_CONSTRAINT_UNIQUE:
            return Kind.CONFLICT
        kind = _SQLITE.get(code & 0xFF)
        if kind is not None:
            return kind
    text = str(orig)
    if _SQLITE_MISSING.search(text):
        return Kind.NOT_INSTALLED
    if code is None:  # Python < 3.11 has no sqlite_errorcode: fall back to SQLite's fixed messages
        lowered = text.lower()
        if "database is locked" in lowered or "database table is locked" in lowered:
            return Kind.TRANSIENT
        if "unable to open database file" in lowered:
            return Kind.MISSING_DATABASE
        if "readonly database" in lowered:
            return Kind.PERMISSION
        if "unique constraint failed" in lowered:
            return Kind.CONFLICT
    return Kind.OTHER


def classify(exc: BaseException, dialect_name: Optional[str] = None, *, connecting: bool = False) -> Kind:
    """The :class:`Kind` of a driver error (raw, or wrapped by SQLAlchemy).

    The code table is picked by the driver the exception comes from (its module), so errors
    raised outside SQLAlchemy (a pool hook, a raw connection) are classified too; ``dialect_name``
    is the fallback for exceptions of unknown origin. ``connecting`` says the error came while a
    connection was being opened (a few codes mean something narrower then).
    """
    orig = driver_error(exc)
    if isinstance(orig, (UnicodeError, OverflowError)):  # a value the driver cannot encode or store
        return Kind.BAD_VALUE
    codes = _codes(orig, dialect_name)
    kind = codes.classify(exc, connecting) if codes is not None else Kind.OTHER
    if kind is Kind.OTHER and getattr(exc, "connection_invalidated", False):
        return Kind.UNAVAILABLE
    return kind


def _dialect_of(orig: BaseException) -> Optional[str]:
    module = type(orig).__module__
    if module.startswith(("psycopg", "pg8000", "asyncpg")):
        return "postgresql"
    if module.startswith(("pymysql", "MySQLdb", "mysql", "mariadb")):
        return "mysql"
    if module.startswith(("pyodbc", "pymssql")):
        return "mssql"
    if module.startswith(("oracledb", "cx_Oracle")):
        return "oracle"
    if module.startswith("sqlite3"):
        return "sqlite"
    return None


def is_unique_violation(exc: BaseException) -> bool:
    """Whether ``exc`` (raw, wrapped, or a controltable error caused by one) is a unique-key conflict."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if classify(current) is Kind.CONFLICT:
            return True
        current = current.__cause__
    return False


def is_driver_error(exc: BaseException, dbapi: Any = None) -> bool:
    """Whether ``exc`` is a DB-API error of ``dbapi`` (a driver module), or looks like any driver's."""
    error_cls = getattr(dbapi, "Error", None)
    if isinstance(error_cls, type) and isinstance(exc, error_cls):
        return True
    return _dialect_of(exc) is not None and type(exc).__name__.endswith("Error") and not isinstance(exc, UnicodeError)


# -- a DDL's lock not granted in time (prepare() on a busy table) ------------------------------------
_PG_LOCK_TIMEOUT = {"55P03"}  # lock_not_available (lock_timeout, NOWAIT)
_MYSQL_LOCK_TIMEOUT = {1205, 3572}  # ER_LOCK_WAIT_TIMEOUT (also metadata locks), ER_LOCK_NOWAIT
_MSSQL_LOCK_TIMEOUT = {1222}  # lock request time out period exceeded (SET LOCK_TIMEOUT)
_ORACLE_LOCK_TIMEOUT = {"ORA-00054", "ORA-04021", "ORA-30006"}  # busy (DDL_LOCK_TIMEOUT), object lock, WAIT
_SQLITE_LOCK_TIMEOUT = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)


def is_stale_prepared_plan(exc: BaseException) -> bool:
    """Whether PostgreSQL refused a server-side prepared statement whose result columns changed type
    since it was prepared (``cached plan must not change result type``, SQLSTATE 0A000: a schema
    upgrade or an ALTER of an event table meanwhile). The statement did nothing; on a connection
    that has not prepared it, it runs."""
    return sqlstate(exc) == "0A000" and "cached plan must not change result type" in str(driver_error(exc))


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether a driver error says a lock (a DDL's table lock) was not granted in time.

    Decided by code per driver, as :func:`classify` is: a lock timeout is one kind of
    :attr:`Kind.TRANSIENT` error, but ``prepare()`` must tell it from a deadlock (a deadlocked
    DDL is retried; a table busy throughout is reported with the DDL still to run).
    """
    codes = _codes(driver_error(exc))
    return codes is not None and codes.lock_timeout(exc)


def _sqlite_lock_timeout(exc: BaseException) -> bool:
    code = getattr(driver_error(exc), "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _SQLITE_LOCK_TIMEOUT
    return classify_sqlite(exc) is Kind.TRANSIENT  # Python < 3.11: SQLite's fixed wording


# -- a DDL that an earlier or concurrent run already applied (idempotent upgrade steps) --------------
_PG_ALREADY = {
    "42701",  # duplicate_column
    "42P07",  # duplicate_table (also an index name already taken)
    "42710",  # duplicate_object
    "42704",  # undefined_object: DROP INDEX of an index a concurrent run dropped
    # unique_violation: two sessions creating the same index or table at once race on the
    # catalogue's own unique index (pg_class_relname_nsp_index) instead of getting 42P07.
    "23505",
}
_MYSQL_ALREADY = {
    1050,  # ER_TABLE_EXISTS_ERROR
    1060,  # ER_DUP_FIELDNAME
    1061,  # ER_DUP_KEYNAME
    1091,  # ER_CANT_DROP_FIELD_OR_KEY: already dropped
}
_MSSQL_ALREADY = {
    2705,  # column names in each table must be unique
    1913,  # an index or statistics with that name already exists
    2714,  # there is already an object named ... in the database
    3701,  # cannot drop the index, it does not exist
}
_ORACLE_ALREADY = {
    "ORA-01430",  # column being added already exists in table
    "ORA-00955",  # name is already used by an existing object
    "ORA-01408",  # such column list already indexed
    "ORA-01418",  # specified index does not exist (already dropped)
}
# SQLite gives every SQL error SQLITE_ERROR (1); its messages are fixed English text, never
# translated, so (as for a missing table) the message is the only code it offers.
_SQLITE_ALREADY = re.compile(r"^duplicate column name\b|^(?:table|index) \S+ already exists|^no such index\b", re.I)


def is_already_applied(exc: BaseException) -> bool:
    """Whether a DDL failed because what it creates exists already (or what it drops is gone).

    Upgrade steps are idempotent: a concurrent installer that ran the same step first makes the
    loser's ``ADD COLUMN`` / ``CREATE INDEX`` / ``DROP INDEX`` fail this way, which means done.
    Only meaningful for a DDL statement (on PostgreSQL a unique violation counts: see above).
    """
    codes = _codes(driver_error(exc))
    return codes is not None and codes.already_applied(exc)


# -- the one place a dialect's codes are picked ---------------------------------------------------
@dataclass(frozen=True)
class _Codes:
    """One dialect's reading of its driver errors."""

    classify: Callable[[BaseException, bool], Kind]  # (exc, connecting)
    lock_timeout: Callable[[BaseException], bool]
    already_applied: Callable[[BaseException], bool]


_MYSQL_CODES = _Codes(lambda e, c: classify_mysql(e), lambda e: mysql_code(e) in _MYSQL_LOCK_TIMEOUT,
                      lambda e: mysql_code(e) in _MYSQL_ALREADY)
_CODES = {
    "postgresql": _Codes(classify_postgresql, lambda e: sqlstate(e) in _PG_LOCK_TIMEOUT,
                         lambda e: sqlstate(e) in _PG_ALREADY),
    "mysql": _MYSQL_CODES,
    "mariadb": _MYSQL_CODES,
    "mssql": _Codes(lambda e, c: classify_mssql(e), lambda e: mssql_codes(e)[1] in _MSSQL_LOCK_TIMEOUT,
                    lambda e: mssql_codes(e)[1] in _MSSQL_ALREADY),
    "oracle": _Codes(lambda e, c: classify_oracle(e), lambda e: oracle_code(e) in _ORACLE_LOCK_TIMEOUT,
                     lambda e: oracle_code(e) in _ORACLE_ALREADY),
    "sqlite": _Codes(lambda e, c: classify_sqlite(e), _sqlite_lock_timeout,
                     lambda e: bool(_SQLITE_ALREADY.search(str(driver_error(e)).strip()))),
}


def _codes(orig: BaseException, dialect_name: Optional[str] = None) -> Optional[_Codes]:
    """The codes of the driver ``orig`` (a driver error) comes from, else of ``dialect_name``."""
    return _CODES.get(_dialect_of(orig) or dialect_name or "")
