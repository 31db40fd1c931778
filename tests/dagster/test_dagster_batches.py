"""Batch claiming and work lists from Dagster: the op factories, the claim_batch pattern, metadata."""

import threading
import time
from typing import Any

import pytest
from dagster import AssetExecutionContext, MaterializeResult, asset, job, materialize, op

from dagster_controltable import ControlTableResource, batch_metadata, build_batch_op, build_worklist_op

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


def _drain_job(process: Any, table: str, **kwargs: Any) -> Any:
    drain = build_batch_op(process, table=table, key="id", name="drain", **kwargs)

    @job
    def drain_job() -> None:
        drain()

    return drain_job


def test_batch_op_drains_the_table_and_records_metadata(ct: Any, resource: ControlTableResource,
                                                        make_events: Any) -> None:
    table = make_events(25)
    seen: list[list[int]] = []

    def process(context: Any, batch: Any) -> None:
        assert batch.owner.startswith(f"dagster:{context.run_id}:drain")
        seen.append([row["id"] for row in batch.rows])

    result = _drain_job(process, table, size=10).execute_in_process(resources={"controltable": resource})
    assert result.success
    assert [len(b) for b in seen] == [10, 10, 5]
    assert sorted(k for b in seen for k in b) == list(range(1, 26))
    summary = result.output_for_node("drain")
    assert summary["batches"] == 3 and summary["events"] == 25
    (output_event,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    md = output_event.event_specific_data.metadata
    assert md["controltable/events"].value == 25 and md["controltable/batches"].value == 3
    assert len(set(md["controltable/tokens"].value)) == 3
    assert md["controltable/keys"].value["keys"] == list(range(1, 26))
    stats = ct.events(table, key="id").stats()
    assert stats.done == 25 and stats.pending == 0 and stats.claimed == 0


def test_batch_op_respects_max_batches_and_empty_tables(ct: Any, resource: ControlTableResource,
                                                        make_events: Any) -> None:
    table = make_events(5)
    job_def = _drain_job(lambda context, batch: None, table, size=2, max_batches=1)
    assert job_def.execute_in_process(resources={"controltable": resource}).output_for_node("drain")["events"] == 2
    assert ct.events(table, key="id").pending_count() == 3
    empty = make_events(0)
    result = _drain_job(lambda context, batch: None, empty).execute_in_process(resources={"controltable": resource})
    assert result.success and result.output_for_node("drain")["batches"] == 0


def test_failing_batch_is_given_back_and_the_step_fails_clearly(ct: Any, resource: ControlTableResource,
                                                                 make_events: Any) -> None:
    table = make_events(12)

    def process(context: Any, batch: Any) -> None:
        if 3 in batch.keys:
            raise RuntimeError("warehouse rejected the batch")

    job_def = _drain_job(process, table, size=5, backoff=120.0)
    result = job_def.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error.cls_name == "Failure"
    assert "warehouse rejected the batch" in error.message and "given back" in error.message
    events = ct.events(table, key="id")
    stats = events.stats()
    assert stats.done == 0 and stats.claimed == 0 and stats.pending == 12
    assert events.pending_count() == 7  # the failed 5 wait out the back-off


def test_completion_is_fenced_when_the_claim_expired_and_was_taken_over(
    ct: Any, resource: ControlTableResource, make_events: Any
) -> None:
    table = make_events(3)
    thief: dict[str, Any] = {}

    def slow(context: Any, batch: Any) -> None:
        batch.stop_renewing()  # the op renews the claim: stop, as a renewer that cannot get through would
        time.sleep(1.2)  # the 0.5 s claim runs out...
        thief["batch"] = ct.events(table, key="id").claim(10, owner="other-worker")  # ...and is taken over

    result = _drain_job(slow, table, lease=0.5).execute_in_process(resources={"controltable": resource},
                                                                   raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error.cls_name == "Failure" and "lease lost" in error.message
    assert thief["batch"] is not None and sorted(thief["batch"].keys) == [1, 2, 3]
    stats = ct.events(table, key="id").stats()
    assert stats.done == 0 and stats.claimed == 3  # nothing completed under the stale token
    thief["batch"].complete()


def test_claim_batch_pattern_in_an_asset(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(4)

    @asset
    def totals(context: AssetExecutionContext, controltable: ControlTableResource) -> MaterializeResult:
        with controltable.claim_batch(table, key="id", size=10) as batch:
            if batch is None:
                return MaterializeResult(metadata={"controltable/events": 0})
            total = sum(row["amount"] for row in batch.rows)
            return MaterializeResult(metadata={**batch_metadata(batch), "total": total})

    result = materialize([totals], resources={"controltable": resource})
    (mat,) = result.asset_materializations_for_node("totals")
    assert mat.metadata["total"].value == 10
    assert mat.metadata["controltable/events"].value == 4
    assert mat.metadata["controltable/keys"].value["keys"] == [1, 2, 3, 4]
    assert mat.metadata["controltable/token"].value > 0
    assert ct.events(table, key="id").stats().done == 4
    result = materialize([totals], resources={"controltable": resource})
    assert result.asset_materializations_for_node("totals")[0].metadata["controltable/events"].value == 0


def test_transaction_commits_user_writes_with_the_completion(ct: Any, resource: ControlTableResource,
                                                             make_events: Any) -> None:
    from sqlalchemy import text

    table = make_events(3)
    sink = f"sink_{table}"
    with ct.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {sink} (id INTEGER PRIMARY KEY)"))
    try:
        def process(context: Any, batch: Any) -> None:
            with batch.transaction() as conn:
                for key in batch.keys:
                    conn.execute(text(f"INSERT INTO {sink} (id) VALUES (:k)"), {"k": key})

        assert _drain_job(process, table).execute_in_process(resources={"controltable": resource}).success
        with ct.engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {sink}")).scalar() == 3
        assert ct.events(table, key="id").stats().done == 3
    finally:
        with ct.engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {sink}"))


def test_worklist_job_allocates_in_order_until_none_are_left(ct: Any, resource: ControlTableResource) -> None:
    wl = ct.worklist("steps")
    wl.populate([{"n": 1}, {"n": 2}, {"n": 3}], order=100)
    wl.populate([{"n": 4}, {"n": 5}], order=200)
    wl.populate([{"n": 6}], order=300)
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def process(context: Any, item: Any) -> None:
        with lock:
            seen.append((item.order, item.payload["n"], context.op.name))

    worker = build_worklist_op(process, worklist="steps", name="worker", timeout=30)

    @op
    def fill() -> None:
        pass

    @job
    def steps_job() -> None:
        started = fill()
        worker(start_after=started)
        worker.alias("worker_2")(start_after=started)

    result = steps_job.execute_in_process(resources={"controltable": resource})
    assert result.success
    orders = [o for o, _, _ in seen]
    assert orders == sorted(orders) and sorted(n for _, n, _ in seen) == [1, 2, 3, 4, 5, 6]
    total = result.output_for_node("worker")["items"] + result.output_for_node("worker_2")["items"]
    assert total == 6
    assert wl.status().finished


def test_worklist_item_error_fails_the_step_and_blocks_the_order(ct: Any, resource: ControlTableResource) -> None:
    wl = ct.worklist("fragile")
    wl.populate([{"n": 1}, {"n": 2}], order=100)
    wl.populate([{"n": 3}], order=200)

    def process(context: Any, item: Any) -> None:
        if item.payload["n"] == 2:
            raise ValueError("bad input file")

    worker = build_worklist_op(process, worklist="fragile", name="worker", timeout=5)

    @job
    def fragile_job() -> None:
        worker()

    result = fragile_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    assert error.cls_name == "Failure" and "bad input file" in error.message and "clear" in error.message
    st = wl.status()
    assert st.current_order == 100 and st.blocked_by_errors
