"""Scenario 2: against a peer. pgqueuer draining 20,000 no-op jobs (batch 100, one worker) versus
controltable draining 20,000 events (batch 100, one worker), alternating, median of the repeats.

pgqueuer runs in its own spawned process on an asyncpg connection, in drain mode; its timer covers
``QueueManager.run`` (start-up checks, dequeue, completion log flush). controltable's timer covers
the claim+complete loop of one pool worker. Enqueueing/filling is outside both timers.
"""

from __future__ import annotations

from typing import Any

from .common import Config, Report, Row, asyncpg_dsn, create_event_table, fill_events, median
from .workers import SPAWN, WorkerPool, pgqueuer_drain

GOAL = 2.0


def _pgqueuer(url: str, jobs: int, batch: int) -> dict[str, Any]:
    results: Any = SPAWN.Queue()
    proc = SPAWN.Process(target=pgqueuer_drain, args=(asyncpg_dsn(url), jobs, batch, results))
    proc.start()
    out: dict[str, Any] = results.get(timeout=600)
    proc.join(timeout=30)
    if "error" in out:
        raise RuntimeError(f"pgqueuer run failed: {out['error']}")
    if out["rows"] != jobs or out["left_in_queue"]:
        raise RuntimeError(f"pgqueuer did not drain the queue: {out}")
    return out


def run(cfg: Config, report: Report, pool: WorkerPool, url: str) -> None:
    jobs, batch, repeats = 20_000, 100, cfg.scale(5, 1)
    table = "bench_s2"
    report.log(f"scenario 2 [postgres]: pgqueuer vs controltable, {jobs:,} jobs, batch {batch}, 1 worker, "
               f"{repeats} repeat(s)")
    create_event_table(url, table)
    pgq: list[dict[str, Any]] = []
    ct: list[dict[str, Any]] = []
    for i in range(repeats):
        pgq.append(_pgqueuer(url, jobs, batch))
        report.log(f"  run {i + 1}: pgqueuer {pgq[-1]['rate']:,.0f} jobs/s")
        fill_events(url, table, jobs)
        ct.append(pool.run("drain", url, table, batch, 1))
        assert ct[-1]["rows"] == jobs, ct[-1]
        report.log(f"  run {i + 1}: controltable {ct[-1]['rate']:,.0f} events/s")
    ct_rate = median([r["rate"] for r in ct])
    pgq_rate = median([r["rate"] for r in pgq])
    report.extra["s2"] = {"jobs": jobs, "batch": batch, "pgqueuer": pgq, "controltable": ct}
    ratio = ct_rate / pgq_rate
    report.add(Row(
        "2 against pgqueuer", "postgres", f"controltable drain, 1 worker x batch {batch}", ct_rate, "events/s",
        "pgqueuer drain, same", pgq_rate, "jobs/s", ratio, goal=f">= {GOAL}", met=ratio >= GOAL,
        note=f"median of {repeats}; pgqueuer {_version()}",
    ))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pgqueuer")
    except Exception:
        return "?"
