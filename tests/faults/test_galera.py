"""MariaDB Galera, live: a three-node cluster started by the test, workers on every node, one node killed and rejoined.

On Galera, row locks are local to a node: ``SELECT ... FOR UPDATE`` on node B does not wait for
node A, and the loser of a conflict learns it at COMMIT (certification failure, error 1213) or
when a replicated write aborts it (brute-force abort, also 1213). The engines stay correct
because every decision writes the row it was made under (the resource row's counters, the
work-list row, the claimed event rows), so two conflicting decisions on two nodes cannot both
certify; the loser's transaction was not applied and ``Database.run`` runs it again.

Checked, with worker processes connected to different nodes (``fault_workers.py``) while node 2 is
SIGKILLed and later rejoins by state transfer:

* slots: no capacity, exclusivity or FIFO violation among the holds confirmed at their end;
* events: no event completed twice, none lost, none stuck;
* every exception a worker saw is a ControlTableError (never a raw driver error);
* printed: the drain's throughput on the cluster against one MariaDB server, same run, same workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from support.required import fail_or_skip

from controltable import ControlTable, checks

from .galera import GaleraCluster, galera_missing
from .servers import ThrowawayMariaDB
from .test_faults import _drained, _error_summary, _finish, _read, _report, _retry

pytestmark = [pytest.mark.faults]

WORKERS = Path(__file__).with_name("fault_workers.py")
CAPACITIES = {"cap1": 1, "cap3": 3}
EVENTS = 6000
THROUGHPUT_EVENTS = 3000


@pytest.fixture(scope="module")
def cluster() -> Iterator[GaleraCluster]:
    missing = galera_missing()
    if missing:
        fail_or_skip(missing, "galera")
    c = GaleraCluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, str(WORKERS), *args], env=env, stderr=subprocess.PIPE)


def _events(ct: ControlTable, count: int) -> str:
    name = f"ev_{uuid.uuid4().hex[:10]}"
    md = MetaData()
    table = Table(name, md, Column("id", Integer, primary_key=True, autoincrement=False),
                  Column("payload", String(100), nullable=False))
    md.create_all(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"id": k, "payload": f"event {k}"} for k in range(count)])
    ct.events(name, key="id").prepare()
    return name


def _kill_and_rejoin(cluster: GaleraCluster, wait_before: float = 0.0) -> float:
    """Kill node 2 (SIGKILL), leave it down a moment, start it again; returns its rejoin time.

    Write conflicts are counted on nodes 0 and 1 only: a restarted node's counters start over."""
    node = cluster.nodes[2]
    cluster.kill_node(node)
    time.sleep(max(wait_before, 1.0))
    started = time.monotonic()
    cluster.start_node(node)
    return time.monotonic() - started


@pytest.mark.timeout(240)
def test_galera_slots_never_exceed_capacity_with_workers_on_every_node(cluster: GaleraCluster, tmp_path: Path) -> None:
    namespace = f"g_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(cluster.nodes[0].url(), namespace=namespace)
    ct.install()
    conflicts_before = cluster.conflicts(cluster.nodes[:2])
    for resource, cap in CAPACITIES.items():
        ct.set_capacity(resource, cap)
    stop = tmp_path / "stop"
    logs = [tmp_path / f"slots-{i}.jsonl" for i in range(6)]
    procs = [_spawn("slots", cluster.nodes[i % 3].url(), namespace, f"s{i}", str(200 + i), str(log), str(stop),
                    "--meet")
             for i, log in enumerate(logs)]
    started = time.monotonic()
    rejoin = 0.0
    try:
        deadline = time.monotonic() + 150
        while sum(1 for r in _read(logs) if "iv" in r) < 60:
            assert time.monotonic() < deadline, "the fleet made no progress before the node was killed"
            time.sleep(0.3)
        rejoin = _kill_and_rejoin(cluster, wait_before=2.0)
        mark = sum(1 for r in _read(logs) if "iv" in r)
        while sum(1 for r in _read(logs) if "iv" in r) < mark + 60:
            assert time.monotonic() < deadline, "the fleet made no progress after the node rejoined"
            time.sleep(0.3)
    finally:
        tails = _finish(procs, stop)
    elapsed = time.monotonic() - started
    records = _read(logs)
    intervals = [checks.Interval(**r["iv"]) for r in records if "iv" in r]
    problems = checks.violations(intervals, CAPACITIES)
    peak, peak_holders = checks.peak_usage([iv for iv in intervals if iv.resource == "cap3"])
    errors, foreign = _error_summary(records)
    per_node = Counter(int(iv.worker[1:]) % 3 for iv in intervals)
    conflicts = cluster.conflicts(cluster.nodes[:2]) - conflicts_before
    ct.close()
    _report(f"galera slots: {len(intervals)} holds in {elapsed:.1f} s (per node {dict(sorted(per_node.items()))}), "
            f"node 2 killed and rejoined in {rejoin:.1f} s; violations {len(problems)}, "
            f"cap3 peak {peak} slots / {peak_holders} holders, "
            f"write conflicts between nodes (rolled back, retried) {conflicts}; worker exceptions {dict(errors)}")
    assert not foreign, f"exceptions that are not ControlTableErrors reached the workers: {foreign[:5]}"
    assert all(p.returncode == 0 for p in procs), f"a worker failed: {tails}"
    assert problems == [], problems[:10]
    assert len(per_node) == 3, "holds were not made through every node"
    assert conflicts > 0, "no write conflict between nodes: the run did not test certification"
    # Holders, not slots: one holder of two slots alone would pass a check on slots in use.
    assert peak_holders > 1, "shared holders never overlapped: the capacity check proved nothing"


def _drain(url_of: list[str], namespace: str, name: str, tmp_path: Path, tag: str,
           ) -> tuple[list[subprocess.Popen[bytes]], list[Path], Path]:
    stop = tmp_path / f"stop-{tag}"
    logs = [tmp_path / f"drain-{tag}-{i}.jsonl" for i in range(len(url_of))]
    procs = [_spawn("drain", url, namespace, name, f"{tag}{i}", str(log), str(stop), "--size", "20",
                    *(["--chain"] if i % 2 else []))
             for i, (url, log) in enumerate(zip(url_of, logs))]
    return procs, logs, stop


@pytest.mark.timeout(240)
def test_galera_drain_completes_each_event_once_across_a_node_kill(cluster: GaleraCluster, tmp_path: Path) -> None:
    namespace = f"g_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(cluster.nodes[0].url(), namespace=namespace)
    ct.install()
    name = _events(ct, EVENTS)
    ev = ct.events(name, key="id")
    conflicts_before = cluster.conflicts(cluster.nodes[:2])
    procs, logs, stop = _drain([n.url() for n in cluster.nodes] * 2, namespace, name, tmp_path, "d")
    started = time.monotonic()
    rejoin = 0.0
    try:
        deadline = time.monotonic() + 180
        while _retry(ev.stats).done < EVENTS // 4:
            assert time.monotonic() < deadline, "the drain made no progress"
            time.sleep(0.3)
        rejoin = _kill_and_rejoin(cluster)
        while _retry(ev.stats).done < EVENTS and any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, f"the drain did not finish: {_retry(ev.stats).as_dict()}"
            time.sleep(0.3)
    finally:
        tails = _finish(procs, stop)
    elapsed = time.monotonic() - started
    records = _read(logs)
    completed, processed = _drained(records)
    errors, foreign = _error_summary(records)
    final = _retry(ev.stats)
    conflicts = cluster.conflicts(cluster.nodes[:2]) - conflicts_before
    ct.close()
    twice = [k for k, n in completed.items() if n > 1]
    _report(f"galera drain: {EVENTS} events in {elapsed:.1f} s, node 2 killed and rejoined in {rejoin:.1f} s; "
            f"write conflicts between nodes {conflicts}; "
            f"completed twice {len(twice)}, processed twice {sum(1 for n in processed.values() if n > 1)}, "
            f"lost {EVENTS - final.done}, final {final.as_dict()}; worker exceptions {dict(errors)}")
    assert not foreign, f"exceptions that are not ControlTableErrors reached the workers: {foreign[:5]}"
    assert all(p.returncode == 0 for p in procs), f"a worker failed: {tails}"
    assert twice == [], f"events completed twice: {twice[:10]}"
    assert (final.done, final.pending, final.claimed, final.error) == (EVENTS, 0, 0, 0), final.as_dict()
    assert set(processed) == set(range(EVENTS))
    assert conflicts > 0, "no write conflict between nodes: the run did not test certification"


def _timed_drain(urls: list[str], tmp_path: Path, tag: str) -> float:
    """Events per second for THROUGHPUT_EVENTS events drained by one worker per URL."""
    namespace = f"g_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(urls[0], namespace=namespace)
    ct.install()
    name = _events(ct, THROUGHPUT_EVENTS)
    ev = ct.events(name, key="id")
    procs, _, stop = _drain(urls, namespace, name, tmp_path, tag)
    started = time.monotonic()
    try:
        while _retry(ev.stats).done < THROUGHPUT_EVENTS:
            assert time.monotonic() - started < 120, f"the {tag} drain did not finish"
            time.sleep(0.1)
        elapsed = time.monotonic() - started
    finally:
        _finish(procs, stop)
        ct.close()
    return THROUGHPUT_EVENTS / elapsed


@pytest.mark.timeout(240)
def test_galera_drain_throughput_against_one_server(cluster: GaleraCluster, tmp_path: Path) -> None:
    galera = _timed_drain([n.url() for n in cluster.nodes], tmp_path, "g")
    single = ThrowawayMariaDB()
    try:
        single.start()
        one = _timed_drain([single.url()] * 3, tmp_path, "m")
    finally:
        single.close()
    _report(f"galera drain throughput: {galera:.0f} events/s on 3 nodes (one worker each) against "
            f"{one:.0f} events/s on one MariaDB (3 workers), ratio {galera / one:.2f}")
    assert galera > 0 and one > 0
