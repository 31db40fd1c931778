"""The deferrable slot operator and ``@task.controltable_slot`` against a real control table (no scheduler).

The same flow Airflow drives: ``execute`` (granted at once, or TaskDeferred with a SlotTrigger),
the trigger in an event loop, ``execute_in_slot`` on resume; and ``on_kill`` during the work.
The running-Airflow tests (test_airflow_live.py) cover the real scheduler and triggerer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from typing import Any

import pytest
from airflow_helpers import TRIGGER_HANG, first_event, make_context
from support.live import await_until

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.backends("sqlite", "postgres")]

CTX = make_context(run_id="run_a", task_id="load")
HOLDER = "airflow:test_dag:run_a:load:-1"


def ctx(try_number: int = 1) -> Any:
    context = make_context(run_id="run_a", task_id="load")
    context["ti"].try_number = try_number
    return context


def operator(conn_id: str, fn: Any, **kwargs: Any) -> Any:
    from airflow.sdk.bases.operator import ExecutorSafeguard

    from airflow_controltable.operators.slots import SlotPythonOperator

    ExecutorSafeguard.test_mode = True
    kwargs.setdefault("resource", "warehouse")
    return SlotPythonOperator(task_id="load", python_callable=fn, conn_id=conn_id, poll_interval=0.05, **kwargs)


def holders(ct: Any, resource: str = "warehouse") -> list[str]:
    return [h.holder for st in ct.status([resource]) for h in st.holders if not h.expired]


def test_granted_at_once_runs_under_the_slot_and_releases(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)
    seen: dict[str, Any] = {}

    def work(lease: Any = None) -> int:
        seen["holders"] = holders(ct)
        return int(lease.token)

    assert operator(conn_id, work).execute(ctx()) == 1
    assert seen["holders"] == [HOLDER]
    assert holders(ct) == []


def test_waits_deferred_then_resumes_with_the_grant(conn_id: str, ct: Any) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=0)  # defer at once
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    trigger = deferred.value.trigger
    assert isinstance(trigger, SlotTrigger) and deferred.value.method_name == "execute_in_slot"
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)
    assert kwargs["attempt"] == 1 and kwargs["holder"] == HOLDER
    rebuilt = SlotTrigger(**kwargs)
    threading.Timer(0.3, other.release).start()
    event = asyncio.run(first_event(rebuilt))
    assert event.payload["status"] == "granted" and event.payload["token"] == 2
    assert op.execute_in_slot(ctx(), event=event.payload) == 2
    assert op.slot_resumed and op.slot_granted_by == "trigger" and holders(ct) == []


def test_failure_releases_and_a_retry_gets_a_higher_token(conn_id: str, ct: Any) -> None:
    ct.set_capacity("warehouse", 1)

    def boom(lease: Any = None) -> None:
        raise RuntimeError("load failed")

    with pytest.raises(RuntimeError, match="load failed"):
        operator(conn_id, boom).execute(ctx(1))
    assert holders(ct) == []
    assert operator(conn_id, lambda lease=None: lease.token).execute(ctx(2)) == 2


def test_new_attempt_of_a_granted_holder_gets_a_new_token_in_place(conn_id: str, ct: Any) -> None:
    """A retry whose previous attempt still holds the slot (e.g. orphaned) supersedes it with a higher token."""
    ct.set_capacity("warehouse", 1)
    old = ct.acquire("warehouse", holder=HOLDER, attempt=1, timeout=0)
    token = operator(conn_id, lambda lease=None: lease.token).execute(ctx(2))
    assert token > old.token
    from controltable import LeaseLost

    with pytest.raises(LeaseLost):
        old.renew()


def test_on_kill_stops_the_work_before_the_release(conn_id: str, ct: Any) -> None:
    """SIGTERM during the work: on_kill raises into the work, and the slot is released after it unwound."""
    from airflow_controltable.kill import ControlTableTaskKilled

    ct.set_capacity("warehouse", 1)
    events: list[str] = []
    op: Any = None

    def work(lease: Any = None) -> None:
        try:
            signal.raise_signal(signal.SIGTERM)  # the handler below plays Airflow's: it calls on_kill
            events.append("work went on after the kill")
        finally:
            events.append(f"unwinding, holders={holders(ct)}")

    previous = signal.signal(signal.SIGTERM, lambda *_: op.on_kill())
    try:
        op = operator(conn_id, work)
        with pytest.raises(ControlTableTaskKilled):
            op.execute(ctx())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert events == [f"unwinding, holders={[HOLDER]}"]  # still held while the work unwound
    assert holders(ct) == []


def _kill_during_one_long_statement(conn_id: str, ct: Any, backend_url: str, *, sleep: str, running: str) -> None:
    """A load of one statement (``sleep``, then a write) killed by SIGTERM while it runs: the statement
    is stopped in the server (``running`` counts it there), its write never happens, and the slot
    is held until it has stopped and released after that."""
    import time

    from sqlalchemy import create_engine, text
    from support.live import wait_until

    from airflow_controltable.kill import ControlTableTaskKilled

    ct.set_capacity("warehouse", 1)
    marker = f"ct_kill_{threading.get_ident()}_{time.monotonic_ns()}"
    engine = create_engine(backend_url)
    with engine.begin() as conn:
        conn.execute(text(f"create table {marker} (token int)"))
    seen: list[Any] = []

    def work(lease: Any = None) -> None:
        # A signal to the process, as Airflow's supervisor sends it (the main thread is interrupted).
        threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        try:
            with engine.begin() as conn:  # one statement: sleep, then write
                conn.execute(text(f"insert into {marker} select :t from (select {sleep}) s"), {"t": lease.token})
        finally:
            seen.append(holders(ct))

    def still_running() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text(running), {"q": f"insert into {marker}%"}).scalar() or 0)

    previous = signal.signal(signal.SIGTERM, lambda *_: op.on_kill())
    try:
        op = operator(conn_id, work)
        started = time.monotonic()
        with pytest.raises(ControlTableTaskKilled):
            op.execute(ctx())
        stopped = time.monotonic() - started
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        # The statement sleeps 20 s: the kill ending the work sooner is the cause under test.
        assert stopped < 10, f"hang: the kill took {stopped:.1f} s to stop a statement that sleeps 20 s"
        assert seen == [[HOLDER]] and holders(ct) == []  # held until the statement had stopped
        # Stopped in the server, not left running after the client gave up (the server may take a
        # moment to drop a killed statement from its process list).
        wait_until(lambda: still_running() == 0, 10, "the killed statement to leave the server", state=still_running)
        with engine.connect() as conn:
            assert conn.execute(text(f"select count(*) from {marker}")).scalar() == 0
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"drop table {marker}"))
        engine.dispose()


@pytest.mark.backends("postgres")
def test_on_kill_cancels_the_statement_the_work_has_running(conn_id: str, ct: Any, backend_url: str) -> None:
    """psycopg cancels a running statement on a KeyboardInterrupt, which the kill raises into the work."""
    _kill_during_one_long_statement(
        conn_id, ct, backend_url, sleep="pg_sleep(20)",
        running="select count(*) from pg_stat_activity where query like :q and state = 'active' "
                "and pid <> pg_backend_pid()")


@pytest.mark.backends("mysql")
def test_on_kill_cancels_a_mysql_statement_through_the_server(conn_id: str, ct: Any, backend_url: str) -> None:
    """PyMySQL does not cancel on an interrupt: the kill has the server stop the statement (KILL QUERY)
    before it raises."""
    _kill_during_one_long_statement(
        conn_id, ct, backend_url, sleep="sleep(20)",
        running="select count(*) from information_schema.processlist where info like :q")


def test_wait_timeout_withdraws_from_the_queue(conn_id: str, ct: Any) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.exceptions import ControlTableAirflowError
    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    op = operator(conn_id, lambda: None, wait_timeout=0.5, worker_wait=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    event = asyncio.run(first_event(SlotTrigger(**deferred.value.trigger.serialize()[1])))
    assert event.payload["status"] == "timeout"
    assert [w.holder for st in ct.status(["warehouse"]) for w in st.waiters] == []
    with pytest.raises(ControlTableAirflowError, match="wait_timeout"):
        op.execute_in_slot(ctx(), event=event.payload)


@pytest.mark.backends("postgres")
def test_triggers_of_one_process_share_one_listener_and_wake_on_push(conn_id: str, ct: Any) -> None:
    """Five waiting triggers: one AsyncControlTable (one listening connection); a release wakes the next at once."""
    from airflow_controltable.hooks.controltable import ControlTableHook
    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="blocker", timeout=0)
    # No poll and no refresh within the hour: after its first check a trigger checks again only when
    # a push wakes it, so a grant within the test's hang detector came by the push.
    triggers = [SlotTrigger(resource="warehouse", holder=f"h{i}", lease=60, waiter_ttl=4 * 3600, conn_id=conn_id,
                            poll_interval=3600, refresh_interval=3600) for i in range(5)]

    async def queued() -> int:
        return len((await asyncio.to_thread(ct.status, ["warehouse"]))[0].waiters)

    async def queued_all() -> bool:
        return await queued() == 5

    async def scenario() -> tuple[list[Any], float, int]:
        tasks = [asyncio.ensure_future(first_event(t)) for t in triggers]
        loop = asyncio.get_running_loop()
        await await_until(queued_all, TRIGGER_HANG, "the five triggers to queue", state=queued)
        assert not any(t.done() for t in tasks)
        # The triggers check through the loop's one async twin of the hook's shared table.
        twins = {id(t._act) for t in triggers}
        assert len(twins) == 1, "the triggers of one loop do not share one AsyncControlTable"
        shared = triggers[0]._act.sync
        assert await asyncio.to_thread(lambda: shared.push_active), "the triggers' listener is not up"
        received = shared.wakeups.received
        started = loop.time()
        await asyncio.to_thread(blocker.release)
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        elapsed = loop.time() - started
        for t in tasks:
            t.cancel()
        return [t.result() for t in done], elapsed, shared.wakeups.received - received

    events, elapsed, pushes = asyncio.run(scenario())
    assert events[0].payload["status"] == "granted"
    # By cause: a push arrived, and no trigger polls within the hour, so the push is what woke the
    # granted one; how soon is printed, not asserted.
    assert pushes > 0, "no notification reached the triggers' listener"
    print(f"granted {elapsed:.2f} s after the release")
    tables = {id(t._ct) for t in triggers}
    assert len(tables) == 1 and next(iter(t._ct for t in triggers)) is ControlTableHook(conn_id).get_control_table()


def test_use_priority_weight_queues_by_the_tasks_weight(conn_id: str, ct: Any) -> None:
    """Opt-in: the task's priority_weight is the slot request's priority, through the trigger too."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)
    assert ct.try_acquire("warehouse", holder="earlier-low") is None
    op = operator(conn_id, lambda lease=None: lease.token, use_priority_weight=True, priority_weight=7,
                  worker_wait=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    (st,) = ct.status(["warehouse"])
    assert [(w.holder, w.priority) for w in st.waiters] == [(HOLDER, 7), ("earlier-low", 0)]
    _, kwargs = deferred.value.trigger.serialize()
    assert kwargs["priority"] == 7
    rebuilt = SlotTrigger(**json.loads(json.dumps(kwargs)))
    threading.Timer(0.3, other.release).start()
    event = asyncio.run(first_event(rebuilt))
    assert event.payload["status"] == "granted"  # ahead of the earlier, lower request
    assert op.execute_in_slot(ctx(), event=event.payload) == event.payload["token"]
    ct.release("warehouse", "earlier-low")
    # Off by default: plain FIFO whatever the weight.
    plain = operator(conn_id, lambda lease=None: lease.token, priority_weight=7)
    assert plain._slot_priority() == 0




# -- waiting on the worker when the slot is expected soon ------------------------------------------
def waiters(ct: Any, resource: str = "warehouse") -> list[str]:
    return [w.holder for st in ct.status([resource]) for w in st.waiters]


def test_next_in_line_waits_on_the_worker_and_the_release_grants_it_there(conn_id: str, ct: Any) -> None:
    """Next in line: no deferral; the task waits on its worker (its place shown in the queue) and the
    release hands it the slot there."""
    from support.live import wait_until

    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)

    def release_once_waiting() -> None:  # synchronised on the waiter showing in the queue
        wait_until(lambda: waiters(ct) == [HOLDER], 60, "the task to queue while waiting on its worker (hang)")
        other.release()

    helper = threading.Thread(target=release_once_waiting, daemon=True)
    helper.start()
    # A deferral would raise TaskDeferred here; the 120 s bound is only a hang detector.
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=120)
    assert op.execute(ctx()) == 2
    helper.join(timeout=60)
    assert op.slot_granted_by == "worker" and not op.slot_resumed
    assert holders(ct) == [] and waiters(ct) == []


def test_a_grant_between_the_first_look_and_the_decision_is_taken_on_the_worker(conn_id: str, ct: Any) -> None:
    """A loaded CI run: the release came after the task's first look queued it but before it decided how
    long to wait on its worker; the decision read no waiting place and deferred, handing a grant already
    made to the triggerer. The release is put in that window here: the grant is taken on the worker."""
    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=30)  # 30 s: a hang detector
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=120)
    decide = op._worker_wait_budget

    def release_then_decide(context: Any) -> float:
        assert waiters(ct) == [HOLDER]  # queued by the first look
        other.release()  # the grant is made on the queued task's behalf
        return decide(context)

    op._worker_wait_budget = release_then_decide
    assert op.execute(ctx()) == 2  # no TaskDeferred
    assert op.slot_granted_by == "worker" and not op.slot_resumed
    assert holders(ct) == [] and waiters(ct) == []


def test_a_wait_that_runs_out_on_the_worker_defers_keeping_the_queue_place(conn_id: str, ct: Any) -> None:
    """Not granted within worker_wait: the task defers with its place (still the head), and the trigger
    gets the grant."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=0.3)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx())
    assert op.slot_granted_by == "worker"  # it did wait there first
    assert ct.try_acquire("warehouse", holder="later") is None
    assert waiters(ct) == [HOLDER, "later"]  # the place it took first is kept: FIFO
    other.release()
    event = asyncio.run(first_event(SlotTrigger(**deferred.value.trigger.serialize()[1])))
    assert event.payload["status"] == "granted" and event.payload["holder"] == HOLDER
    assert op.execute_in_slot(ctx(), event=event.payload) == event.payload["token"]
    assert op.slot_granted_by == "trigger"
    ct.release("warehouse", "later")


def test_a_long_expected_wait_defers_at_once(conn_id: str, ct: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Far back in the queue with nothing known of the holds (more rounds than WORKER_WAIT_ROUNDS): the
    task defers without waiting on the worker."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.defaults import WORKER_WAIT_ROUNDS
    from airflow_controltable.operators import slots as slot_operators

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    for i in range(WORKER_WAIT_ROUNDS):
        assert ct.try_acquire("warehouse", holder=f"ahead{i}") is None
    waited: list[float] = []
    real = slot_operators.wait_for_grant
    monkeypatch.setattr(slot_operators, "wait_for_grant",
                        lambda *a, **k: (waited.append(a[3]), real(*a, **k))[1])
    with pytest.raises(TaskDeferred):
        operator(conn_id, lambda lease=None: lease.token, worker_wait=120).execute(ctx())
    assert waited == [], "it waited on the worker although the grant was not expected soon"
    assert waiters(ct)[-1] == HOLDER


def test_killed_while_waiting_on_the_worker_withdraws_from_the_queue(conn_id: str, ct: Any) -> None:
    """SIGTERM (Airflow calls on_kill) during the wait on the worker: the wait stops and the queue place is
    withdrawn, so it does not hold up the queue until its waiter_ttl runs out."""
    from support.live import wait_until

    from airflow_controltable.kill import ControlTableTaskKilled

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    op: Any = None

    def kill_once_waiting() -> None:
        wait_until(lambda: waiters(ct) == [HOLDER], 60, "the task to queue while waiting on its worker (hang)")
        os.kill(os.getpid(), signal.SIGTERM)  # as Airflow's supervisor does: the main thread is interrupted

    previous = signal.signal(signal.SIGTERM, lambda *_: op.on_kill())
    try:
        op = operator(conn_id, lambda lease=None: lease.token, worker_wait=120)
        threading.Thread(target=kill_once_waiting, daemon=True).start()
        with pytest.raises(ControlTableTaskKilled, match="waiting for a slot"):
            op.execute(ctx())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert waiters(ct) == [] and holders(ct) == ["other"]


def test_a_kill_before_the_wait_on_the_worker_began_is_not_lost(conn_id: str, ct: Any) -> None:
    """A loaded CI run: the SIGTERM came after the task had queued but before its wait on the worker
    began, when nothing was there to stop; the task then waited its 120 s and deferred. ``on_kill``
    now records the kill, and a wait or work about to start never starts. Here the handler has run
    before ``execute`` (the widest form of that window): the task queues, stops and withdraws."""
    from airflow_controltable.kill import ControlTableTaskKilled

    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="other", timeout=0)
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=120)
    op.on_kill()  # nothing stoppable runs yet: before the fix, this did nothing at all
    with pytest.raises(ControlTableTaskKilled, match="waiting for a slot"):
        op.execute(ctx())
    assert waiters(ct) == [] and holders(ct) == ["other"]


def test_the_head_resumes_early_when_holds_are_short_and_waits_on_the_worker(conn_id: str, ct: Any) -> None:
    """A deferred request that becomes the head, on a resource whose recent holds were short, fires "near"
    (no grant yet): the task resumes and waits for the grant on its worker. With nothing known of the
    holds, the head waits for the grant in the triggerer."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.triggers.slot import SlotTrigger

    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)
    op = operator(conn_id, lambda lease=None: lease.token, worker_wait=120)
    assert op._try_slot(ctx()) is None  # queued, the head
    with pytest.raises(TaskDeferred) as deferred:
        op._defer_for_slot(ctx())
    kwargs = json.loads(json.dumps(deferred.value.trigger.serialize()[1]))
    assert kwargs["resume_near"] == 120
    assert asyncio.run(SlotTrigger(**kwargs)._near()) is None  # no hold known yet: no early resume
    other.release()  # a short hold on record; the task's request is granted now ...
    assert ct.find_lease("warehouse", HOLDER) is not None
    ct.release("warehouse", HOLDER)  # ... and withdrawn again, to be queued behind a new holder
    other = ct.acquire("warehouse", holder="other", timeout=0)
    assert op._try_slot(ctx()) is None
    event = asyncio.run(first_event(SlotTrigger(**kwargs)))
    assert event.payload["status"] == "near" and holders(ct) == ["other"]  # fired before any grant
    threading.Thread(target=other.release, daemon=True).start()
    token = op.execute_in_slot(ctx(), event=event.payload)
    assert token == other.token + 1 and op.slot_granted_by == "worker" and op.slot_resumed
    assert holders(ct) == [] and waiters(ct) == []
