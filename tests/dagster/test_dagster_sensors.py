"""pending_events_sensor with build_sensor_context: requests, run keys, no double requests."""

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
