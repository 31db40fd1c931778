"""Scenario 1: claim+complete throughput of 4 worker processes against one set-based UPDATE.

100,000 pending events, 4 workers, batch 1000, on a freshly prepared table (rows inserted, then
``prepare()``, which refreshes the statistics itself: no ANALYZE of the benchmark's own).
The anchor marks the same rows done with a single
``UPDATE ... WHERE ct_state = 0``, timed in the same run on the same table; it is measured before
and after the workers (table refilled each time) and the mean is used. On PostgreSQL the minimal
hand-written ``FOR UPDATE SKIP LOCKED`` loop (one worker) is measured too, for context.
"""

from __future__ import annotations

from .common import (
    Config,
    Report,
    Row,
    count_state,
    create_event_table,
    fill_events,
    fresh_events,
    set_based_update,
)
from .workers import WorkerPool

GOAL = 0.25


def run(cfg: Config, report: Report, pool: WorkerPool, url: str, backend: str) -> None:
    rows = cfg.scale(100_000, 30_000) if backend == "postgres" else cfg.scale(50_000, 20_000)
    workers, batch = 4, 1000
    table = "bench_s1"
    report.log(f"scenario 1 [{backend}]: {rows:,} events, {workers} workers, batch {batch}")
    create_event_table(url, table)
    fill_events(url, table, rows)
    first_s, n = set_based_update(url, table)
    assert n == rows
    # The drain meets the table as a user does: rows first, then prepare() (with its own
    # statistics refresh), no ANALYZE of ours.
    fresh_events(url, table, rows)
    result = pool.run("drain", url, table, batch, workers)
    left = count_state(url, table, 0) + count_state(url, table, 1)
    assert result["rows"] == rows and left == 0, (result, left)
    fill_events(url, table, rows)
    last_s, n = set_based_update(url, table)
    anchor_s = (first_s + last_s) / 2
    anchor = rows / anchor_s
    report.extra.setdefault("s1", {})[backend] = {
        "rows": rows, "workers": workers, "batch": batch, "controltable": result,
        "set_based_update_seconds": [first_s, last_s],
    }
    ratio = result["rate"] / anchor
    report.add(Row(
        "1 claim+complete throughput", backend, f"{workers} workers x batch {batch}", result["rate"], "rows/s",
        "set-based UPDATE", anchor, "rows/s", ratio,
        goal=f">= {GOAL}" if backend == "postgres" else None,
        met=ratio >= GOAL if backend == "postgres" else None,
        note=f"{rows:,} rows in {result['seconds']:.2f} s; anchor {first_s:.2f} s / {last_s:.2f} s",
    ))
    if backend == "postgres":
        fill_events(url, table, rows)
        loop = pool.run("skiplocked", url, table, batch, 1)
        assert loop["rows"] == rows, loop
        report.extra["s1"][backend]["skip_locked_loop"] = loop
        report.add(Row(
            "1 claim+complete throughput", backend, f"hand-written SKIP LOCKED loop, 1 worker x {batch}",
            loop["rate"], "rows/s", "set-based UPDATE", anchor, "rows/s", loop["rate"] / anchor,
            note="reference: the goal quotes about 0.1 for this loop",
        ))
