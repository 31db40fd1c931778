"""SlotSensor (poke, reschedule, deferrable), SlotTrigger and ReleaseSlotOperator against a real control table."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow_helpers import TRIGGER_HANG, first_event, make_context, record_checks
from support.live import await_until

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.backends("sqlite", "postgres")]

RUN_A = make_context(run_id="run_a")
RUN_B = make_context(run_id="run_b")
HOLDER_A = "airflow:test_dag:run_a"
HOLDER_B = "airflow:test_dag:run_b"


def holders(ct: Any, resource: str) -> list[str]:
    return [h.holder for st in ct.status([resource]) for h in st.holders if not h.expired]


def waiters(ct: Any, resource: str) -> list[str]:
    return [w.holder for st in ct.status([resource]) for w in st.waiters if not w.expired]


def _queued(ct: Any, expected: list[str]) -> bool:
    return waiters(ct, "warehouse") == expected


def sensor(conn_id: str, **kwargs: Any) -> Any:
    from airflow_controltable.sensors.slots import SlotSensor

    kwargs.setdefault("resource", "warehouse")
    return SlotSensor(task_id="acquire", conn_id=conn_id, poke_interval=0.1, timeout=30, **kwargs)


# -- sensor in poke / reschedule form ---------------------------------------------------------------
def test_poke_acquires_for_the_dag_run_and_pushes_the_token(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    result = sensor(conn_id, mode="reschedule").poke(RUN_A)
    assert result.is_done
    payload = result.xcom_value
    json.dumps(payload)  # XCom-safe
    assert payload["holder"] == HOLDER_A and payload["token"] == 1 and payload["resource"] == "warehouse"
    assert holders(ct, "warehouse") == [HOLDER_A]
    # Poking again (a reschedule after a crash) is idempotent: same lease, same token.
    assert sensor(conn_id).poke(RUN_A).xcom_value["token"] == 1
    assert holders(ct, "warehouse") == [HOLDER_A]


def test_poke_keeps_the_fifo_place_between_pokes(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    assert sensor(conn_id).poke(RUN_A).is_done
    assert not sensor(conn_id).poke(RUN_B).is_done  # B queues
    late = ct.try_acquire("warehouse", holder="late-shell-job")  # arrives after B
    assert late is None
    assert waiters(ct, "warehouse") == [HOLDER_B, "late-shell-job"]
    ct.release("warehouse", HOLDER_A)
    assert ct.try_acquire("warehouse", holder="late-shell-job") is None  # B is still ahead
    result = sensor(conn_id).poke(RUN_B)
    assert result.is_done and result.xcom_value["token"] == 2
    assert holders(ct, "warehouse") == [HOLDER_B]


def test_shared_mode_and_templated_holder(conn_id: str, ct: Any) -> None:
    ct.set_capacity("pool", 3)
    a = sensor(conn_id, resource="pool", slot_mode="shared", slots=2, holder="team-a").poke(RUN_A)
    b = sensor(conn_id, resource="pool", slot_mode="shared", slots=1, holder="team-b").poke(RUN_A)
    assert a.is_done and b.is_done
    assert sorted(holders(ct, "pool")) == ["team-a", "team-b"]
    assert not sensor(conn_id, resource="pool", slot_mode="exclusive", holder="admin").poke(RUN_A).is_done
    assert sensor(conn_id).template_fields == ("resource", "holder")


def test_poke_mode_execute_waits_until_released(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other-deployment", timeout=0)
    released: list[float] = []

    def release() -> None:
        released.append(time.monotonic())  # before the release: the grant may follow at once
        ct.release("warehouse", "other-deployment")

    timer = threading.Timer(0.5, release)
    timer.start()
    payload = sensor(conn_id, mode="poke").execute(RUN_A)
    returned = time.monotonic()
    assert released and returned >= released[0], "the sensor returned before the slot was released"
    assert payload["holder"] == HOLDER_A
    timer.join()


def test_missing_resource_and_bad_slot_mode_are_clear_errors(conn_id: str, ct: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_controltable.exceptions import ControlTableConfigError

    with pytest.raises(ControlTableConfigError, match="resource 'nope' does not exist") as info:
        sensor(conn_id, resource="nope").poke(RUN_A)
    assert isinstance(info.value, AirflowFailException)
    assert "set_capacity" in str(info.value)
    ct.set_capacity("warehouse", 1)
    with pytest.raises(ControlTableConfigError, match="slot_mode must be"):
        sensor(conn_id, slot_mode="reschedule").poke(RUN_A)


# -- deferrable form and the trigger --------------------------------------------------------------------
def test_deferrable_sensor_defers_then_resumes_with_the_lease(conn_id: str, ct: Any) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    op = sensor(conn_id, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(RUN_A)
    trigger = deferred.value.trigger
    assert isinstance(trigger, SlotTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert waiters(ct, "warehouse") == [HOLDER_A]  # queued before deferring
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_controltable.triggers.slot.SlotTrigger"
    json.dumps(kwargs)
    rebuilt = SlotTrigger(**kwargs)  # what the triggerer does

    threading.Timer(0.3, ct.release, args=("warehouse", "other")).start()
    event = asyncio.run(first_event(rebuilt))
    assert event.payload["status"] == "granted" and event.payload["holder"] == HOLDER_A
    result = op.execute_complete(RUN_A, event=event.payload)
    assert result["token"] == event.payload["token"] == 2
    assert holders(ct, "warehouse") == [HOLDER_A]


def test_deferrable_sensor_does_not_defer_when_free(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    assert sensor(conn_id, deferrable=True).execute(RUN_A)["holder"] == HOLDER_A


def test_execute_complete_fails_clearly_when_the_grant_expired(conn_id: str, ct: Any) -> None:
    from airflow_controltable.exceptions import ControlTableConfigError, ControlTableLeaseLost

    ct.set_capacity("warehouse", 1)
    op = sensor(conn_id, deferrable=True)
    event = {"status": "granted", "resource": "warehouse", "holder": HOLDER_A, "token": 7}
    with pytest.raises(ControlTableLeaseLost, match="no longer held"):
        op.execute_complete(RUN_A, event=event)
    with pytest.raises(ControlTableConfigError, match="boom"):
        op.execute_complete(RUN_A, event={"status": "error", "message": "boom"})


def _trigger(conn_id: str, holder: str, **kwargs: Any) -> Any:
    from airflow_controltable.triggers.slot import SlotTrigger

    return SlotTrigger(resource="warehouse", holder=holder, lease=60, waiter_ttl=30, conn_id=conn_id,
                       poll_interval=0.05, **kwargs)


def test_trigger_yields_when_granted(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)

    async def scenario() -> Any:
        trigger = _trigger(conn_id, HOLDER_A)
        checked = record_checks(trigger)
        task = asyncio.ensure_future(first_event(trigger))
        # The trigger queues up, then keeps waiting: checks after it is queued find no grant.
        # Sync calls leave the loop free (the trigger's own statements await it, and on SQLite a
        # blocked loop would hold the write lock its transaction has).
        await await_until(lambda: task.done() or asyncio.to_thread(_queued, ct, [HOLDER_A]), TRIGGER_HANG,
                          "the trigger to queue")
        queued_at = len(checked)
        await await_until(lambda: task.done() or len(checked) >= queued_at + 2, TRIGGER_HANG,
                          "two more checks of the trigger")
        assert not task.done() and checked[queued_at:] == [None] * (len(checked) - queued_at)
        assert await asyncio.to_thread(waiters, ct, "warehouse") == [HOLDER_A]
        await asyncio.to_thread(ct.release, "warehouse", "other")
        return await task

    event = asyncio.run(scenario())
    assert event.payload["status"] == "granted" and event.payload["token"] == 2
    assert holders(ct, "warehouse") == [HOLDER_A]


def _server_connections(url: str) -> int:
    """TCP connections this process holds to the test server (what the shared server counts)."""
    import psutil
    from sqlalchemy.engine import make_url

    port = make_url(url).port or 5432
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == "ESTABLISHED")


@pytest.mark.backends("postgres")
def test_a_loop_that_ends_closes_its_twins_connections(conn_id: str, ct: Any, backend_url: str) -> None:
    """``asyncio.run`` per trigger (what ``dag.test()`` does) leaves no connection behind per loop.

    The loop's async twin holds a pooled and a listening connection bound to that loop; before the
    twin was closed at the loop's end, every loop left both open on the server (a test run held 29).
    """
    from controltable import aio

    ct.set_capacity("warehouse", 1)
    twins: list[Any] = []
    loops: list[Any] = []

    async def granted_once(holder: str) -> Any:
        trigger = _trigger(conn_id, holder)
        event = await first_event(trigger)
        twins.append(trigger._act)
        loops.append(asyncio.get_running_loop())
        assert trigger._act in aio._PER_LOOP[loops[-1]].values()  # the loop's twin while it runs
        return event

    counts = []
    for i in range(4):
        event = asyncio.run(granted_once(f"{HOLDER_A}-{i}"))
        assert event.payload["status"] == "granted"
        ct.release("warehouse", f"{HOLDER_A}-{i}")
        twin = twins[-1]
        assert twin.sync.db.engine.pool.checkedin() == 0  # closed at the loop's end, not left pooled
        # (its listener's connection too: the count below; reading push_active would start a new one)
        counts.append(_server_connections(backend_url))
    assert not set(loops) & set(aio._PER_LOOP)  # no loop's entry outlives it
    # The first loop may have opened what the process keeps (the hook's shared table); later ones add none.
    assert counts[1:] == [counts[0]] * 3, counts


def test_trigger_is_safe_to_run_twice(conn_id: str, ct: Any) -> None:
    """Two copies of the trigger (triggerer failover) and a re-run after the event grant one slot once."""
    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)

    async def scenario() -> list[Any]:
        both = asyncio.gather(
            first_event(_trigger(conn_id, HOLDER_A)), first_event(_trigger(conn_id, HOLDER_A))
        )
        # Both copies wait (one queue entry: one holder) before the slot frees up.
        await await_until(lambda: asyncio.to_thread(_queued, ct, [HOLDER_A]), TRIGGER_HANG, "the triggers to queue")
        await asyncio.to_thread(ct.release, "warehouse", "other")
        return list(await both)

    first, second = asyncio.run(scenario())
    assert first.payload["token"] == second.payload["token"] == 2
    again = asyncio.run(first_event(_trigger(conn_id, HOLDER_A)))  # event delivered twice / trigger re-run
    assert again.payload["token"] == 2
    assert holders(ct, "warehouse") == [HOLDER_A]
    status = ct.status(["warehouse"])[0]
    assert status.used == 1 and status.last_token == 2 and not status.waiters


def test_trigger_reports_a_missing_resource_as_an_error_event(conn_id: str) -> None:
    event = asyncio.run(first_event(_trigger(conn_id, HOLDER_A, slots=1)))
    assert event.payload["status"] == "error"
    assert "does not exist" in event.payload["message"]


# -- release ----------------------------------------------------------------------------------------------
def test_release_operator(conn_id: str, ct: Any, caplog: pytest.LogCaptureFixture) -> None:
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    ct.set_capacity("warehouse", 1)
    assert sensor(conn_id).poke(RUN_A).is_done
    release = ReleaseSlotOperator(task_id="release", resource="warehouse", conn_id=conn_id)
    assert release.execute(RUN_A) == 1
    assert holders(ct, "warehouse") == []
    assert release.execute(RUN_A) == 0  # no longer held: not an error
    ct.acquire("warehouse", holder="custom", timeout=0)
    assert ReleaseSlotOperator(task_id="r", resource="warehouse", holder="custom", conn_id=conn_id).execute(RUN_A) == 1


class _RunTasks:
    """The Task SDK calls the teardown makes: task states, the run's state, the work-ended markers."""

    dag_id, run_id = "d", "r"

    def __init__(self, state: str, run_state: str, marked: set[str]) -> None:
        self.state, self.run_state, self.marked = state, run_state, marked

    def get_task_states(self, dag_id: str, task_ids: list[str], run_ids: list[str]) -> dict[str, Any]:
        return {self.run_id: {t: self.state for t in task_ids}}

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return self.run_state

    def xcom_pull(self, task_ids: str, key: str) -> Any:
        return True if task_ids in self.marked and key == "controltable_work_ended" else None


@pytest.mark.parametrize(("state", "run_state", "marked", "waits"), [
    ("failed", "running", {"load"}, False),  # the load raised: its process recorded the end of the work
    ("failed", "running", set(), True),  # marked failed (no marker): Airflow may still be killing it
    ("failed", "failed", {"load"}, True),  # the run marked failed while the teardown runs
    ("removed", "running", set(), True),
    ("success", "running", set(), False),
])
def test_teardown_waits_the_kill_grace_only_for_work_that_may_still_run(
    state: str, run_state: str, marked: set[str], waits: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_controltable.operators import slots as slots_module
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    op = ReleaseSlotOperator(task_id="release", resource="warehouse", kill_grace=1.5, check_interval=0.1)
    monkeypatch.setattr(op, "covered_task_ids", lambda context: ["load"])
    slept: list[float] = []  # the operator's own sleeps: it sleeps only while it waits out the grace

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(slots_module, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    started = time.monotonic()
    op.wait_until_work_finished({"ti": _RunTasks(state, run_state, marked)}, time.monotonic() + 60)  # type: ignore[arg-type]
    assert bool(slept) is waits, f"waited {sum(slept):.1f} s in {len(slept)} sleeps"
    if waits:  # a lower bound: it waited the whole grace (load only lengthens it)
        assert time.monotonic() - started >= 1.5


def test_teardown_stops_waiting_once_a_killed_task_records_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    op = ReleaseSlotOperator(task_id="release", resource="warehouse", kill_grace=30, check_interval=0.1)
    monkeypatch.setattr(op, "covered_task_ids", lambda context: ["load"])
    ti = _RunTasks("failed", "running", set())
    marked_at: list[float] = []

    def mark() -> None:  # on_kill stopped the work; it finalized
        ti.marked.add("load")
        marked_at.append(time.monotonic())

    threading.Timer(0.5, mark).start()
    started = time.monotonic()
    op.wait_until_work_finished({"ti": ti}, time.monotonic() + 60)  # type: ignore[arg-type]
    returned = time.monotonic()
    # By cause: it returned once the end was recorded (after the marker, before the 30 s grace ran
    # out, which is what it would have waited for without the marker), not within some seconds.
    assert marked_at and returned >= marked_at[0], "it returned before the end was recorded"
    assert returned - started < 30, "it waited out the whole kill grace: the recorded end was not seen"


def test_tasks_covered_by_a_teardown_stop_their_work_on_kill_and_record_its_end() -> None:
    """The work_ended listener: SIGTERM's on_kill raises into a covered task's work (a KeyboardInterrupt,
    which psycopg cancels a running statement on); its end is recorded for the teardown; other tasks
    are left alone."""
    from datetime import datetime

    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator

    from airflow_controltable.kill import ControlTableTaskKilled
    from airflow_controltable.operators.slots import ReleaseSlotOperator
    from airflow_controltable.plugins import work_ended

    with DAG("covered", schedule=None, start_date=datetime(2024, 1, 1)):
        sensor, work, release = BaseOperator(task_id="acquire"), BaseOperator(task_id="work"), ReleaseSlotOperator(
            task_id="release", resource="warehouse")
        alone = BaseOperator(task_id="alone")
        sensor >> work >> release.as_teardown(setups=sensor)

    class RuntimeTI:  # what the Task SDK passes the listener in a task process
        __module__ = "airflow.sdk.execution_time.task_runner"

        def __init__(self, task: Any) -> None:
            self.task, self.pushed = task, {}

        def xcom_push(self, key: str, value: Any) -> None:
            self.pushed[key] = value

    ti, other = RuntimeTI(work), RuntimeTI(alone)
    work_ended.on_task_instance_running(None, ti)
    work_ended.on_task_instance_running(None, other)
    other.task.on_kill()  # not covered: Airflow's own behaviour
    with pytest.raises(ControlTableTaskKilled) as killed:
        ti.task.on_kill()
    assert isinstance(killed.value, KeyboardInterrupt)
    work_ended.on_task_instance_failed(None, ti, killed.value)
    ti.task.on_kill()  # the work is over: a late SIGTERM raises nothing
    work_ended.on_task_instance_failed(None, other, RuntimeError("x"))
    assert ti.pushed == {"controltable_work_ended": True} and other.pushed == {}


def test_release_of_a_missing_resource_is_a_clear_error(conn_id: str) -> None:
    from airflow_controltable.exceptions import ControlTableConfigError
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    op = ReleaseSlotOperator(task_id="release", resource="warehuose", conn_id=conn_id)
    with pytest.raises(ControlTableConfigError, match="resource 'warehuose' does not exist"):
        op.execute(RUN_A)


def test_long_dag_and_run_ids_give_a_bounded_stable_holder() -> None:
    from airflow_controltable.utils import dag_run_holder

    ctx = make_context(dag_id="d" * 250, run_id="scheduled__" + "x" * 240)
    holder = dag_run_holder(ctx)
    assert len(holder) <= 200 and holder == dag_run_holder(ctx)
    assert holder != dag_run_holder(make_context(dag_id="d" * 250, run_id="scheduled__" + "y" * 240))


def test_cleared_run_sensor_gets_a_higher_token_in_place(conn_id: str, ct: Any) -> None:
    """A new try of the sensor (the run was cleared) keeps the run's grant with a new, higher token."""
    from controltable import LeaseLost

    ct.set_capacity("warehouse", 1)
    first = sensor(conn_id).poke(RUN_A).xcom_value
    ct.try_acquire("warehouse", holder="queued-behind")  # someone waits: no re-queueing behind it
    retry = make_context(run_id="run_a")
    retry["ti"].try_number = 2
    second = sensor(conn_id).poke(retry)
    assert second.is_done and second.xcom_value["token"] > first["token"]
    assert holders(ct, "warehouse") == [HOLDER_A]
    with pytest.raises(LeaseLost, match="superseded|attempt"):
        ct.try_acquire("warehouse", holder=HOLDER_A, attempt=1)  # the old try's late call is rejected
