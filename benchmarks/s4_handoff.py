"""Scenario 4: handoff latency. Capacity 1; this process holds the slot, a waiter in another process
is queued in ``ct.acquire(timeout=...)``; we release and the waiter records when it was granted.

Latency = waiter's ``time.time()`` after ``acquire`` returned minus the holder's ``time.time()``
just *before* calling ``release()`` (so the release transaction itself is included). Before each
release the holder waits until the waiter is queued, then a random 0.1-0.25 s, so the waiter is
asleep in its wait rather than mid-poll. Run with push wake-ups (LISTEN/NOTIFY) and, for
comparison, with push disabled in both processes (polling only). The anchor is the ``SELECT 1``
round trip on a raw connection, sampled during the same waits.
"""

from __future__ import annotations

import random
import time
from typing import Any

from controltable import ControlTable

from .common import Config, Report, Row, percentile, raw_connection, select_one, settle_control_tables, timed
from .workers import SPAWN, handoff_waiter

GOAL = 100.0
NAMESPACE = "bench_s4"


def _handoffs(url: str, push: bool, rounds: int) -> tuple[list[float], list[float], int]:
    resource = "handoff-push" if push else "handoff-poll"
    ct = ControlTable(url, namespace=NAMESPACE)
    ct.install()
    ct.set_capacity(resource, 1)
    settle_control_tables(ct)
    ct.wakeups.enabled = push
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=handoff_waiter, args=(url, NAMESPACE, resource, push, child), daemon=True)
    proc.start()
    assert parent.recv() == "ready"
    conn = raw_connection(url)
    latencies: list[float] = []
    round_trips: list[float] = []
    woken = 0
    for i in range(rounds):
        lease = ct.acquire(resource, holder="holder", timeout=0)
        parent.send(i)
        while not ct.status([resource])[0].waiters:
            time.sleep(0.002)
        until = time.monotonic() + random.uniform(0.1, 0.25)
        while time.monotonic() < until:
            round_trips.append(timed(lambda: select_one(conn)))
            time.sleep(0.01)
        released = time.time()
        lease.release()
        granted, by_push, _active = parent.recv()
        latencies.append(granted - released)
        woken += int(by_push)
    parent.send("stop")
    proc.join(timeout=20)
    conn.close()
    ct.close()
    return latencies, round_trips, woken


def run(cfg: Config, report: Report, url: str) -> None:
    for push, rounds in ((True, cfg.scale(120, 40)), (False, cfg.scale(40, 15))):
        mode = "push (LISTEN/NOTIFY)" if push else "polling only"
        report.log(f"scenario 4 [postgres]: handoff, {mode}, {rounds} handoffs")
        lat, rtt, woken = _handoffs(url, push, rounds)
        p50, p99 = percentile(lat, 50) * 1e3, percentile(lat, 99) * 1e3
        r50, r99 = percentile(rtt, 50) * 1e3, percentile(rtt, 99) * 1e3
        report.extra.setdefault("s4", {})["push" if push else "poll"] = {
            "handoffs": rounds, "p50_ms": p50, "p99_ms": p99, "select1_p50_ms": r50, "select1_p99_ms": r99,
            "woken_by_notification": woken, "latencies_ms": [x * 1e3 for x in lat]}
        goal: dict[str, Any] = {"goal": "<= 100", "met": p50 / r50 <= GOAL} if push else {}
        note = f"{woken}/{rounds} grants followed a notification"
        report.add(Row("4 handoff latency", "postgres", f"{mode} p50", p50, "ms", "SELECT 1 p50", r50, "ms",
                       p50 / r50, note=note, **goal))
        report.add(Row("4 handoff latency", "postgres", f"{mode} p99", p99, "ms", "SELECT 1 p50", r50, "ms",
                       p99 / r50))
