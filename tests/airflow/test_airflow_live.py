"""The provider in a running Airflow 3: scheduler, triggerer, dag-processor and api-server, LocalExecutor.

One deployment for the module (a throwaway metadata database, see ``live_airflow.py``, on a throwaway
PostgreSQL server with the control table, ``support/throwaway.py``: the daemons' connections stay off
the shared server).
Runs are triggered through the REST API; exclusion is checked from the intervals the loads record
themselves, task states from the metadata database, tokens and queues from the control table.
PostgreSQL's server binaries are needed; when CI requires PostgreSQL (``CONTROLTABLE_TEST_REQUIRE``),
their absence fails.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_airflow import LiveAirflow, live_intervals, state_mismatches
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import OperationalError
from support.live import deployment_postgres_url

from controltable import ControlTable
from controltable.checks import Interval, violations

pytestmark = pytest.mark.timeout(900)

DAGS = Path(__file__).resolve().parent / "dags" / "ct_live_dags.py"


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[LiveAirflow, ControlTable]]:
    url = deployment_postgres_url("the live Airflow tests (metadata database)")
    namespace = f"live_{uuid.uuid4().hex[:10]}"
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    intervals = intervals_table(ct)
    intervals.create(ct.engine, checkfirst=True)
    airflow = LiveAirflow(server_url=url, control_url=url, namespace=namespace, dag_files=[DAGS])
    try:
        airflow.start()
        airflow.wait_for_dags(["ct_live_slot", "ct_live_slot_deferred", "ct_live_slot_worker", "ct_live_sensor",
                               "ct_live_poison", "ct_live_pool", "ct_live_sql", "ct_live_sql_sensor"])
        yield airflow, ct
        lags = airflow.resume_lags()
        if lags:
            print(f"\ndeferral -> scheduler received the deferring process's exit, over {len(lags)} deferrals: "
                  f"p50 {statistics.median(lags):.2f} s, max {max(lags):.2f} s (a trigger firing sooner would "
                  "have let the scheduler fail the resumed task)")
    finally:
        airflow.stop()
        intervals.drop(ct.engine, checkfirst=True)
        ct.close()


@pytest.fixture(autouse=True)
def _scheduler_never_failed_a_resumed_task(
    request: pytest.FixtureRequest, live: tuple[LiveAirflow, ControlTable],
) -> Iterator[None]:
    """After each test: the scheduler failed no task as "finished but queued/running" (the deferral race).

    On a failed test, print the scheduler's and triggerer's logs (shown with the failure).
    """
    airflow, _ = live
    offset = airflow.log_size("scheduler")
    started = time.monotonic()
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"\n=== {request.node.name} failed after {time.monotonic() - started:.0f} s ===\n{airflow.diagnostics()}")
    mismatches = state_mismatches(airflow.log_since("scheduler", offset))
    assert not mismatches, "the scheduler failed a task it took for ended:\n" + "\n".join(mismatches) + \
        "\n" + airflow.diagnostics()


# -- helpers ---------------------------------------------------------------------------------------------
def intervals_table(ct: ControlTable) -> Table:
    return live_intervals(ct.namespace)


#: A load the test stops (its run marked failed): long enough that only the stop can end it, whatever
#: the deployment's pace (a 60 s load once left 50 s for the mark, the heartbeat and the kill).
LONG_LOAD = 600

#: The loads' progress stamp period (ct_live_dags.HEARTBEAT): a load that did not close its record
#: may have worked this long after its last stamp.
HEARTBEAT = 0.1


def recorded(ct: ControlTable, run_ids: list[str]) -> list[dict[str, Any]]:
    table = intervals_table(ct)
    for attempt in range(3):
        try:
            with ct.engine.connect() as conn:
                rows = conn.execute(select(table).where(table.c.run_id.in_(run_ids)).order_by(table.c.started))
                return [dict(r._mapping) for r in rows]
        except OperationalError:  # a pooled connection closed under us (a shared server's admin): reconnect
            if attempt == 2:
                raise
            ct.engine.dispose()
    raise AssertionError("unreachable")


def check_exclusive(rows: list[dict[str, Any]], resource: str) -> None:
    """No two recorded loads overlapped, and tokens grew in the order the loads started.

    A load killed without unwinding (SIGKILL) did not close its record: count it as working until
    one stamp period after its last stamp.
    """
    ivs = [Interval(worker=f"{r['run_id']}#{r['try_number']}", resource=resource, mode="exclusive", slots=1,
                    start=r["started"], end=r["finished"] + (0 if r["closed"] else HEARTBEAT), ticket=i,
                    token=r["token"] if r["token"] is not None else i) for i, r in enumerate(rows)]
    problems = violations(ivs, {resource: 1})
    assert not problems, problems


def handoffs(rows: list[dict[str, Any]]) -> list[float]:
    return [b["started"] - a["finished"] for a, b in zip(rows, rows[1:])]


def queued(ct: ControlTable, resource: str) -> list[str]:
    """The holders waiting on ``resource``, in queue order."""
    (st,) = ct.status([resource])
    return [w.holder for w in st.waiters]


def queue_order(ct: ControlTable, resource: str, runs: list[str]) -> list[str]:
    """The runs in their queue order on ``resource`` (a task's holder id holds its run id)."""
    return [next(r for r in runs if r in holder) for holder in queued(ct, resource)]


def start_runs(airflow: LiveAirflow, dag_id: str, n: int, **conf: Any) -> list[str]:
    return [airflow.trigger(dag_id, conf) for _ in range(n)]


def wait_started(ct: ControlTable, run_id: str, timeout: float = 120.0) -> dict[str, Any]:
    return LiveAirflow.wait_until(lambda: (recorded(ct, [run_id]) or [None])[0], timeout,
                                  f"the load of {run_id} to start", interval=0.2)


# -- the recommended pattern ---------------------------------------------------------------------------------
@pytest.mark.timeout(1500)  # two hang detectors of 600 s below
def test_six_runs_on_one_slot_defer_and_hand_over_in_grant_order(live: tuple[LiveAirflow, ControlTable]) -> None:
    """Six runs find the slot held (by the test), all defer, and are granted one at a time in queue order.

    The test holds the slot until the metadata database shows every load deferred and the control
    table shows all six queued, so each of them waits whatever the scheduler's pace (a loaded
    scheduler starting runs seconds apart once let some find the slot free: a count of waiters is not
    a cause). Then: each resumed from deferral, the grants follow the queue, never an overlap.
    """
    airflow, ct = live
    ct.set_capacity("cap1", 1)
    blocker = ct.acquire("cap1", holder="test:blocker", lease=3600, timeout=0)
    runs = start_runs(airflow, "ct_live_slot_deferred", 6, resource="cap1", seconds=1.5)

    def deferred() -> set[str]:
        return {run_id for (run_id, _task, _), state in airflow.task_states("ct_live_slot_deferred").items()
                if run_id in runs and state == "deferred"}

    LiveAirflow.wait_until(lambda: deferred() == set(runs) and len(queued(ct, "cap1")) == len(runs), 600,
                           "the six loads to queue and defer behind the test's hold (a hang)", interval=1.0,
                           state=lambda: f"deferred {sorted(deferred())}, queued {queued(ct, 'cap1')}\n"
                                         f"{airflow.diagnostics()}")
    queue = queue_order(ct, "cap1", runs)
    assert sorted(queue) == sorted(runs), (queue, runs)
    blocker.release()

    states = airflow.wait_for_runs("ct_live_slot_deferred", runs, 600)
    assert set(states.values()) == {"success"}, [airflow.task_logs("ct_live_slot_deferred", r) for r in runs
                                                 if states[r] != "success"]
    rows = recorded(ct, runs)
    assert sorted(r["run_id"] for r in rows) == sorted(runs), "each run loads exactly once"
    check_exclusive(rows, "cap1")
    assert [r["run_id"] for r in rows] == queue, "the loads did not start in the queue's order"
    tokens = [r["token"] for r in rows]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6, f"tokens not in grant order: {tokens}"
    assert tokens[0] > blocker.token, (blocker.token, tokens)
    assert all(r["deferred"] for r in rows), f"a load that deferred did not run as resumed: {rows}"
    gaps = handoffs(rows)
    print(f"\nhandoff (load end -> next load start) over {len(gaps)} grants: p50 {statistics.median(gaps):.2f} s, "
          f"max {max(gaps):.2f} s")
    status = ct.status(["cap1"])[0]
    assert not status.holders and not status.waiters


@pytest.mark.timeout(1500)  # two hang detectors of 600 s below
def test_a_short_queue_is_granted_on_the_workers_without_deferring(live: tuple[LiveAirflow, ControlTable]) -> None:
    """Two runs behind the test's hold are next and next-but-one, so they wait on their workers and
    the releases grant them there; none defers (so no exit report to race with), the grants follow
    the queue, tokens grow, never an overlap.

    The test holds the slot until both are queued and running, so each of them waits whatever the
    scheduler's pace: a loaded scheduler once started three runs seconds apart and each found the
    slot free. Their DAG waits on the worker up to a hang detector (``ct_live_slot_worker``), the
    decision the same as the default's (positions 1 and 2, no hold history); the default's 20 s
    against a slow scheduler is a speed, not a cause.
    """
    airflow, ct = live
    ct.set_capacity("shortq", 1)
    blocker = ct.acquire("shortq", holder="test:blocker", lease=3600, timeout=0)
    runs = start_runs(airflow, "ct_live_slot_worker", 2, resource="shortq", seconds=1)
    seen: set[tuple[str, str]] = set()

    def sample() -> None:
        seen.update((run_id, state) for (run_id, _task, _), state in airflow.task_states("ct_live_slot_worker").items()
                    if run_id in runs)

    def both_wait_on_workers() -> bool:
        sample()
        running = {run_id for run_id, state in seen if state == "running"}
        return running == set(runs) and len(queued(ct, "shortq")) == len(runs)

    LiveAirflow.wait_until(both_wait_on_workers, 600, "both loads to queue on their workers (a hang)", interval=1.0,
                           state=lambda: f"task states seen {sorted(seen)}, queued {queued(ct, 'shortq')}\n"
                                         f"{airflow.diagnostics()}")
    queue = queue_order(ct, "shortq", runs)
    blocker.release()
    states = airflow.wait_for_runs("ct_live_slot_worker", runs, 600, sampler=sample)
    assert set(states.values()) == {"success"}, [airflow.task_logs("ct_live_slot_worker", r) for r in runs
                                                 if states[r] != "success"]
    assert not [s for s in seen if s[1] == "deferred"], f"a load deferred: {sorted(seen)}"
    rows = recorded(ct, runs)
    check_exclusive(rows, "shortq")
    assert [r["run_id"] for r in rows] == queue, "the loads did not start in the queue's order"
    assert [r["granted_by"] for r in rows] == ["worker", "worker"], rows
    assert not any(r["deferred"] for r in rows), rows
    tokens = [r["token"] for r in rows]
    assert tokens == sorted(tokens) and tokens[0] > blocker.token, f"tokens not in grant order: {tokens}"
    gaps = handoffs(rows)
    print(f"\nshort queue on the workers: load end -> next load start {', '.join(f'{g:.3f}' for g in gaps)} s")


def test_run_marked_failed_while_its_load_holds_the_slot(live: tuple[LiveAirflow, ControlTable]) -> None:
    airflow, ct = live
    ct.set_capacity("failres", 1)
    (first,) = start_runs(airflow, "ct_live_slot_deferred", 1, resource="failres", seconds=LONG_LOAD)
    started = wait_started(ct, first)
    (second,) = start_runs(airflow, "ct_live_slot_deferred", 1, resource="failres", seconds=1)
    LiveAirflow.wait_until(lambda: airflow.task_states("ct_live_slot_deferred").get((second, "load", -1)) == "deferred",
                           120, "the second run to defer")
    marked = time.time()
    airflow.api("PATCH", f"/dags/ct_live_slot_deferred/dagRuns/{first}", {"state": "failed"})
    states = airflow.wait_for_runs("ct_live_slot_deferred", [first, second], 180)
    assert states == {first: "failed", second: "success"}, airflow.task_logs("ct_live_slot_deferred", second)
    rows = recorded(ct, [first, second])
    assert [r["run_id"] for r in rows] == [first, second]
    check_exclusive(rows, "failres")
    killed = rows[0]
    assert killed["finished"] - started["started"] < LONG_LOAD - 10, "the first load was stopped, not run to its end"
    print(f"\nrecommended pattern, run marked failed: the killed load stopped {killed['finished'] - marked:.1f} s "
          f"after the mark (closed: {killed['closed']}); the next load started "
          f"{rows[1]['started'] - marked:.1f} s after it")


def test_cleared_run_gets_a_higher_token_and_never_overlaps(live: tuple[LiveAirflow, ControlTable]) -> None:
    airflow, ct = live
    ct.set_capacity("clearres", 1)
    (run,) = start_runs(airflow, "ct_live_slot", 1, resource="clearres", seconds=20)
    wait_started(ct, run)
    airflow.api("POST", "/dags/ct_live_slot/clearTaskInstances",
                {"dry_run": False, "dag_run_id": run, "only_failed": False, "task_ids": ["load"]})
    LiveAirflow.wait_until(lambda: len(recorded(ct, [run])) >= 2, 180, "the second attempt to start")
    # The second attempt has 20 s to run; stop waiting for it by marking the run once it has started.
    rows = recorded(ct, [run])
    first, second = rows[0], rows[1]
    assert (first["try_number"], second["try_number"]) == (1, 2)
    assert second["token"] > first["token"], rows
    airflow.api("PATCH", f"/dags/ct_live_slot/dagRuns/{run}", {"state": "failed"})
    airflow.wait_for_runs("ct_live_slot", [run], 120)
    LiveAirflow.wait_until(lambda: all(r["finished"] for r in recorded(ct, [run])), 60, "both attempts to end")
    check_exclusive(recorded(ct, [run]), "clearres")


def test_triggerer_restart_while_four_tasks_are_deferred(live: tuple[LiveAirflow, ControlTable]) -> None:
    airflow, ct = live
    ct.set_capacity("restartres", 1)
    blocker = ct.acquire("restartres", holder="test-blocker", lease=300, timeout=0)
    runs = start_runs(airflow, "ct_live_slot_deferred", 4, resource="restartres", seconds=0.5)

    def all_deferred() -> bool:
        states = airflow.task_states("ct_live_slot_deferred")
        return all(states.get((r, "load", -1)) == "deferred" for r in runs)

    LiveAirflow.wait_until(all_deferred, 180, "four deferred tasks")
    airflow.stop_component("triggerer")
    time.sleep(2)
    airflow.start_component("triggerer")
    blocker.release()
    states = airflow.wait_for_runs("ct_live_slot_deferred", runs, 300)
    assert set(states.values()) == {"success"}, states
    rows = recorded(ct, runs)
    assert sorted(r["run_id"] for r in rows) == sorted(runs), f"each task gets the slot exactly once: {rows}"
    check_exclusive(rows, "restartres")
    status = ct.status(["restartres"])[0]
    assert not status.holders and not status.waiters


# -- batches ------------------------------------------------------------------------------------------------
def test_poison_batch_ends_in_error_after_max_attempts(live: tuple[LiveAirflow, ControlTable]) -> None:
    airflow, ct = live
    name = f"live_events_{ct.namespace}"
    events = Table(name, MetaData(), Column("id", Integer, primary_key=True, autoincrement=False),
                   Column("payload", String(50)))
    events.create(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(events), [{"id": i, "payload": f"bad {i}"} for i in range(1, 6)])
    table = ct.events(name, key="id", max_attempts=2, backoff=0)
    table.prepare()
    try:
        for attempt in (1, 2):
            (run,) = start_runs(airflow, "ct_live_poison", 1, table=name)
            airflow.wait_for_runs("ct_live_poison", [run], 180)
            states = airflow.task_states("ct_live_poison")
            assert states[(run, "process", -1)] == "failed", f"attempt {attempt}: {states}"
            assert states[(run, "fail", -1)] == "success", f"attempt {attempt}: {states}"
        stats = table.stats()
        assert stats.error == 5 and stats.pending == 0 and stats.claimed == 0, stats
    finally:
        events.drop(ct.engine)


# -- the sensor + teardown pattern ----------------------------------------------------------------------------
def test_teardown_waits_for_a_load_marked_failed(live: tuple[LiveAirflow, ControlTable]) -> None:
    airflow, ct = live
    ct.set_capacity("sensorres", 1)
    (first,) = start_runs(airflow, "ct_live_sensor", 1, resource="sensorres", seconds=LONG_LOAD)
    started = wait_started(ct, first)
    (second,) = start_runs(airflow, "ct_live_sensor", 1, resource="sensorres", seconds=1)
    before = ct.status(["sensorres"])[0].last_token
    marked = time.time()
    airflow.api("PATCH", f"/dags/ct_live_sensor/dagRuns/{first}", {"state": "failed"})
    states = airflow.wait_for_runs("ct_live_sensor", [first, second], 240)
    assert states[second] == "success", states
    rows = recorded(ct, [first, second])
    assert [r["run_id"] for r in rows] == [first, second]
    check_exclusive(rows, "sensorres")
    assert rows[0]["finished"] - started["started"] < LONG_LOAD - 10, "the first load was stopped, not run to its end"
    assert rows[1]["token"] > before >= rows[0]["token"]
    print(f"\nsensor + teardown, run marked failed: the killed load stopped {rows[0]['finished'] - marked:.1f} s "
          f"after the mark (closed: {rows[0]['closed']}); the next load started {rows[1]['started'] - marked:.1f} s "
          "after it")


# -- a load that is one SQL statement ----------------------------------------------------------------------
@pytest.mark.parametrize("dag_id", ["ct_live_sql", "ct_live_sql_sensor"])
def test_statement_of_a_killed_load_never_writes_after_the_next_load_started(
    live: tuple[LiveAirflow, ControlTable], dag_id: str,
) -> None:
    """A load whose work is one long statement (pg_sleep, then a write), its run marked failed: the
    statement is cancelled in the server before the slot goes on (psycopg cancels on the
    KeyboardInterrupt the kill raises), so no write of it lands after the next load started."""
    from sqlalchemy import text

    airflow, ct = live
    resource = f"sqlres_{dag_id[-6:]}"
    ct.set_capacity(resource, 1)
    seconds = LONG_LOAD
    (first,) = start_runs(airflow, dag_id, 1, resource=resource, seconds=seconds)
    wait_started(ct, first)
    (second,) = start_runs(airflow, dag_id, 1, resource=resource, seconds=1)
    marked = time.time()
    airflow.api("PATCH", f"/dags/{dag_id}/dagRuns/{first}", {"state": "failed"})
    states = airflow.wait_for_runs(dag_id, [first, second], 240)
    assert states[second] == "success", (states, airflow.task_logs(dag_id, second))
    rows = recorded(ct, [first, second])
    assert [r["run_id"] for r in rows] == [first, second]
    # Had the statement gone on in the server, it would be there, active, until it wrote `seconds` after
    # it started: wait until no statement of these loads runs (the second's ended with its run).
    def statements_running() -> int:
        with ct.engine.connect() as conn:
            return int(conn.execute(text(
                "select count(*) from pg_stat_activity where state = 'active' and pid <> pg_backend_pid() "
                "and query like :q"), {"q": f"insert into live_sql_writes_{ct.namespace} %"}).scalar_one())

    LiveAirflow.wait_until(lambda: statements_running() == 0, 300,
                           "the killed load's statement to leave the server (it ran on, or a hang)")
    with ct.engine.connect() as conn:
        writes = dict(conn.execute(text(f"select run_id, written from live_sql_writes_{ct.namespace} "
                                        "where run_id in (:a, :b)"), {"a": first, "b": second}).all())
    assert second in writes
    late = [w for run, w in writes.items() if run == first and w >= rows[1]["started"]]
    assert not late, f"the killed load's statement wrote {late[0] - rows[1]['started']:.1f} s after the next start"
    assert first not in writes  # cancelled, not merely early
    print(f"\n{dag_id}, run marked failed during a {seconds} s statement: the load stopped "
          f"{rows[0]['finished'] - marked:.1f} s after the mark; the next load started "
          f"{rows[1]['started'] - marked:.1f} s after it; the statement never wrote")
