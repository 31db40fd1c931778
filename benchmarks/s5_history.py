"""Scenario 5: claim latency against table history. The same small claims on a table with 1,000,000
done rows and on one with 10,000 done rows (both with the same pending rows after the history),
alternating claim by claim. Built set-based: ``INSERT ... SELECT generate_series`` with
``ct_state = 2`` for the done rows, then ``VACUUM ANALYZE``. The figure is the big table's p50 and
the anchor the small table's p50 (claim+complete of a batch of 10, and claim alone).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from controltable import ControlTable

from .common import Config, Report, Row, create_event_table, fill_events, in_conn, percentile

GOAL = 1.5
BATCH = 10


def _explain(url: str, ct: ControlTable, table: str) -> list[str]:
    events = ct.events(table, key="event_id")
    now: Any = time.time()
    stmt = events.sql.claim_select(BATCH, events.sql.due_pending(now))
    sql = str(stmt.compile(dialect=ct.engine.dialect, compile_kwargs={"literal_binds": True}))
    return in_conn(url, lambda c: [r[0] for r in c.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"))])


def run(cfg: Config, report: Report, url: str) -> None:
    big_done, small_done = cfg.scale(1_000_000, 1_000_000), 10_000
    pending, samples = 10_000, cfg.scale(300, 100)
    report.log(f"scenario 5 [postgres]: building {big_done:,} and {small_done:,} done rows (+{pending:,} pending)")
    for name, done in (("bench_s5_big", big_done), ("bench_s5_small", small_done)):
        create_event_table(url, name)
        fill_events(url, name, pending, done=done)
    ct = ControlTable(url)
    tables = {name: ct.events(name, key="event_id") for name in ("bench_s5_big", "bench_s5_small")}
    claim: dict[str, list[float]] = {name: [] for name in tables}
    total: dict[str, list[float]] = {name: [] for name in tables}
    report.log(f"  timing {samples} claims of {BATCH} on each, alternating")
    for i in range(samples + 20):
        for name, events in tables.items():
            t0 = time.perf_counter()
            batch = events.claim(size=BATCH, owner="s5")
            t1 = time.perf_counter()
            assert batch is not None and len(batch) == BATCH
            batch.complete()
            t2 = time.perf_counter()
            if i >= 20:
                claim[name].append(t1 - t0)
                total[name].append(t2 - t0)
    plan = _explain(url, ct, "bench_s5_big")  # the due-pending half of a claim, as the core runs it
    ct.close()
    stats: dict[str, Any] = {}
    for name in tables:
        stats[name] = {"claim_p50_ms": percentile(claim[name], 50) * 1e3,
                       "claim_p99_ms": percentile(claim[name], 99) * 1e3,
                       "claim_complete_p50_ms": percentile(total[name], 50) * 1e3,
                       "claim_complete_p99_ms": percentile(total[name], 99) * 1e3}
    report.extra["s5"] = {"big_done": big_done, "small_done": small_done, "pending": pending, "batch": BATCH,
                          "samples": samples, "stats": stats, "explain_big": plan}
    big, small = stats["bench_s5_big"], stats["bench_s5_small"]
    label = f"{big_done // 1000:,}k done rows"
    anchor = f"{small_done // 1000}k done rows"
    r = big["claim_complete_p50_ms"] / small["claim_complete_p50_ms"]
    report.add(Row("5 claim vs history", "postgres", f"claim+complete({BATCH}) p50, {label}",
                   big["claim_complete_p50_ms"], "ms", anchor, small["claim_complete_p50_ms"], "ms", r,
                   goal="<= 1.5", met=r <= GOAL))
    report.add(Row("5 claim vs history", "postgres", f"claim({BATCH}) p50, {label}", big["claim_p50_ms"], "ms",
                   anchor, small["claim_p50_ms"], "ms", big["claim_p50_ms"] / small["claim_p50_ms"]))
    report.add(Row("5 claim vs history", "postgres", f"claim+complete({BATCH}) p99, {label}",
                   big["claim_complete_p99_ms"], "ms", anchor, small["claim_complete_p99_ms"], "ms",
                   big["claim_complete_p99_ms"] / small["claim_complete_p99_ms"]))
