"""Batch and work-list operators and PendingEventsSensor against a real control table."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from airflow_helpers import TRIGGER_HANG, first_event, make_context, record_checks
from sqlalchemy import Column, Integer, MetaData, String, Table, insert
from support.live import await_until

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.backends("sqlite", "postgres")]

CTX = make_context(run_id="run_a", task_id="claim")


@pytest.fixture
def events(ct: Any, namespace: str) -> Any:
    """A user event table with 25 rows, prepared for claiming; dropped afterwards."""
    name = f"ev_{namespace}"
    table = Table(name, MetaData(), Column("id", Integer, primary_key=True, autoincrement=False),
                  Column("payload", String(50)))
    table.create(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "payload": f"p{i}"} for i in range(1, 26)])
    et = ct.events(name, key="id")
    et.prepare()
    yield et
    table.drop(ct.engine)


def claim_op(conn_id: str, events: Any, **kwargs: Any) -> Any:
    from airflow_controltable.operators.events import ClaimBatchOperator

    kwargs.setdefault("table", events.name)
    return ClaimBatchOperator(task_id="claim", key="id", conn_id=conn_id, **kwargs)


def test_claim_returns_mappable_handles_and_complete_finishes_them(conn_id: str, events: Any) -> None:
    from airflow_controltable.operators.events import CompleteBatchOperator

    handles = claim_op(conn_id, events, size=10, max_batches=5).execute(CTX)
    assert [len(h["keys"]) for h in handles] == [10, 10, 5]
    assert json.loads(json.dumps(handles)) == handles  # XCom / mapping safe
    assert handles[0]["keys"] == list(range(1, 11)) and handles[0]["table"] == events.name
    assert events.pending_count() == 0
    assert claim_op(conn_id, events).execute(CTX) == []  # nothing left: mapped tasks would skip

    for handle in handles:  # as mapped task instances would
        CompleteBatchOperator(task_id="complete", handle=handle, conn_id=conn_id).execute(CTX)
    stats = events.stats()
    assert stats.done == 25 and stats.claimed == 0


def test_include_rows_and_a_list_of_handles(conn_id: str, events: Any) -> None:
    from airflow_controltable.operators.events import CompleteBatchOperator

    handles = claim_op(conn_id, events, size=3, max_batches=2, include_rows=True).execute(CTX)
    assert handles[0]["rows"][0] == {"id": 1, "payload": "p1"}
    assert CompleteBatchOperator(task_id="complete", handle=handles, conn_id=conn_id).execute(CTX) == 6
    assert events.stats().done == 6


def test_complete_after_lost_lease_fails_the_task_clearly_and_retryably(conn_id: str, events: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_controltable.exceptions import ControlTableLeaseLost
    from airflow_controltable.operators.events import CompleteBatchOperator

    (handle,) = claim_op(conn_id, events, size=5, lease=0.5).execute(CTX)
    time.sleep(1.2)
    other = events.claim(5, owner="another-worker")  # the expired rows are re-claimed
    assert other is not None and other.keys == handle["keys"]
    with pytest.raises(ControlTableLeaseLost, match="no longer held by this batch") as info:
        CompleteBatchOperator(task_id="complete", handle=handle, conn_id=conn_id).execute(CTX)
    # A lost lease is retryable (controltable.errors.is_retryable), as in the Dagster integration:
    # not an AirflowFailException, so the task's retries apply.
    assert not isinstance(info.value, AirflowFailException)
    other.complete()
    assert events.stats().done == 5


def test_fail_batch_returns_rows_for_retry(conn_id: str, events: Any) -> None:
    from airflow_controltable.operators.events import FailBatchOperator

    (handle,) = claim_op(conn_id, events, size=4).execute(CTX)
    assert FailBatchOperator(task_id="fail", handle=json.dumps(handle), reason="bad", conn_id=conn_id).execute(CTX) == 4
    stats = events.stats()
    assert stats.claimed == 0 and stats.pending == 25 and stats.error == 0


def test_claim_bad_input(conn_id: str, events: Any) -> None:
    from airflow_controltable.exceptions import ControlTableConfigError
    from airflow_controltable.operators.events import CompleteBatchOperator

    with pytest.raises(ControlTableConfigError, match="size must be"):
        claim_op(conn_id, events, size=0).execute(CTX)
    with pytest.raises(ControlTableConfigError, match="does not exist"):
        claim_op(conn_id, events, table="no_such_events").execute(CTX)
    with pytest.raises(ControlTableConfigError, match="batch handle"):
        CompleteBatchOperator(task_id="c", handle=42, conn_id=conn_id).execute(CTX)


def test_pending_events_sensor_poke_and_deferrable(conn_id: str, events: Any) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_controltable.sensors.events import PendingEventsSensor
    from airflow_controltable.triggers.events import PendingEventsTrigger

    def sensor(n: int, **kw: Any) -> Any:
        return PendingEventsSensor(task_id="wait", table=events.name, key="id", min_events=n, conn_id=conn_id,
                                   poke_interval=0.05, timeout=30, **kw)

    assert sensor(25).poke(CTX).is_done
    assert not sensor(26).poke(CTX).is_done
    assert sensor(1, deferrable=True).execute(CTX) == 25
    with pytest.raises(TaskDeferred) as deferred:
        sensor(30, deferrable=True).execute(CTX)
    classpath, kwargs = deferred.value.trigger.serialize()
    trigger = PendingEventsTrigger(**kwargs)
    checked = record_checks(trigger)

    async def scenario() -> Any:
        task = asyncio.ensure_future(first_event(trigger))
        # Two checks that found 25 of 30 rows: the trigger is waiting, not ready.
        await await_until(lambda: task.done() or len(checked) >= 2, TRIGGER_HANG, "two checks of the trigger")
        assert not task.done() and checked[:2] == [None, None]
        # Off the loop: on SQLite a sync statement there would wait for the write lock the
        # trigger's open transaction holds, which needs the loop to finish.
        table = await asyncio.to_thread(lambda: Table(events.name, MetaData(), autoload_with=events.engine))
        await asyncio.to_thread(_insert, events.engine, table, range(26, 31))
        return await asyncio.wait_for(task, TRIGGER_HANG)

    event = asyncio.run(scenario())
    assert event.payload == {"status": "ready", "pending": 30}
    assert sensor(30, deferrable=True).execute_complete(CTX, event=event.payload) == 30


def _insert(engine: Any, table: Table, ids: Any) -> None:
    with engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "payload": f"p{i}"} for i in ids])


# -- work lists ------------------------------------------------------------------------------------------
def test_allocate_and_complete_work_items_in_order(conn_id: str, ct: Any) -> None:
    from airflow_controltable.operators.worklist import AllocateWorkItemOperator, CompleteWorkItemOperator

    wl = ct.worklist("nightly")
    wl.populate([{"n": 1}, {"n": 2}], order=100)
    wl.populate([{"n": 3}], order=200)
    allocate = AllocateWorkItemOperator(task_id="allocate", worklist="nightly", max_items=10, conn_id=conn_id)
    first = allocate.execute(CTX)
    assert [h["payload"] for h in first] == [{"n": 1}, {"n": 2}] and {h["order"] for h in first} == {100}
    json.dumps(first)
    assert allocate.execute(CTX) == []  # order 200 waits for order 100
    assert CompleteWorkItemOperator(task_id="complete", handle=first, conn_id=conn_id).execute(CTX) == 2
    second = allocate.execute(CTX)
    assert [h["payload"] for h in second] == [{"n": 3}]
    CompleteWorkItemOperator(task_id="complete", handle=second[0], conn_id=conn_id).execute(CTX)
    assert wl.status().finished


def test_lost_work_item_lease_and_blocked_list(conn_id: str, ct: Any) -> None:
    from airflow_controltable.exceptions import ControlTableConfigError, ControlTableLeaseLost
    from airflow_controltable.operators.worklist import (
        AllocateWorkItemOperator,
        CompleteWorkItemOperator,
        FailWorkItemOperator,
    )

    wl = ct.worklist("wl")
    wl.populate([{"n": 1}], order=1)
    wl.populate([{"n": 2}], order=2)
    (handle,) = AllocateWorkItemOperator(task_id="a", worklist="wl", lease=0.5, conn_id=conn_id).execute(CTX)
    time.sleep(1.2)
    retaken = wl.allocate(owner="someone-else")
    assert retaken is not None and retaken.id == handle["id"]
    with pytest.raises(ControlTableLeaseLost, match="no longer held|re-allocated"):
        CompleteWorkItemOperator(task_id="c", handle=handle, conn_id=conn_id).execute(CTX)
    FailWorkItemOperator(task_id="f", handle=retaken.handle(), conn_id=conn_id).execute(CTX)
    with pytest.raises(ControlTableConfigError, match="blocked at order 1"):
        AllocateWorkItemOperator(task_id="a", worklist="wl", conn_id=conn_id).execute(CTX)
