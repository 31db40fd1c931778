"""The slot, event and work-list contracts through a real PgBouncer, in transaction and in session mode.

The plain URL (only host and port point at the pooler; nothing in ``pgbouncer.ini`` changed for
us) must keep every promise: real worker processes, and the independent checks of the core
suite (:mod:`controltable.checks` for capacity, exclusivity and FIFO; exactly-once for events;
strictly sequential orders for a work list). Before issue 22 the install already failed at
connect (``unsupported startup parameter: options``), and the sixth statement on a connection
with ``DuplicatePreparedStatement``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from support import event_tables
from support import event_workers as workers_mod
from support.event_workers import Workers

from controltable import ControlTable
from controltable.checks import Interval, peak_usage, violations

SLOT_WORKERS = Path(__file__).parents[1] / "core" / "slot_workers.py"


@pytest.fixture
def pooled(pgbouncer_url: Callable[[str], str], pool_mode: str) -> Iterator[ControlTable]:
    """A ControlTable installed and used through the pooler, in a namespace of its own."""
    ct = ControlTable(pgbouncer_url(pool_mode), namespace=f"t_{uuid.uuid4().hex[:12]}")
    ct.install()
    yield ct
    ct.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.close()


def test_many_statements_on_one_pooled_connection(pooled: ControlTable) -> None:
    """Far past psycopg's prepare threshold (5), and across transactions on other server connections."""
    pooled.set_capacity("r", 1)
    for _ in range(30):
        with pooled.acquire("r", holder="h", timeout=10):
            pass
    assert [s.used for s in pooled.status() if s.name == "r"] == [0]


def test_slots_capacity_exclusivity_and_fifo(pooled: ControlTable, tmp_path: Path) -> None:
    """6 processes, capacity 1 and 3, mixed shared/exclusive requests, through the pooler."""
    capacities = {"cap1": 1, "cap3": 3}
    for name, cap in capacities.items():
        pooled.set_capacity(name, cap)
    url = pooled.db.engine.url.render_as_string(hide_password=False)
    n_workers, rounds = 6, 8
    logs = [tmp_path / f"w{i}.jsonl" for i in range(n_workers)]
    errs = [tmp_path / f"w{i}.err" for i in range(n_workers)]
    procs = []
    for i in range(n_workers):
        with open(errs[i], "wb") as err:
            procs.append(subprocess.Popen([sys.executable, str(SLOT_WORKERS), "stress", url, pooled.namespace,
                                           f"w{i}", str(2000 + i), str(rounds), str(logs[i]), "meet"], stderr=err))
    try:
        for p, err in zip(procs, errs):
            assert p.wait(timeout=120) == 0, f"worker failed:\n{err.read_text()[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    intervals = [Interval(**json.loads(line)) for log in logs for line in log.read_text().splitlines()]
    assert len(intervals) == n_workers * rounds
    assert violations(intervals, capacities) == []
    shared3 = [iv for iv in intervals if iv.resource == "cap3" and iv.mode == "shared"]
    assert peak_usage(shared3)[1] >= 2, "shared holders never overlapped: the test proves nothing"
    assert any(iv.mode == "exclusive" for iv in intervals)
    assert all(s.used == 0 and not s.holders for s in pooled.status())


def test_events_drained_exactly_once(pooled: ControlTable, procs: Workers, tmp_path: Path) -> None:
    """4 processes drain 3,000 events in batches of 50 while a producer adds 500 more."""
    table = event_tables.create(pooled, 0)
    try:
        pooled.events(table.name, key="id").prepare()
        initial, extra, n_workers = 3000, 500, 4
        event_tables.fill(pooled, table.name, 1, initial)
        url = pooled.db.engine.url.render_as_string(hide_password=False)
        flag = tmp_path / "producer.done"
        logs = [tmp_path / f"w{i}.jsonl" for i in range(n_workers)]
        for i, log in enumerate(logs):
            procs.start(f"w{i}", "drain", "--url", url, "--namespace", pooled.namespace, "--table", table.name,
                        "--log", log, "--size", 50, "--done-flag", flag, "--work", 0.01, "--max-seconds", 90)
        procs.start("producer", "produce", "--url", url, "--namespace", pooled.namespace, "--table", table.name,
                    "--start", initial + 1, "--count", extra, "--chunk", 50, "--interval", 0.02,
                    "--done-flag", flag, "--wait-for", *logs)
        procs.wait(["producer", *[f"w{i}" for i in range(n_workers)]], timeout=120)
        keys = [k for log in logs for line in workers_mod.read_jsonl(log) if "keys" in line for k in line["keys"]]
        twice = [k for k, n in Counter(keys).items() if n > 1]
        assert not twice, f"{len(twice)} keys completed more than once, e.g. {twice[:10]}"
        assert set(keys) == set(range(1, initial + extra + 1))
        st = pooled.events(table.name, key="id").stats()
        assert (st.pending, st.claimed, st.expired, st.error, st.done) == (0, 0, 0, 0, initial + extra), st
    finally:
        event_tables.drop(pooled, table.name)


ORDERED_WORKLOAD = [100, 100, 200, 200, 200, 300, 400, 400, 500]


def test_worklist_orders_strictly_sequential(pooled: ControlTable, procs: Workers, tmp_path: Path) -> None:
    wl = pooled.worklist(f"wl_{uuid.uuid4().hex[:8]}")
    for order, group in itertools.groupby(ORDERED_WORKLOAD):
        wl.populate([{"order": order, "n": n} for n, _ in enumerate(group)], order=order)
    url = pooled.db.engine.url.render_as_string(hide_password=False)
    names = [f"w{i}" for i in range(3)]
    ready = [tmp_path / f"{n}.ready" for n in names]
    logs = [tmp_path / f"{n}.jsonl" for n in names]
    go = tmp_path / "go"
    for i, (n, r, log) in enumerate(zip(names, ready, logs)):
        procs.start(n, "worklist", "--url", url, "--namespace", pooled.namespace, "--worklist", wl.name,
                    "--log", log, "--seed", i, "--min-work", 0.1, "--max-work", 0.3, "--poll", 0.02,
                    "--max-seconds", 60, "--ready", r, "--go", go, "--meet-order", 200)
    workers_mod.wait_for_files(ready, 60, procs)
    go.touch()
    procs.wait(names, timeout=90)
    entries: list[dict[str, Any]] = [e for log in logs for e in workers_mod.read_jsonl(log)]
    assert sorted(e["id"] for e in entries) == sorted({e["id"] for e in entries}) and len(entries) == 9
    assert sorted(e["order"] for e in entries) == ORDERED_WORKLOAD
    for a in entries:
        for b in entries:
            if b["order"] < a["order"]:
                assert a["start"] >= b["end"], f"item {a['id']} (order {a['order']}) began before {b['id']} ended"
    overlapping = [(a, b) for a, b in itertools.combinations([e for e in entries if e["order"] == 200], 2)
                   if a["start"] < b["end"] and b["start"] < a["end"]]
    assert overlapping, "the items of one order never ran side by side: the test proves nothing"
    assert wl.status().finished
