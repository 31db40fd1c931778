"""The code location the live tests deploy: jobs that hold a slot and record it, a drain job, sensors.

Loaded by a real code server (``dagster api grpc -f``) next to ``dagster-daemon`` and
``dagster-webserver``; configured through the environment the harness sets:
CONTROLTABLE_URL and CONTROLTABLE_NAMESPACE (the control table), LIVE_RECORDS (a folder where
every hold writes what it saw, so the test checks the runs from their own records).

(No ``from __future__ import annotations``: Dagster reads the ``context`` annotations.)
"""

import json
import os
import time
from pathlib import Path
from typing import Optional

from dagster import (
    Config,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    OpExecutionContext,
    in_process_executor,
    job,
    multiprocess_executor,
    op,
)
from sqlalchemy import MetaData, Table, insert

from dagster_controltable import (
    ControlTableResource,
    build_batch_op,
    controltable_run_cleanup_sensor,
    pending_events_sensor,
)

EVENTS = os.environ.get("LIVE_EVENT_TABLE", "live_events")
RECORDS = Path(os.environ.get("LIVE_RECORDS", "."))

controltable = ControlTableResource(url=EnvVar("CONTROLTABLE_URL"), namespace=EnvVar("CONTROLTABLE_NAMESPACE"),
                                    default_lease=30.0)


class HoldConfig(Config):
    resource: str = "live"
    hold: float = 1.0
    wait: str = "block"
    lease: float = 30.0
    retry_interval: float = 5.0
    max_retries: int = 200
    waiter_ttl: Optional[float] = None


def _write(name: str, record: dict) -> None:
    tmp = RECORDS / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(RECORDS / name)


@op
def hold(context: OpExecutionContext, config: HoldConfig, controltable: ControlTableResource) -> None:
    """Hold one slot of ``config.resource`` for ``config.hold`` seconds and record the interval."""
    key = f"{context.run_id}_{context.op.name}"
    with controltable.slot(config.resource, lease=config.lease, wait=config.wait, waiter_ttl=config.waiter_ttl,
                           retry_interval=config.retry_interval, max_retries=config.max_retries) as lease:
        start = time.time()
        info = {"run_id": context.run_id, "holder": lease.holder, "resource": config.resource,
                "token": lease.token, "ticket": lease.ticket, "mode": lease.mode, "slots": lease.slots,
                "pid": os.getpid(), "ppid": os.getppid(), "start": start}
        _write(f"holding_{key}.json", info)
        time.sleep(config.hold)
        end = time.time()
    _write(f"held_{key}.json", {**info, "end": end})


@job(executor_def=in_process_executor)
def hold_job() -> None:
    hold()


@job(executor_def=multiprocess_executor)
def hold_job_mp() -> None:
    hold()


def _drain(context: OpExecutionContext, batch) -> None:  # type: ignore[no-untyped-def]
    """Log every key with the batch token, in the transaction that completes the batch."""
    log = Table(f"{EVENTS}_log", MetaData(), autoload_with=batch.events.engine)
    with batch.transaction() as conn:
        conn.execute(insert(log), [{"event_id": int(k), "token": int(batch.token), "run_id": context.run_id}
                                   for k in batch.keys])


drain_events = build_batch_op(_drain, table=EVENTS, key="id", size=20, name="drain_live_events")


@job(executor_def=in_process_executor)
def drain_job() -> None:
    drain_events()


events_sensor = pending_events_sensor(drain_job, table=EVENTS, key="id", minimum_interval_seconds=1,
                                      default_status=DefaultSensorStatus.RUNNING)
cleanup_sensor = controltable_run_cleanup_sensor(minimum_interval_seconds=1,
                                                 default_status=DefaultSensorStatus.RUNNING)


defs = Definitions(
    jobs=[hold_job, hold_job_mp, drain_job],
    sensors=[events_sensor, cleanup_sensor] if os.environ.get("LIVE_EVENTS_SENSOR") == "1" else [cleanup_sensor],
    resources={"controltable": controltable},
)
