"""The ``controltable`` command: install, inspect and use slots, event tables and work lists from a shell.

Exit codes (stable, for shell scripts):
  0  success
  1  unexpected error
  2  bad usage or bad input (the message says what to fix)
  3  acquire timed out (AcquireTimeout)
  4  the database is unreachable or the control tables are missing
  5  nothing to do: no batch or work item available
  6  the lease was lost (or nothing was held when releasing/renewing)
  7  the demo found a violation
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional, TypeVar

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import defaults
from .control import ControlTable
from .db import DEFAULT_URL
from .defaults import DEFAULT_MODE, DEFAULT_SLOT_PRIORITY
from .errors import (  # noqa: F401 - the EXIT_* statuses are this module's public names too
    EXIT_DATABASE,
    EXIT_EMPTY,
    EXIT_ERROR,
    EXIT_LOST,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    EXIT_VIOLATION,
    AcquireTimeout,
    ConfigurationError,
    ControlTableError,
    DatabaseUnavailableError,
    LeaseLost,
    NotInstalledError,
    PermissionDeniedError,
    PoolerError,
    UnknownResourceError,
    error_outcome,
    redact,
)

# Markup off: names, holders and database messages are printed as given, never parsed as rich
# markup (a resource called "[/]" must not crash the output). Styled text opts in per call.


def _output_width() -> Optional[int]:
    """The width tables are laid out for: ``COLUMNS`` when set, else the terminal's, else 200.

    ``COLUMNS`` wins so a caller can fit the output to a log viewer or an 80-column mail; piped into a
    log or a file without it, tables keep a wide layout instead of rich's 80-column default, so holder
    ids and times are not cut to "…" where nobody can widen the terminal.
    """
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 20:
        return int(columns)
    return None if sys.stdout.isatty() else 200


console = Console(markup=False, width=_output_width())
err = Console(stderr=True, markup=False, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

#: Passwords of the URLs this process was given: masked in everything the CLI prints.
_SECRETS: set[str] = set()


def _printable(message: object) -> str:
    """``message`` with passwords masked and anything the terminal cannot encode escaped."""
    return redact(message, _SECRETS).encode("utf-8", "backslashreplace").decode("utf-8")


def print_error(message: object) -> None:
    err.print(f"[bold red]error:[/] {escape(_printable(message))}", markup=True, highlight=False)


def fail(message: str, code: int) -> NoReturn:
    print_error(message)
    sys.exit(code)


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
    if not parsed.drivername.startswith("sqlite") or not database or database == ":memory:" \
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


def when(ts: Optional[datetime]) -> str:
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def in_seconds(ts: Optional[datetime], now: float) -> str:
    if ts is None:
        return ""
    delta = ts.timestamp() - now
    return f"in {delta:.0f}s" if delta >= 0 else f"expired {-delta:.0f}s ago"


def _version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        return version("controltable")
    except PackageNotFoundError:
        return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=_version(), prog_name="controltable", message="%(prog)s %(version)s")
@click.option("--url", envvar="CONTROLTABLE_URL", default=DEFAULT_URL, show_default=True,
              help="SQLAlchemy URL of the database (env CONTROLTABLE_URL). The default SQLite file is relative "
                   "to the current directory: give cron jobs an absolute URL.")
@click.option("--namespace", envvar="CONTROLTABLE_NAMESPACE", default="default", show_default=True,
              help="Separates deployments sharing one database.")
@click.option("--schema", envvar="CONTROLTABLE_SCHEMA", default=None, help="Database schema of the control tables.")
@click.option("--prefix", default="ct_", show_default=True, help="Prefix of the control tables' names.")
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
    if listen_url:
        ctx.obj.listen_url = listen_url
        secret = _url_password(listen_url)
        if secret:
            _SECRETS.add(secret)


def main() -> None:
    cli(prog_name="controltable")


# -- installation ------------------------------------------------------------------------------------
@cli.command()
@click.pass_obj
@handled
def init(obj: CT) -> None:
    """Create the control tables (idempotent) and record the schema version; prints where the database is."""
    version = obj.get(create=True).install()
    console.print(f"control tables ready in {obj.get().db.safe_url} (schema version {version})")
    path = sqlite_file(obj.url)
    if path is not None:
        console.print(f"database file: {path}\njobs started elsewhere (cron, other directories) must use "
                      f"CONTROLTABLE_URL=sqlite:///{path}", highlight=False, soft_wrap=True)


@cli.command()
@click.option("--dialect", type=click.Choice(["postgresql", "mssql", "mysql", "oracle", "sqlite"]), required=True)
@click.option("--events-table", default="events", show_default=True, help="Event table name to show claims for.")
@click.option("--key", default="event_id", show_default=True, help="Its unique key column.")
@click.option("--order-by", default=None, help="Its claim-order column (default: the key).")
@click.option("--server-version", default=None,
              help="Server version to compile for, e.g. 16 (SQL Server 2022) or 23 (Oracle 23ai); "
                   "default: SQL Server 2019 (15), Oracle 19c, PostgreSQL 15, MySQL 8.0.")
@click.pass_obj
@handled
def sql(obj: CT, dialect: str, events_table: str, key: str, order_by: Optional[str],
        server_version: Optional[str]) -> None:
    """Print the DDL and every statement the engine runs, for a DBA to review or pre-create.

    The global --prefix and --schema apply to every statement (the control tables'), as they do
    at run time.
    """
    from .sqlscript import parse_version, render

    click.echo(render(dialect, prefix=obj.prefix, schema=obj.schema, events_table=events_table, key=key,
                      order_by=order_by, server_version=parse_version(server_version)), nl=False)


# -- capacity ----------------------------------------------------------------------------------------
@cli.group()
def capacity() -> None:
    """Create, resize, list and delete resources."""


@capacity.command("set")
@click.argument("name")
@click.argument("slots", type=int)
@click.option("--rate", default=None, metavar="COUNT/PERIOD",
              help="Also at most COUNT grants in any PERIOD, e.g. 100/60s or 10/1m; 'none' clears.")
@click.option("--aging", default=None, metavar="SECONDS",
              help="A waiter's priority rises by one per SECONDS waited (e.g. 30 or 5m); 'none' clears.")
@click.pass_obj
@handled
def capacity_set(obj: CT, name: str, slots: int, rate: Optional[str], aging: Optional[str]) -> None:
    """Set NAME's capacity to SLOTS (creates it). Shrinking never evicts holders.

    --rate and --aging left out keep what is set.
    """
    from .slots import parse_duration, parse_rate

    policy: dict[str, Any] = {}
    if rate is not None:
        policy["rate"] = None if rate.lower() == "none" else parse_rate(rate)
    if aging is not None:
        policy["aging"] = None if aging.lower() == "none" else parse_duration(aging)
    ct = obj.get()
    ct.set_capacity(name, slots, **policy)
    (st,) = ct.status([name])
    extra = "".join([f", rate {st.rate}" if st.rate else "", f", aging {st.aging:g}s" if st.aging else ""])
    console.print(f"{name}: capacity {slots}{extra}")


@capacity.command("list")
@click.pass_obj
@handled
def capacity_list(obj: CT) -> None:
    """List resources and their capacity."""
    table = Table("resource", "capacity", "rate", "aging", "in use", "waiting", title=f"namespace {obj.namespace}")
    for st in obj.get().status():
        table.add_row(st.name, str(st.capacity), str(st.rate or ""), f"{st.aging:g}s" if st.aging else "",
                      str(st.used), str(sum(1 for w in st.waiters if not w.expired)))
    console.print(table)


@capacity.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete even with live holders or waiters.")
@click.pass_obj
@handled
def capacity_delete(obj: CT, name: str, force: bool) -> None:
    """Delete resource NAME."""
    if not obj.get().delete_resource(name, force=force):
        fail(f"resource {name!r} does not exist in namespace {obj.namespace!r}", EXIT_USAGE)
    console.print(f"deleted {name}")


# -- doctor ------------------------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--events", "event_tables", multiple=True, metavar="[SCHEMA.]TABLE:KEY[:ORDER_BY]",
              help="An event table to check (repeatable): claim columns, indexes, statistics, privileges.")
@click.pass_obj
@handled
def doctor(obj: CT, as_json: bool, event_tables: tuple[str, ...]) -> None:
    """Check whether this setup keeps controltable's promises (pooler, push, replication, clock, privileges...).

    Exit 0 when all is well, 1 on a warning, 2 on an error; every finding says what to do.
    """
    from .doctor import LEVELS, exit_code
    from .web.data import parse_event_spec

    ct = obj.get()
    specs = [parse_event_spec(text) for text in event_tables]
    findings = ct.doctor(event_tables=[ct.events(s.table, key=s.key, order_by=s.order_by, table_schema=s.schema)
                                       for s in specs])
    if as_json:
        click.echo(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        styles = dict(zip(LEVELS, ("green", "cyan", "yellow", "bold red")))
        table = Table("check", "level", "finding", "fix", title=f"controltable doctor: {ct.db.safe_url}")
        for f in findings:
            table.add_row(f.check, Text(f.level, style=styles.get(f.level, "")), f.message,
                          "" if f.fix == "nothing to do" else f.fix)
        console.print(table)
    raise SystemExit(exit_code(findings))


# -- status ------------------------------------------------------------------------------------------
def _note_push(ct: ControlTable) -> None:
    """Say so when push wake-ups do not arrive (behind a pooler in transaction mode): waiters poll then."""
    push = ct.push_status()
    if push.state == "inactive":
        err.print(f"note: {push.detail}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("resources", nargs=-1)
@click.pass_obj
@handled
def status(obj: CT, as_json: bool, resources: tuple[str, ...]) -> None:
    """Show resources with their holders and waiters."""
    ct = obj.get()
    states = ct.status(list(resources) or None)
    if as_json:
        click.echo(json.dumps([_status_dict(s) for s in states], default=str, indent=2))
        return
    _note_push(ct)
    now = ct.now()
    if not states:
        console.print(f"no resources in namespace {obj.namespace!r}; "
                      "create one with `controltable capacity set NAME N`")
        return
    # Columns that say nothing are left out and long ids fold, so the table fits COLUMNS (80 included)
    # without cutting a holder id: priority only when one differs from the default, the waits-behind
    # column only with waiters, the start time only where it fits.
    entries = [e for st in states for e in (*st.holders, *st.waiters)]
    show_priority = any(e.priority != DEFAULT_SLOT_PRIORITY or e.effective_priority != e.priority for e in entries)
    show_behind = any(st.waiters for st in states)
    wide = console.width >= 120

    def behind(e: Any) -> str:
        return "" if e.state == "granted" else _behind(e.ahead, 3 if wide else 1)

    def holder(e: Any) -> str:  # narrow: who a waiter waits behind goes under its id
        return e.holder if wide or not behind(e) else f"{e.holder}\n behind: {behind(e)}"

    # (header, cell, flexible): flexible columns (names, ids) share the width left and fold; the
    # others keep their text on one line.
    columns: list[tuple[str, Callable[[Any], str], int]] = [
        ("holder", holder, 3), ("mode", lambda e: mode_name(e.mode), 0),
    ]
    if wide or any(e.slots != 1 for e in entries):
        columns.append(("slots", lambda e: str(e.slots), 0))
    if show_priority:
        columns.append(("priority", _priority, 0))
    columns.append(("token", lambda e: str(e.token or ""), 0))
    if wide:
        columns.append(("since (UTC)", lambda e: when(e.since), 0))
    columns.append(("lease", lambda e: in_seconds(e.expires_at, now), 0))
    if show_behind and wide:
        columns.append(("waits behind", behind, 2))
    table = Table(title=f"controltable status: namespace {obj.namespace}",
                  box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, show_edge=wide,
                  padding=(0, 1) if wide else (0, 1, 0, 0), expand=not wide)
    table.add_column("resource", overflow="fold", ratio=2)
    table.add_column("in use", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for header, _, ratio in columns:
        if ratio:
            table.add_column(header, overflow="fold", ratio=ratio)
        else:
            table.add_column(header, no_wrap=True)
    for st in states:
        rows = [(h, "holding") for h in st.holders] + [(w, f"waiting #{w.position}") for w in st.waiters]
        policy = "".join([f"\nrate {st.rate}" if st.rate else "", f"\naging {st.aging:g}s" if st.aging else ""])
        used = f"{st.used}/{st.capacity}"
        if not rows:
            table.add_row(st.name + policy, used, "idle", *["" for _ in columns])
        for i, (e, state) in enumerate(rows):
            table.add_row(st.name + policy if i == 0 else "", used if i == 0 else "",
                          state + ((" (expired)" if wide else "\n(expired)") if e.expired else ""),
                          *[cell(e) for _, cell, _ in columns])
    console.print(table)


def _priority(entry: Any) -> str:
    """An entry's priority, with what aging made of it when that differs."""
    text = str(entry.priority)
    if entry.effective_priority != entry.priority:
        text += f" ({entry.effective_priority:.1f})"
    return text


def percent(share: Optional[float]) -> str:
    """A share (0..1) as a percentage that keeps small values visible: 0.14 %, 3.5 %, 42 %."""
    if share is None:
        return ""
    value = share * 100
    if value == 0:
        return "0 %"
    if value < 0.01:
        return "<0.01 %"
    if value < 1:
        return f"{value:.2f} %"
    if value < 10:
        return f"{value:.1f} %"
    return f"{value:.0f} %"


#: What the CLI calls each stored mode: "counting" is the documented word for a slot that counts
#: (stored, and accepted as input, as "shared" by older releases).
MODE_NAMES = {"shared": "counting", "counting": "counting", "exclusive": "exclusive"}


def mode_name(mode: str) -> str:
    return MODE_NAMES.get(mode, mode)


def _behind(ahead: list[str], show: int = 3) -> str:
    """The first few holders and waiters ahead of a waiter ("who blocks me"), and how many more."""
    if not ahead:
        return ""
    more = f" +{len(ahead) - show} more" if len(ahead) > show else ""
    return ", ".join(ahead[:show]) + more


def _status_dict(st: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(st)


@cli.command()
@click.argument("resource", required=False)
@click.option("--window", default="1h", show_default=True, help="How far back: seconds or e.g. 15m, 1h, 1d.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@handled
def stats(obj: CT, resource: Optional[str], window: str, as_json: bool) -> None:
    """Waits (p50/p95/max), utilisation, grants per hour and expired leases, from the grant history."""
    from dataclasses import asdict

    from .slots import parse_duration

    rows = obj.get().stats([resource] if resource else None, window=parse_duration(window))
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], default=str, indent=2))
        return
    if resource and not rows:
        fail(f"resource {resource!r} does not exist in namespace {obj.namespace!r}", EXIT_USAGE)

    def secs(value: Optional[float]) -> str:
        return "" if value is None else f"{value:.2f}s"

    table = Table("resource", "capacity", "grants", "grants/h", "wait p50", "wait p95", "wait max", "utilisation",
                  "expired", title=f"controltable stats: namespace {obj.namespace}, last {window}")
    for r in rows:
        table.add_row(r.resource, str(r.capacity), str(r.grants), f"{r.grants_per_hour:.1f}", secs(r.wait_p50),
                      secs(r.wait_p95), secs(r.wait_max), percent(r.utilisation),
                      str(r.expired))
    console.print(table)


@cli.command()
@click.argument("resource", required=False)
@click.option("--since", default="1h", show_default=True, help="How far back: seconds or e.g. 15m, 1h, 1d.")
@click.option("--limit", default=100, show_default=True, type=int, help="At most this many grants (newest first).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@handled
def history(obj: CT, resource: Optional[str], since: str, limit: int, as_json: bool) -> None:
    """The grants made in the last SINCE (of RESOURCE, or all), newest first: who, token, wait, hold, outcome."""
    from dataclasses import asdict

    from .slots import parse_duration

    ct = obj.get()
    records = ct.history(resource, since=parse_duration(since), limit=limit)
    if resource and not records and not ct.status([resource]):
        fail(f"resource {resource!r} does not exist in namespace {obj.namespace!r}", EXIT_USAGE)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in records], default=str, indent=2))
        return
    if not records:
        console.print(f"no grants in the last {since} in namespace {obj.namespace!r}"
                      + (f" for {resource!r}" if resource else ""))
        return
    now = ct.now()
    wide = console.width >= 120
    show_priority = any(r.priority != DEFAULT_SLOT_PRIORITY for r in records)
    table = Table(title=f"controltable history: namespace {obj.namespace}, last {since}",
                  box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD, show_edge=wide,
                  padding=(0, 1) if wide else (0, 1, 0, 0), expand=not wide)
    # Narrow (80 columns): the date goes (the time stays), the resource goes when one was asked for,
    # and names fold rather than being cut.
    show_resource = resource is None
    show_slots = wide or any(r.slots != 1 for r in records)
    if show_resource:
        table.add_column("resource", overflow="fold", ratio=2, min_width=8)
    table.add_column("holder", overflow="fold", ratio=3, min_width=12)
    for header in ("token", "mode", *(["slots"] if show_slots else []), *(["priority"] if show_priority else []),
                   "granted (UTC)" if wide else "granted", "waited", "held", "outcome"):
        table.add_column(header, no_wrap=True)
    for r in records:
        end = r.ended_at.timestamp() if r.ended_at is not None else now
        cells = [escape(r.resource)] if show_resource else []
        cells += [escape(r.holder), str(r.token), mode_name(r.mode)]
        if show_slots:
            cells.append(str(r.slots))
        if show_priority:
            cells.append(str(r.priority))
        cells += [when(r.granted_at) if wide else r.granted_at.astimezone(timezone.utc).strftime("%H:%M:%S"),
                  duration_text(r.wait_seconds), duration_text(max(end - r.granted_at.timestamp(), 0.0)),
                  r.outcome]  # "held": still held, the hold so far
        table.add_row(*cells)
    console.print(table)


def duration_text(seconds: float) -> str:
    """A duration a reader takes in at a glance: 0.42s, 12.3s, 4m05s, 2h03m."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


@cli.command()
@click.pass_obj
@handled
def reap(obj: CT) -> None:
    """Remove expired holders and waiters now (acquire does it anyway); prints how many."""
    console.print(f"reaped {obj.get().reap()} expired entries")


# -- acquire / release / run -------------------------------------------------------------------------
@cli.command()
@click.argument("resource")
@click.option("--holder", required=True, help="Who holds the slot; release with the same holder.")
@click.option("--slots", default=1, show_default=True, type=int)
@click.option("--counting/--exclusive", "--shared", "shared", default=DEFAULT_MODE == "shared", show_default=False,
              help="Counting slot beside other holders (default; --shared is the old name), or --exclusive to "
                   "run alone.")
@click.option("--attempt", type=int, default=None, help="Attempt number (a retry gets a new token).")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: forever; 0: try once).")
@click.option("--lease", type=float, default=300.0, show_default=True, help="Lease seconds; renew with `renew`.")
@click.option("--priority", type=int, default=DEFAULT_SLOT_PRIORITY, show_default=True,
              help="Higher is granted first; equal priorities in arrival order.")
@click.pass_obj
@handled
def acquire(obj: CT, resource: str, holder: str, slots: int, shared: bool, attempt: Optional[int],
            timeout: Optional[float], lease: float, priority: int) -> None:
    """Wait for and take a slot; prints the fencing token. Exit 3 on timeout."""
    got = obj.get().acquire(resource, holder=holder, slots=slots, mode="shared" if shared else "exclusive",
                            timeout=timeout, lease=lease, attempt=attempt, priority=priority)
    click.echo(got.token)


@cli.command()
@click.argument("resource")
@click.option("--holder", required=True)
@click.pass_obj
@handled
def release(obj: CT, resource: str, holder: str) -> None:
    """Release HOLDER's slot on RESOURCE. Exit 6 if nothing was held (already expired or released)."""
    if obj.get().release(resource, holder) == 0:
        fail(f"{holder!r} held nothing on {resource!r} (lease expired or already released)", EXIT_LOST)
    console.print(f"released {resource} ({holder})")


@cli.command()
@click.argument("resource")
@click.option("--holder", required=True)
@click.option("--lease", type=float, default=None, help="New lease length (default: the original).")
@click.pass_obj
@handled
def renew(obj: CT, resource: str, holder: str, lease: Optional[float]) -> None:
    """Extend HOLDER's lease on RESOURCE. Exit 6 if the lease was lost."""
    found = obj.get().find_lease(resource, holder)
    if found is None:
        fail(f"{holder!r} holds nothing on {resource!r}", EXIT_LOST)
    found.renew(lease)
    console.print(f"renewed until {when(found.expires_at)} UTC")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--resource", "resources", multiple=True, required=True,
              help="Resource to hold (repeat for several, all-or-nothing); NAME or NAME:SLOTS.")
@click.option("--slots", default=1, show_default=True, type=int, help="Slots when one resource is named.")
@click.option("--counting/--exclusive", "--shared", "shared", default=DEFAULT_MODE == "shared", show_default=False,
              help="Counting slot beside other holders (default; --shared is the old name), or --exclusive to "
                   "run alone.")
@click.option("--attempt", type=int, default=None, help="Attempt number (a retry gets a new token).")
@click.option("--holder", default=None, help="Holder id (default: host:pid:random).")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: forever). Exit 3 on timeout.")
@click.option("--lease", type=float, default=60.0, show_default=True,
              help="Lease seconds; renewed every third of it while the command runs.")
@click.option("--priority", type=int, default=DEFAULT_SLOT_PRIORITY, show_default=True,
              help="Higher is granted first; equal priorities in arrival order.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
@handled
def run(obj: CT, resources: tuple[str, ...], slots: int, shared: bool, attempt: Optional[int],
        holder: Optional[str], timeout: Optional[float], lease: float, priority: int, command: tuple[str, ...]) -> None:
    """Hold a slot while COMMAND runs (flock(1) for the whole fleet); exits with COMMAND's code.

    The lease is renewed in the background; SIGTERM/SIGINT are passed to COMMAND and the slot is
    released when it exits. If the lease is lost while COMMAND runs, exit 6 (unless COMMAND failed).
    """
    problem = _cannot_start(command[0])
    if problem:  # before queueing: a command that cannot start must not spend a grant and a token
        fail(f"cannot run {command[0]!r}: {problem}; nothing was queued", 127)
    request: Any
    if len(resources) == 1 and ":" not in resources[0]:
        request = {resources[0]: slots}
    else:
        request = {}
        for spec in resources:
            name, _, k = spec.partition(":")
            try:
                request[name] = int(k) if k else slots
            except ValueError:
                fail(f"--resource {spec!r}: slots after ':' must be a whole number", EXIT_USAGE)
    ct = obj.get()
    lease_obj = ct.acquire(request, holder=holder, mode="shared" if shared else "exclusive", timeout=timeout,
                           lease=lease, attempt=attempt, priority=priority)
    lease_obj.start_renewing()
    env = dict(os.environ, CONTROLTABLE_TOKEN=str(lease_obj.token), CONTROLTABLE_HOLDER=lease_obj.holder)
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        lease_obj.release()
        fail(f"cannot run {command[0]!r}: {exc}", 127)

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        code = child.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        lost = lease_obj.lost
        try:
            lease_obj.release()
        except LeaseLost as exc:
            lost = lost or exc
    if lost is not None:
        print_error(lost)
        if code == 0:
            sys.exit(EXIT_LOST)
    sys.exit(code if code >= 0 else 128 - code)


def _cannot_start(program: str) -> Optional[str]:
    """Why ``program`` cannot be started (as ``subprocess.Popen`` would look it up), or None.

    A path (anything with a slash) must be an executable file; a bare name must be on ``PATH``.
    The child may still fail to start for other reasons (a bad interpreter line): ``run`` then
    releases the slot and exits 127 as before.
    """
    import shutil

    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.exists(program):
            return "no such file"
        if os.path.isdir(program):
            return "it is a directory"
        if not os.access(program, os.X_OK):
            return "not executable (chmod +x it, or run it through its interpreter)"
        return None
    return None if shutil.which(program) else "not found on PATH"


# -- demo --------------------------------------------------------------------------------------------
@cli.command()
@click.option("--workers", default=6, show_default=True, help="Worker processes.")
@click.option("--rounds", default=8, show_default=True, help="Slot requests per worker.")
@click.option("--capacity", "cap", default=2, show_default=True, help="Capacity of the demo resource.")
@click.option("--events", "n_events", default=2000, show_default=True, help="Events to drain in the batch phase.")
@click.pass_obj
def demo(obj: CT, workers: int, rounds: int, cap: int, n_events: int) -> None:
    """Workers contend for a small resource and drain an event table; the summary checks the results."""
    from .demo import run_demo

    sys.exit(run_demo(obj.url, workers=workers, rounds=rounds, capacity=cap, n_events=n_events,
                      console=Console()))  # the demo's own output uses rich markup


# -- status page -------------------------------------------------------------------------------------
@cli.command()
@click.option("--host", default=defaults.WEB_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", default=defaults.WEB_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option("--events", "event_tables", multiple=True, metavar="[SCHEMA.]TABLE:KEY[:ORDER_BY[:TIME_COLUMN]]",
              help="An event table to show (repeatable); TIME_COLUMN gives the oldest pending age.")
@click.option("--worklist", "worklists", multiple=True, metavar="NAME", help="A work list to show (repeatable).")
@click.option("--actions", is_flag=True,
              help=f"Allow releasing holders and changing capacities; needs the token in {defaults.WEB_TOKEN_ENV}.")
@click.option("--poll", type=Seconds(defaults.MAX_POLL_SECONDS), default=defaults.WEB_POLL_INTERVAL,
              show_default=True, help="Seconds between the page's refreshes.")
@click.pass_obj
@handled
def serve(obj: CT, host: str, port: int, event_tables: tuple[str, ...], worklists: tuple[str, ...], actions: bool,
          poll: float) -> None:
    """Serve a live status page (and /metrics, /api/status) of the control table; read-only by default."""
    from .web.serve import run

    run(obj.get(), host=host, port=port, events=event_tables, worklists=worklists, actions=actions,
        poll_interval=poll, announce=lambda line: console.print(line, highlight=False))


# -- events ------------------------------------------------------------------------------------------
@cli.group()
def events() -> None:
    """Prepare event tables for batch claiming and inspect them."""


def _event_options(fn: F) -> F:
    for option in reversed([
        click.argument("table"),
        click.option("--key", required=True, help="Unique key column."),
        click.option("--order-by", default=None, help="Claim order column (default: the key)."),
        click.option("--table-schema", default=None, help="Schema of the event table."),
    ]):
        fn = option(fn)
    return fn


@events.command("prepare")
@_event_options
@click.option("--dry-run", is_flag=True, help="Print the DDL without running it.")
@click.option("--filtered-indexes", is_flag=True,
              help="SQL Server: filtered claim indexes (smaller; but writers whose session has QUOTED_IDENTIFIER "
                   "or ANSI_NULLS OFF then fail on this table).")
@click.option("--disable-lock-escalation", is_flag=True,
              help="SQL Server: ALTER TABLE ... SET (LOCK_ESCALATION = DISABLE).")
@click.pass_obj
@handled
def events_prepare(obj: CT, table: str, key: str, order_by: Optional[str], table_schema: Optional[str],
                   dry_run: bool, filtered_indexes: bool, disable_lock_escalation: bool) -> None:
    """Add the claim columns and claim indexes to TABLE (only what is missing), then refresh its statistics."""
    ev = obj.get().events(table, key=key, order_by=order_by, table_schema=table_schema)
    options = {"filtered_indexes": filtered_indexes, "disable_lock_escalation": disable_lock_escalation}
    if dry_run:
        from sqlalchemy.schema import CreateIndex, DDLElement

        from .dialects import AnalyzeTable

        stmts = ev.prepare_statements(**options)
        if stmts:
            stmts.append(AnalyzeTable(ev.reflect(), histograms=(ev.cols.state,)))
        for stmt in stmts:
            ddl = stmt if isinstance(stmt, DDLElement) else CreateIndex(stmt)
            click.echo(f"{str(ddl.compile(dialect=obj.get().engine.dialect)).strip()};")
        return
    done = ev.prepare(**options)
    for line in done:
        console.print(f"ran: {line}", highlight=False)
    console.print(f"{table} is ready for claiming" + ("" if done else " (nothing to change)"))


@events.command("stats")
@_event_options
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handled
def events_stats(obj: CT, table: str, key: str, order_by: Optional[str], table_schema: Optional[str],
                 as_json: bool) -> None:
    """Counts per claim state of TABLE."""
    st = obj.get().events(table, key=key, order_by=order_by, table_schema=table_schema).stats()
    if as_json:
        click.echo(json.dumps(st.as_dict(), default=str))
        return
    t = Table("pending", "claimed", "(expired)", "done", "error", "total", "oldest pending key",
              title=f"events {st.table}")
    t.add_row(str(st.pending), str(st.claimed), str(st.expired), str(st.done), str(st.error), str(st.total),
              "" if st.oldest_pending_key is None else str(st.oldest_pending_key))
    console.print(t)


@events.command("retry-errors")
@_event_options
@click.pass_obj
@handled
def events_retry(obj: CT, table: str, key: str, order_by: Optional[str], table_schema: Optional[str]) -> None:
    """Put TABLE's error rows back to pending."""
    n = obj.get().events(table, key=key, order_by=order_by, table_schema=table_schema).retry_errors()
    console.print(f"{n} rows back to pending")


# -- work lists --------------------------------------------------------------------------------------
@cli.group()
def worklist() -> None:
    """Ordered work lists: populate, allocate, finish and administer items."""


def _read_payloads(path: str) -> list[Any]:
    """The payloads in ``path`` (``-``: stdin); a file that cannot be read or decoded is bad input
    (a ConfigurationError, exit code 2), never "a bug in controltable"."""
    try:
        if path == "-":
            raw = getattr(sys.stdin, "buffer", None)
            data = raw.read() if raw is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        else:
            with open(path, "rb") as stream:
                data = stream.read()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read {path}: {exc.strerror or exc}; give an existing, readable file of JSON (an array or "
            "JSON lines), or - for stdin"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); save it as "
            "UTF-8 JSON (e.g. iconv -f latin1 -t utf-8); nothing was added"
        ) from None
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path}: not valid JSON ({exc}); give a JSON array or JSON lines") from exc
        return list(data)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"{path} line {n}: not valid JSON ({exc}); nothing was added") from exc
    return out


@worklist.command("populate")
@click.argument("name")
@click.option("--order", default=100, show_default=True, type=int, help="Execution order of these items.")
@click.option("--priority", default=0, show_default=True, type=int, help="Higher runs first within the order.")
@click.option("--file", "path", default="-", show_default=True, help="JSON array or JSON lines; '-' is stdin.")
@click.pass_obj
@handled
def wl_populate(obj: CT, name: str, order: int, priority: int, path: str) -> None:
    """Add items to work list NAME."""
    from rich.progress import Progress

    payloads = _read_payloads(path)
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"populating {name}", total=len(payloads))
        n = obj.get().worklist(name).populate(payloads, order=order, priority=priority,
                                               progress=lambda k: progress.advance(task, k))
    console.print(f"added {n} items to {name} at order {order}")


@worklist.command("status")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handled
def wl_status(obj: CT, name: str, as_json: bool) -> None:
    """Counts per order and state; what the list waits for."""
    st = obj.get().worklist(name).status()
    if as_json:
        from dataclasses import asdict

        click.echo(json.dumps(asdict(st)))
        return
    t = Table("order", "new", "active", "done", "error", title=f"work list {name}")
    for o in st.orders:
        mark = " <- current" if o.order == st.current_order else ""
        t.add_row(f"{o.order}{mark}", str(o.new), f"{o.active}" + (f" ({o.expired} expired)" if o.expired else ""),
                  str(o.done), str(o.error))
    console.print(t)
    if st.finished:
        console.print("finished: every item is done" if st.orders else "empty")
    elif st.blocked_by_errors:
        console.print(f"[bold red]blocked[/] at order {st.current_order} by errored items: "
                      f"fix them, then `controltable worklist clear-errors {escape(name)}`", markup=True)


@worklist.command("allocate")
@click.argument("name")
@click.option("--owner", default=None)
@click.option("--lease", type=float, default=600.0, show_default=True)
@click.pass_obj
@handled
def wl_allocate(obj: CT, name: str, owner: Optional[str], lease: float) -> None:
    """Allocate the next item; prints its handle as JSON. Exit 5 when none is available."""
    item = obj.get().worklist(name).allocate(owner, lease)
    if item is None:
        sys.exit(EXIT_EMPTY)
    click.echo(json.dumps(item.handle()))


def _item_command(name: str, help_text: str, action: Callable[[Any, Optional[str]], None],
                  reason: bool = False, hidden: bool = False) -> None:
    @worklist.command(name, help=help_text, hidden=hidden)
    @click.argument("worklist_name", metavar="NAME")
    @click.argument("item_id", type=int)
    @click.option("--token", type=int, default=None, help="Token from allocate (fences the call).")
    @click.option("--reason", default=None, required=reason)
    @click.pass_obj
    @handled
    def cmd(obj: CT, worklist_name: str, item_id: int, token: Optional[int], reason: Optional[str]) -> None:
        item = obj.get().worklist(worklist_name).get(item_id, token)
        action(item, reason)
        console.print(f"item {item_id}: {name}")


_item_command("complete", "Mark item ITEM_ID of NAME done.", lambda item, _r: item.complete())
_item_command("fail", "Mark item ITEM_ID of NAME as error (blocks later orders).",
              lambda item, r: item.fail(r or ""), reason=True)
_item_command("release", "Give item ITEM_ID of NAME back, untouched.", lambda item, _r: item.release())


def _free_deprecated(item: Any, _reason: Optional[str]) -> None:
    err.print("`controltable worklist free` is deprecated; use `controltable worklist release`", highlight=False)
    item.release()


_item_command("free", "Deprecated: use `release`.", _free_deprecated, hidden=True)


@worklist.command("reset")
@click.argument("name")
@click.pass_obj
@handled
def wl_reset(obj: CT, name: str) -> None:
    """Every item of NAME back to new."""
    console.print(f"{obj.get().worklist(name).reset()} items reset")


@worklist.command("clear-errors")
@click.argument("name")
@click.option("--item", "item_id", type=int, default=None, help="Only this item.")
@click.pass_obj
@handled
def wl_clear(obj: CT, name: str, item_id: Optional[int]) -> None:
    """Errored items of NAME back to new."""
    wl = obj.get().worklist(name)
    n = wl.clear_errors() if item_id is None else wl.clear_error(item_id)
    console.print(f"{n} items back to new")


@worklist.command("drop")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask.")
@click.pass_obj
@handled
def wl_drop(obj: CT, name: str, yes: bool) -> None:
    """Delete work list NAME and all its items."""
    if not yes and sys.stdin.isatty():
        click.confirm(f"delete work list {name} and all its items?", abort=True)
    console.print(f"dropped {name} ({obj.get().worklist(name).drop()} items)")


if __name__ == "__main__":  # pragma: no cover
    main()
