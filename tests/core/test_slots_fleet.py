"""A fleet: 200 waiters (4 processes x 50 threads) on one resource of capacity 4, checked independently.

Each waiter acquires once (10% exclusive) and records its hold; ``controltable.checks`` then
verifies capacity, exclusivity and FIFO (tokens in ticket order) from those records alone, and
that the resource was really full (peak = capacity) while the queue drained.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controltable import ControlTable
from controltable.checks import Interval, peak_usage, violations

WORKERS = Path(__file__).with_name("slot_workers.py")
pytestmark = pytest.mark.slow

PROCESSES, THREADS, CAPACITY = 4, 50, 4


@pytest.mark.timeout(1800)  # above the processes' hang detector below (their waiters' own is 900 s)
def test_two_hundred_waiters(backend_url: str, namespace: str, tmp_path: Path) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    ct.set_capacity("fleet", CAPACITY)
    logs = [tmp_path / f"p{i}.jsonl" for i in range(PROCESSES)]
    errs = [tmp_path / f"p{i}.err" for i in range(PROCESSES)]
    procs = [
        subprocess.Popen([sys.executable, str(WORKERS), "fleet", backend_url, namespace, f"p{i}", str(THREADS),
                          str(7 + i), str(logs[i])], stderr=open(errs[i], "wb"))  # noqa: SIM115
        for i in range(PROCESSES)
    ]
    try:
        for p, err in zip(procs, errs):
            assert p.wait(timeout=1200) == 0, f"fleet process failed:\n{err.read_text()[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    intervals = [Interval(**json.loads(line)) for log in logs for line in log.read_text().splitlines()]
    assert len(intervals) == PROCESSES * THREADS
    assert violations(intervals, {"fleet": CAPACITY}) == []
    shared = [iv for iv in intervals if iv.mode == "shared"]
    assert peak_usage(shared)[0] == CAPACITY, "the resource was never full: the test proves nothing"
    assert any(iv.mode == "exclusive" for iv in intervals)
    (st,) = ct.status(["fleet"])
    assert st.used == 0 and not st.holders and not st.waiters
    ct.close()
