"""``pending_events_sensor``: request a run when an event table has claimable events.

The run key is derived from the backlog (the newest claimable key in claim order) and a sequence
number kept in the sensor cursor. While a run requested for a backlog is queued or running, the
same backlog is never requested again, not even when the daemon re-evaluates a tick whose cursor
was not saved (the same cursor gives the same run key, and Dagster drops duplicate run keys). A
new backlog (new events) gets a new key. If the requested run finished and claimable events of
the same backlog are left (it failed and the back-off passed, or it processed only part), the
backlog is requested once more under the next sequence number.

``controltable_run_cleanup_sensor``: withdraw the slots and queue places of cancelled and failed runs.
"""

import json
import time
from datetime import datetime, timezone
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

from controltable import ControlTableError

from . import defaults
from .resource import ControlTableResource
from .text import duration

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
             schema: Optional[str], time_column: Optional[str] = None) -> tuple[int, Any]:
    """How many events are claimable now, and the newest claimable position (the backlog's signature)."""
    events = resource.events(table, key=key, order_by=order_by, table_schema=schema, time_column=time_column)
    try:
        return events.backlog()
    except ControlTableError as exc:
        raise resource.failure(exc, f"counting claimable events of {table!r}") from exc


def _waiting_for(resource: ControlTableResource, table: str, key: str, order_by: Optional[str],
                 schema: Optional[str], claimable: int, time_column: Optional[str] = None) -> str:
    """What the rest of the backlog waits for, for a skip reason a user can act on (see :func:`describe_backlog`)."""
    try:
        st = resource.events(table, key=key, order_by=order_by, table_schema=schema, time_column=time_column).stats()
    except Exception as exc:  # the skip reason is informational; the next tick tries again
        return f"details unavailable ({type(exc).__name__})"
    return describe_backlog(st, claimable, table=table, key=key)


def describe_backlog(stats: Any, claimable: int, *, table: str, key: str) -> str:
    """The events of ``stats`` (an ``EventStats``) that a claim cannot take now, and what each group waits for.

    Events that are not claimable are either claimed by a running batch (they come back if its
    lease runs out), backing off after a failed attempt, or in the error state (they wait for a
    person: ``controltable events retry-errors``). The oldest pending event is named, with its
    age when the table has a time column, so a stuck backlog shows how long it has been stuck.
    """
    backing_off = max(stats.pending - max(claimable - stats.expired, 0), 0)
    parts = []
    if stats.claimed:
        live = stats.claimed - stats.expired
        parts.append(f"{live} claimed by running batches" + (f", {stats.expired} with expired claims (claimable)"
                                                             if stats.expired else ""))
    if backing_off:
        parts.append(f"{backing_off} backing off after a failed attempt")
    if stats.error:
        parts.append(f"{stats.error} in error after their last attempt (retry them with `controltable events "
                     f"retry-errors {table} --key {key}` or EventTable.retry_errors())")
    if stats.pending and stats.oldest_pending_key is not None:
        age = stats.oldest_pending_age
        parts.append(f"oldest pending: {key}={stats.oldest_pending_key!r}"
                     + (f", {duration(age)} old" if age is not None else ""))
    return "; ".join(parts) if parts else "nothing else pending"


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
    table_schema: Optional[str] = None,
    name: Optional[str] = None,
    minimum_interval_seconds: int = defaults.EVENTS_SENSOR_INTERVAL,
    resource_key: str = defaults.RESOURCE_KEY,
    run_config: Optional[Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, str]] = None,
    rerequest_after: float = defaults.REREQUEST_AFTER,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    description: Optional[str] = None,
    time_column: Optional[str] = None,
) -> SensorDefinition:
    """A sensor that requests ``job`` when ``table`` has at least ``min_events`` claimable events.

    The job should drain the table (e.g. with :func:`build_batch_op`). ``rerequest_after`` is
    how long to wait for a requested run to appear in this instance before assuming it was lost
    and requesting the backlog again; a run that is known and still queued or running always
    blocks a second request for the same backlog. ``table_schema`` is the event table's schema.
    A skip reason says what the events that are not
    claimable wait for, and how old the oldest pending one is when ``time_column`` names the
    column holding each event's time.
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
        count, newest = _backlog(resource, table, key, order_by, table_schema, time_column)
        if count < min_events:
            waiting = _waiting_for(resource, table, key, order_by, table_schema, count, time_column)
            return SkipReason(f"{count} claimable event(s) in {table!r}, fewer than min_events={min_events}; "
                              f"others: {waiting}")
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
                "controltable/backlog": signature[:defaults.BACKLOG_TAG_LENGTH],
            },
        )
        new_cursor = json.dumps({"backlog": signature, "run_key": run_key, "seq": seq, "at": time.time()})
        context.log.info(f"requesting a run for {count} claimable event(s) of {table!r} as {run_key!r}")
        return SensorResult(run_requests=[request], cursor=new_cursor)

    return _pending_events


#: Run states whose slot requests the cleanup sensor withdraws (the run will never use them again).
CLEANUP_STATUSES = (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
#: Seconds the cleanup sensor looks back before its cursor (runs seen again are skipped by run id).
_CLEANUP_OVERLAP = defaults.CLEANUP_OVERLAP


def controltable_run_cleanup_sensor(
    *,
    name: str = "controltable_run_cleanup",
    resource_key: str = defaults.RESOURCE_KEY,
    minimum_interval_seconds: int = defaults.CLEANUP_SENSOR_INTERVAL,
    lookback: float = defaults.CLEANUP_LOOKBACK,
    max_runs: int = defaults.CLEANUP_MAX_RUNS,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    description: Optional[str] = None,
) -> SensorDefinition:
    """A sensor that withdraws every slot and queue place of a cancelled or failed run at once.

    A step waiting between retries (``slot(wait="retry")``) has no process that could leave the
    queue when its run is cancelled; a step whose run worker was killed cannot release either.
    Without this sensor their entries stay until their waiter TTL or lease runs out, and strict
    FIFO holds everyone behind them (other Dagster instances, Airflow, shell jobs included). The
    sensor looks at runs that became CANCELED or FAILURE since its last tick and calls
    :meth:`ControlTableResource.release_run` for each (holder ids ``dagster:<run id>:*``), in the
    resource's namespace and, if the run's config gave the resource another namespace, in that
    one too. Dagster evaluates sensors every few seconds at best (``minimum_interval_seconds``);
    the resource's own teardown withdraws a run's requests at once where it can (in-process
    executor, cancelled steps). ``lookback`` bounds the first tick's look into the past.
    """

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={resource_key},
        default_status=default_status,
        description=description or ("Withdraws the controltable slots and queue places of cancelled and failed "
                                    "runs."),
    )
    def _cleanup(context: SensorEvaluationContext, **resources: Any) -> SkipReason:
        resource: ControlTableResource = resources.get(resource_key) or getattr(context.resources, resource_key)
        cursor = _load_cursor(context.cursor)
        now = time.time()
        last = float(cursor.get("updated", now - lookback))
        seen = set(cursor.get("seen", []))
        records = context.instance.get_run_records(
            filters=RunsFilter(statuses=list(CLEANUP_STATUSES),
                               updated_after=datetime.fromtimestamp(last - _CLEANUP_OVERLAP, tz=timezone.utc)),
            order_by="update_timestamp", ascending=True, limit=max_runs,
        )
        withdrawn: dict[str, int] = {}
        newest = last
        recent: list[tuple[float, str]] = []
        for record in records:
            run = record.dagster_run
            updated = record.update_timestamp.timestamp()
            newest = max(newest, updated)
            recent.append((updated, run.run_id))
            if run.run_id in seen:
                continue
            count = resource.release_run(run.run_id)
            other = _run_namespace(run, resource_key)
            if other is not None and other != resource.namespace:
                count += resource.release_run(run.run_id, namespace=other)
            if count:
                withdrawn[run.run_id] = count
                context.log.info(f"controltable: run {run.run_id} is {run.status.value}: withdrew {count} slot "
                                 "request(s)")
        keep = [run_id for updated, run_id in recent if updated >= newest - _CLEANUP_OVERLAP]
        context.update_cursor(json.dumps({"updated": newest, "seen": keep[-max_runs:]}))
        if withdrawn:
            runs = ", ".join(f"{run_id} ({n})" for run_id, n in withdrawn.items())
            return SkipReason(f"withdrew the slot requests of cancelled/failed runs: {runs}")
        return SkipReason(f"no slot requests of cancelled or failed runs to withdraw ({len(records)} such run(s) "
                          "looked at)")

    return _cleanup


def _run_namespace(run: Any, resource_key: str) -> Optional[str]:
    """The namespace a run's own config gave the resource (Dagster resets it to "default" if left out)."""
    try:
        config = (run.run_config or {}).get("resources", {}).get(resource_key, {})
    except AttributeError:
        return None
    if not isinstance(config, Mapping) or "config" not in config:
        return None
    value = config["config"].get("namespace", "default") if isinstance(config["config"], Mapping) else None
    return value if isinstance(value, str) else None
