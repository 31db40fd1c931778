"""The exceptions controltable raises: one hierarchy, each message naming the problem and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence


class ControlTableError(Exception):
    """Base class of every error controltable raises on purpose."""


class ConfigurationError(ControlTableError, ValueError):
    """Bad input from the caller: a name, a number or a URL that cannot work as given."""


class PoolerError(ConfigurationError):
    """A connection pooler in transaction mode (PgBouncer, RDS Proxy, Supavisor, pgcat) is in the way.

    It refused a startup parameter, or session state (a prepared statement, a ``SET``) did not
    survive from one transaction to the next because the pooler gave the next transaction another
    server connection. Not retried: a setting fixes it (see :func:`pooler_message`).
    """


def pooler_message(what: str, url: str = "") -> str:
    """The message of a :class:`PoolerError`: what happened (``what``), then what to do.

    One text for every place that detects a pooler (error translation, the connection hook that
    finds a ``SET`` lost), so the advice is the same wherever it is met.
    """
    where = f" at {url}" if url else ""
    return (
        f"{what}{where}: this looks like a connection pooler in transaction mode (PgBouncer, RDS Proxy, "
        "Supavisor, pgcat) between controltable and the database; use the plain URL with an up-to-date "
        "controltable (it keeps no session state: no startup options, and server-side prepared statements only "
        "on a connection that proves it reaches the server itself; ?prepare_threshold=off in the URL turns them "
        "off), "
        "set listen_url (CONTROLTABLE_LISTEN_URL, --listen-url) to a direct connection for push wake-ups, "
        "or put controltable on a pool in session mode; `controltable doctor` checks the setup"
    )


class NotInstalledError(ControlTableError):
    """The control tables (or an event table's claim columns) are missing from the database."""


class UnknownResourceError(ControlTableError, KeyError):
    """A resource that has no capacity set in this namespace."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DatabaseUnavailableError(ControlTableError):
    """The database could not be reached (after the retries that were safe)."""


class AuthenticationError(DatabaseUnavailableError):
    """The database refused the login: unknown user or role, wrong password, locked account."""


class DatabaseMissingError(DatabaseUnavailableError):
    """The database named in the URL does not exist (or, for SQLite, its directory cannot be used)."""


class TooManyConnectionsError(DatabaseUnavailableError):
    """The database server (or the role, or the user) is at its connection limit.

    Retried like an unreachable server while the caller's time allows (other processes'
    connections come and go); ``is_retryable`` says yes.
    """


class ReadOnlyDatabaseError(DatabaseUnavailableError):
    """The server takes no writes: a standby, or a primary that a failover demoted.

    Retried like an unreachable server while the caller's time allows (with several hosts in the
    URL and ``target_session_attrs=read-write`` the next connection finds the new primary);
    ``is_retryable`` says yes.
    """


class StatementTimeoutError(DatabaseUnavailableError):
    """A statement ran longer than the statement timeout and was cancelled (nothing was committed)."""


class DatabaseBusyError(DatabaseUnavailableError):
    """Deadlocks or lock timeouts kept rolling the transaction back, through every safe retry, or every
    connection of this process's pool stayed in use while a call waited for one."""


class PermissionDeniedError(ControlTableError):
    """The database user lacks a privilege on the control tables, the event table or the schema."""


class ConflictError(ControlTableError):
    """A unique key was violated: a concurrent change made the same row first."""


class UnexpectedDatabaseError(ControlTableError):
    """The database rejected a statement for a reason controltable has no diagnosis for."""


class AcquireTimeout(ControlTableError, TimeoutError):
    """A slot was not granted within the requested timeout; the queue entry was withdrawn."""


class LeaseLost(ControlTableError):
    """A lease (slot, batch or work item) expired and was reaped or taken over by someone else.

    Whatever was done under the lost lease may have overlapped with another holder; the
    protected system should reject writes carrying the stale fencing token.
    """

    def __init__(self, message: str, keys: Sequence[object] = (), *, gone: bool = True) -> None:
        super().__init__(message)
        #: For event batches: the keys that were no longer held by this batch.
        self.keys: list[object] = list(keys)
        #: Whether the grant is gone from the database (taken over, reaped, expired). False when
        #: renewal only stopped on purpose (orphaned, ``alive()`` false): the rows are still live,
        #: so a release must still give them back rather than leave them to expire.
        self.gone = gone


class LeaseLostInterrupt(LeaseLost):
    """Raised *inside* the work when its lease was found lost or expired while the work ran.

    The background renewer raises it asynchronously in the thread that holds the lease, while
    that thread is inside the ``with`` block (``slot()``, ``Lease``, ``Batch.renewing()``,
    ``Item.renewing()``), so work stops instead of overlapping the next holder. It is a
    :class:`LeaseLost`: code that already handles a lost lease handles it. Turn it off with
    ``interrupt=False`` (or :data:`~controltable.defaults.INTERRUPT_ON_LEASE_LOSS`); the fencing
    token stays the defence for writes already in flight.
    """

    def __init__(self, message: str = "", keys: Sequence[object] = ()) -> None:
        super().__init__(message or (
            "the lease this work held was lost or expired while the work ran, so the work was interrupted "
            "(another holder may have it now); retry the work, or pass interrupt=False to let it run on"
        ), keys)


def describe_keys(keys: Iterable[object], limit: int = 10) -> str:
    """Render a few keys for an error message without flooding the log."""
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{shown}{more}"


# -- never print a password -------------------------------------------------------------------
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s:/@'\"]*):[^\s'\"]*@")
_BARE_CREDENTIALS = re.compile(r"(?P<user>[^\s:/@'\"=]+):(?!//)[^\s@'\"]+@(?=[^\s@'\"]*$|[^\s@'\"]*[\s'\"])")
_PASSWORD_PARAM = re.compile(
    r"(?i)(?:(?<![A-Za-z0-9])|(?<=%3B)|(?<=%26)|(?<=%20))(?P<key>password|passwd|pwd)"
    r"(?P<sep>\s*(?:[=:]|%3D)\s*)(?P<q>['\"]?)[^\s&;'\",)]*"
)
MASK = "***"


def redact(text: object, secrets: Iterable[Optional[str]] = ()) -> str:
    """``text`` with every password it may contain masked: the one helper every message goes through.

    Masks the password part of anything shaped like a URL (``scheme://user:pw@host``, also
    without a scheme), ``password=...`` in query strings and ODBC/libpq connection strings, and
    every occurrence of the known ``secrets`` (the password of the URL in use).
    """
    out = str(text)
    for secret in secrets:
        if secret and len(secret) >= 3:
            out = out.replace(secret, MASK)
    out = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{MASK}@", out)
    out = _BARE_CREDENTIALS.sub(lambda m: f"{m.group('user')}:{MASK}@", out)
    out = _PASSWORD_PARAM.sub(lambda m: f"{m.group('key')}{m.group('sep')}{m.group('q')}{MASK}", out)
    return out


def safe_url(url: Any) -> str:
    """A URL (SQLAlchemy ``URL`` or text) for messages and logs, its password masked."""
    render = getattr(url, "render_as_string", None)
    if render is not None:
        return redact(render(hide_password=True), [getattr(url, "password", None)])
    return redact(url)


# -- the one error table -------------------------------------------------------------------------
#: The CLI's exit statuses (``controltable ...; echo $?``); :attr:`ErrorOutcome.exit_code` is one of them.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_TIMEOUT, EXIT_DATABASE, EXIT_EMPTY, EXIT_LOST, EXIT_VIOLATION = range(8)

#: The families of :attr:`ErrorOutcome.family`: what an orchestrator makes of an error.
FAMILIES = ("lease_lost", "timeout", "unavailable", "conflict", "connection", "configuration", "failure")


@dataclass(frozen=True)
class ErrorOutcome:
    """What an error means for whoever called controltable, on every surface alike.

    The CLI exits with :attr:`exit_code`, the Airflow provider picks its exception by
    :attr:`family` and retries the task when :attr:`retryable`, the Dagster integration sets
    ``Failure(allow_retries=retryable)`` and writes :attr:`kind` and :attr:`fix` into its
    description. One table (:data:`ERROR_TABLE`), so a task, an op and a shell script facing the
    same error behave the same.
    """

    #: A few words naming the problem ("slot not granted in time").
    kind: str
    #: One of :data:`FAMILIES`.
    family: str
    #: Running the same work again later may succeed.
    retryable: bool
    #: The CLI's exit status.
    exit_code: int
    #: What to do, in one line; the error's own message names the specifics.
    fix: str


#: (error class, extra test or None, outcome), most specific first; :func:`error_outcome` takes the
#: first row that matches. Retryable: the database unreachable, busy or slow (it may come back), a
#: slot not granted in time (the holders move on), a lost lease (a new attempt gets a new fencing
#: token), a unique-key clash with a concurrent change. Not retryable: a refused login, a missing
#: database, missing privileges or tables, an unknown resource and bad arguments, which only a
#: person can fix.
ERROR_TABLE: tuple[tuple[type[BaseException], Optional[Callable[[BaseException], bool]], ErrorOutcome], ...] = (
    (AuthenticationError, None, ErrorOutcome(
        "control-table login failed (authentication)", "connection", False, EXIT_DATABASE,
        "check the user and password in the control table's URL (e.g. the CONTROLTABLE_URL variable); the "
        "database refused the login, so retrying cannot help")),
    (DatabaseMissingError, None, ErrorOutcome(
        "control-table database missing", "connection", False, EXIT_DATABASE,
        "create the database (or fix its name in the URL), then create the control tables once with "
        "`controltable init --url ...`")),
    (StatementTimeoutError, None, ErrorOutcome(
        "control-table statement timed out", "unavailable", True, EXIT_DATABASE,
        "a statement ran past the statement timeout: look for long locks on the control tables, or raise "
        "`statement_timeout`")),
    (DatabaseBusyError, None, ErrorOutcome(
        "control-table database busy", "unavailable", True, EXIT_DATABASE,
        "the database kept rolling back on locks, or this process's connection pool stayed full; the work "
        "may be retried")),
    (DatabaseUnavailableError, None, ErrorOutcome(
        "control-table database unreachable", "unavailable", True, EXIT_DATABASE,
        "check the URL (e.g. the CONTROLTABLE_URL variable) and that the database server is running and "
        "reachable from this process; `connect_timeout` bounds the wait")),
    (PermissionDeniedError, None, ErrorOutcome(
        "permission denied on the control tables", "failure", False, EXIT_DATABASE,
        "grant the database user the privileges named above on the control tables (or event table)")),
    (PoolerError, None, ErrorOutcome(
        "connection pooler in the way", "configuration", False, EXIT_DATABASE,
        "use the plain URL through the pooler, set listen_url to a direct connection, or use a session-mode "
        "pool; `controltable doctor` checks the setup")),
    (NotInstalledError, lambda exc: "event table" in str(exc), ErrorOutcome(
        "event table not prepared", "configuration", False, EXIT_DATABASE,
        "add the claim columns once with `controltable events prepare TABLE --key KEY` (or "
        "ControlTable.events(TABLE, key=KEY).prepare())")),
    (NotInstalledError, None, ErrorOutcome(
        "control tables not installed", "configuration", False, EXIT_DATABASE,
        "create the control tables once with `controltable init --url ...` (or install())")),
    (UnknownResourceError, None, ErrorOutcome(
        "unknown controltable resource", "configuration", False, EXIT_USAGE,
        "create the resource once with set_capacity(name, n) or `controltable capacity set NAME N`, and check "
        "the namespace")),
    (AcquireTimeout, None, ErrorOutcome(
        "slot not granted in time", "timeout", True, EXIT_TIMEOUT,
        "raise the timeout or the capacity, or see `controltable status` for who holds the slot")),
    (LeaseLostInterrupt, None, ErrorOutcome(
        "lease lost, work interrupted", "lease_lost", True, EXIT_LOST,
        "the slot, batch or work item was lost or expired while the work ran, so it was stopped before it "
        "could overlap the next holder; it may be retried (with a new fencing token). Ask for a longer lease "
        "if renewals are slow, or turn the interruption off (interrupt=False, interrupt_on_lease_loss=False) "
        "to let work run on")),
    (LeaseLost, None, ErrorOutcome(
        "lease lost", "lease_lost", True, EXIT_LOST,
        "the lease expired before it was renewed or completed; ask for a longer lease, and make the protected "
        "system reject stale fencing tokens")),
    (ConflictError, None, ErrorOutcome(
        "concurrent change", "conflict", True, EXIT_ERROR,
        "a concurrent change made the same row first; the work may be retried")),
    (ConfigurationError, None, ErrorOutcome(
        "controltable configuration error", "configuration", False, EXIT_USAGE,
        "fix the argument or configuration named above")),
    (ControlTableError, None, ErrorOutcome(
        "controltable error", "failure", False, EXIT_ERROR, "see the message above")),
)


def error_outcome(exc: BaseException) -> ErrorOutcome:
    """The row of :data:`ERROR_TABLE` for ``exc`` (any exception: a foreign one is a plain failure)."""
    for cls, test, outcome in ERROR_TABLE:
        if isinstance(exc, cls) and (test is None or test(exc)):
            return outcome
    return ErrorOutcome(type(exc).__name__, "failure", False, EXIT_ERROR, "see the chained exception")


def is_retryable(exc: BaseException) -> bool:
    """Whether running the same work again later may succeed: the one retry policy of every surface
    (:attr:`ErrorOutcome.retryable` of :func:`error_outcome`)."""
    return error_outcome(exc).retryable
