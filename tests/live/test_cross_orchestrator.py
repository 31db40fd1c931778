"""The same slot, whoever starts the work: Airflow, Dagster, Prefect and ``controltable run`` on one resource at once.

Issue 36's cross-orchestrator test. Three deployments run side by side, as their users run them, on
one throwaway PostgreSQL (``support/throwaway.py``: their daemons' connections stay off the shared
server) that also holds the control table:

- Airflow 3 (scheduler, triggerer, dag-processor, api-server; ``tests/airflow/live_airflow.py``): the
  ``ct_live_slot`` DAG of the live Airflow tests, whose task defers to the triggerer while it waits;
- Dagster (code server, daemon, webserver; ``tests/dagster/ct_dagster_live``): the ``hold_job`` of the
  live Dagster tests, queued runs launched by the daemon;
- Prefect 3 (server, process work pool and worker; ``tests/prefect/live_prefect.py``), under its own
  interpreter (``.venv-prefect``: Prefect pins FastAPI versions Airflow cannot use): the ``hold``
  flow of the live Prefect tests;
- ``controltable run`` processes the test starts, whose command (``cli_hold.py``) is the work.

Each participant records the interval it held the slot itself, the way its own live test does
(Airflow: a row in a table beside the control table; Dagster, Prefect and the CLI: a file per
hold), measured inside the hold on this host's clock.

Per capacity (1, then 2) the test holds the whole resource, then submits work in rounds, one item
per participant a round, and waits until ``status()`` shows the round's four items queued before
the next round starts (synchronised on the queue, never on a sleep), so the queue interleaves the
orchestrators. It reads the queue, releases the resource and waits for every item to end. Then:

- every item ended well and recorded exactly one hold, with the token the grant history gave it;
- the interval checker (``controltable.checks.violations``, the one the live tests use) finds no
  use beyond the capacity, and tokens follow the queue's order (FIFO across orchestrators: the
  queue position is the ticket);
- tokens strictly increase in grant order (the grant history, database clock), and at capacity 1
  in the order the holds started too;
- every participant was granted while another participant's work waited in the queue (from the
  grant history: a grant made after another's request was queued and before it was granted);
- nothing holds or waits on the resource afterwards.

Times are hang detectors only (several times what a step takes on a loaded two-core machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
from ct_dagster_live.harness import STORAGE_SCHEME, Deployment, ThrowawayDatabase
from live_airflow import LiveAirflow, live_intervals
from live_prefect import PrefectDeployment
from sqlalchemy import select
from support.live import deployment_postgres_url, wait_until
from support.required import fail_or_skip

from controltable import ControlTable
from controltable.checks import Interval, peak_usage, violations

pytestmark = [pytest.mark.timeout(3600)]  # a hang detector for the whole test, its own waits' ones inside

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
AIRFLOW_DAGS = TESTS / "airflow" / "dags" / "ct_live_dags.py"
PREFECT_FLOWS = TESTS / "prefect" / "live_flows"
PARTICIPANTS = ("airflow", "dagster", "prefect", "cli")
#: Rounds of one item per participant: with two, each participant's first item is granted while the
#: second round of every other participant waits behind it.
ROUNDS = 2
#: How long each item works inside its hold (seconds).
WORK = 1.5
#: Hang detectors: starting the three deployments at once (a few minutes on a loaded machine), an item
#: reaching the queue (an Airflow task scheduled, started and deferred; a Prefect flow run picked up by
#: the worker's poll and started; well under a minute quiet, minutes in a loaded CI run), every item
#: ending after the release.
START_HANG = 900.0
QUEUE_HANG = 600.0
END_HANG = 900.0


def prefect_python() -> str:
    """The interpreter Prefect is installed in: CONTROLTABLE_TEST_PREFECT_PYTHON, else ``.venv-prefect``
    beside this interpreter's venv (as ``scripts/run-tests`` lays them out)."""
    configured = os.environ.get("CONTROLTABLE_TEST_PREFECT_PYTHON")
    # Absolute (the deployment runs it from its own folder), but not resolved: a venv's python is a
    # symlink whose target is the base interpreter, without the venv's packages.
    default = Path(sys.prefix).parent / ".venv-prefect" / "bin" / "python"
    path = Path(os.path.abspath(configured)) if configured else default
    if not path.exists():
        fail_or_skip(f"the cross-orchestrator test needs Prefect's interpreter, and {path} is missing "
                     "(set CONTROLTABLE_TEST_PREFECT_PYTHON, or `make .venv-prefect/.installed`)", "prefect")
    return str(path)


@dataclass
class Cross:
    """The three deployments, the control table they share and where the work records its holds."""

    ct: ControlTable
    url: str
    airflow: LiveAirflow
    dagster: Deployment
    prefect: PrefectDeployment
    records: dict[str, Path]
    cli: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def diagnostics(self) -> str:
        parts = [self.airflow.diagnostics(3000)]
        parts += [f"--- dagster {name}.log\n{self.dagster.log_tail(name, 2000)}" for name in ("daemon", "grpc")]
        parts += [f"--- prefect {name}.log\n{self.prefect.log_tail(name, 2000)}" for name in self.prefect.procs]
        return "\n".join(parts)


@pytest.fixture(scope="module")
def cross() -> Iterator[Cross]:
    python = prefect_python()
    url = deployment_postgres_url("the cross-orchestrator test (deployments and control table)")
    namespace = f"cross_{uuid.uuid4().hex[:10]}"
    # Folders of its own, not pytest's basetemp (another pytest session may clean that meanwhile).
    scratch = Path(tempfile.mkdtemp(prefix="ct-cross-"))
    records = {name: scratch / "records" / name for name in ("dagster", "prefect", "cli")}
    for folder in records.values():
        folder.mkdir(parents=True)
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    intervals = live_intervals(namespace)  # where the Airflow DAG records its loads
    intervals.create(ct.engine)
    airflow = LiveAirflow(server_url=url, control_url=url, namespace=namespace, dag_files=[AIRFLOW_DAGS])
    storage = ThrowawayDatabase(url, "cross")
    dagster = Deployment(scratch / "dagster_home", storage.url(STORAGE_SCHEME),
                         {"CONTROLTABLE_URL": url, "CONTROLTABLE_NAMESPACE": namespace,
                          "LIVE_RECORDS": str(records["dagster"])})
    prefect = PrefectDeployment(scratch / "prefect_home", python=python,
                                env={"LIVE_BLOCK": "cross", "LIVE_RECORDS": str(records["prefect"])},
                                pythonpath=(str(ROOT / "core" / "src"), str(ROOT / "prefect_plugin" / "src")))
    state = Cross(ct, url, airflow, dagster, prefect, records)

    def start_airflow() -> None:
        airflow.start(timeout=START_HANG)
        airflow.wait_for_dags(["ct_live_slot"], START_HANG)

    def start_prefect() -> None:
        prefect.start()
        prefect.save_block("cross", url=url, namespace=namespace, default_lease=30.0)
        prefect.deploy(PREFECT_FLOWS, {"hold": "flows.py:hold"})

    starts: dict[str, Callable[[], None]] = {
        "airflow": start_airflow, "dagster": lambda: dagster.start(timeout=START_HANG), "prefect": start_prefect}
    try:
        began = time.monotonic()
        # The three start side by side: most of their start is spent waiting on migrations and imports.
        with ThreadPoolExecutor(len(starts)) as pool:
            futures = {name: pool.submit(start) for name, start in starts.items()}
            failed = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
        if failed:
            raise AssertionError(f"a deployment did not start: {failed}\n{state.diagnostics()}")
        print(f"\nAirflow, Dagster and Prefect deployments started in {time.monotonic() - began:.0f} s")
        yield state
    finally:
        for proc in state.cli:  # `controltable run` processes still running (a failed test): by PID
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for deployment in (prefect, dagster, airflow):
            deployment.stop()
        storage.drop()
        intervals.drop(ct.engine, checkfirst=True)
        ct.close()
        if not os.environ.get("CT_LIVE_KEEP_HOME"):
            shutil.rmtree(scratch, ignore_errors=True)


# -- the work ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One piece of work a participant was asked to do: its run id (or CLI name) and its holder's prefix."""

    who: str
    key: str
    prefix: str


def submit(cross: Cross, who: str, resource: str, n: int) -> Item:
    """Start one item of ``who`` on ``resource``, the way that orchestrator's users start work."""
    if who == "airflow":
        run_id = cross.airflow.trigger("ct_live_slot", {"resource": resource, "seconds": WORK},
                                       run_id=f"cross_{resource}_{n}_{uuid.uuid4().hex[:6]}")
        return Item(who, run_id, f"airflow:ct_live_slot:{run_id}:")
    if who == "dagster":
        run_id = cross.dagster.submit("hold_job", {"resource": resource, "hold": WORK})
        return Item(who, run_id, f"dagster:{run_id}:")
    if who == "prefect":
        run_id = cross.prefect.submit("hold", resource=resource, seconds=WORK)
        return Item(who, run_id, f"prefect:{run_id}")
    name = f"{resource}_{n}"
    holder = f"cli:{name}"
    log = open(cross.records["cli"] / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps its own copy
    with log:
        # The URL in the environment, as a cron job would set it (never on a command line: it may hold a password).
        cross.cli.append(subprocess.Popen(
            [str(Path(sys.executable).with_name("controltable")), "run", "--resource", resource, "--holder", holder,
             "--lease", "30", "--", sys.executable, str(HERE / "cli_hold.py"), str(cross.records["cli"]), name,
             str(WORK)],
            env={**os.environ, "CONTROLTABLE_URL": cross.url, "CONTROLTABLE_NAMESPACE": cross.ct.namespace},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return Item(who, name, holder)


def queue(ct: ControlTable, resource: str) -> tuple[list[str], list[str]]:
    """(holders, waiters in queue order) of ``resource``."""
    (st,) = ct.status([resource])
    return [h.holder for h in st.holders], [w.holder for w in sorted(st.waiters, key=lambda w: w.position)]


def queued_as(item: Item, waiters: list[str]) -> Optional[str]:
    found = [w for w in waiters if w == item.prefix or w.startswith(item.prefix)]
    assert len(found) <= 1, f"{item} is queued twice: {found}"
    return found[0] if found else None


def wait_ended(cross: Cross, items: list[Item]) -> None:
    """Every item ended well (each harness's own wait, bounded by END_HANG)."""
    keys = {who: [i.key for i in items if i.who == who] for who in PARTICIPANTS}
    states = cross.airflow.wait_for_runs("ct_live_slot", keys["airflow"], END_HANG)
    assert set(states.values()) == {"success"}, [cross.airflow.task_logs("ct_live_slot", r) for r in keys["airflow"]]
    cross.dagster.wait_for_runs(keys["dagster"], {"SUCCESS"}, END_HANG)
    cross.prefect.wait_for_runs(keys["prefect"], {"COMPLETED"}, END_HANG)
    for proc in cross.cli:
        code = proc.wait(END_HANG)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in cross.records["cli"].glob("*.log")}
        assert code == 0, f"`controltable run` (pid {proc.pid}) exited {code}: {logs}"
    cross.cli.clear()


@dataclass(frozen=True)
class Hold:
    """One hold as the work recorded it (this host's clock)."""

    item: Item
    token: int
    start: float
    end: float


def recorded(cross: Cross, items: list[Item]) -> list[Hold]:
    """Each item's hold from its own record: the Airflow DAG's table row, the others' files."""
    holds: list[Hold] = []
    airflow = {i.key: i for i in items if i.who == "airflow"}
    table = live_intervals(cross.ct.namespace)
    with cross.ct.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(table).where(table.c.run_id.in_(list(airflow))))]
    assert sorted(r["run_id"] for r in rows) == sorted(airflow), f"each Airflow load recorded exactly once: {rows}"
    for r in rows:
        assert r["closed"], f"the Airflow load of {r['run_id']} did not end its record: {r}"
        holds.append(Hold(airflow[r["run_id"]], int(r["token"]), r["started"], r["finished"]))
    files = {"dagster": "held_{}_hold.json", "prefect": "held_{}.json", "cli": "held_{}.json"}
    for item in items:
        if item.who == "airflow":
            continue
        path = cross.records[item.who] / files[item.who].format(item.key)
        assert path.exists(), f"{item.who} item {item.key} ended well but left no record of its hold"
        record = json.loads(path.read_text())
        assert record["holder"].startswith(item.prefix), (item, record)
        holds.append(Hold(item, int(record["token"]), record["start"], record["end"]))
    return holds


# -- the test ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [1, 2])
def test_one_resource_from_four_orchestrators_at_once(cross: Cross, capacity: int) -> None:
    ct = cross.ct
    resource = f"cross{capacity}"
    ct.set_capacity(resource, capacity)
    blocker = ct.acquire(resource, holder="test:blocker", slots=capacity, lease=3600, timeout=0)
    began = time.monotonic()
    items: list[Item] = []
    for n in range(ROUNDS):
        batch = [submit(cross, who, resource, n) for who in PARTICIPANTS]
        items += batch

        def round_queued(batch: list[Item] = batch) -> bool:
            return all(queued_as(i, queue(ct, resource)[1]) for i in batch)

        wait_until(round_queued, QUEUE_HANG, f"round {n + 1}'s four items to show in the queue of {resource!r}",
                   interval=0.2, state=lambda: f"{queue(ct, resource)}\n{cross.diagnostics()}")
    holders, waiters = queue(ct, resource)
    assert holders == ["test:blocker"], holders
    holder_of = {w: i for i in items for w in [queued_as(i, waiters)] if w is not None}  # holder -> item
    assert len(waiters) == len(items) == len(holder_of), (waiters, items)
    # The queue's order: the FIFO order every grant must follow, whoever queued.
    position = {i: waiters.index(w) for w, i in holder_of.items()}
    queued_after = time.monotonic() - began
    print(f"\n{resource}: queue (capacity {capacity}) after {queued_after:.0f} s: "
          + ", ".join(f"{position[i]}:{i.who}" for i in sorted(items, key=position.__getitem__)))

    released = time.monotonic()
    blocker.release()
    wait_ended(cross, items)
    ran = time.monotonic() - released

    holds = recorded(cross, items)
    # The control table's own account, on the database clock: each item granted exactly once.
    history = [g for g in ct.history(resource) if g.holder in holder_of]
    assert sorted(g.holder for g in history) == sorted(holder_of), "an item was granted twice or never"
    grants = sorted(history, key=lambda g: (g.granted_at, g.token))
    granted_token = {holder_of[g.holder]: g.token for g in grants}
    assert {h.item: h.token for h in holds} == granted_token, "the work's tokens are not the ones granted"

    # The interval checker: capacity never exceeded, and grants (tokens) in queue (ticket) order.
    intervals = [Interval(worker=f"{h.item.who}:{h.item.key}", resource=resource, mode="shared", slots=1,
                          start=h.start, end=h.end, ticket=position[h.item], token=h.token) for h in holds]
    problems = violations(intervals, {resource: capacity})
    assert problems == [], problems
    tokens = [g.token for g in grants]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), f"tokens out of grant order: {tokens}"
    by_start = [h.token for h in sorted(holds, key=lambda h: h.start)]
    if capacity == 1:
        assert by_start == sorted(by_start), f"at capacity 1 the holds started out of token order: {by_start}"

    # Every participant was granted while another participant's request waited in the queue.
    def granted_while_others_waited(who: str) -> bool:
        return any(g.granted_at > h.enqueued_at and g.granted_at < h.granted_at
                   for g in grants if holder_of[g.holder].who == who
                   for h in grants if holder_of[h.holder].who != who)

    lonely = [who for who in PARTICIPANTS if not granted_while_others_waited(who)]
    assert not lonely, f"granted only while no other orchestrator waited: {lonely}"
    assert queue(ct, resource) == ([], []), "something still holds or waits after every item ended"

    counts = Counter(holder_of[g.holder].who for g in grants)
    peak, _ = peak_usage(intervals)
    order = sorted(holds, key=lambda h: h.start)
    gaps = [f"{a.item.who}->{b.item.who} {b.start - a.end:+.1f}" for a, b in zip(order, order[1:])]
    print(f"{resource}: {len(holds)} holds in {ran:.0f} s after the release ({time.monotonic() - began:.0f} s in "
          f"all); grants per participant {dict(counts)}; overlaps beyond capacity {len(problems)}; peak "
          f"{peak}/{capacity} at once; tokens in grant order {tokens}\n{resource}: gaps between holds (s): "
          + ", ".join(gaps))
