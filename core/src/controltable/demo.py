"""``controltable demo``: worker processes contend for a small resource and drain an event table.

Runs on the embedded SQLite default, shows progress, and ends with a summary that checks,
from the workers' own records, that capacity and exclusivity were never violated, grants
followed FIFO order, and every event was processed exactly once.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .checks import Interval, peak_usage, violations

RESOURCE = "demo-warehouse"
EVENTS = "ct_demo_events"


def _slot_worker(url: str, worker: str, rounds: int, out: Any) -> None:
    from .control import ControlTable

    ct = ControlTable(url, namespace="demo")
    rng = random.Random(worker)
    for _ in range(rounds):
        mode = "exclusive" if rng.random() < 0.3 else "shared"
        asked = time.time()
        with ct.slot(RESOURCE, holder=f"{worker}-{rng.getrandbits(32):08x}", mode=mode, lease=30) as lease:
            start = time.time()
            time.sleep(rng.uniform(0.02, 0.12))
            end = time.time()
            out.put(("slot", Interval(worker, RESOURCE, mode, 1, start, end, lease.ticket, lease.token).as_dict(),
                     start - asked))
        time.sleep(rng.uniform(0, 0.05))
    ct.close()


def _event_worker(url: str, worker: str, out: Any) -> None:
    from .control import ControlTable

    ct = ControlTable(url, namespace="demo")
    ev = ct.events(EVENTS, key="event_id")
    while True:
        batch = ev.claim(50, owner=worker, lease=60)
        if batch is None:
            break
        time.sleep(0.005 * len(batch) / 10)
        batch.complete()
        out.put(("events", worker, batch.keys))
    ct.close()


def run_demo(url: str, *, workers: int, rounds: int, capacity: int, n_events: int, console: Console) -> int:
    from sqlalchemy import Column, Integer, MetaData, String
    from sqlalchemy import Table as SATable

    from .control import ControlTable

    ct = ControlTable(url, namespace="demo")
    ct.install()
    ct.set_capacity(RESOURCE, capacity)
    console.print(f"[bold]controltable demo[/] on {ct.db.safe_url}: {workers} processes, resource "
                  f"{RESOURCE!r} with capacity {capacity} (30% exclusive requests), then {n_events} events")

    md = MetaData()
    table = SATable(EVENTS, md, Column("event_id", Integer, primary_key=True), Column("payload", String(50)))
    md.drop_all(ct.engine)
    md.create_all(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(table.insert(), [{"event_id": i, "payload": f"reading {i}"} for i in range(1, n_events + 1)])
    ct.events(EVENTS, key="event_id").prepare()

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    intervals: list[Interval] = []
    waits: list[float] = []
    processed: Counter[Any] = Counter()
    per_worker: Counter[str] = Counter()
    names = [f"worker-{i + 1}" for i in range(workers)]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        slots_task = progress.add_task("slot grants", total=workers * rounds)
        procs = [ctx.Process(target=_slot_worker, args=(url, n, rounds, out)) for n in names]
        for p in procs:
            p.start()
        while len(intervals) < workers * rounds and any(p.is_alive() for p in procs) or not out.empty():
            try:
                kind, record, waited = out.get(timeout=0.5)
            except Exception:
                continue
            intervals.append(Interval(**record))
            waits.append(waited)
            progress.advance(slots_task)
        for p in procs:
            p.join()
        ev_task = progress.add_task("events processed", total=n_events)
        procs = [ctx.Process(target=_event_worker, args=(url, n, out)) for n in names]
        for p in procs:
            p.start()
        while any(p.is_alive() for p in procs) or not out.empty():
            try:
                kind, worker, keys = out.get(timeout=0.5)
            except Exception:
                continue
            processed.update(keys)
            per_worker[worker] += len(keys)
            progress.advance(ev_task, len(keys))
        for p in procs:
            p.join()

    grants = Table("worker", "grants", "exclusive", "shared", "events done", title="per worker")
    for n in names:
        mine = [iv for iv in intervals if iv.worker == n]
        grants.add_row(n, str(len(mine)), str(sum(iv.mode == "exclusive" for iv in mine)),
                       str(sum(iv.mode == "shared" for iv in mine)), str(per_worker[n]))
    console.print(grants)

    problems = violations(intervals, {RESOURCE: capacity})
    peak, _ = peak_usage(iv for iv in intervals if iv.mode == "shared")
    duplicates = [k for k, c in processed.items() if c > 1]
    stats = ct.events(EVENTS, key="event_id").stats()
    checks = [
        (f"{len(intervals)} grants recorded, {workers * rounds} expected", len(intervals) == workers * rounds),
        (f"capacity {capacity} never exceeded (peak shared slots in use: {peak})",
         not any("capacity" in p for p in problems)),
        ("exclusive holders always ran alone", not any("exclusive" in p for p in problems)),
        ("grants followed FIFO order (tokens increase with queue tickets)", not any("FIFO" in p for p in problems)),
        (f"{len(processed)} of {n_events} events processed, none twice ({len(duplicates)} duplicates)",
         len(processed) == n_events and not duplicates),
        (f"event table: {stats.done} done, {stats.pending} pending, {stats.claimed} claimed",
         stats.done == n_events and stats.pending == 0 and stats.claimed == 0),
    ]
    summary = Table("check", "result", title="summary")
    for text, ok in checks:
        summary.add_row(text, "[green]PASS[/]" if ok else "[red]FAIL[/]")
    console.print(summary)
    if waits:
        console.print(f"wait for a slot: median {statistics.median(waits) * 1000:.0f} ms, "
                      f"max {max(waits) * 1000:.0f} ms")
    for problem in problems[:10]:
        console.print(f"[red]violation:[/] {problem}")
    ok = all(passed for _, passed in checks)
    console.print("[bold green]demo passed[/]" if ok else "[bold red]demo FAILED[/]")
    ct.close()
    return 0 if ok else 7
