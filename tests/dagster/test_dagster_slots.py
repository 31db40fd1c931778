"""ControlTableResource slots inside Dagster steps: holders, contention, release on error, retry mode."""

import threading
import time
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    Failure,
    MaterializeResult,
    OpExecutionContext,
    RetryRequested,
    asset,
    job,
    materialize,
    op,
)
from support.live import wait_until

from dagster_controltable import ControlTableResource

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


def _failure(result: Any) -> Any:
    """The error of the (single) failed step, as Dagster recorded it."""
    events = result.get_step_failure_events()
    assert events, "expected a failed step"
    return events[0].step_failure_data.error


def test_slot_in_asset_holds_and_releases(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    seen: dict[str, Any] = {}

    @asset
    def report(context: AssetExecutionContext, controltable: ControlTableResource) -> MaterializeResult:
        with controltable.slot("warehouse") as lease:
            (status,) = controltable.status(["warehouse"])
            seen["holders"] = [h.holder for h in status.holders]
            seen["holder"] = lease.holder
            seen["run_id"] = context.run_id
            return MaterializeResult(metadata={"token": lease.token})

    result = materialize([report], resources={"controltable": resource})
    assert result.success
    assert seen["holder"] == f"dagster:{seen['run_id']}:report"
    assert seen["holders"] == [seen["holder"]]
    (status,) = ct.status(["warehouse"])
    assert status.holders == [] and status.waiters == []
    mats = result.asset_materializations_for_node("report")
    assert mats[0].metadata["token"].value >= 1


def test_two_runs_contend_for_capacity_one_and_never_overlap(ct: Any, backend_url: str, namespace: str) -> None:
    ct.set_capacity("warehouse", 1)
    intervals: list[tuple[float, float, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=30)

    @op
    def query_warehouse(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        barrier.wait()  # both runs ask for the slot at the same moment
        with controltable.slot("warehouse"):
            start = time.monotonic()
            time.sleep(0.6)
            end = time.monotonic()
        with lock:
            intervals.append((start, end, context.run_id))

    @job
    def warehouse_job() -> None:
        query_warehouse()

    results: list[Any] = []

    def run() -> None:
        # each run has its own resource instance, hence its own engine, like two run processes
        res = ControlTableResource(url=backend_url, namespace=namespace)
        results.append(warehouse_job.execute_in_process(resources={"controltable": res}, raise_on_error=False))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 2 and all(r.success for r in results)
    assert len(intervals) == 2 and intervals[0][2] != intervals[1][2]
    first, second = sorted(intervals)
    assert first[1] <= second[0], f"the two runs overlapped inside the slot: {intervals}"
    (status,) = ct.status(["warehouse"])
    assert status.holders == [] and status.waiters == []
    assert status.last_token == 2


def test_step_raising_inside_slot_releases_it(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)

    @op
    def broken(controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse"):
            raise ValueError("boom inside the slot")

    @job
    def broken_job() -> None:
        broken()

    result = broken_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    assert not result.success
    assert "boom inside the slot" in _failure(result).to_string()
    (status,) = ct.status(["warehouse"])
    assert status.holders == [] and status.waiters == []
    lease = ct.acquire("warehouse", holder="next", timeout=0)  # free at once
    lease.release()


def test_block_mode_timeout_is_a_clear_failure(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="airflow-task")

    @op
    def impatient(controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", timeout=0.3):
            pass

    @job
    def impatient_job() -> None:
        impatient()

    try:
        result = impatient_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
    finally:
        other.release()
    error = _failure(result)
    assert error.cls_name == "Failure"
    assert "slot not granted in time" in error.message and "Fix:" in error.message
    (status,) = ct.status(["warehouse"])
    assert status.waiters == []  # the timed-out request left the queue


def test_retry_mode_keeps_the_queue_place_between_retries(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="shell-job")
    tries: list[int] = []
    granted: list[int] = []

    @op
    def polite(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        tries.append(context.retry_number)
        with controltable.slot("warehouse", wait="retry", retry_interval=0.3, max_retries=40) as lease:
            granted.append(lease.token)

    @job
    def polite_job() -> None:
        polite()

    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(polite_job.execute_in_process(resources={"controltable": resource},
                                                                     raise_on_error=False)))
    runner.start()
    try:
        wait_until(lambda: tries and max(tries) >= 1, 30, "the step to queue, then retry at least once",
                   interval=0.05)
        (status,) = ct.status(["warehouse"])
        assert [w.holder for w in status.waiters if not w.expired][0].startswith("dagster:")
    finally:
        blocker.release()
    # The step is between retries (not running), yet its queue place is kept: a newcomer is behind it.
    assert ct.try_acquire("warehouse", holder="newcomer", waiter_ttl=5) is None
    runner.join(timeout=60)
    ct.release("warehouse", "newcomer")
    assert results and results[0].success, results
    assert granted and len(tries) >= 2
    step_events = [e.event_type_value for e in results[0].all_events if e.step_key == "polite"]
    assert "STEP_UP_FOR_RETRY" in step_events


def test_retry_mode_gives_up_after_max_retries_and_leaves_the_queue(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="long-job")

    @op
    def polite(controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", wait="retry", retry_interval=0.1, max_retries=2):
            pass

    @job
    def polite_job() -> None:
        polite()

    try:
        result = polite_job.execute_in_process(resources={"controltable": resource}, raise_on_error=False)
        error = _failure(result)
        assert error.cls_name == "Failure"
        assert "still busy after" in error.message and "max_retries=2" in error.message
        (status,) = ct.status(["warehouse"])
        assert [w.holder for w in status.waiters if not w.expired] == []
    finally:
        blocker.release()


def test_retry_requested_is_raised_outside_dagster_too(ct: Any, resource: ControlTableResource) -> None:
    """Called from plain code with an explicit holder, retry mode raises RetryRequested itself."""
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="someone")
    try:
        with pytest.raises(RetryRequested), resource.slot("warehouse", holder="script", wait="retry"):
            pass
        with pytest.raises(Failure, match="holder"), resource.slot("warehouse", wait="retry"):
            pass
    finally:
        blocker.release()
        ct.release("warehouse", "script")
        resource.close()


def test_acquire_and_release_default_to_the_step_holder(ct: Any, resource: ControlTableResource) -> None:
    ct.set_capacity("warehouse", 2)
    seen: dict[str, Any] = {}

    @op
    def manual(context: OpExecutionContext, controltable: ControlTableResource) -> None:
        lease = controltable.acquire("warehouse", mode="shared")
        seen["holder"] = lease.holder
        seen["again"] = controltable.acquire("warehouse", mode="shared").token == lease.token  # idempotent
        assert controltable.release("warehouse") == 1

    @job
    def manual_job() -> None:
        manual()

    result = manual_job.execute_in_process(resources={"controltable": resource})
    assert result.success and seen["again"]
    assert seen["holder"] == f"dagster:{result.run_id}:manual"
    (status,) = ct.status(["warehouse"])
    assert status.holders == []


def test_interrupt_inside_the_slot_releases_it(ct: Any, resource: ControlTableResource) -> None:
    """A cancelled run interrupts the step with a BaseException; the slot must be freed at once."""
    ct.set_capacity("warehouse", 1)
    with pytest.raises(KeyboardInterrupt), resource.slot("warehouse", holder="cancelled-step"):
        raise KeyboardInterrupt
    (status,) = ct.status(["warehouse"])
    assert status.holders == [] and status.waiters == []
    resource.close()


def test_interrupt_while_waiting_leaves_the_queue(ct: Any, resource: ControlTableResource,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ct.set_capacity("warehouse", 1)
    blocker = ct.acquire("warehouse", holder="someone")
    control = resource.control_table

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # what Dagster's termination does to a step blocked in acquire

    monkeypatch.setattr(control, "acquire", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt), resource.slot("warehouse", holder="waiting-step"):
            pass
        (status,) = ct.status(["warehouse"])
        assert [w.holder for w in status.waiters] == []  # the try_acquire queue entry was withdrawn
    finally:
        blocker.release()
        resource.close()


def test_priority_from_the_dagster_priority_tags(ct: Any, resource: ControlTableResource) -> None:
    """Opt-in: the run's plus the op's ``dagster/priority`` tags are the slot request's priority."""
    ct.set_capacity("warehouse", 1)
    other = ct.acquire("warehouse", holder="other", timeout=0)
    assert ct.try_acquire("warehouse", holder="earlier-low") is None
    seen: dict[str, Any] = {}

    def watch() -> None:  # once the step waits, note its place and priority, then free the slot
        def queued() -> bool:
            (st,) = ct.status(["warehouse"])
            if any(w.holder.startswith("dagster:") for w in st.waiters):
                seen["waiters"] = [(w.holder.startswith("dagster:"), w.priority) for w in st.waiters]
                return True
            return False

        try:
            wait_until(queued, 30, "the step to queue", interval=0.05)
        finally:  # released either way: the test then reports what was (not) seen
            other.release()

    @op(tags={"dagster/priority": "3"})
    def urgent(controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", priority_from_tag=True, timeout=30) as lease:
            seen["token"] = lease.token

    @job(tags={"dagster/priority": "2"})
    def urgent_job() -> None:
        urgent()

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = urgent_job.execute_in_process(resources={"controltable": resource})
    watcher.join(30)
    assert result.success
    assert seen["waiters"] == [(True, 5), (False, 0)]  # 2 + 3, ahead of the earlier request
    order = [r.holder for r in reversed(ct.history("warehouse"))]  # oldest first
    assert order[0] == "other" and order[1].startswith("dagster:") and order[2] == "earlier-low"
    ct.release("warehouse", "earlier-low")
