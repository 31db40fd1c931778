"""Scenario 7: scaling. Claim+complete throughput with 1, 2, 4 and 8 worker processes and batch sizes
1, 10, 100 and 1000 (the plot). Each cell starts from a freshly filled table and runs until the
table is drained or the cell's time is up. The anchor is the set-based UPDATE rate on the same
table, measured at the start and the end of the sweep.
"""

from __future__ import annotations

from typing import Any

from .common import Config, Report, Row, create_event_table, fill_events, set_based_update
from .workers import WorkerPool

WORKERS = (1, 2, 4, 8)
BATCHES = (1, 10, 100, 1000)


def run(cfg: Config, report: Report, pool: WorkerPool, url: str) -> None:
    rows = cfg.scale(100_000, 30_000)
    duration = cfg.scale_f(3.0, 1.5)
    table = "bench_s7"
    report.log(f"scenario 7 [postgres]: workers {WORKERS} x batch {BATCHES}, {rows:,} rows, <= {duration:g} s a cell")
    create_event_table(url, table)
    anchors = []
    fill_events(url, table, rows)
    anchors.append(set_based_update(url, table)[0])
    cells: list[dict[str, Any]] = []
    for batch in BATCHES:
        for workers in WORKERS:
            fill_events(url, table, rows)
            result = pool.run("drain", url, table, batch, workers, duration=duration)
            cells.append({"workers": workers, "batch": batch, **result})
            report.log(f"  {workers} workers x batch {batch:>4}: {result['rate']:>9,.0f} rows/s")
    fill_events(url, table, rows)
    anchors.append(set_based_update(url, table)[0])
    anchor = rows / (sum(anchors) / len(anchors))
    for cell in cells:
        cell["ratio"] = cell["rate"] / anchor
    report.extra["s7"] = {"rows": rows, "cell_seconds": duration, "anchor_rows_per_s": anchor,
                          "anchor_seconds": anchors, "cells": cells}
    for cell in cells:
        if cell["batch"] == 1000 or (cell["batch"] == 1 and cell["workers"] in (1, 8)):
            report.add(Row("7 scaling", "postgres", f"{cell['workers']} workers x batch {cell['batch']}",
                           cell["rate"], "rows/s", "set-based UPDATE", anchor, "rows/s", cell["ratio"]))
