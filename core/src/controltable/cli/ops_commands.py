"""Operations commands of ``controltable``: init, sql, doctor, stats, history, demo and serve."""

from __future__ import annotations

import json
import sys
from datetime import timezone
from typing import Optional

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .. import defaults
from ..defaults import DEFAULT_SLOT_PRIORITY
from ..dialects import SUPPORTED_DIALECTS
from ..errors import EXIT_USAGE
from .group import CT, Seconds, cli, handled, sqlite_file
from .output import console, duration_text, err, fail, percent, when


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
@click.option("--dialect", type=click.Choice(list(SUPPORTED_DIALECTS)), required=True,
              help="The database to compile the DDL and statements for.")
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
    from ..sqlscript import parse_version, render

    click.echo(render(dialect, prefix=obj.prefix, schema=obj.schema, events_table=events_table, key=key,
                      order_by=order_by, server_version=parse_version(server_version)), nl=False)


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
    from ..doctor import LEVELS, exit_code
    from ..web.data import parse_event_spec

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


@cli.command()
@click.argument("resource", required=False)
@click.option("--window", default="1h", show_default=True, help="How far back: seconds or e.g. 15m, 1h, 1d.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@handled
def stats(obj: CT, resource: Optional[str], window: str, as_json: bool) -> None:
    """Waits (p50/p95/max), utilisation, grants per hour and expired leases, from the grant history."""
    from dataclasses import asdict

    from ..slots import parse_duration

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

    from ..slots import parse_duration

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
        cells += [escape(r.holder), str(r.token), r.mode]
        if show_slots:
            cells.append(str(r.slots))
        if show_priority:
            cells.append(str(r.priority))
        cells += [when(r.granted_at) if wide else r.granted_at.astimezone(timezone.utc).strftime("%H:%M:%S"),
                  duration_text(r.wait_seconds), duration_text(max(end - r.granted_at.timestamp(), 0.0)),
                  r.outcome]  # "held": still held, the hold so far
        table.add_row(*cells)
    console.print(table)


# -- demo --------------------------------------------------------------------------------------------
@cli.command()
@click.option("--workers", default=6, show_default=True, help="Worker processes.")
@click.option("--rounds", default=8, show_default=True, help="Slot requests per worker.")
@click.option("--capacity", "cap", default=2, show_default=True, help="Capacity of the demo resource.")
@click.option("--events", "n_events", default=2000, show_default=True, help="Events to drain in the batch phase.")
@click.pass_obj
def demo(obj: CT, workers: int, rounds: int, cap: int, n_events: int) -> None:
    """Workers contend for a small resource and drain an event table; the summary checks the results."""
    from ..demo import run_demo

    sys.exit(run_demo(obj.url, workers=workers, rounds=rounds, capacity=cap, n_events=n_events,
                      console=Console()))  # the demo's own output uses rich markup


# -- status page -------------------------------------------------------------------------------------
@cli.command()
@click.option("--host", default=defaults.WEB_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", default=defaults.WEB_PORT, show_default=True, type=click.IntRange(1, 65535),
              help="Port to listen on.")
@click.option("--events", "event_tables", multiple=True, metavar="[SCHEMA.]TABLE:KEY[:ORDER_BY[:TIME_COLUMN]]",
              help="An event table to show (repeatable); TIME_COLUMN gives the oldest pending age.")
@click.option("--worklist", "worklists", multiple=True, metavar="NAME", help="A work list to show (repeatable).")
@click.option("--actions", is_flag=True,
              help=f"Allow releasing holders and changing capacities; needs the token in {defaults.WEB_TOKEN_ENV}.")
@click.option("--poll", type=Seconds(defaults.MAX_POLL_SECONDS), default=defaults.WEB_POLL_INTERVAL,
              show_default=True, help="Seconds between the page's refreshes.")
@click.option("--allow-unauthenticated", is_flag=True,
              help=f"Listen beyond loopback without {defaults.WEB_TOKEN_ENV} (anyone who reaches the port reads "
                   "the page and /metrics); refused without this flag.")
@click.pass_obj
@handled
def serve(obj: CT, host: str, port: int, event_tables: tuple[str, ...], worklists: tuple[str, ...], actions: bool,
          poll: float, allow_unauthenticated: bool) -> None:
    """Serve a live status page (and /metrics, /api/status) of the control table; read-only by default.

    With CONTROLTABLE_WEB_TOKEN set, every request needs the token; without it, only loopback."""
    from ..web.serve import run

    run(obj.get(), host=host, port=port, events=event_tables, worklists=worklists, actions=actions,
        poll_interval=poll, allow_unauthenticated=allow_unauthenticated,
        announce=lambda line: console.print(line, highlight=False),
        warn=lambda line: err.print(line, style="bold red", highlight=False))
