"""A nine-item, five-order workload in real processes: orders are strictly sequential, items of one order overlap."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import event_workers as workers_mod

pytestmark = pytest.mark.slow

ORDERED_WORKLOAD = [100, 100, 200, 200, 200, 300, 400, 400, 500]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _assert_orders_sequential(spans: dict[int, tuple[int, float, float]], what: str) -> None:
    """No item starts before every item of a lower order has ended. ``spans``: id -> (order, start, end)."""
    for i, (order, start, _) in spans.items():
        for j, (lower, _, end) in spans.items():
            if lower < order:
                assert start >= end, (
                    f"{what}: item {i} (order {order}) started at {start:.6f}, before item {j} "
                    f"(order {lower}) ended at {end:.6f} ({end - start:.6f} s early)"
                )


def test_ordered_workload_in_three_processes(ct: Any, backend_url: str, procs: Any, tmp_path: Path) -> None:
    wl = ct.worklist(f"wl_{uuid.uuid4().hex[:8]}")
    try:
        for order, group in itertools.groupby(ORDERED_WORKLOAD):
            wl.populate([{"order": order, "n": n} for n, _ in enumerate(group)], order=order)
        names = [f"w{i}" for i in range(3)]
        ready = [tmp_path / f"{n}.ready" for n in names]
        logs = [tmp_path / f"{n}.jsonl" for n in names]
        go = tmp_path / "go"
        for i, (n, r, log) in enumerate(zip(names, ready, logs)):
            procs.start(n, "worklist", "--url", backend_url, "--namespace", ct.namespace, "--worklist", wl.name,
                        "--log", log, "--seed", i, "--min-work", 0.2, "--max-work", 0.6, "--poll", 0.02,
                        "--max-seconds", 120, "--ready", r, "--go", go)
        workers_mod.wait_for_files(ready, 120, procs)
        go.touch()
        procs.wait(names, timeout=180)

        entries = [e for log in logs for e in workers_mod.read_jsonl(log)]
        ids = [e["id"] for e in entries]
        assert len(ids) == 9 and len(set(ids)) == 9, entries
        assert sorted(e["order"] for e in entries) == ORDERED_WORKLOAD
        assert all(e["payload"]["order"] == e["order"] for e in entries)

        # Orders never overlap, seen from the workers' own clocks...
        _assert_orders_sequential({e["id"]: (e["order"], e["start"], e["end"]) for e in entries}, "worker logs")
        # ...while the items of one order run side by side.
        spans_200 = [(e["start"], e["end"]) for e in entries if e["order"] == 200]
        pairs = [(a, b) for a, b in itertools.combinations(spans_200, 2) if _overlap(a, b)]
        assert pairs, f"no two items of order 200 overlapped: {sorted(spans_200)}"
        assert len({e["owner"] for e in entries if e["order"] == 200}) >= 2
        assert len({e["owner"] for e in entries}) == 3, "every worker should have done something"

        st = wl.status()
        assert st.finished and st.total("done") == 9 and st.total("error") == 0
        rows = wl.items_list()
        assert len(rows) == 9 and all(r["state"] == "done" for r in rows)
        assert {r["id"] for r in rows} == set(ids)
        # ...and seen from the database's own started_at / finished_at.
        _assert_orders_sequential({r["id"]: (r["exec_order"], r["started_at"], r["finished_at"]) for r in rows},
                                  "database started_at/finished_at")
    finally:
        wl.drop()
