"""``pending_events_sensor``: request a run when an event table has claimable events.

The run key is derived from the backlog (the newest claimable key in claim order) and a sequence
number kept in the sensor cursor. While a run requested for a backlog is queued or running, the
same backlog is never requested again, not even when the daemon re-evaluates a tick whose cursor
was not saved (the same cursor gives the same run key, and Dagster drops duplicate run keys). A
new backlog (new events) gets a new key. If the requested run finished and claimable events of
the same backlog are left (it failed and the back-off passed, or it processed only part), the
backlog is requested once more under the next sequence number.
"""

import json
import time
from typing import Any, Mapping, Optional, Union

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from controltable import ControlTableError

from .resource import ControlTableResource, as_failure

RUN_KEY_TAG = "dagster/run_key"
IN_FLIGHT = {
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
    DagsterRunStatus.MANAGED,
}


def _backlog(resource: ControlTableResource, table: str, key: str, order_by: Optional[str],
             schema: Optional[str]) -> tuple[int, Any]:
    """How many events are claimable now, and the newest claimable key (the backlog's signature)."""
    events = resource.events(table, key=key, order_by=order_by, schema=schema)
    ct = resource.control_table
    try:
        count = events.pending_count()
        if count == 0:
            return 0, None
        t = events.table
        now = ct.now()
        stmt = (
            select(t.c[events.key])
            .where(events.claimable(now))
            .order_by(t.c[events.order_by].desc(), t.c[events.key].desc())
            .limit(1)
        )
        with ct.engine.connect() as conn:
            newest = conn.scalar(stmt)
        return count, newest
    except (ControlTableError, SQLAlchemyError) as exc:
        raise as_failure(exc, f"counting claimable events of {table!r}", url=resource.safe_url,
                         namespace=resource.namespace) from exc


def _run_for_key(context: SensorEvaluationContext, run_key: str) -> Optional[Any]:
    """The run this sensor requested under ``run_key``, if this Dagster instance has it."""
    try:
        runs = context.instance.get_runs(filters=RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    except Exception:  # no instance (a bare test context): behave as if the run is not known yet
        return None
    return runs[0] if runs else None


def _load_cursor(raw: Optional[str]) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def pending_events_sensor(
    job: Union[JobDefinition, Any],
    *,
    table: str,
    key: str,
    min_events: int = 1,
    order_by: Optional[str] = None,
    schema: Optional[str] = None,
    name: Optional[str] = None,
    minimum_interval_seconds: int = 30,
    resource_key: str = "controltable",
    run_config: Optional[Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, str]] = None,
    rerequest_after: float = 600.0,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    description: Optional[str] = None,
) -> SensorDefinition:
    """A sensor that requests ``job`` when ``table`` has at least ``min_events`` claimable events.

    The job should drain the table (e.g. with :func:`build_batch_op`). ``rerequest_after`` is
    how long to wait for a requested run to appear in this instance before assuming it was lost
    and requesting the backlog again; a run that is known and still queued or running always
    blocks a second request for the same backlog.
    """
    if min_events < 1:
        raise ValueError(f"min_events must be at least 1, got {min_events}")
    sensor_name = name or f"{table}_pending_events"

    @sensor(
        name=sensor_name,
        job=job,
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={resource_key},
        default_status=default_status,
        description=description or f"Requests {getattr(job, 'name', 'the job')} when {table} has claimable events.",
    )
    def _pending_events(context: SensorEvaluationContext, **resources: Any) -> Union[SensorResult, SkipReason]:
        # Dagster passes required resources as keyword arguments when the sensor is called directly
        # (tests), and through context.resources when the daemon evaluates a tick.
        resource: ControlTableResource = resources.get(resource_key) or getattr(context.resources, resource_key)
        count, newest = _backlog(resource, table, key, order_by, schema)
        if count < min_events:
            return SkipReason(f"{count} claimable event(s) in {table!r}, fewer than min_events={min_events}")
        signature = json.dumps(newest if isinstance(newest, (int, float, str, bool)) else str(newest))
        cursor = _load_cursor(context.cursor)
        seq = int(cursor.get("seq", 0))
        if cursor.get("backlog") == signature and cursor.get("run_key"):
            run = _run_for_key(context, str(cursor["run_key"]))
            if run is not None and run.status in IN_FLIGHT:
                return SkipReason(
                    f"{count} claimable event(s) in {table!r} already requested: run {run.run_id} is "
                    f"{run.status.value}"
                )
            if run is None and time.time() - float(cursor.get("at", 0)) < rerequest_after:
                return SkipReason(
                    f"{count} claimable event(s) in {table!r} already requested as {cursor['run_key']!r}; "
                    f"requesting again after {rerequest_after:g} s if no such run appears"
                )
        seq += 1
        run_key = f"{table}:{signature}:{seq}"
        request = RunRequest(
            run_key=run_key,
            run_config=dict(run_config or {}),
            tags={
                **dict(tags or {}),
                "controltable/table": table,
                "controltable/claimable": str(count),
                "controltable/backlog": signature[:200],
            },
        )
        new_cursor = json.dumps({"backlog": signature, "run_key": run_key, "seq": seq, "at": time.time()})
        context.log.info(f"requesting a run for {count} claimable event(s) of {table!r} as {run_key!r}")
        return SensorResult(run_requests=[request], cursor=new_cursor)

    return _pending_events
