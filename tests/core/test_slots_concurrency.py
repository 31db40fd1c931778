"""Slots under real concurrency: many OS processes, random delays, killed holders, and an
independent check of the recorded intervals (capacity, exclusivity, FIFO)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.live import wait_until

from controltable import ControlTable
from controltable.checks import Interval, peak_usage, violations

WORKERS = Path(__file__).with_name("slot_workers.py")
pytestmark = pytest.mark.slow


def spawn(*args: str, stderr: Path | None = None) -> subprocess.Popen[bytes]:
    err = open(stderr, "wb") if stderr is not None else None  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, str(WORKERS), *args], stderr=err)


def wait_for_file(path: Path, timeout: float = 60) -> str:
    wait_until(lambda: path.exists() and path.stat().st_size, timeout, f"{path} to be written", interval=0.05)
    return path.read_text()


def test_stress_capacity_exclusivity_and_fifo(backend_url: str, namespace: str, tmp_path: Path) -> None:
    """12 processes, capacity 1 and 3, mixed shared/exclusive requests with random holds."""
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    capacities = {"cap1": 1, "cap3": 3}
    for name, cap in capacities.items():
        ct.set_capacity(name, cap)
    n_workers, rounds = 12, 12
    logs = [tmp_path / f"w{i}.jsonl" for i in range(n_workers)]
    errs = [tmp_path / f"w{i}.err" for i in range(n_workers)]
    procs = [spawn("stress", backend_url, namespace, f"w{i}", str(1000 + i), str(rounds), str(logs[i]), "meet",
                   stderr=errs[i]) for i in range(n_workers)]
    for p, err in zip(procs, errs):
        assert p.wait(timeout=400) == 0, f"worker failed:\n{err.read_text()[-3000:]}"
    intervals = [Interval(**json.loads(line)) for log in logs for line in log.read_text().splitlines()]
    assert len(intervals) == n_workers * rounds
    problems = violations(intervals, capacities)
    assert problems == []
    # The run must actually have exercised the cases being checked.
    shared3 = [iv for iv in intervals if iv.resource == "cap3" and iv.mode == "shared"]
    assert peak_usage(shared3)[1] >= 2, "shared holders never overlapped: the test proves nothing"
    assert any(iv.mode == "exclusive" for iv in intervals)
    assert all(s.used == 0 and not s.holders for s in ct.status())


def test_checker_detects_violations() -> None:
    """The independent checker must be able to fail."""
    a = Interval("a", "r", "shared", 1, 0.0, 2.0, 1, 1)
    b = Interval("b", "r", "shared", 1, 1.0, 3.0, 2, 2)
    x = Interval("x", "r", "exclusive", 1, 1.5, 1.6, 3, 3)
    assert violations([a, b], {"r": 2}) == []
    assert any("capacity" in p for p in violations([a, b], {"r": 1}))
    assert any("exclusive" in p for p in violations([a, x], {"r": 5}))
    late = Interval("c", "r", "shared", 1, 5.0, 6.0, 0, 9)  # earliest ticket, latest token
    assert any("FIFO" in p for p in violations([a, late], {"r": 5}))


def test_killed_holder_slot_returns_within_lease(backend_url: str, namespace: str, tmp_path: Path) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    ct.set_capacity("r", 1)
    lease_s = 2.0
    out = tmp_path / "holder.json"
    holder = spawn("hold", backend_url, namespace, "r", "doomed", str(lease_s), str(out))
    try:
        granted = json.loads(wait_for_file(out))
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        # The acquire's timeout (over 5x the lease) is the hang detector; how soon after the lease
        # the slot comes back is not asserted (a loaded machine stretches it).
        lease = ct.acquire("r", holder="survivor", timeout=5 * lease_s + 20, lease=30)
        assert lease.token > granted["token"]
        # Not before the dead holder's lease ran out (on the database clock).
        assert lease.granted_at is not None and lease.granted_at.timestamp() >= granted["expires"] - 0.05
        lease.release()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_killed_waiter_does_not_block_the_queue(backend_url: str, namespace: str, tmp_path: Path) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    ct.set_capacity("r", 1)
    first = ct.acquire("r", holder="first", timeout=0)
    out = tmp_path / "waiter.txt"
    waiter = spawn("wait", backend_url, namespace, "r", "ghost", str(out))
    try:
        wait_for_file(out)
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait(10)
        assert [w.holder for w in ct.status(["r"])[0].waiters] == ["ghost"]
        first.release()
        # Granted behind the dead waiter once its grant's pickup (DEFAULT_PICKUP, 8 s) lapses; 60 s
        # (over 5x that) is the hang detector, no bound on how soon.
        lease = ct.acquire("r", holder="behind", timeout=60)
        assert lease.token > first.token
        assert "ghost" not in [w.holder for w in ct.status(["r"])[0].waiters]
        lease.release()
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_many_processes_killed_mid_hold_all_slots_come_back(backend_url: str, namespace: str,
                                                            tmp_path: Path) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    ct.set_capacity("pool", 3)
    procs = []
    outs = []
    for i in range(3):
        out = tmp_path / f"h{i}.json"
        outs.append(out)
        # A 3 s lease: renewed every second, it survives a renewal 2 s late on a loaded machine.
        procs.append(spawn("hold", backend_url, namespace, "pool", f"h{i}", "3", str(out), "shared"))
    try:
        granted = [json.loads(wait_for_file(out))["token"] for out in outs]
        assert len(set(granted)) == 3  # three grants (their leases are not renewed: not asserted held now)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        # The killed holders' leases run out (3 s) and the slots come back; 30 s is a hang detector.
        leases = [ct.acquire("pool", holder=f"n{i}", mode="shared", timeout=30) for i in range(3)]
        assert ct.status(["pool"])[0].used == 3
        for lease in leases:
            lease.release()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
