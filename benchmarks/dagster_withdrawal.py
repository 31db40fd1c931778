"""Dagster: a cancelled run's retry wait withdrawn within moments (``python -m benchmarks.dagster_withdrawal``).

Needs Dagster and the Dagster plugin (the project's .venv has both; .venv-bench, which
``benchmarks/run`` creates, has only the core, so benchmarks/main.py never imports this module).
No Dagster deployment: like tests/dagster/test_dagster_run_lifecycle.py
(``test_retry_watcher_withdraws_a_place_within_moments_of_the_cancel``), each round puts a run in
STARTED state in a temporary local Dagster instance, queues that run's step behind a holder of the
only slot, starts the detached retry watcher that a ``wait="retry"`` step of the multiprocess
executor leaves behind when it raises ``RetryRequested``
(:func:`dagster_controltable.retry_watch.ensure_watcher`), waits until the watcher says it is ready
(its ack file), then reports the run CANCELING and times (monotonic clock of this process) from
the start of that call (``report_run_canceling``, whose own time the note gives) until the step's
queue place is gone, looking every 10 ms. Worst of the rounds, goal
"withdrawn within a fraction of a second" (docs/dagster.md, the failure table), taken as 1 s; the
watcher reads the run's status every ``WATCH_TICK`` (0.1 s).

Usage: ``.venv/bin/python -m benchmarks.dagster_withdrawal [--quick] [--postgres-url URL]
[--mysql-url URL|none] [--sqlite-url URL|none]`` (the same defaults as benchmarks/main.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any, Optional

from controltable import ControlTable

from .common import Config, Report, percentile
from .goals import goal_row
from .main import DEFAULT_MYSQL, DEFAULT_PG, reachable
from .report import fmt, text_table

GOAL_S = 1.0
RESOURCE = "warehouse"


def _withdrawals(url: str, rounds: int, report: Report) -> list[tuple[float, float]]:
    """Per round: seconds from reporting the run CANCELING to its step's queue place being gone, and
    how many of them the report itself took (``report_run_canceling`` returning)."""
    from dagster import DagsterInstance

    namespace = f"bench_dagster_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    ct.set_capacity(RESOURCE, 1)
    blocker = ct.acquire(RESOURCE, holder="shell-job", lease=600)
    try:
        with tempfile.TemporaryDirectory(prefix="ct-bench-dagster-") as home, \
                DagsterInstance.local_temp(home) as instance:
            return [_withdrawal(ct, instance, url, report) for _ in range(rounds)]
    finally:
        blocker.release()
        ct.close()


def _withdrawal(ct: ControlTable, instance: Any, url: str, report: Report) -> tuple[float, float]:
    """One round of :func:`_withdrawals`; the watcher is stopped at the end whatever happened."""
    from dagster._core.events import DagsterEvent, DagsterEventType
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._serdes import serialize_value

    from dagster_controltable import retry_watch

    run = instance.add_run(DagsterRun(job_name="bench_noop_job", run_config={}))
    instance.handle_run_event(run.run_id, DagsterEvent(
        event_type_value=DagsterEventType.RUN_START.value, job_name=run.job_name))
    holder = f"dagster:{run.run_id}:load"
    if ct.try_acquire(RESOURCE, holder=holder, waiter_ttl=120) is not None:
        raise RuntimeError("the step was granted: the slot should be busy")
    settings = {"url": url, "namespace": ct.namespace, "schema": None, "prefix": "ct_", "run_id": run.run_id,
                "holder": holder, "resources": [RESOURCE], "instance_ref": serialize_value(instance.get_ref())}
    ack = retry_watch.ack_file(holder)
    try:
        started = time.monotonic()
        retry_watch.ensure_watcher(settings, holder, time.time() + 120)
        _wait(lambda: "ready" in (_read_json(ack) or {}), 90, "the watcher's ack file (ready)")
        report.log(f"  watcher ready after {time.monotonic() - started:.1f} s")
        if ct.wait_info(RESOURCE, holder) is None:
            raise RuntimeError("the step's place was gone before the cancel")
        cancelled = time.monotonic()
        instance.report_run_canceling(instance.get_run_by_id(run.run_id))
        recorded = time.monotonic()
        _wait(lambda: ct.wait_info(RESOURCE, holder) is None, 60,
              "the watcher to withdraw the cancelled run's place", interval=0.01)
        return time.monotonic() - cancelled, recorded - cancelled
    finally:
        retry_watch.stop_watcher(holder)  # it ends by itself after the withdrawal; else it is stopped here
        ct.release(RESOURCE, holder)


def _read_json(path: Any) -> Optional[dict[str, Any]]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _wait(check: Any, seconds: float, what: str, interval: float = 0.05) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(interval)
    raise RuntimeError(f"timed out after {seconds:g} s waiting for {what}")


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    rounds = cfg.scale(6, 3)
    report.log(f"dagster [{backend}]: retry watcher's withdrawal of a cancelled run's place, {rounds} rounds")
    got = _withdrawals(url, rounds, report)
    took = [t for t, _ in got]
    calls = [c for _, c in got]
    report.add(goal_row(backend, f"Dagster retry watcher: run cancel to place withdrawn, worst of {rounds}", max(took),
                    "s", GOAL_S, note=f"p50 {percentile(took, 50):.3f} s, of which the cancel call "
                    f"(report_run_canceling) p50 {percentile(calls, 50):.3f} s; after the call returned: "
                    f"worst {max(t - c for t, c in got):.3f} s"))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.dagster_withdrawal", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    p.add_argument("--postgres-url", default=os.environ.get("CONTROLTABLE_BENCH_POSTGRES_URL", DEFAULT_PG),
                   help="'none' to skip")
    p.add_argument("--mysql-url", default=os.environ.get("CONTROLTABLE_BENCH_MYSQL_URL", DEFAULT_MYSQL),
                   help="'none' to skip")
    p.add_argument("--sqlite-url", default=None, help="default: a file in a temporary directory; 'none' to skip")
    a = p.parse_args(argv)
    try:
        import dagster  # noqa: F401

        import dagster_controltable  # noqa: F401
    except ImportError as exc:
        print(f"needs Dagster and the Dagster plugin (the project's .venv): {exc}", file=sys.stderr)
        return 2
    none = ("", "none")
    report = Report()
    cfg = Config(quick=a.quick, postgres_url=None, mysql_url=None, sqlite_url=None, out_dir="")
    with tempfile.TemporaryDirectory(prefix="ct-bench-dagster-db-") as tmp:
        urls: list[tuple[str, str]] = []
        for server, backend in ((a.postgres_url, "postgres"), (a.mysql_url, "mysql")):
            if server not in none:
                bench = reachable(server, report)
                if bench:
                    urls.append((bench, backend))
        if a.sqlite_url not in none:
            urls.append((a.sqlite_url or f"sqlite:///{os.path.join(tmp, 'bench-dagster.db')}", "sqlite"))
        for url, backend in urls:
            try:
                run(cfg, report, url, backend)
            except Exception as exc:
                report.errors.append(f"FAILED dagster [{backend}]: {type(exc).__name__}: {exc}")
                report.log(f"dagster [{backend}] FAILED: {type(exc).__name__}: {exc}")
    print("\ntiming goal (measured here; the test asserts the cause only)")
    for r in report.rows:
        print(f"  [{r.backend:8}] {r.figure}: {fmt(r.value)} {r.unit}, goal {r.goal}: "
              f"{'met' if r.met else 'MISSED'}{'  (' + r.note + ')' if r.note else ''}")
    print("\n" + text_table(report.rows))
    for err in report.errors:
        print(f"error: {err}")
    return 1 if any(e.startswith("FAILED") for e in report.errors) else 0


if __name__ == "__main__":
    sys.exit(main())
