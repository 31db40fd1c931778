"""Scenario "goals": the timing goals the tests no longer assert, each measured beside its goal.

The tests assert causes (what ended a wait, which token came next, whether work ran after its
lease was lost) and keep times only as hang detectors; the numbers the documentation promises are
measured here instead, on a machine as quiet as the run can get (``benchmarks/run --only goals``):

- handoff with push (PostgreSQL LISTEN/NOTIFY): release to the waiter's grant, p50, goal 100 ms
  (docs/production-databases.md); the waiter runs in another process (scenario 4's).
- handoff with the notification lost (polling only): p99 within the waiter's longest poll
  interval plus a round trip (the polling fallback of tests/core/test_wakeups.py).
- lease-interrupt latency: a slot's lease taken from another connection to ``LeaseLostInterrupt``
  in the working thread, worst of the rounds, goal one renewal interval plus 0.5 s (docs/faults.md).
- renewal: the longest gap between two background renewals, goal at most one interval late
  (two intervals): a lease lapses only when a renewal is two intervals late.
- cancel (PostgreSQL, MariaDB): a statement stopped by its caller's 1 s deadline, from the deadline
  to the error, goal the deadline's grace plus the cancel's (tests/core/test_connect_deadlines.py).

Each figure's anchor is its goal, so the ratio is "fraction of the goal used".
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from sqlalchemy import text

from controltable import ControlTable, ControlTableError, LeaseLostInterrupt, defaults
from controltable.slots.waiting import MAX_POLL_INTERVAL

from . import s4_handoff
from .common import Config, Report, Row, percentile

HANDOFF_PUSH_GOAL_MS = 100.0
HANDOFF_POLL_GOAL_MS = (MAX_POLL_INTERVAL + 0.5) * 1000.0
LEASE = 1.5
INTERVAL = LEASE / 3
INTERRUPT_GOAL_S = INTERVAL + 0.5
RENEWAL_GAP_GOAL_S = 2 * INTERVAL
CANCEL_GOAL_S = defaults.DEADLINE_STATEMENT_GRACE + defaults.CANCEL_GRACE + 0.5


def _row(backend: str, figure: str, value: float, unit: str, goal: float, note: str = "") -> Row:
    return Row("goals", backend, figure, value, unit, "goal", goal, unit, value / goal,
               goal=f"<= {goal:g} {unit}", met=value <= goal, note=note)


def _interrupt_latencies(url: str, rounds: int) -> list[float]:
    """Seconds from the take (another connection releases the holder) to the interrupt."""
    namespace = f"bench_goals_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    ct.set_capacity("r", 1)
    other = ControlTable(url, namespace=namespace)
    out: list[float] = []
    try:
        for i in range(rounds):
            taken: list[float] = []

            def take(holder: str, taken: list[float]) -> None:
                time.sleep(0.3)
                taken.append(time.monotonic())
                other.release("r", holder)

            holder = f"a{i}"
            try:
                with ct.slot("r", holder=holder, lease=LEASE, timeout=30):
                    threading.Thread(target=take, args=(holder, taken), daemon=True).start()
                    end = time.monotonic() + 30
                    while time.monotonic() < end:
                        time.sleep(0.005)
            except LeaseLostInterrupt:
                out.append(time.monotonic() - taken[0])
            else:
                raise RuntimeError("the work was not interrupted within 30 s of its lease being taken")
    finally:
        other.close()
        ct.close()
    return out


def _renewal_gaps(url: str, seconds: float) -> tuple[list[float], list[float]]:
    """Gaps between the starts of successive background renewals, and each renewal's own time."""
    namespace = f"bench_goals_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    ct.set_capacity("r", 1)
    starts: list[float] = []
    took: list[float] = []
    lease = ct.acquire("r", holder="renewing", lease=LEASE, timeout=0)
    real = lease.renew

    def renew(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        starts.append(t0)
        try:
            return real(*args, **kwargs)
        finally:
            took.append(time.monotonic() - t0)

    lease.renew = renew  # type: ignore[method-assign]
    lease.start_renewing()
    time.sleep(seconds)
    lease.release()
    ct.close()
    return [b - a for a, b in zip(starts, starts[1:])], took


def _cancel_delays(url: str, backend: str, rounds: int) -> list[float]:
    """Seconds from a 1 s deadline to the error of the statement it stopped (a 60 s sleep)."""
    sleep = "SELECT pg_sleep(60)" if backend == "postgres" else "SELECT SLEEP(60)"
    ct = ControlTable(url)
    out: list[float] = []
    try:
        ct.ping()
        for _ in range(rounds):
            deadline = time.monotonic() + 1.0
            try:
                ct.db.run(lambda c: c.execute(text(sleep)).all(), deadline=deadline)
            except ControlTableError:
                out.append(time.monotonic() - deadline)
            else:
                raise RuntimeError("the deadline did not stop the statement")
    finally:
        ct.close()
    return out


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    if backend == "postgres":
        rounds = cfg.scale(60, 20)
        report.log(f"goals [{backend}]: handoff with push, {rounds} handoffs")
        lat, _rtt, woken = s4_handoff._handoffs(url, True, rounds)
        report.add(_row(backend, "handoff with push p50", percentile(lat, 50) * 1e3, "ms", HANDOFF_PUSH_GOAL_MS,
                        note=f"{woken}/{rounds} grants followed a notification"))
        rounds = cfg.scale(15, 6)
        report.log(f"goals [{backend}]: handoff with the notification lost (polling), {rounds} handoffs")
        lat, _rtt, _woken = s4_handoff._handoffs(url, False, rounds)
        report.add(_row(backend, "handoff, notification lost (polling) p99", percentile(lat, 99) * 1e3, "ms",
                        HANDOFF_POLL_GOAL_MS))
    rounds = cfg.scale(8, 3)
    report.log(f"goals [{backend}]: lease-interrupt latency, {rounds} rounds")
    late = _interrupt_latencies(url, rounds)
    report.add(_row(backend, f"lease-interrupt latency, worst of {rounds} (lease {LEASE:g} s)", max(late), "s",
                    INTERRUPT_GOAL_S, note=f"p50 {percentile(late, 50):.3f} s"))
    seconds = cfg.scale_f(10.0, 4.0)
    report.log(f"goals [{backend}]: background renewal for {seconds:g} s")
    gaps, took = _renewal_gaps(url, seconds)
    report.add(_row(backend, f"renewal, longest gap between renewals (interval {INTERVAL:g} s)",
                    max(gaps) if gaps else float("inf"), "s", RENEWAL_GAP_GOAL_S,
                    note=f"{len(took)} renewals, p50 round trip {percentile(took, 50) * 1e3:.1f} ms"))
    if backend in ("postgres", "mysql"):
        rounds = cfg.scale(5, 2)
        report.log(f"goals [{backend}]: statement stopped by its caller's deadline, {rounds} rounds")
        delays = _cancel_delays(url, backend, rounds)
        report.add(_row(backend, f"cancel: deadline to error, worst of {rounds}", max(delays), "s", CANCEL_GOAL_S,
                        note=f"p50 {percentile(delays, 50):.3f} s"))
