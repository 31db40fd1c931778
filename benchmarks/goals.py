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
- orphan slot back: a holder renewing with ``stop_when_orphaned=True`` (outside any ``with``, so
  nothing interrupts it) has its parent SIGKILLed while it lives on; from the kill to a queued
  participant's ``acquire`` returning the grant (monotonic clock of the benchmark process), worst of
  the rounds, goal "the slot comes back within one lease" (docs/faults.md) plus 0.5 s for the
  waiter's look at the expiry and its grant (lease 2.5 s). Beside it the same with the holder's
  work inside ``with lease:``: the renewer notices the orphaning within
  ``defaults.ORPHAN_CHECK_INTERVAL``, interrupts the work and the block's exit gives the slot back,
  goal that interval plus the same 0.5 s (docs/prefect.md: "notices within a second"). The holders
  are benchmarks/orphan_holder.py, shaped like tests/core/test_renewal_orphan.py's.

The Dagster retry watcher's withdrawal of a cancelled run's queue place has its own module
(benchmarks/dagster_withdrawal.py: it needs Dagster, which the benchmark virtualenv lacks).

Each figure's anchor is its goal, so the ratio is "fraction of the goal used".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import text

from controltable import ControlTable, ControlTableError, LeaseLostInterrupt, defaults
from controltable.slots.waiting import MAX_POLL_INTERVAL

from . import orphan_holder, s4_handoff
from .common import Config, Report, Row, percentile

HANDOFF_PUSH_GOAL_MS = 100.0
HANDOFF_POLL_GOAL_MS = (MAX_POLL_INTERVAL + 0.5) * 1000.0
LEASE = 1.5
INTERVAL = LEASE / 3
INTERRUPT_GOAL_S = INTERVAL + 0.5
RENEWAL_GAP_GOAL_S = 2 * INTERVAL
CANCEL_GOAL_S = defaults.DEADLINE_STATEMENT_GRACE + defaults.CANCEL_GRACE + 0.5
ORPHAN_LEASE = 2.5
#: The waiter's part: its look at the holder's expiry (sleeps are jittered up to 25 %) and the grant.
ORPHAN_SLACK = 0.5
ORPHAN_EXPIRE_GOAL_S = ORPHAN_LEASE + ORPHAN_SLACK
ORPHAN_INTERRUPT_GOAL_S = defaults.ORPHAN_CHECK_INTERVAL + ORPHAN_SLACK
ORPHAN_HOLDER = Path(orphan_holder.__file__)


def goal_row(backend: str, figure: str, value: float, unit: str, goal: float, note: str = "") -> Row:
    """A figure beside its goal (its anchor; the ratio is the fraction of the goal used)."""
    return Row("goals", backend, figure, value, unit, "goal", goal, unit, value / goal,
               goal=f"<= {goal:g} {unit}", met=value <= goal, note=note)


def _one_slot(url: str) -> ControlTable:
    """A control table in a namespace of its own, its resource ``r`` of one slot."""
    ct = ControlTable(url, namespace=f"bench_goals_{uuid.uuid4().hex[:8]}")
    ct.install()
    ct.set_capacity("r", 1)
    return ct


def _interrupt_latencies(url: str, rounds: int) -> list[float]:
    """Seconds from the take (another connection releases the holder) to the interrupt."""
    ct = _one_slot(url)
    other = ControlTable(url, namespace=ct.namespace)
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
    ct = _one_slot(url)
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


def _wait_for(check: Any, seconds: float, what: str) -> Any:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {seconds:g} s waiting for {what}")


def _orphan_rounds(url: str, mode: str, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds from SIGKILLing a holder's parent to a queued waiter's grant: (monotonic, database clock).

    ``mode`` "expire": the holder only renews (its lease runs out); "interrupt": its work is inside
    ``with lease:`` (interrupted, and the exit releases). Every process started is killed at the end.
    """
    ct = _one_slot(url)
    waiter = ControlTable(url, namespace=ct.namespace)
    mono: list[float] = []
    db: list[float] = []
    try:
        for i in range(rounds):
            took, took_db = _orphan_round(ct, waiter, url, mode, f"{ct.namespace}-{i}")
            mono.append(took)
            if took_db is not None:
                db.append(took_db)
    finally:
        waiter.close()
        ct.close()
    return mono, db


def _orphan_round(ct: ControlTable, waiter: ControlTable, url: str, mode: str,
                  name: str) -> tuple[float, Optional[float]]:
    """One round of :func:`_orphan_rounds`; kills the parent's process group (parent and orphan) at the end."""
    out = Path(tempfile.gettempdir()) / f"ct-bench-orphan-{name}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **{orphan_holder.URL_ENV: url})
    parent = subprocess.Popen(  # noqa: S603 - this interpreter, our own script
        [sys.executable, str(ORPHAN_HOLDER), "parent", mode, ct.namespace, "r", f"orphan-{name}",
         str(ORPHAN_LEASE), str(out)], env=env, start_new_session=True)
    child_pid = 0
    granted: list[tuple[float, Any]] = []
    nxt = f"next-{name}"

    def child_holds() -> bool:
        if parent.poll() is not None:
            raise RuntimeError(f"the holder's parent exited ({parent.returncode})")
        return out.exists()

    def wait_for_slot() -> None:
        got = waiter.acquire("r", holder=nxt, lease=30, timeout=ORPHAN_LEASE + 60)
        granted.append((time.monotonic(), got))

    try:
        _wait_for(child_holds, 60, "the orphan-to-be to hold the slot")
        info = json.loads(out.read_text())
        child_pid = int(info["pid"])
        if info["parent"] != parent.pid:
            raise RuntimeError("the holder is not the parent's child")
        thread = threading.Thread(target=wait_for_slot, daemon=True)
        thread.start()
        _wait_for(lambda: granted or ct.wait_info("r", nxt) is not None, 30, "the other participant to queue")
        if granted:
            raise RuntimeError("the waiter was granted while the holder still renewed")
        time.sleep(0.3)  # the waiter settles into its sleep at the head of the queue
        killed = time.monotonic()
        os.kill(parent.pid, signal.SIGKILL)
        killed_db = ct.now()
        parent.wait(timeout=30)
        thread.join(timeout=ORPHAN_LEASE + 90)
        if not granted:
            raise RuntimeError("the orphan's slot did not come back")
        at, lease = granted[0]
        if not _alive(child_pid):
            raise RuntimeError("the orphan died: the figure would not be of a living orphan")
        lease.release()
        return at - killed, (lease.granted_at.timestamp() - killed_db if lease.granted_at is not None else None)
    finally:
        try:  # the parent's own process group (start_new_session): the parent and the orphan
            os.killpg(parent.pid, signal.SIGKILL)
        except OSError:
            pass
        if child_pid and _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=30)
        out.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _orphan_note(db: list[float], mono: list[float], extra: Optional[str] = None) -> str:
    parts = [f"p50 {percentile(mono, 50):.3f} s"]
    if db:
        parts.append(f"database clock worst {max(db):.3f} s")
    if extra:
        parts.append(extra)
    return ", ".join(parts)


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    if backend == "postgres":
        rounds = cfg.scale(60, 20)
        report.log(f"goals [{backend}]: handoff with push, {rounds} handoffs")
        lat, _rtt, woken = s4_handoff._handoffs(url, True, rounds)
        report.add(goal_row(backend, "handoff with push p50", percentile(lat, 50) * 1e3, "ms", HANDOFF_PUSH_GOAL_MS,
                        note=f"{woken}/{rounds} grants followed a notification"))
        rounds = cfg.scale(15, 6)
        report.log(f"goals [{backend}]: handoff with the notification lost (polling), {rounds} handoffs")
        lat, _rtt, _woken = s4_handoff._handoffs(url, False, rounds)
        report.add(goal_row(backend, "handoff, notification lost (polling) p99", percentile(lat, 99) * 1e3, "ms",
                        HANDOFF_POLL_GOAL_MS))
    rounds = cfg.scale(8, 3)
    report.log(f"goals [{backend}]: lease-interrupt latency, {rounds} rounds")
    late = _interrupt_latencies(url, rounds)
    report.add(goal_row(backend, f"lease-interrupt latency, worst of {rounds} (lease {LEASE:g} s)", max(late), "s",
                    INTERRUPT_GOAL_S, note=f"p50 {percentile(late, 50):.3f} s"))
    seconds = cfg.scale_f(10.0, 4.0)
    report.log(f"goals [{backend}]: background renewal for {seconds:g} s")
    gaps, took = _renewal_gaps(url, seconds)
    report.add(goal_row(backend, f"renewal, longest gap between renewals (interval {INTERVAL:g} s)",
                    max(gaps) if gaps else float("inf"), "s", RENEWAL_GAP_GOAL_S,
                    note=f"{len(took)} renewals, p50 round trip {percentile(took, 50) * 1e3:.1f} ms"))
    if backend in ("postgres", "mysql"):
        rounds = cfg.scale(5, 2)
        report.log(f"goals [{backend}]: statement stopped by its caller's deadline, {rounds} rounds")
        delays = _cancel_delays(url, backend, rounds)
        report.add(goal_row(backend, f"cancel: deadline to error, worst of {rounds}", max(delays), "s", CANCEL_GOAL_S,
                        note=f"p50 {percentile(delays, 50):.3f} s"))
    rounds = cfg.scale(5, 2)
    report.log(f"goals [{backend}]: orphan slot back, lease left to expire, {rounds} rounds (lease {ORPHAN_LEASE:g} s)")
    mono, db = _orphan_rounds(url, "expire", rounds)
    report.add(goal_row(backend, f"orphan slot back, lease left to expire: kill to grant, worst of {rounds} "
                    f"(lease {ORPHAN_LEASE:g} s)", max(mono), "s", ORPHAN_EXPIRE_GOAL_S,
                    note=_orphan_note(db, mono)))
    report.log(f"goals [{backend}]: orphan slot back, work interrupted, {rounds} rounds")
    mono, db = _orphan_rounds(url, "interrupt", rounds)
    report.add(goal_row(backend, "orphan slot back, work interrupted (in `with lease:`): kill to grant, "
                        f"worst of {rounds} (check interval {defaults.ORPHAN_CHECK_INTERVAL:g} s)", max(mono), "s",
                    ORPHAN_INTERRUPT_GOAL_S, note=_orphan_note(db, mono)))
