"""pending_events_sensor with build_sensor_context: requests, run keys, no double requests."""

import re
import time
from typing import Any

import pytest
from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    SensorResult,
    SkipReason,
    build_sensor_context,
    job,
)

from dagster_controltable import ControlTableResource, build_batch_op, pending_events_sensor

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


def _job(table: str, **kwargs: Any) -> Any:
    drain = build_batch_op(lambda context, batch: None, table=table, key="id", name="drain", **kwargs)

    @job
    def drain_job() -> None:
        drain()

    return drain_job


def _tick(sensor: Any, resource: ControlTableResource, instance: DagsterInstance,
          cursor: Any = None) -> Any:
    # The resource has setup/teardown, so the context must be entered (see FINDINGS: a "generator" resource).
    with build_sensor_context(instance=instance, cursor=cursor, resources={"controltable": resource}) as ctx:
        return sensor(ctx)


def _requests(result: Any) -> list[RunRequest]:
    assert isinstance(result, SensorResult), result
    return list(result.run_requests or [])


def test_skips_without_claimable_events(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(0)
    sensor = pending_events_sensor(_job(table), table=table, key="id")
    with DagsterInstance.ephemeral() as instance:
        result = _tick(sensor, resource, instance)
    assert isinstance(result, SkipReason) and "0 claimable" in (result.skip_message or "")


def test_min_events(ct: Any, resource: ControlTableResource, make_events: Any, add_events: Any) -> None:
    table = make_events(3)
    sensor = pending_events_sensor(_job(table), table=table, key="id", min_events=5)
    with DagsterInstance.ephemeral() as instance:
        assert isinstance(_tick(sensor, resource, instance), SkipReason)
        add_events(table, [4, 5])
        (request,) = _requests(_tick(sensor, resource, instance))
    assert request.tags["controltable/claimable"] == "5"


def test_run_keys_never_double_request_the_same_backlog(ct: Any, resource: ControlTableResource,
                                                        make_events: Any, add_events: Any) -> None:
    table = make_events(10)
    job_def = _job(table)
    sensor = pending_events_sensor(job_def, table=table, key="id")
    with DagsterInstance.ephemeral() as instance:
        first = _tick(sensor, resource, instance)
        (request,) = _requests(first)
        assert request.run_key and request.tags["controltable/claimable"] == "10"
        # A tick re-evaluated with the old cursor (cursor not saved) gives the same key: Dagster dedupes it.
        (again,) = _requests(_tick(sensor, resource, instance))
        assert again.run_key == request.run_key
        # With the cursor saved and the run queued, the same backlog is not requested again.
        instance.create_run_for_job(job_def, status=DagsterRunStatus.STARTED,
                                    tags={"dagster/run_key": request.run_key})
        skipped = _tick(sensor, resource, instance, cursor=first.cursor)
        assert isinstance(skipped, SkipReason) and "already requested" in (skipped.skip_message or "")
        # New events: a new backlog, a new key.
        add_events(table, [11, 12])
        second = _tick(sensor, resource, instance, cursor=first.cursor)
        (new_request,) = _requests(second)
        assert new_request.run_key != request.run_key


def test_requests_again_when_the_run_finished_and_left_events(
    ct: Any, resource: ControlTableResource, make_events: Any
) -> None:
    table = make_events(6)
    job_def = _job(table, size=2, max_batches=1)  # each run takes only one batch of two
    sensor = pending_events_sensor(job_def, table=table, key="id")
    with DagsterInstance.ephemeral() as instance:
        first = _tick(sensor, resource, instance)
        (request,) = _requests(first)
        result = job_def.execute_in_process(instance=instance, resources={"controltable": resource},
                                            tags={"dagster/run_key": request.run_key})
        assert result.success
        second = _tick(sensor, resource, instance, cursor=first.cursor)
        (retry,) = _requests(second)
        assert retry.run_key != request.run_key and retry.tags["controltable/claimable"] == "4"


def test_unknown_run_is_requested_again_only_after_rerequest_after(
    ct: Any, resource: ControlTableResource, make_events: Any
) -> None:
    table = make_events(2)
    patient = pending_events_sensor(_job(table), table=table, key="id", rerequest_after=3600)
    eager = pending_events_sensor(_job(table), table=table, key="id", rerequest_after=0, name="eager")
    with DagsterInstance.ephemeral() as instance:
        first = _tick(patient, resource, instance)
        _requests(first)
        assert isinstance(_tick(patient, resource, instance, cursor=first.cursor), SkipReason)
        (again,) = _requests(_tick(eager, resource, instance, cursor=first.cursor))
        assert again.run_key.endswith(":2")


def test_evaluate_tick_through_dagster(ct: Any, resource: ControlTableResource, make_events: Any) -> None:
    table = make_events(1)
    sensor = pending_events_sensor(_job(table), table=table, key="id", name="my_sensor")
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
        instance=instance, resources={"controltable": resource}
    ) as ctx:
        data = sensor.evaluate_tick(ctx)
    (request,) = data.run_requests
    assert request.tags["dagster/sensor_name"] == "my_sensor"
    assert data.cursor is not None


def test_skip_reason_says_what_the_events_wait_for_and_how_old_the_oldest_is(
    ct: Any, resource: ControlTableResource, timed_events: Any
) -> None:
    made = time.monotonic()
    table = timed_events([(1, 7300.0), (2, 60.0), (3, 30.0), (4, 10.0)])
    events = ct.events(table, key="id", max_attempts=1, backoff=600)
    assert events.claim(1, owner="test").fail("boom") == 1  # id 1: in error after its last attempt
    retrying = ct.events(table, key="id", max_attempts=5, backoff=600)
    assert retrying.claim(1, owner="test").fail("flaky") == 1  # id 2: backing off for 10 minutes
    assert retrying.claim(1, owner="test") is not None  # id 3: claimed by a running batch
    sensor = pending_events_sensor(_job(table), table=table, key="id", min_events=5, time_column="created_at")
    with DagsterInstance.ephemeral() as instance:
        result = _tick(sensor, resource, instance)
    assert isinstance(result, SkipReason)
    reason = result.skip_message or ""
    assert reason.startswith(f"1 claimable event(s) in {table!r}, fewer than min_events=5"), reason
    assert "1 claimed by running batches" in reason
    assert "1 backing off after a failed attempt" in reason
    assert "1 in error after their last attempt" in reason and "retry-errors" in reason
    # The oldest pending event in claim order (id 1 is in error, not pending), with its age:
    # 60 s old when made, plus the time the test took since (a loaded machine once took 10 s),
    # plus up to 1 s because the fixture stores whole seconds (truncated, so older), plus up to
    # 0.5 s because the reason rounds to whole seconds. A defect (a wrong row, a client clock,
    # a time zone) is off by far more than these.
    found = re.search(r"oldest pending: id=2, (\d+) s old", reason)
    assert found, reason
    assert 59 <= int(found.group(1)) <= 60 + (time.monotonic() - made) + 1.5, reason
