"""Drain an event table in mapped batches: claim, process each batch in its own task, complete.

Setup: a connection ``controltable_default`` (see ``controltable_warehouse_slot.py``). The first
task creates a demo ``example_events`` table beside the control tables and adds a few events; in
real use the events are your own table and ``controltable events prepare`` adds the claim columns
once.

Several DAG runs (or Dagster jobs) can drain the same table at once: a claim skips rows others hold,
and completion is fenced on the batch token, so a batch whose lease ran out fails clearly instead
of marking rows another worker re-claimed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from airflow_controltable.hooks.controltable import ControlTableHook
from airflow_controltable.operators.events import ClaimBatchOperator, CompleteBatchOperator
from airflow_controltable.sensors.events import PendingEventsSensor

CONN_ID = "controltable_default"
TABLE = "example_events"

events_table = Table(
    TABLE,
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("payload", String(200), nullable=False),
)

with DAG(
    dag_id="controltable_event_batches",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"new_events": Param(25, type="integer", description="demo events to add first")},
    tags=["controltable", "example"],
) as dag:

    @task
    def add_demo_events() -> int:
        """Create the demo event table, prepare it for claiming, and append some events."""
        table = ControlTableHook(CONN_ID).get_control_table()
        table.install()
        events_table.create(table.engine, checkfirst=True)
        table.events(TABLE, key="id").prepare()
        count = int(get_current_context()["params"]["new_events"])
        with table.engine.begin() as conn:
            start = int(conn.scalar(select(func.coalesce(func.max(events_table.c.id), 0))) or 0) + 1
            if count:
                conn.execute(insert(events_table), [
                    {"id": i, "payload": f"event {i}"} for i in range(start, start + count)])
        return count

    wait = PendingEventsSensor(
        task_id="wait_for_events", table=TABLE, key="id", min_events=1, conn_id=CONN_ID,
        deferrable=True, poke_interval=5, timeout=3600,
    )

    # Up to 10 batches of 10 events: one handle each, mapped below.
    claim = ClaimBatchOperator(
        task_id="claim_batches", table=TABLE, key="id", size=10, max_batches=10, conn_id=CONN_ID, lease=1800,
    )

    @task
    def process(handle: dict[str, Any]) -> dict[str, Any]:
        """Process one batch. Rebuild the rows from the handle (keys travel through XCom, not data)."""
        table = ControlTableHook(CONN_ID).get_control_table()
        batch = table.events(handle["table"], key=handle["key"]).batch(handle)
        for row in batch.rows:
            print(f"processing {row['id']}: {row['payload']}")
        return handle

    processed = process.expand(handle=claim.output)
    complete = CompleteBatchOperator.partial(task_id="complete_batch", conn_id=CONN_ID).expand(handle=processed)

    add_demo_events() >> wait >> claim


if __name__ == "__main__":
    dag.test()
