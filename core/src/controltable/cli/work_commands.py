"""Event-table and work-list commands of ``controltable``: the ``events`` and ``worklist`` groups."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Optional

import click
from rich.markup import escape
from rich.table import Table

from ..defaults import DEFAULT_ITEM_LEASE
from ..errors import EXIT_EMPTY, ConfigurationError
from .group import CT, F, cli, handled
from .output import console, err


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

        from ..dialects import AnalyzeTable

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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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
@click.option("--owner", default=None,
              help="Who allocates, shown in status (default: host:pid:random); finish the item with its token.")
@click.option("--lease", type=float, default=DEFAULT_ITEM_LEASE, show_default=True,
              help="Lease seconds; an item not finished by then goes back to new for another worker.")
@click.pass_obj
@handled
def wl_allocate(obj: CT, name: str, owner: Optional[str], lease: float) -> None:
    """Allocate the next item; prints its handle as JSON. Exit 5 when none is available."""
    item = obj.get().worklist(name).allocate(owner, lease)
    if item is None:
        sys.exit(EXIT_EMPTY)
    click.echo(json.dumps(item.handle()))


def _item_command(name: str, help_text: str, action: Callable[[Any, Optional[str]], None],
                  reason: bool = False) -> None:
    # Only `fail` keeps a reason: an option the other commands would ignore is not offered.
    why = click.option("--reason", required=True, help="Why the item failed; kept with it and shown by status.")

    @worklist.command(name, help=help_text)
    @click.argument("worklist_name", metavar="NAME")
    @click.argument("item_id", type=int)
    @click.option("--token", type=int, default=None, help="Token from allocate (fences the call).")
    @(why if reason else (lambda f: f))
    @click.pass_obj
    @handled
    def cmd(obj: CT, worklist_name: str, item_id: int, token: Optional[int], reason: Optional[str] = None) -> None:
        item = obj.get().worklist(worklist_name).get(item_id, token)
        action(item, reason)
        console.print(f"item {item_id}: {name}")


_item_command("complete", "Mark item ITEM_ID of NAME done.", lambda item, _r: item.complete())
_item_command("fail", "Mark item ITEM_ID of NAME as error (blocks later orders).",
              lambda item, r: item.fail(r or ""), reason=True)
_item_command("release", "Give item ITEM_ID of NAME back, untouched.", lambda item, _r: item.release())


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
