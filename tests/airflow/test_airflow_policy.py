"""One policy and one vocabulary with the core and the Dagster integration, and a safe resume from deferral.

* the retry policy: ``translate()`` follows ``controltable.errors.is_retryable``;
* holder ids come from ``controltable.holders.holder_id``;
* the slot surfaces (sensor, operator, ``slot_held``) use the same argument names;
* defaults live in ``airflow_controltable.defaults`` and reuse the core's;
* a trigger fires no sooner than ``settle`` after the deferring process exited: decided by pure
  functions (no database) and checked with a real process that exits.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from airflow_helpers import make_context

from controltable import (
    AcquireTimeout,
    AuthenticationError,
    ConfigurationError,
    ConflictError,
    ControlTableError,
    DatabaseUnavailableError,
    LeaseLost,
    NotInstalledError,
    UnknownResourceError,
)
from controltable.errors import (
    DatabaseBusyError,
    DatabaseMissingError,
    PermissionDeniedError,
    StatementTimeoutError,
    UnexpectedDatabaseError,
    is_retryable,
)

CORE_ERRORS = [
    AcquireTimeout("not granted in time"), LeaseLost("lease lost"), DatabaseUnavailableError("down"),
    DatabaseBusyError("busy"), StatementTimeoutError("slow"), ConflictError("clash"),
    AuthenticationError("login refused"), DatabaseMissingError("no such database"), ConfigurationError("bad"),
    NotInstalledError("not installed"), UnknownResourceError("no such resource"), PermissionDeniedError("denied"),
    UnexpectedDatabaseError("odd"), ControlTableError("other"),
]


def fake_scheduler(monkeypatch: pytest.MonkeyPatch, latest: Any) -> Any:
    """An execution API that answers the health check with the heartbeat ``latest()`` returns; the
    triggers read it through ``AIRFLOW__CORE__EXECUTION_API_SERVER_URL``. Shut it down when done."""
    import json
    import threading
    from datetime import datetime, timezone
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"scheduler": {"status": "healthy", "latest_scheduler_heartbeat":
                                             datetime.fromtimestamp(latest(), timezone.utc).isoformat()}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"http://127.0.0.1:{server.server_port}/execution/")
    return server


# -- retry policy ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("error", CORE_ERRORS, ids=lambda e: type(e).__name__)
def test_translate_retries_exactly_what_the_core_calls_retryable(error: ControlTableError) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_controltable.exceptions import ControlTableRetryableError
    from airflow_controltable.utils import translate

    translated = translate(error)
    assert isinstance(translated, AirflowException)
    assert str(error) in str(translated), "the core's message (which names the fix) is kept"
    # AirflowFailException fails the task without retries; anything else is retried per `retries`.
    assert isinstance(translated, AirflowFailException) is (not is_retryable(error))
    assert isinstance(translated, ControlTableRetryableError) is is_retryable(error)


def test_timeouts_and_lost_leases_are_retried_like_in_dagster() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_controltable.exceptions import ControlTableAcquireTimeout, ControlTableLeaseLost
    from airflow_controltable.utils import translate

    assert isinstance(translate(AcquireTimeout("x")), ControlTableAcquireTimeout)
    assert isinstance(translate(LeaseLost("x")), ControlTableLeaseLost)
    assert not isinstance(translate(AcquireTimeout("x")), AirflowFailException)
    assert not isinstance(translate(LeaseLost("x")), AirflowFailException)


def test_trigger_error_events_follow_the_policy() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_controltable.utils import trigger_failure

    retry = trigger_failure({"status": "error", "message": "DatabaseBusyError: busy", "retryable": True}, "waiting")
    fail = trigger_failure({"status": "error", "message": "UnknownResourceError: nope", "retryable": False}, "waiting")
    assert not isinstance(retry, AirflowFailException) and "busy" in str(retry)
    assert isinstance(fail, AirflowFailException) and "nope" in str(fail)


# -- holder ids ----------------------------------------------------------------------------------------------
def test_holder_ids_come_from_the_core_helper() -> None:
    from airflow_controltable.utils import dag_run_holder, task_instance_holder
    from controltable.holders import holder_id

    long_run = "r" * 300
    context = make_context(run_id=long_run, task_id="load")
    assert dag_run_holder(context) == holder_id("airflow", "test_dag", long_run)
    assert task_instance_holder(context) == holder_id("airflow", "test_dag", long_run, "load", -1)
    assert len(dag_run_holder(context)) <= 200
    # two ids that differ only past the limit stay two holders (hashed, not truncated)
    other = make_context(run_id="r" * 299 + "s", task_id="load")
    assert dag_run_holder(other) != dag_run_holder(context)


# -- one vocabulary ----------------------------------------------------------------------------------------
SLOT_WORDS = {"resource", "slots", "slot_mode", "holder", "lease", "waiter_ttl", "pickup", "poll_interval",
              "conn_id", "namespace", "control_schema"}


def test_sensor_and_operator_share_the_slot_vocabulary() -> None:
    from airflow_controltable.decorators import slot_held
    from airflow_controltable.operators.slots import HoldSlotMixin
    from airflow_controltable.sensors.slots import SlotSensor

    sensor = set(inspect.signature(SlotSensor.__init__).parameters)
    operator = set(inspect.signature(HoldSlotMixin.__init__).parameters)
    held = set(inspect.signature(slot_held.__wrapped__).parameters)  # type: ignore[attr-defined]
    assert sensor >= SLOT_WORDS, SLOT_WORDS - sensor
    assert operator >= SLOT_WORDS, SLOT_WORDS - operator
    assert {"resource", "slots", "slot_mode", "holder", "lease", "wait_timeout", "conn_id", "namespace",
            "control_schema"} <= held
    assert "wait_timeout" in operator


@pytest.mark.usefixtures("airflow_db")
def test_sensor_takes_poll_interval_and_pickup() -> None:
    from airflow_controltable.sensors.slots import SlotSensor

    default = SlotSensor(task_id="s", resource="r", poke_interval=60)
    assert default._poll_interval() == 2.0 and default._pickup() == 130.0
    given = SlotSensor(task_id="s", resource="r", poll_interval=0.5, pickup=12)
    assert given._poll_interval() == 0.5 and given._pickup() == 12.0


@pytest.mark.usefixtures("airflow_db")
def test_slot_held_waits_at_most_wait_timeout(
    backend_url: str, namespace: str, ct: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.execution_time.context import set_current_context
    from airflow_helpers import set_connection

    from airflow_controltable.decorators import slot_held
    from airflow_controltable.exceptions import ControlTableAcquireTimeout

    conn_id = set_connection(monkeypatch, "ct_policy", conn_type="controltable",
                             extra={"url": backend_url, "namespace": namespace})
    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    context = make_context(run_id="run_a", task_id="load")
    context["task"] = type("Task", (), {"on_kill": lambda self: None})()
    with set_current_context(context):  # type: ignore[arg-type]
        with pytest.raises(ControlTableAcquireTimeout), slot_held("warehouse", conn_id=conn_id, wait_timeout=0.2):
            pass
        with pytest.raises(TypeError, match="timeout"), slot_held("warehouse", conn_id=conn_id, timeout=0.2):
            pass  # one name: `timeout` is not a second spelling of wait_timeout


# -- defaults ------------------------------------------------------------------------------------------------
def test_provider_defaults_reuse_the_cores() -> None:
    from airflow_controltable import defaults
    from controltable import defaults as core

    assert defaults.DEFAULT_RENEWED_LEASE == core.DEFAULT_LEASE
    assert defaults.DEFAULT_MODE is core.DEFAULT_MODE
    assert defaults.MAX_ID == core.NAME_LENGTH


# -- firing safely after a deferral ------------------------------------------------------------------------
def facts(**overrides: Any) -> dict[str, Any]:
    base = {"at": 1000.0, "settle": 10.0, "linger": 20.0, "host": socket.gethostname(), "pid": 1, "created": None}
    return {**base, **overrides}


def test_exit_time_decisions() -> None:
    from airflow_controltable.defaults import DEFAULT_EXIT_ALLOWANCE
    from airflow_controltable.resume_race import exit_time, fire_not_before

    d = facts()
    # could not look (another host): assumed gone after the allowance
    assert exit_time(d, False, 1500.0, None) == 1000.0 + DEFAULT_EXIT_ALLOWANCE
    # already gone at the first look on this host: gone before that look (bounded by Airflow's kill)
    assert exit_time(d, False, 1500.0, None, first_look=1001.0) == 1001.0
    assert exit_time(d, False, 1500.0, None, first_look=1400.0) == 1000.0 + 20.0 + DEFAULT_EXIT_ALLOWANCE
    # seen alive, then seen gone: that moment
    assert exit_time(d, True, 1500.0, 1002.5) == 1002.5
    # seen alive and still there: not before now, and never later than Airflow's kill of a lingering process
    assert exit_time(d, True, 1005.0, None) == 1005.0
    assert exit_time(d, True, 9999.0, None) == 1000.0 + 20.0 + DEFAULT_EXIT_ALLOWANCE
    # fire `settle` after the exit, and not before an explicit not_before
    assert fire_not_before(d, None, 1002.5) == 1012.5
    assert fire_not_before(d, 2000.0, 1002.5) == 2000.0
    assert fire_not_before(None, 1234.0, None) == 1234.0
    assert fire_not_before(None, None, None) == 0.0


def test_deferral_facts_follow_the_workers_heartbeat_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_controltable.defaults import DEFAULT_RESUME_MARGIN
    from airflow_controltable.resume_race import deferral_facts

    monkeypatch.delenv("AIRFLOW__CONTROLTABLE__RESUME_SETTLE", raising=False)
    monkeypatch.setenv("AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL", "7")
    found = deferral_facts()
    assert found is not None
    assert found["settle"] == 7 + DEFAULT_RESUME_MARGIN and found["pid"] == os.getpid()
    assert found["host"] == socket.gethostname() and abs(found["at"] - time.time()) < 5
    monkeypatch.setenv("AIRFLOW__CONTROLTABLE__RESUME_SETTLE", "2.5")
    assert deferral_facts()["settle"] == 2.5  # type: ignore[index]
    monkeypatch.setenv("AIRFLOW__CONTROLTABLE__RESUME_SETTLE", "0")
    assert deferral_facts() is None  # the protection turned off


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_fires_settle_seconds_after_the_deferring_process_exits(conn_id: str, ct: Any, tmp_path: Any) -> None:
    """A free slot is granted at the first check, yet the event waits for the process's exit plus settle."""
    import psutil

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    exited = tmp_path / "exited"  # the child's own record of when it ended
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(2.0); "
                              "open(sys.argv[1], 'w').write(repr(time.time()))", str(exited)])
    try:
        deferral = facts(at=time.time(), settle=1.0, pid=child.pid, created=psutil.Process(child.pid).create_time())
        trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                              poll_interval=0.1, deferral=deferral)
        SlotTrigger(**trigger.serialize()[1])  # what the triggerer rebuilds from the stored kwargs

        async def first() -> Any:
            async for event in trigger.run():
                return event, time.time()

        event, fired = asyncio.run(asyncio.wait_for(first(), 30))  # 30 s: the hang detector
        assert child.poll() is not None, "the event came while the deferring process still ran"
    finally:
        child.kill()
        child.wait(10)
    assert event.payload["status"] == "granted"
    # By order, not by a wall time from the test's start: the event comes after the child's own
    # recorded exit plus the 1 s settle, not at the grant (the slot was free at the first check).
    ended = float(exited.read_text())
    assert fired >= ended + 1.0 - 0.01, f"fired {fired - ended:.2f} s after the process exited (settle 1 s)"


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_in_the_deferring_process_itself_fires_at_once(conn_id: str, ct: Any) -> None:
    """``dag.test()`` runs the trigger inline in the process that deferred: no executor report to wait for."""
    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    at = time.time()
    trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                          poll_interval=0.1, deferral=facts(at=at, settle=30.0, pid=os.getpid()))

    async def first() -> Any:
        async for event in trigger.run():
            return event

    event = asyncio.run(asyncio.wait_for(first(), 30))
    assert event.payload["status"] == "granted"
    assert time.time() - at < 10


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_on_another_host_waits_the_allowance_plus_settle(conn_id: str, ct: Any) -> None:
    from airflow_controltable.defaults import DEFAULT_EXIT_ALLOWANCE
    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    at = time.time()
    trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                          poll_interval=0.1, deferral=facts(at=at, settle=0.5, host="another-host", pid=os.getpid()))

    async def first() -> Any:
        async for event in trigger.run():
            return event

    event = asyncio.run(asyncio.wait_for(first(), 30))
    assert event.payload["status"] == "granted"
    assert time.time() - at >= DEFAULT_EXIT_ALLOWANCE + 0.5 - 0.05


def test_scheduler_caught_up_needs_two_heartbeats_after_the_report() -> None:
    from airflow_controltable.resume_race import scheduler_caught_up

    assert not scheduler_caught_up(100.0, [])
    assert not scheduler_caught_up(100.0, [98.0, 99.5])  # loops that may have started before the report
    assert not scheduler_caught_up(100.0, [99.0, 101.0])  # the loop ending at 101 may have read before 100
    assert scheduler_caught_up(100.0, [101.0, 102.0])  # the loop ending at 102 started after 101 > 100
    assert scheduler_caught_up(100.0, [99.0, 101.0, 103.0])


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_waits_for_a_slow_scheduler_to_heartbeat_after_the_exit(
    conn_id: str, ct: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scheduler stuck in a long loop (no heartbeat) holds the event back until it heartbeats twice."""

    from airflow_controltable.defaults import DEFAULT_EXIT_ALLOWANCE
    from airflow_controltable.triggers.slot import SlotTrigger

    at = time.time()
    resumes = at + DEFAULT_EXIT_ALLOWANCE + 3.0  # the scheduler heartbeats again only from here on

    def latest() -> float:
        beat = time.time() if time.time() >= resumes else at - 1.0
        return beat

    server = fake_scheduler(monkeypatch, latest)
    try:
        ct.set_capacity("warehouse", 1)
        trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                              poll_interval=0.1, deferral=facts(at=at, settle=0.2, wake=0.0, host="another-host"))

        async def first() -> Any:
            async for event in trigger.run():
                return event

        event = asyncio.run(asyncio.wait_for(first(), 60))
    finally:
        server.shutdown()
    assert event.payload["status"] == "granted"
    assert time.time() >= resumes + 0.4, "fired before the scheduler heartbeated twice after the exit report"


def test_event_table_schema_is_table_schema() -> None:
    """One vocabulary with the core and Dagster: ``table_schema`` is the event table's schema."""
    from airflow_controltable.operators.events import ClaimBatchOperator
    from airflow_controltable.sensors.events import PendingEventsSensor

    op = ClaimBatchOperator(task_id="claim", table="events", key="id", table_schema="raw")
    sensor = PendingEventsSensor(task_id="wait", table="events", key="id", table_schema="raw")
    assert op.table_schema == sensor.table_schema == "raw"
    assert "table_schema" in op.template_fields and "table_schema" in sensor.template_fields


def test_scheduler_beats_are_read_once_for_all_triggers_and_a_late_grant_does_not_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One reader serves every waiting trigger; a trigger asking after the scheduler caught up is answered at once."""
    from airflow_controltable import resume_race as triggers  # the workaround's own module

    monkeypatch.setattr(triggers, "SCHEDULER_HEARTBEAT_POLL", 0.05)
    reads: list[float] = []
    scheduler = iter([99.0, 101.0, 101.0, 102.0, 103.0] + [104.0] * 1000)

    def beat(url: str) -> float:
        reads.append(time.time())
        return next(scheduler)

    monkeypatch.setattr(triggers, "read_scheduler_heartbeat", beat)

    async def scenario() -> tuple[list[Any], int]:
        beats = triggers.scheduler_beats("http://airflow/api/v2/monitor/health")
        assert triggers.scheduler_beats("http://airflow/api/v2/monitor/health") is beats
        together = await asyncio.gather(*(beats.caught_up(100.0, 10) for _ in range(20)))
        read_while_waiting = len(reads)
        # A grant long after the deferral: the beats are known, so the answer comes without waiting,
        # i.e. the coroutine finishes at its first step, never suspending (not: "within 50 ms").
        late_call = beats.caught_up(100.0, 10)
        try:
            late_call.send(None)
        except StopIteration as done:
            late = done.value
        else:
            late_call.close()
            raise AssertionError("the late trigger waited although the scheduler had caught up")
        return [*together, late], read_while_waiting

    answers, read_while_waiting = asyncio.run(scenario())
    assert answers == [True] * 21
    assert read_while_waiting <= 6  # one reader for twenty triggers, not twenty


def test_scheduler_beats_without_a_health_endpoint_leave_the_settle_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_controltable import resume_race as triggers  # the workaround's own module

    monkeypatch.setattr(triggers, "read_scheduler_heartbeat", lambda url: None)

    async def ask() -> Any:
        return await triggers.scheduler_beats("http://nowhere/health").caught_up(100.0, 5)

    assert asyncio.run(ask()) is None


def test_exit_reporter_is_the_parent_that_names_the_task_instance() -> None:
    """The deferring process names the LocalExecutor worker above it only when its title carries the task instance."""
    # The ids travel in the environment: the parent's title (its command line) carries only the one given.
    # The parent titles itself as a LocalExecutor worker supervising that task instance; then as another
    # executor's supervisor (Celery's), whose pipes say nothing about the scheduler: no reporter.
    code = ("import json, subprocess, sys; print(subprocess.run([sys.executable, '-c', "
            "'import json, os; from airflow_controltable.resume_race import exit_reporter; "
            "print(json.dumps([exit_reporter(os.environ[\"NAMED\"]), exit_reporter(os.environ[\"OTHER\"])]))'], "
            "capture_output=True, text=True, check=True).stdout)")
    env = {**os.environ, "NAMED": "wid-4711", "OTHER": "wid-" + "other"}
    import json

    answers = {}
    for title in ("airflow worker -- LocalExecutor: wid-4711", "airflow supervisor: wid-4711"):
        parent = subprocess.run(
            [sys.executable, "-c", f"import os, setproctitle; setproctitle.setproctitle({title!r}); "
             f"print(os.getpid()); {code}"], capture_output=True, text=True, check=True, timeout=120, env=env)
        printed_pid, answer = parent.stdout.split("\n", 1)
        answers[title] = (int(printed_pid), json.loads(answer))
    worker_pid, (named, other) = answers["airflow worker -- LocalExecutor: wid-4711"]
    assert named["pid"] == worker_pid and named["workload"] == "wid-4711" and named["created"] > 0
    assert other is None  # a parent whose title does not name the task instance reports nothing we can see
    assert answers["airflow supervisor: wid-4711"][1] == [None, None], "another executor's supervisor is no reporter"


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_fires_two_heartbeats_after_the_report_is_queued_not_after_the_settle(
    conn_id: str, ct: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    """A reporter in view (no pipes to watch): the event waits for the worker to queue the exit report, then
    for the scheduler's second heartbeat after that, and no longer for the fixed settle (60 s here)."""

    import psutil

    from airflow_controltable.triggers.slot import SlotTrigger

    beats: list[float] = []

    def latest() -> float:  # a scheduler that heartbeats every 0.3 s
        beat = int(time.time() / 0.3) * 0.3
        beats.append(beat)
        return beat

    server = fake_scheduler(monkeypatch, latest)
    reported_at = tmp_path / "reported"
    go = tmp_path / "go"
    # The worker: titled after the task instance until it has queued the report, then "<idle>".
    worker = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time, setproctitle\n"
        "go, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "setproctitle.setproctitle('airflow worker -- LocalExecutor: wid-0815')\n"
        "while not go.exists(): time.sleep(0.05)\n"
        "time.sleep(1.0)\n"
        "setproctitle.setproctitle('airflow worker -- LocalExecutor: <idle>')\n"
        "out.write_text(repr(time.time()))\n"
        "time.sleep(120)\n"), str(go), str(reported_at)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # no pipe: heartbeats prove it
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    try:
        from support.live import wait_until

        wait_until(lambda: "wid-0815" in " ".join(psutil.Process(worker.pid).cmdline()), 60,
                   "the worker never titled itself (hang)")
        reporter = {"pid": worker.pid, "created": psutil.Process(worker.pid).create_time(), "workload": "wid-0815"}
        deferral = facts(at=time.time(), settle=60.0, wake=0.0, pid=task.pid,
                         created=psutil.Process(task.pid).create_time(), reporter=reporter)
        ct.set_capacity("warehouse", 1)
        trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                              poll_interval=0.1, deferral=deferral)
        trigger = SlotTrigger(**trigger.serialize()[1])  # the reporter travels in the stored kwargs

        async def first() -> Any:
            async def release_worker_after_exit() -> None:
                while task.poll() is None:
                    await asyncio.sleep(0.05)
                go.write_text("")  # the worker reports only after the task process exited, as Airflow's does

            helper = asyncio.ensure_future(release_worker_after_exit())
            async for event in trigger.run():
                fired = time.time()
                await helper
                return event, fired

        event, fired = asyncio.run(asyncio.wait_for(first(), 45))  # > 45 s: the 60 s settle was waited (a hang)
    finally:
        server.shutdown()
        for proc in (task, worker):
            proc.kill()
            proc.wait(10)
    assert event.payload["status"] == "granted"
    reported = float(reported_at.read_text())
    assert fired >= reported, "fired before the worker queued the deferring process's exit report"
    later = sorted({b for b in beats if reported < b <= fired})
    assert len(later) >= 2, f"fired before the scheduler heartbeated twice after the report: {later}"


def test_pipes_drained_decisions() -> None:
    from airflow_controltable.resume_race import pipes_drained

    drained: set[str] = set()
    assert pipes_drained({"pipe:[1]": 40, "pipe:[2]": 0}, drained) is False  # the report may sit in pipe 1
    assert pipes_drained({"pipe:[1]": 0, "pipe:[2]": 12}, drained) is True  # each seen empty once since the report
    assert pipes_drained({"pipe:[1]": 0, "pipe:[3]": None}, set()) is None  # one cannot be looked at: no proof


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.backends("sqlite")
def test_trigger_fires_once_the_scheduler_read_the_exit_report_off_the_workers_pipe(
    conn_id: str, ct: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker writes the exit report to a pipe only the scheduler reads (LocalExecutor's result queue), then
    titles itself idle; the event comes once that pipe was read, with no heartbeat after the report at all."""

    import psutil
    from support.live import wait_until

    from airflow_controltable.triggers.slot import SlotTrigger

    stale = time.time() - 5.0

    server = fake_scheduler(monkeypatch, lambda: stale)  # a scheduler whose heartbeat never moves (a long loop)
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    worker = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time, setproctitle\n"
        "out, go = int(sys.argv[1]), int(sys.argv[2])\n"
        "setproctitle.setproctitle('airflow worker -- LocalExecutor: wid-0816')\n"
        "os.read(go, 1); os.close(go)\n"
        "os.write(out, b'report')  # the executor event, put before the worker titles itself idle\n"
        "setproctitle.setproctitle('airflow worker -- LocalExecutor: <idle>')\n"
        "time.sleep(120)\n"), str(write_end), str(go_read)],
        pass_fds=(write_end, go_read), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    os.close(go_read)
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    read_at: list[float] = []
    try:
        wait_until(lambda: "wid-0816" in " ".join(psutil.Process(worker.pid).cmdline()), 60,
                   "the worker never titled itself (hang)")
        reporter = {"pid": worker.pid, "created": psutil.Process(worker.pid).create_time(), "workload": "wid-0816"}
        deferral = facts(at=time.time(), settle=60.0, wake=0.0, pid=task.pid,
                         created=psutil.Process(task.pid).create_time(), reporter=reporter)
        ct.set_capacity("warehouse", 1)
        trigger = SlotTrigger(resource="warehouse", holder="h", lease=60, waiter_ttl=60, conn_id=conn_id,
                              poll_interval=0.1, deferral=deferral)

        async def scheduler() -> None:
            while task.poll() is None:
                await asyncio.sleep(0.05)
            os.write(go_write, b"g")  # the worker reports after the task process exited
            while "wid-0816" in " ".join(psutil.Process(worker.pid).cmdline()):
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # a scheduler loop that reads its executor's results a moment later
            read_at.append(time.time())
            assert os.read(read_end, 64) == b"report"

        async def first() -> Any:
            reader = asyncio.ensure_future(scheduler())
            async for event in trigger.run():
                fired = time.time()
                await reader
                return event, fired

        event, fired = asyncio.run(asyncio.wait_for(first(), 45))  # > 45 s: it waited for a settle or beats (hang)
    finally:
        server.shutdown()
        for proc in (task, worker):
            proc.kill()
            proc.wait(10)
        for fd in (read_end, write_end, go_write):
            os.close(fd)
    assert event.payload["status"] == "granted"
    assert read_at and fired >= read_at[0], "fired before the scheduler read the exit report off the worker's pipe"


def test_pipe_looks_are_shared_by_all_triggers_and_never_older_than_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hundred triggers waiting on the workers' one result pipe look at it once per interval, not a hundred times;
    a look that began before a trigger saw its report queued does not count for that trigger."""
    from airflow_controltable import resume_race

    looks: list[float] = []

    def unread(pipe: str, path: str) -> int:
        looks.append(time.time())
        return 0

    monkeypatch.setattr(resume_race, "pipe_unread", unread)

    async def scenario() -> tuple[int, int]:
        shared = resume_race.pipe_looks()
        assert resume_race.pipe_looks() is shared
        pipes = {"pipe:[7]": "/proc/1/fd/3"}
        since = time.time()
        answers = await asyncio.gather(*(shared.look(pipes, since) for _ in range(100)))
        assert all(a == {"pipe:[7]": 0} for a in answers)
        together = len(looks)
        await shared.look(pipes, time.time() + 0.001)  # a report seen after the last look began: look again
        return together, len(looks)

    together, after = asyncio.run(scenario())
    assert together <= 3, f"{together} looks for 100 triggers"
    assert after == together + 1


# -- waiting on the worker before deferring: when it pays (pure) --------------------------------------
def test_worker_wait_budget_waits_only_when_the_grant_is_expected_soon() -> None:
    from airflow_controltable.defaults import WORKER_WAIT_MARGIN, WORKER_WAIT_ROUNDS
    from airflow_controltable.worker_wait import worker_wait_budget

    def budget(position: Any, capacity: int = 1, slots: int = 1, exclusive: bool = False,
               worker_wait: float = 20.0, hold: Any = None) -> float:
        return worker_wait_budget(position=position, capacity=capacity, slots=slots, exclusive=exclusive,
                                  worker_wait=worker_wait, hold=hold)

    # Nothing known of the holds: the first WORKER_WAIT_ROUNDS rounds of the capacity wait, the rest defer.
    assert budget(1) == 20.0 and budget(WORKER_WAIT_ROUNDS) == 20.0 and budget(WORKER_WAIT_ROUNDS + 1) == 0.0
    assert budget(2 * WORKER_WAIT_ROUNDS, capacity=2) == 20.0  # two slots per round
    assert budget(2 * WORKER_WAIT_ROUNDS + 1, capacity=2) == 0.0
    assert budget(WORKER_WAIT_ROUNDS, capacity=2, slots=2) == 20.0  # a request of 2 slots takes a round each
    assert budget(WORKER_WAIT_ROUNDS + 1, capacity=2, slots=2) == 0.0
    assert budget(WORKER_WAIT_ROUNDS + 1, capacity=10, exclusive=True) == 0.0  # an exclusive one runs alone
    # Known holds: the rounds ahead times the typical hold, with the margin, against the bound.
    assert budget(3, capacity=1, hold=20.0 / WORKER_WAIT_MARGIN / 3) == 20.0  # just fits
    assert budget(4, capacity=1, hold=20.0 / WORKER_WAIT_MARGIN / 3) == 0.0  # one round more does not
    assert budget(6, capacity=2, hold=20.0 / WORKER_WAIT_MARGIN / 3) == 20.0  # two slots per round
    assert budget(1, capacity=1, hold=60.0) == 0.0  # a long load ahead: defer at once
    # Off, not waiting (granted meanwhile, withdrawn), or a resource without capacity: defer.
    assert budget(1, worker_wait=0) == 0.0 and budget(None) == 0.0 and budget(1, capacity=0) == 0.0


def test_typical_hold_is_the_median_of_released_grants() -> None:
    from datetime import datetime, timedelta, timezone

    from airflow_controltable.worker_wait import typical_hold
    from controltable import GrantRecord

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def record(held: float, outcome: str = "released") -> GrantRecord:
        return GrantRecord(resource="r", holder="h", mode="shared", slots=1, priority=0, token=1, enqueued_at=t0,
                           granted_at=t0, ended_at=t0 + timedelta(seconds=held), outcome=outcome)

    assert typical_hold([record(1.0), record(3.0), record(2.0), record(600.0, "expired")]) == 2.0
    held_now = GrantRecord(resource="r", holder="h", mode="shared", slots=1, priority=0, token=1, enqueued_at=t0,
                           granted_at=t0, ended_at=None, outcome="held")
    assert typical_hold([held_now, record(600.0, "expired")]) is None and typical_hold([]) is None
