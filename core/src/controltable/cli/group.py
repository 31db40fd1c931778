"""The ``controltable`` group: its global options, the lazily opened ``CT``, error handling and exit statuses."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import click

from .. import defaults
from ..control import ControlTable
from ..dialects import is_sqlite_url
from ..errors import EXIT_DATABASE, EXIT_ERROR, ControlTableError, error_outcome
from .output import _SECRETS, _printable, err, fail

F = TypeVar("F", bound=Callable[..., Any])


def _exit_code(exc: BaseException) -> int:
    """The exit status of a failed command: the error table's (:func:`controltable.errors.error_outcome`)."""
    return error_outcome(exc).exit_code


def _url_password(url: str) -> Optional[str]:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:  # not a URL: redact() masks URL-shaped credentials anyway
        return None


def sqlite_file(url: str) -> Optional[Path]:
    """The absolute path of an SQLite database file named by ``url``; None for other databases and memory.

    The default URL is relative (``sqlite:///controltable.db``): it names a file in the current
    directory, so the CLI prints where that is rather than leave a cron job to find out.
    """
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return None
    database = parsed.database
    if not is_sqlite_url(parsed) or not database or database == ":memory:" \
            or database.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(database).expanduser().absolute()


class CT:
    """Lazily opened ControlTable built from the global options."""

    def __init__(self, url: str, namespace: str, schema: Optional[str], prefix: str,
                 connect_timeout: float = defaults.CONNECT_TIMEOUT,
                 statement_timeout: Optional[float] = defaults.STATEMENT_TIMEOUT) -> None:
        self.url, self.namespace, self.schema, self.prefix = url, namespace, schema, prefix
        self.connect_timeout, self.statement_timeout = connect_timeout, statement_timeout
        self._ct: Optional[ControlTable] = None
        #: ``--listen-url``; None lets ControlTable read CONTROLTABLE_LISTEN_URL (PostgreSQL only).
        self.listen_url: Optional[str] = None
        password = _url_password(url)
        if password:
            _SECRETS.add(password)

    def get(self, *, create: bool = False) -> ControlTable:
        """The ControlTable; only ``create=True`` (``init``, ``demo``) may create a missing SQLite file.

        Every other command needs installed control tables, so a missing database file is refused
        with its path instead of being created empty (a read-only ``status`` left one behind, and
        a job started in the wrong directory then saw a control table of its own).
        """
        path = sqlite_file(self.url)
        if self._ct is None and not create and path is not None and not path.exists():
            fail(f"no controltable database at {path} (the SQLite file of --url/CONTROLTABLE_URL; a relative "
                 f"one is relative to the current directory {Path.cwd()}); create it with `controltable init`, "
                 "or set CONTROLTABLE_URL (or --url) to the database your jobs use, e.g. an absolute "
                 "sqlite:////path/controltable.db", EXIT_DATABASE)
        if self._ct is None:
            self._ct = ControlTable(self.url, namespace=self.namespace, schema=self.schema, prefix=self.prefix,
                                    connect_timeout=self.connect_timeout, statement_timeout=self.statement_timeout,
                                    listen_url=self.listen_url)
        return self._ct

    def close(self) -> None:
        """Close the ControlTable if a command opened one: its pool's connections and the wake-up listener.

        Called when the command's click context closes, so the connections end with the command (and
        the server sees a clean logout), not with the process or a garbage collection of the engine when
        the command runs in a longer-lived process (click's test runner, an embedding program).
        """
        if self._ct is not None:
            ct, self._ct = self._ct, None
            ct.close()


def handled(fn: F) -> F:
    """Turn controltable errors into a one-line message and a documented exit code.

    Anything else is a bug: it exits 1 with a one-line message (the traceback, passwords
    masked, with CONTROLTABLE_DEBUG=1).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ControlTableError as exc:
            fail(str(exc), _exit_code(exc))
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:
            if os.environ.get("CONTROLTABLE_DEBUG"):
                import traceback

                err.print(_printable("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
            fail(f"unexpected {type(exc).__name__}: {exc} (a bug in controltable: please report it; "
                 "CONTROLTABLE_DEBUG=1 shows the traceback)", EXIT_ERROR)

    return wrapper  # type: ignore[return-value]


class Seconds(click.ParamType):
    """A finite, non-negative number of seconds up to a bound; ``none``/``0`` where allowed mean "no limit"."""

    name = "seconds"

    def __init__(self, maximum: float, *, none_ok: bool = False) -> None:
        self.maximum, self.none_ok = maximum, none_ok

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> Any:
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0 \
                and self.none_ok:
            return None
        if self.none_ok and isinstance(value, str) and value.strip().lower() in ("none", "0", "off"):
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number <= 0 or number > self.maximum:
            self.fail(f"{value!r} must be a finite number of seconds above 0 and at most {self.maximum:g}", param,
                      ctx)
        return number


def _version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:
        return version("controltable")
    except PackageNotFoundError:
        return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=_version(), prog_name="controltable", message="%(prog)s %(version)s")
@click.option("--url", envvar="CONTROLTABLE_URL", default=defaults.DEFAULT_URL, show_default=True,
              help="SQLAlchemy URL of the database (env CONTROLTABLE_URL). The default SQLite file is relative "
                   "to the current directory: give cron jobs an absolute URL.")
@click.option("--namespace", envvar="CONTROLTABLE_NAMESPACE", default=defaults.DEFAULT_NAMESPACE, show_default=True,
              help="Separates deployments sharing one database.")
@click.option("--schema", envvar="CONTROLTABLE_SCHEMA", default=None, help="Database schema of the control tables.")
@click.option("--prefix", default=defaults.DEFAULT_PREFIX, show_default=True,
              help="Prefix of the control tables' names.")
@click.option("--connect-timeout", envvar="CONTROLTABLE_CONNECT_TIMEOUT", type=Seconds(defaults.MAX_CONNECT_TIMEOUT),
              default=defaults.CONNECT_TIMEOUT, show_default=True,
              help="Seconds to wait for a connection and login (env CONTROLTABLE_CONNECT_TIMEOUT).")
@click.option("--statement-timeout", envvar="CONTROLTABLE_STATEMENT_TIMEOUT",
              type=Seconds(defaults.MAX_STATEMENT_TIMEOUT, none_ok=True), default=defaults.STATEMENT_TIMEOUT,
              show_default=True,
              help="Seconds one statement may run, lock waits included; 0 keeps the server's setting "
                   "(env CONTROLTABLE_STATEMENT_TIMEOUT).")
@click.option("--listen-url", default=None, metavar="URL",
              help=f"Direct URL of the PostgreSQL server for push wake-ups when --url goes through a connection "
                   f"pooler in transaction mode (env {defaults.LISTEN_URL_ENV}, read on PostgreSQL only).")
@click.pass_context
def cli(ctx: click.Context, url: str, namespace: str, schema: Optional[str], prefix: str,
        connect_timeout: float, statement_timeout: Optional[float], listen_url: Optional[str] = None) -> None:
    """Resource slots, event batch claiming and ordered work lists in a control table in your database.

    Passwords in --url / CONTROLTABLE_URL are never printed (masked as ***).
    """
    ctx.obj = CT(url, namespace, schema, prefix, connect_timeout, statement_timeout)
    ctx.call_on_close(ctx.obj.close)
    if listen_url:
        ctx.obj.listen_url = listen_url
        secret = _url_password(listen_url)
        if secret:
            _SECRETS.add(secret)


def main() -> None:
    cli(prog_name="controltable")
