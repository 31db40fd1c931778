"""Scenario "pooler": controltable through PgBouncer in transaction mode against the same server direct.

A throwaway PgBouncer (Debian's package, stock settings but for the pool mode; the test suite's
``tests/support/pgbouncer.py``) is started in front of the benchmark database, and every figure is
the pooled run over the direct run of the same work in the same benchmark run:

* handoff p50 (capacity 1; a waiter in another process is granted when this process releases) with
  ``listen_url`` (waiter and holder work through the pooler, the waiter's listener connects
  direct) over the direct handoff with push: goal <= 3;
* handoff p50 through the pooler *without* ``listen_url`` (the listener's self-probe finds pushes
  swallowed, waiters poll): goal <= 100 ms, next to the direct handoff;
* uncontended ``acquire(timeout=0)`` + ``release()`` p50 through the pooler over direct: goal <= 1.5;
* claim+complete drain rate (batches of 100, one process) through the pooler over direct: goal >= 0.8.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

from controltable import ControlTable

from .common import Config, Report, Row, fresh_events, median, percentile
from .workers import SPAWN

NAMESPACE = "bench_pooler"
HANDOFF_RATIO_GOAL = 3.0
POLL_HANDOFF_GOAL_MS = 100.0
ACQUIRE_RATIO_GOAL = 1.5
DRAIN_RATIO_GOAL = 0.8
SCENARIO = "pooler PgBouncer"


def pgbouncer(url: str) -> Any:
    """A PgBouncer in transaction mode in front of ``url`` (not started)."""
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.pgbouncer import PgBouncer  # the test suite's helper (it imports pytest)

    return PgBouncer("transaction", url)


# -- handoff -----------------------------------------------------------------------------------------
def handoff_waiter(url: str, listen_url: str | None, resource: str, conn: Any) -> None:
    """On each "go", wait for ``resource`` (queued behind the parent) and report when granted."""
    ct = ControlTable(url, namespace=NAMESPACE, listen_url=listen_url)
    active = ct.push_active  # starts the listener and its self-probe before the first handoff
    conn.send(("ready", active))
    while True:
        msg = conn.recv()
        if msg == "stop":
            break
        before = ct.wakeups.received
        lease = ct.acquire(resource, holder=f"waiter-{msg}", timeout=60, lease=60)
        granted = time.time()
        lease.release()
        conn.send((granted, ct.wakeups.received > before))
    ct.close()


def handoffs(url: str, waiter_url: str, listen_url: str | None, resource: str,
             rounds: int) -> tuple[list[float], int, bool]:
    """Latencies (s) of ``rounds`` handoffs from this process (working through ``url``) to a waiter
    process (through ``waiter_url``, listening on ``listen_url``); pushes seen; whether push was active."""
    ct = ControlTable(url, namespace=NAMESPACE)
    ct.install()
    ct.set_capacity(resource, 1)
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=handoff_waiter, args=(waiter_url, listen_url, resource, child), daemon=True)
    proc.start()
    ready, active = parent.recv()
    assert ready == "ready"
    latencies: list[float] = []
    pushed = 0
    try:
        for i in range(rounds):
            lease = ct.acquire(resource, holder="holder", timeout=0)
            parent.send(i)
            while not ct.status([resource])[0].waiters:
                time.sleep(0.002)
            time.sleep(random.uniform(0.1, 0.25))  # the waiter is asleep in its wait, not mid-poll
            released = time.time()
            lease.release()
            granted, by_push = parent.recv()
            latencies.append(granted - released)
            pushed += int(by_push)
    finally:
        parent.send("stop")
        proc.join(timeout=20)
        ct.close()
    return latencies, pushed, active


# -- uncontended acquire + release -------------------------------------------------------------------------
def acquire_release(urls: dict[str, str], samples: int) -> dict[str, list[float]]:
    """``acquire(timeout=0)`` + ``release()`` on a capacity-1 resource, interleaved sample by sample
    between the URLs so every side sees the same noise."""
    tables = {name: ControlTable(url, namespace=NAMESPACE) for name, url in urls.items()}
    out: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for name, ct in tables.items():
            ct.install()
            ct.set_capacity(f"uncontended-{name}", 1)
            for _ in range(20):  # warm: connections open, statements seen once
                ct.acquire(f"uncontended-{name}", holder="h", timeout=0).release()
        for _ in range(samples):
            for name, ct in tables.items():
                start = time.perf_counter()
                ct.acquire(f"uncontended-{name}", holder="h", timeout=0).release()
                out[name].append(time.perf_counter() - start)
    finally:
        for ct in tables.values():
            ct.close()
    return out


# -- claim + complete drain ------------------------------------------------------------------------------------
def drain(url: str, table: str, direct_url: str, rows: int) -> float:
    """Rows per second draining ``rows`` fresh pending rows through ``url`` (batches of 100)."""
    fresh_events(direct_url, table, rows)
    ct = ControlTable(url)
    try:
        events = ct.events(table, key="event_id")
        done = 0
        start = time.perf_counter()
        while True:
            batch = events.claim(size=100, owner="pooler-bench")
            if batch is None:
                break
            done += len(batch)
            batch.complete()
        elapsed = time.perf_counter() - start
    finally:
        ct.close()
    if done != rows:
        raise RuntimeError(f"drained {done} rows of {rows}")
    return rows / elapsed


def run(cfg: Config, report: Report, url: str) -> None:
    bouncer = pgbouncer(url)
    bouncer.start()
    pooled = bouncer.url
    report.extra["pooler"] = {"pgbouncer": bouncer.exe, "pool_mode": "transaction"}
    try:
        _run(cfg, report, url, pooled)
    finally:
        bouncer.stop()


def _run(cfg: Config, report: Report, direct: str, pooled: str) -> None:
    extra = report.extra["pooler"]
    rounds = cfg.scale(60, 20)
    figures: dict[str, tuple[float, int, bool]] = {}
    for label, holder_url, waiter_url, listen_url in (
        ("direct", direct, direct, None),
        ("PgBouncer + listen_url", pooled, pooled, direct),
        ("PgBouncer, no listen_url", pooled, pooled, None),
    ):
        report.log(f"scenario pooler: handoff {label}, {rounds} handoffs")
        lat, pushed, active = handoffs(holder_url, waiter_url, listen_url, f"handoff-{len(figures)}", rounds)
        p50 = percentile(lat, 50) * 1e3
        figures[label] = (p50, pushed, active)
        extra[f"handoff {label}"] = {"p50_ms": p50, "p99_ms": percentile(lat, 99) * 1e3, "pushed": pushed,
                                     "push_active": active, "latencies_ms": [x * 1e3 for x in lat]}
    base, _, _ = figures["direct"]
    listen, listen_pushed, listen_active = figures["PgBouncer + listen_url"]
    ratio = listen / base
    report.add(Row(SCENARIO, "postgres", "handoff p50 with listen_url", listen, "ms", "direct handoff p50", base,
                   "ms", ratio, goal=f"<= {HANDOFF_RATIO_GOAL:g}", met=ratio <= HANDOFF_RATIO_GOAL,
                   note=f"push active {listen_active}; {listen_pushed}/{rounds} grants followed a push"))
    polled, poll_pushed, poll_active = figures["PgBouncer, no listen_url"]
    report.add(Row(SCENARIO, "postgres", "handoff p50 without listen_url (polling)", polled, "ms",
                   "direct handoff p50", base, "ms", polled / base, goal=f"<= {POLL_HANDOFF_GOAL_MS:g} ms",
                   met=polled <= POLL_HANDOFF_GOAL_MS,
                   note=f"push active {poll_active} (self-probe); {poll_pushed}/{rounds} grants followed a push"))

    samples = cfg.scale(400, 120)
    report.log(f"scenario pooler: uncontended acquire+release, {samples} samples each")
    times = acquire_release({"direct": direct, "pgbouncer": pooled}, samples)
    d50, p50 = (percentile(times[k], 50) * 1e3 for k in ("direct", "pgbouncer"))
    extra["acquire_release"] = {"direct_p50_ms": d50, "pgbouncer_p50_ms": p50,
                                "direct_p99_ms": percentile(times["direct"], 99) * 1e3,
                                "pgbouncer_p99_ms": percentile(times["pgbouncer"], 99) * 1e3}
    report.add(Row(SCENARIO, "postgres", "uncontended acquire+release p50", p50, "ms", "direct p50", d50, "ms",
                   p50 / d50, goal=f"<= {ACQUIRE_RATIO_GOAL:g}", met=p50 / d50 <= ACQUIRE_RATIO_GOAL))

    rows = cfg.scale(20_000, 5_000)
    rates: dict[str, list[float]] = {"direct": [], "pgbouncer": []}
    # Alternated, median of each: a drain is a few seconds, and the shared machine's load drifts.
    for label in ("direct", "pgbouncer", "direct", "pgbouncer", "direct", "pgbouncer"):
        report.log(f"scenario pooler: claim+complete drain {label}, {rows} rows")
        rates[label].append(drain(pooled if label == "pgbouncer" else direct, "pooler_bench_events", direct, rows))
    extra["drain"] = {"rows": rows, **{f"{k}_rows_per_s": v for k, v in rates.items()}}
    pooled_rate, anchor = median(rates["pgbouncer"]), median(rates["direct"])
    ratio = pooled_rate / anchor
    report.add(Row(SCENARIO, "postgres", "claim+complete drain (1 worker, batch 100)", pooled_rate, "rows/s",
                   "direct drain", anchor, "rows/s", ratio, goal=f">= {DRAIN_RATIO_GOAL:g}",
                   met=ratio >= DRAIN_RATIO_GOAL, note="median of 3 alternated drains each"))

