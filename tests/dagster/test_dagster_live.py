"""The integration in a running Dagster deployment: daemon, queued runs, GraphQL, PostgreSQL storage.

Two Dagster instances (each its own DAGSTER_HOME and throwaway storage database, code server,
daemon and webserver; see ``ct_dagster_live/harness.py``) share one control table on PostgreSQL. Runs are
launched and terminated through GraphQL and checked from their own records (intervals written
inside the hold) and the control table:

- six queued runs on a capacity-1 slot never overlap, and their tokens follow grant order;
- terminating a holding run and a waiting run frees the slot and the queue place at once, in
  both wait modes; a retry-mode waiter of the multiprocess executor leaves the queue within 2 s
  (the watcher its step left behind);
- a SIGKILLed run worker's orphaned step stops renewing, so the slot comes back within the lease;
- the events sensor with producers inserting: every event done exactly once, one run per backlog;
- the second instance's runs and the first's never overlap on the shared slot.

Runs on a throwaway PostgreSQL (``support/throwaway.py``: the daemons' connections stay off the shared
server): skipped without its binaries, a failure when CONTROLTABLE_TEST_REQUIRE names postgres.
Bounded to a few minutes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ct_dagster_live.harness import STORAGE_SCHEME, Deployment, ThrowawayDatabase, create_event_tables, wait_until
from sqlalchemy import MetaData, Table, func, insert, select
from support.live import deployment_postgres_url, parent_of, wait_for_file

from controltable import ControlTable
from controltable.checks import Interval, violations
from dagster_controltable import retry_watch

pytestmark = [pytest.mark.timeout(900)]

#: Hang detector for a terminated run's queue place and slot to go (the goal is 2 s). Its requests
#: would otherwise last at least half of TERMINATED_EXPIRY (a lease or queue entry renewed at half its
#: length), so their going within it is the termination handling's doing (the run's own withdrawal or
#: the cleanup sensor), not expiry.
TERMINATE_HANG = 120.0
TERMINATED_EXPIRY = 600.0
#: Hang detector: a SIGKILLed run worker's orphaned step letting its 6 s lease go.
ORPHAN_HANG = 120.0


@pytest.fixture(scope="module")
def live_url() -> str:
    return deployment_postgres_url("the live Dagster tests (run storage)")


@pytest.fixture(scope="module")
def live(live_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The control table (own namespace), the event table, and the first deployment, started."""
    namespace = f"live_{uuid.uuid4().hex[:10]}"
    events = f"live_ev_{uuid.uuid4().hex[:8]}"
    records = tmp_path_factory.mktemp("live_records")
    ct = ControlTable(live_url, namespace=namespace)
    ct.install()
    create_event_tables(ct.engine, events)
    ct.events(events, key="id").prepare()
    env = {"CONTROLTABLE_URL": live_url, "CONTROLTABLE_NAMESPACE": namespace, "LIVE_RECORDS": str(records),
           "LIVE_EVENT_TABLE": events}
    state: dict[str, Any] = {"ct": ct, "env": env, "records": records, "events": events, "deployments": [],
                             "databases": [], "url": live_url, "orphans": []}
    try:
        state["one"] = _deploy(state, "one", tmp_path_factory, LIVE_EVENTS_SENSOR="1")
        yield state
    finally:
        for dep in state["deployments"]:
            dep.stop()
        for pid in state["orphans"]:  # step processes a test left running on purpose
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for db in state["databases"]:
            db.drop()
        with ct.engine.begin() as conn:
            for name in (f"{events}_log", events):
                Table(name, MetaData()).drop(conn, checkfirst=True)
        ct.close()


def _deploy(state: dict[str, Any], label: str, factory: pytest.TempPathFactory, **env: str) -> Deployment:
    db = ThrowawayDatabase(state["url"], label)
    state["databases"].append(db)
    dep = Deployment(factory.mktemp(f"dagster_home_{label}"), db.url(STORAGE_SCHEME), {**state["env"], **env})
    state["deployments"].append(dep)
    try:
        dep.start()
    except Exception:
        for name in dep.procs:
            print(f"--- {label} {name}.log\n{dep.log_tail(name)}")
        raise
    return dep


@pytest.fixture(scope="module")
def second(live: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    """Another Dagster instance (own DAGSTER_HOME and storage) on the same control table."""
    return _deploy(live, "two", tmp_path_factory)


def _held(live: dict[str, Any], run_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in Path(live["records"]).glob("held_*.json"):
        record = json.loads(path.read_text())
        if record["run_id"] in run_ids:
            out.append(record)
    return out


def _holding(live: dict[str, Any], run_id: str) -> dict[str, Any] | None:
    for path in Path(live["records"]).glob(f"holding_{run_id}_*.json"):
        return dict(json.loads(path.read_text()))
    return None


def _entries(ct: ControlTable, resource: str) -> tuple[list[str], list[str]]:
    (st,) = ct.status([resource])
    return [h.holder for h in st.holders], [w.holder for w in st.waiters]


def _check_intervals(records: list[dict[str, Any]], resource: str, capacity: int) -> None:
    intervals = [Interval(worker=r["holder"], resource=resource, mode=r["mode"], slots=r["slots"], start=r["start"],
                          end=r["end"], ticket=r["ticket"], token=r["token"]) for r in records]
    assert violations(intervals, {resource: capacity}) == []
    by_start = sorted(records, key=lambda r: r["start"])
    tokens = [r["token"] for r in by_start]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), f"tokens out of grant order: {tokens}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(")")[-1].split()[0] != "Z"


def _hold(resource: str, hold: float, **extra: Any) -> dict[str, Any]:
    """The hold op's config; an option given as None is left to the op's default."""
    return {"resource": resource, "hold": hold, **{k: v for k, v in extra.items() if v is not None}}


SENSOR_TICKS = """query { sensorsOrError(repositorySelector: {repositoryLocationName: "live",
                                                              repositoryName: "__repository__"}) {
    __typename ... on Sensors { results { name sensorState { status ticks(limit: 5) { status skipReason
                                                                                   error { message } } } } }
    ... on PythonError { message } } }"""


def test_webserver_and_daemon_run_on_the_postgres_storage(live: dict[str, Any]) -> None:
    """The supported storage URL: the webserver reads sensor state and ticks (schedule storage)."""
    dep: Deployment = live["one"]
    assert dep.storage_url.startswith(f"{STORAGE_SCHEME}://")
    query = SENSOR_TICKS

    def ticked() -> Any:
        result = dep.graphql(query)["sensorsOrError"]
        assert result["__typename"] == "Sensors", result
        states = {s["name"]: s["sensorState"] for s in result["results"]}
        return states if all(st["ticks"] for st in states.values()) else None

    states = wait_until(ticked, 120, "a tick of every sensor", interval=2.0)
    assert set(states) == {"controltable_run_cleanup", f"{live['events']}_pending_events"}
    for state in states.values():
        assert state["status"] == "RUNNING"
        assert all(t["status"] != "FAILURE" for t in state["ticks"]), state["ticks"]
    # A skipped tick of the events sensor says how many events are claimable and what the rest wait for.
    skipped = [t["skipReason"] for t in states[f"{live['events']}_pending_events"]["ticks"] if t["status"] == "SKIPPED"]
    assert all("claimable event(s)" in reason for reason in skipped), skipped


def test_six_queued_runs_on_a_capacity_one_slot(live: dict[str, Any]) -> None:
    ct: ControlTable = live["ct"]
    dep: Deployment = live["one"]
    ct.set_capacity("six", 1)
    runs = [dep.submit("hold_job", _hold("six", 1.0)) for _ in range(6)]
    dep.wait_for_runs(runs, {"SUCCESS"}, timeout=300)
    records = _held(live, runs)
    assert len(records) == 6
    _check_intervals(records, "six", 1)
    assert _entries(ct, "six") == ([], [])


@pytest.mark.parametrize("wait", ["block", "retry"])
def test_terminate_a_waiting_and_a_holding_run(live: dict[str, Any], wait: str) -> None:
    ct: ControlTable = live["ct"]
    dep: Deployment = live["one"]
    resource = f"term_{wait}"
    ct.set_capacity(resource, 1)
    # (between retries a place lives its retry interval and a margin: waiter_ttl must exceed the interval)
    config = _hold(resource, 300.0, wait=wait, retry_interval=TERMINATED_EXPIRY, lease=TERMINATED_EXPIRY,
                   waiter_ttl=TERMINATED_EXPIRY if wait == "block" else None)
    holder_run = dep.submit("hold_job", config)
    wait_until(lambda: _holding(live, holder_run), 120, "the first run to hold the slot")
    waiter_run = dep.submit("hold_job", config)
    wait_until(lambda: any(w.startswith(f"dagster:{waiter_run}:") for w in _entries(ct, resource)[1]), 120,
               "the second run to queue")
    if wait == "retry":  # the step has given up its worker and sits in the queue between retries
        wait_until(lambda: "STEP_UP_FOR_RETRY" in dep.run_logs([waiter_run]), 60, "the step's retry")
    # The waiting step's log says where it stands and behind whom (the holding run's step).
    where = f"'{resource}': position 1 behind dagster:{holder_run}:hold"
    wait_until(lambda: where in dep.run_logs([waiter_run], chars=1_000_000), 30,
               f"the waiting step's log line {where!r}")

    started = time.monotonic()
    dep.terminate(waiter_run)
    wait_until(lambda: not any(w.startswith(f"dagster:{waiter_run}:") for w in _entries(ct, resource)[1]),
               TERMINATE_HANG, "the waiting run's queue place to go (a hang)", interval=0.05)
    withdrawn_after = time.monotonic() - started
    assert _entries(ct, resource)[0] == [f"dagster:{holder_run}:hold"]

    started = time.monotonic()
    dep.terminate(holder_run)
    wait_until(lambda: _entries(ct, resource) == ([], []), TERMINATE_HANG,
               "the holding run's slot to be freed (a hang)", interval=0.05)
    freed_after = time.monotonic() - started
    dep.wait_for_runs([holder_run, waiter_run], {"CANCELED"}, timeout=120)
    print(f"{wait}: waiting run's place gone after {withdrawn_after:.2f} s, slot freed after {freed_after:.2f} s")
    print([line for line in dep.run_logs([waiter_run]).splitlines() if "withdrew" in line])


def test_retry_waiter_of_the_multiprocess_executor_leaves_the_queue_when_the_run_is_cancelled(
    live: dict[str, Any],
) -> None:
    """A step between retries has no process: the watcher it left behind (retry_watch) withdraws its
    place when the run is cancelled (the cleanup sensor is the backstop; here it runs every second,
    so either may be first: this test cannot tell them apart). Its place lives its retry interval
    (TERMINATED_EXPIRY) and a margin, so the place going within TERMINATE_HANG is the cancellation's
    doing, not expiry."""
    ct: ControlTable = live["ct"]
    dep: Deployment = live["one"]
    resource = "term_mp"
    ct.set_capacity(resource, 1)
    ct.acquire(resource, holder="shell:blocker", lease=300)
    config = _hold(resource, 1.0, wait="retry", retry_interval=TERMINATED_EXPIRY)  # its place: the interval + a margin
    run = dep.submit("hold_job_mp", config)
    wait_until(lambda: "STEP_UP_FOR_RETRY" in dep.run_logs([run]), 120, "the step's retry")
    (holder,) = [w for w in _entries(ct, resource)[1] if w.startswith(f"dagster:{run}:")]
    # The watcher process has started (it imports dagster, a few seconds on a loaded machine) and
    # watches the run: it says so in its ack file. From then on a cancel is seen within a tick.
    ack = retry_watch.ack_file(holder)
    wait_until(lambda: "ready" in wait_for_file(ack, 60, "the watcher's ack file", json.loads), 60,
               "the retry watcher to be ready", interval=0.05)
    started = time.monotonic()
    dep.terminate(run)
    wait_until(lambda: not _entries(ct, resource)[1], TERMINATE_HANG, "the place to be withdrawn (a hang)",
               interval=0.05)
    withdrawn_after = time.monotonic() - started
    dep.wait_for_runs([run], {"CANCELED"}, timeout=120)
    print(f"retry waiter of a multiprocess run withdrawn {withdrawn_after:.2f} s after terminateRun")
    ct.release(resource, "shell:blocker")


def test_sigkilled_run_worker_frees_the_slot_within_the_lease(live: dict[str, Any]) -> None:
    ct: ControlTable = live["ct"]
    dep: Deployment = live["one"]
    resource = "killed"
    lease = 6.0
    ct.set_capacity(resource, 1)
    run = dep.submit("hold_job_mp", _hold(resource, 300.0, lease=lease))
    holding = wait_until(lambda: _holding(live, run), 120, "the step to hold the slot")
    live["orphans"].append(holding["pid"])
    assert holding["ppid"] != holding["pid"]  # the multiprocess executor: the step runs in a child process
    os.kill(holding["ppid"], signal.SIGKILL)  # the run worker
    killed = time.monotonic()
    # Once the step process is re-parented its renewer starts no renewal (it checks getppid() before
    # each): the expiries seen from here on are this one and at most one renewal sent before.
    wait_until(lambda: parent_of(holding["pid"]) != holding["ppid"], 60, "the orphaned step to be re-parented (a hang)",
               interval=0.05)
    (st,) = ct.status([resource])
    expiries = {h.expires_at for h in st.holders}

    def back() -> bool:
        (st,) = ct.status([resource])
        expiries.update(h.expires_at for h in st.holders)
        return not st.holders

    # Back by the lease running out or by the cleanup sensor once the daemon marks the run failed; a
    # step that kept renewing would hold it as long as the cleanup sensor lets it (checked below).
    wait_until(back, ORPHAN_HANG, "the slot to come back (a hang)", interval=0.1)
    back_after = time.monotonic() - killed
    print(f"slot back {back_after:.2f} s after the run worker was killed (lease {lease:g} s); the orphaned step "
          f"renewed {len(expiries) - 1} time(s) after the kill; still running: {_alive(holding['pid'])}; run "
          f"{dep.status(run)}")
    if _orphan_detection():
        # the orphan stopped renewing: at most one renewal was already under way when it was re-parented
        assert len(expiries) <= 2, f"the orphaned step started a renewal after its parent was gone: {sorted(expiries)}"


def _orphan_detection() -> bool:
    import inspect

    from controltable.renewal import BackgroundRenewal

    return "stop_when_orphaned" in inspect.signature(BackgroundRenewal.start_renewing).parameters


def test_events_sensor_with_producers(live: dict[str, Any]) -> None:
    ct: ControlTable = live["ct"]
    dep: Deployment = live["one"]
    name = live["events"]
    table = Table(name, MetaData(), autoload_with=ct.engine)
    producers, per_producer = 3, 40

    def produce(n: int) -> None:
        for i in range(per_producer):
            with ct.engine.begin() as conn:
                conn.execute(insert(table), [{"id": n * 1000 + i, "payload": f"p{n}"}])
            time.sleep(0.15)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(1, producers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = producers * per_producer
    events = ct.events(name, key="id")
    try:
        wait_until(lambda: events.stats().done == total, 240, f"all {total} events done", interval=1.0)
    except AssertionError:
        from dagster import RunsFilter

        runs = [r.run_id for r in dep.instance.get_runs(filters=RunsFilter(job_name="drain_job"))]
        print(events.stats(), dep.graphql(SENSOR_TICKS), dep.run_logs(runs[:3]), dep.log_tail("daemon"))
        raise
    log = Table(f"{name}_log", MetaData(), autoload_with=ct.engine)
    with ct.engine.connect() as conn:
        counts = dict(conn.execute(select(log.c.event_id, func.count()).group_by(log.c.event_id)).all())
    assert len(counts) == total and set(counts.values()) == {1}, "an event was processed twice or never"

    from dagster import RunsFilter

    records = dep.instance.get_run_records(filters=RunsFilter(job_name="drain_job"))
    assert records, "the sensor requested no run"
    by_backlog: dict[str, list[Any]] = {}
    for r in records:
        by_backlog.setdefault(r.dagster_run.tags["controltable/backlog"], []).append(r)
    for backlog, rs in by_backlog.items():  # a backlog is requested again only once its run has ended
        spans = sorted((r.start_time or 0, r.end_time or time.time()) for r in rs)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"two runs at once for backlog {backlog}"
    keys = [r.dagster_run.tags.get("dagster/run_key") for r in records]
    assert len(keys) == len(set(keys))


def test_second_instance_shares_the_slot(live: dict[str, Any], second: Deployment) -> None:
    ct: ControlTable = live["ct"]
    one: Deployment = live["one"]
    ct.set_capacity("cross", 1)
    runs_one = [one.submit("hold_job", _hold("cross", 1.0)) for _ in range(3)]
    runs_two = [second.submit("hold_job", _hold("cross", 1.0)) for _ in range(3)]
    one.wait_for_runs(runs_one, {"SUCCESS"}, timeout=300)
    second.wait_for_runs(runs_two, {"SUCCESS"}, timeout=300)
    records = _held(live, runs_one + runs_two)
    assert len(records) == 6
    _check_intervals(records, "cross", 1)
