"""Airflow benchmark: the recommended slot pattern against a plain Airflow pool, in one real deployment.

``.venv/bin/python -m benchmarks.airflow_live [--short-runs 100] [--long-runs 20]``
``.venv/bin/python -m benchmarks.airflow_live --queues 2,3 --capacity 1`` (short queues: issue 35 item 8)

Starts scheduler, triggerer, dag-processor and api-server (LocalExecutor, a throwaway PostgreSQL
metadata database; the harness of ``tests/airflow/live_airflow.py``), then for 1 s loads and for
30 s loads (or, with ``--queues``, for each queue length given, with 1 s loads) triggers N runs on
a capacity-2 (``--capacity``) resource twice: with ``@task.controltable_slot`` as users get it
(``controltable``: a slot expected soon waited for on the worker, else deferred; hold while
working) and with a plain Airflow pool of 2 slots; ``--patterns controltable,deferred,pool`` adds
``deferred``, every wait deferred (``worker_wait=0``, the behaviour before the wait on the worker).
Same deployment, same DAG file, same load code, one after the other. Prints per pattern:

* wall time (first trigger -> last load end) and the ratio controltable / pool;
* load end -> next load start p50 (what a user sees between loads);
* release -> next grant p50 for grants that waited (controltable only: the slot engine and push);
* slot idle time per grant: held but not working. controltable: grant -> load start (the resume
  on a worker); pool: queued -> load start (a pool slot counts from the moment the task is queued);
* how many tasks the scheduler failed as "finished but queued" (the deferral race the triggers
  wait out), and the deferral -> exit-report delays it measured.

The deployment runs with Airflow's default ``[workers] min_heartbeat_interval`` (5 s) unless
``--min-heartbeat-interval`` says otherwise (the live tests use 10 s to widen the kill window), and
with Airflow's default scheduler and triggerer heartbeats (5 s) unless ``--fast-scheduler`` (the
live tests' 1 s loops). It also says where the time to trigger the runs goes: the API calls
(p50, max) and the first trigger -> first load start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "airflow"))
sys.path.insert(0, str(ROOT / "tests"))  # live_airflow imports the shared test helpers (support.live)

from live_airflow import SCHEDULER_DEFAULTS, LiveAirflow, live_intervals, state_mismatches  # noqa: E402

from controltable import ControlTable  # noqa: E402

DAGS = ROOT / "tests" / "airflow" / "dags" / "ct_live_dags.py"
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
CAPACITY = 2


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _intervals(ct: ControlTable, run_ids: list[str]) -> list[dict[str, Any]]:
    table = live_intervals(ct.namespace)  # the table the DAGs write
    with ct.engine.connect() as conn:
        rows = conn.execute(select(table).where(table.c.run_id.in_(run_ids)).order_by(table.c.started))
        return [dict(r._mapping) for r in rows]


def measure(
    airflow: LiveAirflow, ct: ControlTable, pattern: str, runs: int, seconds: float, capacity: int = CAPACITY,
) -> dict[str, Any]:
    dag_id = {"controltable": "ct_live_slot", "deferred": "ct_live_slot_deferred", "pool": "ct_live_pool"}[pattern]
    resource = f"bench_{uuid.uuid4().hex[:6]}"
    ct.set_capacity(resource, capacity)
    t0 = time.time()
    run_ids: list[str] = []
    trigger_calls: list[float] = []
    for _ in range(runs):
        call = time.monotonic()
        run_ids.append(airflow.trigger(dag_id, {"resource": resource, "seconds": seconds}))
        trigger_calls.append(time.monotonic() - call)
    triggered = time.time() - t0
    states = airflow.wait_for_runs(dag_id, run_ids, timeout=max(600.0, runs * seconds * 2))
    rows = _intervals(ct, run_ids)
    failed = sorted(r for r, s in states.items() if s != "success")
    for run_id in failed[:3]:  # say why, from the task's own log
        for log in sorted(airflow.home.glob(f"logs/dag_id={dag_id}/run_id={run_id}/**/*.log")):
            print(f"   failed run {run_id}, {log.name}:\n{log.read_text(errors='replace')[-3000:]}")
    rows = [r for r in rows if r["run_id"] not in failed]
    wall = max(r["finished"] for r in rows) - t0
    starts = sorted(r["started"] for r in rows)
    ends = sorted(r["finished"] for r in rows)
    # With capacity C, load k (k >= C, in start order) can only start after the (k-C)-th end.
    end_to_start = [s - e for s, e in zip(starts[capacity:], ends) if s >= e]
    idle: list[float] = []
    release_to_grant: list[float] = []
    if pattern != "pool":
        idle = [r["started"] - r["granted"] for r in rows if r["granted"] is not None]
        grants = sorted(r["granted"] for r in rows if r["granted"] is not None)
        release_to_grant = [g - e for g, e in zip(grants[capacity:], ends) if g >= e]
    else:
        queued = {
            row["run_id"]: row["queued_dttm"].timestamp()
            for row in airflow.metadata(
                "SELECT run_id, queued_dttm FROM task_instance WHERE dag_id = :d AND task_id = 'load_in_pool'",
                d=dag_id,
            )
            if row["queued_dttm"] is not None
        }
        idle = [r["started"] - queued[r["run_id"]] for r in rows if r["run_id"] in queued]
    return {
        "pattern": pattern, "runs": runs, "seconds": seconds, "wall": wall, "gaps": end_to_start,
        "ideal": runs * seconds / capacity,
        "end_to_start_p50": _p50(end_to_start), "release_to_grant_p50": _p50(release_to_grant),
        "release_to_grant_max": max(release_to_grant) if release_to_grant else float("nan"),
        "idle_per_grant": statistics.fmean(idle) if idle else float("nan"),
        "deferred": sum(1 for r in rows if r["deferred"]),
        "on_worker": sum(1 for r in rows if r.get("granted_by") == "worker"),
        "failed": len(failed),
        # Where triggering N runs goes: the API calls themselves (the api-server shares the machine
        # with the tasks that start and defer meanwhile), and trigger -> first load start.
        "triggered": triggered, "trigger_call_p50": _p50(trigger_calls), "trigger_call_max": max(trigger_calls),
        "first_start": min(starts) - t0 if starts else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.airflow_live", description=__doc__.split("\n\n")[0])
    p.add_argument("--short-runs", type=int, default=100, help="runs with 1 s loads (issue: 100)")
    p.add_argument("--long-runs", type=int, default=20, help="runs with 30 s loads (issue: 20)")
    p.add_argument("--long-seconds", type=float, default=30.0)
    p.add_argument("--queues", default="",
                   help="comma-separated queue lengths (runs of 1 s loads) measured instead of --short/--long-runs")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure the plan this many times (p50s below pool the gaps of all repeats)")
    p.add_argument("--patterns", default="controltable,pool",
                   help="measured in this order for each plan item: controltable, deferred (worker_wait=0), pool")
    p.add_argument("--capacity", type=int, default=CAPACITY, help="the resource's slots and the pool's (default 2)")
    p.add_argument("--postgres-url", default=os.environ.get("CONTROLTABLE_BENCH_POSTGRES_URL", DEFAULT_PG))
    p.add_argument("--throwaway-postgres", action="store_true",
                   help="run the control tables and Airflow's metadata database on a PostgreSQL of its own "
                        "(tests/support/throwaway.py), not --postgres-url: a shared server's connections may run out")
    p.add_argument("--min-heartbeat-interval", type=float, default=5.0,
                   help="[workers] min_heartbeat_interval of the deployment (Airflow's default: 5)")
    p.add_argument("--fast-scheduler", action="store_true",
                   help="the live tests' 1 s scheduler and triggerer heartbeats (default: Airflow's own settings)")
    a = p.parse_args(argv)
    if a.throwaway_postgres:
        from support import throwaway

        try:
            a.postgres_url = throwaway.url("postgres", "the Airflow benchmark")
            print(f"throwaway PostgreSQL: {a.postgres_url}", flush=True)
            run(a)
        finally:
            throwaway.close()
    else:
        run(a)


def run(a: argparse.Namespace) -> None:
    """One deployment, the plan measured in it, the tables printed."""
    env = {"AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": f"{a.min_heartbeat_interval:g}"}
    if not a.fast_scheduler:
        env.update(SCHEDULER_DEFAULTS)

    namespace = f"bench_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(a.postgres_url, namespace=namespace)
    ct.install()
    table = live_intervals(namespace)
    table.create(ct.engine, checkfirst=True)
    airflow = LiveAirflow(server_url=a.postgres_url, control_url=a.postgres_url, namespace=namespace,
                          dag_files=[DAGS], parallelism=32,
                          extra_env=env)
    results: list[dict[str, Any]] = []
    mismatches: list[str] = []
    waits: list[str] = []
    lags: list[float] = []
    try:
        started = time.monotonic()
        airflow.start()
        airflow.wait_for_dags(["ct_live_slot", "ct_live_slot_deferred", "ct_live_pool"])
        airflow.api("POST", "/pools", {"name": "live_pool", "slots": a.capacity})
        print(f"deployment up in {time.monotonic() - started:.0f} s (home {airflow.home})", flush=True)
        plan = ([(int(n), 1.0) for n in a.queues.split(",") if n.strip()] if a.queues
                else [(a.short_runs, 1.0), (a.long_runs, a.long_seconds)]) * max(a.repeat, 1)
        patterns = [p.strip() for p in a.patterns.split(",") if p.strip()]
        if "pool" not in patterns:
            patterns.append("pool")  # every figure is read against the same run's pool
        for pattern in patterns:  # warm-up, not recorded: the first task of a DAG starts cold
            measure(airflow, ct, pattern, 1, 0.1, a.capacity)
        for runs, seconds in plan:
            if runs <= 0:
                continue
            for pattern in patterns:
                print(f"-- {pattern}: {runs} runs x {seconds:.0f} s loads, capacity {a.capacity}", flush=True)
                results.append(measure(airflow, ct, pattern, runs, seconds, a.capacity))
                r = results[-1]
                print(f"   wall {r['wall']:.1f} s (ideal {r['ideal']:.0f} s), failed runs {r['failed']}", flush=True)
        mismatches = state_mismatches(airflow.logs("scheduler", 500_000_000))
        # What the triggers waited for before firing (resume_race's log lines), as they said it.
        texts = [airflow.logs("triggerer", 500_000_000)]
        texts += [p.read_text(errors="replace") for p in airflow.home.glob("logs/**/*") if p.is_file()]
        waits = [line[:200] for text in texts for line in text.splitlines()
                 if "controltable: firing in" in line or "controltable: waited" in line]
        lags = airflow.resume_lags()
    finally:
        airflow.stop()
        table.drop(ct.engine, checkfirst=True)
        ct.close()

    print("\n| loads | pattern | runs | wall s | wall / pool | load end -> next start p50 s | next start / pool | "
          "release -> next grant p50 (max) s | slot idle per grant s | waited deferred | waited on the worker | "
          "failed runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(results):
        # The pool of the same plan item (measured beside it, in the same deployment).
        pool = next(q for q in results[i - i % len(patterns):] if q["pattern"] == "pool")
        mine = r["pattern"] != "pool"
        rtg = f"{r['release_to_grant_p50']:.3f} ({r['release_to_grant_max']:.3f})" if mine else "-"
        print(f"| {r['seconds']:.0f} s | {r['pattern']} | {r['runs']} | {r['wall']:.1f} | "
              f"{r['wall'] / pool['wall']:.2f} | {r['end_to_start_p50']:.2f} | "
              f"{r['end_to_start_p50'] / pool['end_to_start_p50']:.2f} | {rtg} | "
              f"{r['idle_per_grant']:.2f} | {r['deferred'] if mine else '-'} | "
              f"{r['on_worker'] if mine else '-'} | "
              f"{r['failed']} |")
    print("\n| loads | runs | repeats | pattern | load end -> next start p50 s (gaps) | pool | ratio |")
    print("|---|---|---|---|---|---|---|")
    for key in dict.fromkeys((r["seconds"], r["runs"]) for r in results):
        gaps = {pattern: [g for r in results if (r["seconds"], r["runs"]) == key and r["pattern"] == pattern
                          for g in r["gaps"]] for pattern in patterns}
        repeats = sum(1 for r in results if (r["seconds"], r["runs"]) == key and r["pattern"] == "pool")
        pool_p50 = _p50(gaps["pool"])
        for pattern in (p for p in patterns if p != "pool"):
            p50 = _p50(gaps[pattern])
            print(f"| {key[0]:.0f} s | {key[1]} | {repeats} | {pattern} | {p50:.2f} ({len(gaps[pattern])}) | "
                  f"{pool_p50:.2f} ({len(gaps['pool'])}) | {p50 / pool_p50:.2f} |")
    print("\n| loads | pattern | trigger N runs s | API call p50 (max) s | first trigger -> first load start s |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seconds']:.0f} s | {r['pattern']} | {r['triggered']:.1f} | {r['trigger_call_p50']:.2f} "
              f"({r['trigger_call_max']:.2f}) | {r['first_start']:.1f} |")
    settings = "the live tests' 1 s loops" if a.fast_scheduler else "Airflow's defaults (5 s heartbeats)"
    print(f"\nscheduler and triggerer settings: {settings}")
    print(f"\ntasks the scheduler failed as ended but queued/running (the deferral race): {len(mismatches)}")
    for line in mismatches[:5]:
        print("  ", line[:300])
    print(f"trigger waits before firing ({len(waits)} lines):")
    for line in waits[:12]:
        print("  ", line)
    if lags:
        print(f"deferral -> scheduler received the deferring process's exit: {len(lags)} deferrals, "
              f"p50 {_p50(lags):.2f} s, max {max(lags):.2f} s")


if __name__ == "__main__":
    main()
