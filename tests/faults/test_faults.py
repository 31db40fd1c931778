"""Fault injection against throwaway servers: restarts and connections cut mid-COMMIT, with real worker processes.

Per server (PostgreSQL and MariaDB, each started by the test in a temp directory, never the
shared ones), two scenarios run through :class:`FaultProxy`:

* a drain of 20,000 events by four worker processes (two complete-then-claim, two
  ``complete_and_claim``);
* a slot stress run by four processes recording the intervals they held, checked with
  :func:`controltable.checks.violations`.

During each, the server is restarted twice (PostgreSQL: ``fast`` then ``immediate``; MariaDB: a
clean shutdown then SIGKILL), every open connection is cut once, and every n-th COMMIT is cut
(alternately before it reaches the server and after, losing only the reply). The promises checked:
no capacity/exclusivity/FIFO violation, no event completed twice, none lost, none stuck, and every
exception any worker saw is a ``ControlTableError``. Events processed twice are counted and
printed: processing is at-least-once, completion exactly-once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from controltable import ControlTable, checks

from .proxy import FaultProxy
from .servers import ThrowawayServer

pytestmark = [pytest.mark.faults]

WORKERS = Path(__file__).with_name("fault_workers.py")
EVENTS = 20_000
DRAIN_WORKERS = 4
SLOT_WORKERS = 4
#: Every n-th COMMIT through the proxy is cut.
CUT_EVERY = {"drain": 37, "slots": 23}
REPORT = os.environ.get("CONTROLTABLE_FAULTS_REPORT")


@pytest.fixture
def proxy(server: ThrowawayServer) -> Iterator[FaultProxy]:
    p = FaultProxy(server.port)
    yield p
    p.close()


def _retry(fn: Callable[[], Any], seconds: float = 60) -> Any:
    """Run a controller-side query, riding out the restarts the test itself causes."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, str(WORKERS), *args], env=env, stderr=subprocess.PIPE)


def _finish(procs: list[subprocess.Popen[bytes]], stop: Path, seconds: float = 90) -> list[str]:
    """Raise the stop flag, wait for the workers (bounded), return each one's stderr tail."""
    stop.touch()
    deadline = time.monotonic() + seconds
    tails = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        tails.append(err.decode(errors="replace")[-2000:])
    return tails


def _read(logs: list[Path]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in logs:
        if path.exists():
            records.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return records


def _drained(records: list[dict[str, Any]]) -> tuple[Counter[Any], Counter[Any]]:
    """Per event key, from the drain workers' lines: how often its completion returned (``c``) and
    how often it was processed (``p``)."""
    return (Counter(k for r in records if "c" in r for k in r["c"]),
            Counter(k for r in records if "p" in r for k in r["p"]))


def _error_summary(records: list[dict[str, Any]]) -> tuple[Counter[str], list[dict[str, Any]]]:
    errors = [r for r in records if "err" in r]
    return Counter(r["err"] for r in errors), [r for r in errors if not r["ct"]]


def _report(line: str) -> None:
    print(line)
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _restart_plan(server: ThrowawayServer, proxy: FaultProxy) -> list[Callable[[], Any]]:
    server.restarts.clear()  # the server is shared by the module's tests; count this test's only
    clean, brutal = server.restart_modes
    return [lambda: server.restart(clean), proxy.cut_all, lambda: server.restart(brutal)]


@pytest.mark.timeout(420)
def test_drain_survives_restarts_and_cut_commits(server: ThrowawayServer, proxy: FaultProxy, tmp_path: Path) -> None:
    namespace = f"f_{uuid.uuid4().hex[:10]}"
    name = f"ev_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(server.url(), namespace=namespace)
    ct.install()
    md = MetaData()
    table = Table(name, md, Column("id", Integer, primary_key=True, autoincrement=False),
                  Column("payload", String(100), nullable=False))
    md.create_all(ct.engine)
    with ct.engine.begin() as conn:
        for start in range(0, EVENTS, 5000):
            conn.execute(insert(table), [{"id": k, "payload": f"event {k}"} for k in range(start, start + 5000)])
    ev = ct.events(name, key="id")
    ev.prepare()

    proxy.cut_commit_every = CUT_EVERY["drain"]
    stop = tmp_path / "stop"
    logs = [tmp_path / f"drain-{i}.jsonl" for i in range(DRAIN_WORKERS)]
    procs = [
        _spawn("drain", server.url(proxy.port), namespace, name, f"w{i}", str(logs[i]), str(stop),
               *(["--chain"] if i % 2 else []))
        for i in range(DRAIN_WORKERS)
    ]
    plan = _restart_plan(server, proxy)
    thresholds = [EVENTS // 5, EVENTS * 2 // 5, EVENTS * 3 // 5]
    started = time.monotonic()
    try:
        stats = None
        while time.monotonic() - started < 300:
            stats = _retry(ev.stats)
            while plan and stats.done >= thresholds[0]:
                thresholds.pop(0)
                plan.pop(0)()
            if stats.done == EVENTS or all(p.poll() is not None for p in procs):
                break
            time.sleep(0.25)
    finally:
        tails = _finish(procs, stop)
    elapsed = time.monotonic() - started

    records = _read(logs)
    completed, processed = _drained(records)
    errors, foreign = _error_summary(records)
    final = _retry(ev.stats)
    twice = sum(1 for n in processed.values() if n > 1)
    _report(
        f"faults drain {server.kind}: {EVENTS} events, {elapsed:.1f} s, restarts {[m for m, _ in server.restarts]}, "
        f"commits {proxy.stats.commits}, cut {proxy.stats.cuts}, refused {proxy.stats.refused}; "
        f"completed twice {sum(1 for n in completed.values() if n > 1)}, processed twice {twice}, "
        f"final {final.as_dict()}; worker exceptions {dict(errors)}"
    )
    ct.close()
    assert len(server.restarts) == 2 and not plan, f"the restarts did not all happen: {server.restarts}"
    assert proxy.stats.cuts["before"] >= 2 and proxy.stats.cuts["after"] >= 2, proxy.stats
    assert not foreign, f"exceptions that are not ControlTableErrors reached the workers: {foreign[:5]}"
    assert all(p.returncode == 0 for p in procs), f"a worker failed: {tails}"
    assert [k for k, n in completed.items() if n > 1] == [], "an event was completed twice"
    assert (final.done, final.pending, final.claimed, final.error) == (EVENTS, 0, 0, 0), (
        f"events lost or stuck: {final.as_dict()}"
    )
    # Completions a worker never heard of (lost reply) are done in the table but not in a log.
    assert set(completed) <= set(range(EVENTS)) and set(processed) == set(range(EVENTS))


@pytest.mark.timeout(420)
def test_slots_survive_restarts_and_cut_commits(server: ThrowawayServer, proxy: FaultProxy, tmp_path: Path) -> None:
    namespace = f"f_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(server.url(), namespace=namespace)
    ct.install()
    capacities = {"cap1": 1, "cap3": 3}
    for resource, cap in capacities.items():
        ct.set_capacity(resource, cap)

    proxy.cut_commit_every = CUT_EVERY["slots"]
    stop = tmp_path / "stop"
    logs = [tmp_path / f"slots-{i}.jsonl" for i in range(SLOT_WORKERS)]
    procs = [_spawn("slots", server.url(proxy.port), namespace, f"s{i}", str(1000 + i), str(logs[i]), str(stop),
                    "--meet")
             for i in range(SLOT_WORKERS)]
    plan = _restart_plan(server, proxy)
    thresholds = [40, 100, 160]
    after_last = 80  # holds needed after the last fault: the workers recovered
    started = time.monotonic()
    holds = mark = 0
    try:
        while time.monotonic() - started < 200:
            holds = sum(1 for r in _read(logs) if "iv" in r)
            while plan and holds >= thresholds[0]:
                thresholds.pop(0)
                plan.pop(0)()
                mark = holds
            if not plan and holds >= mark + after_last:
                break
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
    finally:
        tails = _finish(procs, stop)
    elapsed = time.monotonic() - started

    records = _read(logs)
    intervals = [checks.Interval(**r["iv"]) for r in records if "iv" in r]
    problems = checks.violations(intervals, capacities)
    errors, foreign = _error_summary(records)
    peak_used, peak_holders = checks.peak_usage([iv for iv in intervals if iv.resource == "cap3"])
    # Stuck: once every lease has run out, nothing may remain held or queued.
    time.sleep(4.5)
    _retry(ct.reap)
    left = _retry(lambda: [(s.name, len(s.holders), len(s.waiters)) for s in ct.status()])
    _report(
        f"faults slots {server.kind}: {len(intervals)} holds, {elapsed:.1f} s, restarts "
        f"{[m for m, _ in server.restarts]}, commits {proxy.stats.commits}, cut {proxy.stats.cuts}, "
        f"violations {len(problems)}, cap3 peak {peak_used} slots / {peak_holders} holders; "
        f"worker exceptions {dict(errors)}"
    )
    ct.close()
    assert len(server.restarts) == 2 and not plan, f"the restarts did not all happen: {server.restarts}"
    assert proxy.stats.cuts["before"] >= 2 and proxy.stats.cuts["after"] >= 2, proxy.stats
    assert not foreign, f"exceptions that are not ControlTableErrors reached the workers: {foreign[:5]}"
    assert all(p.returncode == 0 for p in procs), f"a worker failed: {tails}"
    assert problems == [], problems[:10]
    # Holders, not slots: one holder of two slots alone would pass a check on slots in use.
    assert peak_holders > 1, "shared holders never overlapped: the capacity check proved nothing"
    assert all(h == 0 and w == 0 for _, h, w in left), f"slots stuck after every lease ran out: {left}"
