"""``controltable demo``: worker processes contend for a small resource and drain an event table.

Runs on the embedded SQLite default. Each worker process runs a few threads that each ask for a
shared slot (10% ask for an exclusive one), so a queue forms behind the full resource and drains.
Progress shows the slots in use and the queue length live; the summary checks, from the workers'
own records, that the resource was full (peak = capacity) and never over it, that exclusive
holders ran alone, that grants followed queue order (FIFO), how long a freed slot took to reach
the next waiter (handoff), and that every event was processed exactly once.
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import random
import statistics
import threading
import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .checks import Interval, peak_usage, violations

RESOURCE = "demo-warehouse"
EVENTS = "ct_demo_events"
THREADS = 3  # requesters per worker process: enough for a queue to form behind the resource


def _slot_worker(url: str, worker: str, rounds: int, out: Any) -> None:
    from .control import ControlTable

    ct = ControlTable(url, namespace="demo")  # one per process, shared by its threads

    def requester(thread: int) -> None:
        rng = random.Random(f"{worker}.{thread}")
        for _ in range(rounds):
            mode = "exclusive" if rng.random() < 0.1 else "shared"
            asked = time.time()
            with ct.slot(RESOURCE, holder=f"{worker}.{thread}-{rng.getrandbits(32):08x}", mode=mode,
                         lease=30) as lease:
                start = time.time()
                time.sleep(rng.uniform(0.05, 0.15))
                end = time.time()
            out.put(("slot", Interval(worker, RESOURCE, mode, 1, start, end, lease.ticket, lease.token).as_dict(),
                     asked))
            time.sleep(rng.uniform(0, 0.02))

    threads = [threading.Thread(target=requester, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ct.close()


def handoffs(intervals: list[Interval], asked: list[float]) -> list[float]:
    """For each grant that had to queue: the time from the release that freed its slot to its start.

    Taken from the workers' records alone: the latest hold that ended before the grant started.
    """
    ends = sorted(iv.end for iv in intervals)
    out = []
    for iv, t in zip(intervals, asked):
        i = bisect.bisect_right(ends, iv.start)
        if i and ends[i - 1] > t:  # queued: a holder left after it asked
            out.append(iv.start - ends[i - 1])
    return out


def peak_queue(intervals: list[Interval], asked: list[float]) -> int:
    """The most requests waiting at once (asked, not yet started), from the records."""
    points = sorted([(t, 1) for t in asked] + [(iv.start, -1) for iv in intervals])
    level = peak = 0
    for _, d in points:
        level += d
        peak = max(peak, level)
    return peak


def queue_line(status: Any, capacity: int) -> str:
    """The live line about the demo resource: slots in use, the queue, and what heads it.

    "in use 1/2, waiting 16" alone looks like a slot wasted; it is FIFO at work when an exclusive
    request heads the queue (it waits for the resource to empty, and everyone behind it waits too).
    """
    waiting = sorted((w for w in status.waiters if not w.expired), key=lambda w: w.position)
    line = f"in use {status.used}/{capacity}, waiting {len(waiting):2d}"
    if waiting:
        head = "an exclusive request" if waiting[0].mode == "exclusive" else "a shared request"
        line += f", {head} heads the queue"
    return line


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
    # Short lines of whole sentences: piped into a log (80 columns) nothing wraps mid-sentence.
    console.print(f"[bold]controltable demo[/] on {ct.db.safe_url}")
    console.print(f"{workers} processes x {THREADS} threads ask {rounds} times each for a slot of {RESOURCE!r}.")
    console.print(f"Capacity {capacity}; a slot counts, and 10% of the requests ask for the resource alone.")
    console.print(f"Then the same processes drain an event table of {n_events} rows.")

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
    asked: list[float] = []
    processed: Counter[Any] = Counter()
    per_worker: Counter[str] = Counter()
    names = [f"worker-{i + 1}" for i in range(workers)]
    columns = (TextColumn("{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn(), TimeElapsedColumn())
    heads: Counter[str] = Counter()
    with Progress(*columns, console=console) as progress:
        total = workers * THREADS * rounds
        slots_task = progress.add_task("slot grants", total=total)
        queue_task = progress.add_task("queue", total=None)  # a line of its own: the bar line stays short
        procs = [ctx.Process(target=_slot_worker, args=(url, n, rounds, out)) for n in names]
        for p in procs:
            p.start()
        looked = 0.0
        while len(intervals) < total and any(p.is_alive() for p in procs) or not out.empty():
            if time.monotonic() - looked > 0.5:
                looked = time.monotonic()
                (st,) = ct.status([RESOURCE])
                line = queue_line(st, capacity)
                heads.update(["exclusive" if "exclusive request heads" in line else "shared"] if st.waiters else [])
                progress.update(queue_task, description=line)
            try:
                kind, record, when = out.get(timeout=0.2)
            except Exception:
                continue
            intervals.append(Interval(**record))
            asked.append(when)
            progress.advance(slots_task)
        for p in procs:
            p.join()
        looks = sum(heads.values())
        progress.update(queue_task, total=1, completed=1, description=f"queue: exclusive at its head in "
                        f"{heads['exclusive']} of {looks} looks" if looks else "queue drained")
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

    if heads["exclusive"]:
        console.print("An exclusive request at the head of the queue waits for the resource to empty,")
        console.print("and FIFO keeps everyone behind it waiting, so a slot may stay free meanwhile.")
    grants = Table("worker", "grants", "exclusive", "shared", "events done", title="per worker")
    for n in names:
        mine = [iv for iv in intervals if iv.worker == n]
        grants.add_row(n, str(len(mine)), str(sum(iv.mode == "exclusive" for iv in mine)),
                       str(sum(iv.mode != "exclusive" for iv in mine)), str(per_worker[n]))
    console.print(grants)

    problems = violations(intervals, {RESOURCE: capacity})
    peak, _ = peak_usage(iv for iv in intervals if iv.mode != "exclusive")
    queued = peak_queue(intervals, asked)
    handed = handoffs(intervals, asked)
    waits = [iv.start - t for iv, t in zip(intervals, asked)]
    duplicates = [k for k, c in processed.items() if c > 1]
    stats = ct.events(EVENTS, key="event_id").stats()
    checks = [
        (f"{len(intervals)} grants recorded, {total} expected", len(intervals) == total),
        (f"the resource was full: peak slots in use {peak} = capacity {capacity}", peak == capacity),
        (f"capacity {capacity} never exceeded", not any("capacity" in p for p in problems)),
        (f"a queue formed (up to {queued} waiting at once) and drained", queued > capacity and len(intervals) == total),
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
        console.print(f"Wait for a slot: median {statistics.median(waits) * 1000:.0f} ms, "
                      f"max {max(waits) * 1000:.0f} ms.")
    if handed:
        handed.sort()
        console.print(f"Handoff, from a release to the next waiter's start ({len(handed)} queued grants):")
        console.print(f"median {statistics.median(handed) * 1000:.0f} ms, "
                      f"90th percentile {handed[int(len(handed) * 0.9)] * 1000:.0f} ms.")
    for problem in problems[:10]:
        console.print(f"[red]violation:[/] {problem}")
    ok = all(passed for _, passed in checks)
    console.print("[bold green]demo passed[/]" if ok else "[bold red]demo FAILED[/]")
    ct.close()
    return 0 if ok else 7
