"""The exceptions controltable raises: one hierarchy, each message naming the problem and the fix."""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional, Sequence


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
        "controltable (it keeps no session state: no startup options, no server-side prepared statements), "
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
    """Deadlocks or lock timeouts kept rolling the transaction back, through every safe retry."""


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

    def __init__(self, message: str, keys: Sequence[object] = ()) -> None:
        super().__init__(message)
        #: For event batches: the keys that were no longer held by this batch.
        self.keys: list[object] = list(keys)


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


def is_retryable(exc: BaseException) -> bool:
    """Whether running the same work again later may succeed: the one retry policy of every surface.

    The Airflow provider (task retries) and the Dagster integration (``Failure(allow_retries=...)``)
    both ask this, so a task and an op facing the same error behave the same. Retryable: the
    database unreachable, busy or slow (it may come back), a slot not granted in time (the holders
    move on), a lost lease (a new attempt gets a new fencing token), a unique-key clash with a
    concurrent change. Not retryable: a refused login, a missing database, missing privileges or
    tables, an unknown resource and bad arguments, which only a person can fix.
    """
    if isinstance(exc, (AuthenticationError, DatabaseMissingError)):
        return False
    return isinstance(exc, (DatabaseUnavailableError, AcquireTimeout, LeaseLost, ConflictError))
