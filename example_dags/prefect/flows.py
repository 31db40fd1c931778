"""Prefect example for controltable: a shared warehouse slot, an event table drained in batches, a work list.

Run it against the embedded SQLite control table (no server needed beyond Prefect's own)::

    export CONTROLTABLE_URL=sqlite:///$(mktemp -d)/controltable.db   # or postgresql+psycopg://...
    python example_dags/prefect/flows.py

or deploy it to a process work pool (``prefect worker start --pool etl --type process``)::

    prefect block register -m prefect_controltable
    python -c "from prefect_controltable import ControlTableBlock as B; B(url='postgresql+psycopg://etl@db/wh').save('prod')"
    prefect deploy example_dags/prefect/flows.py:nightly --name nightly --pool etl

Every flow run holds the ``warehouse`` slot with the same queue as Airflow tasks, Dagster ops and
shell jobs (``controltable run --resource warehouse -- ./load.sh``) on that database.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import flow, task
from prefect_controltable import ControlTableBlock, build_batch_task, build_worklist_task, slot
from sqlalchemy import Column, Float, Integer, MetaData, Table, insert

BLOCK_NAME = os.environ.get("CONTROLTABLE_BLOCK", "controltable-example")
EVENTS = "demo_events"


def ensure_setup() -> ControlTableBlock:
    """Save the block (from CONTROLTABLE_URL) and create the demo's tables, once."""
    block = ControlTableBlock(url=os.environ.get("CONTROLTABLE_URL", "sqlite:///controltable.db"))
    block.save(BLOCK_NAME, overwrite=True)
    ct = block.control_table()
    ct.install()
    ct.set_capacity("warehouse", 2)
    events = Table(EVENTS, MetaData(), Column("event_id", Integer, primary_key=True), Column("mm", Float))
    events.create(ct.engine, checkfirst=True)
    with ct.engine.begin() as conn:
        conn.execute(insert(events), [{"mm": n / 10} for n in range(50)])
    ct.events(EVENTS, key="event_id").prepare()
    worklist = ct.worklist("reports")
    worklist.populate([{"report": "orders"}, {"report": "customers"}], order=100)
    worklist.populate([{"report": "summary"}], order=200)  # starts once both of order 100 are done
    return block


@task(retries=2, retry_delay_seconds=5)
def load_orders() -> int:
    """Holds one of the warehouse's two slots while it loads; a retry gets a new fencing token."""
    with slot("warehouse", block=BLOCK_NAME) as lease:
        return lease.token


def handle(batch: Any) -> None:
    print(f"batch {batch.token}: {len(batch.rows)} event(s)")


def report(item: Any) -> None:
    print(f"report {item.payload['report']} (order {item.order})")


drain_events = build_batch_task(handle, block=BLOCK_NAME, table=EVENTS, key="event_id", size=20)
build_reports = build_worklist_task(report, block=BLOCK_NAME, worklist="reports", timeout=60)


@flow(log_prints=True)
def nightly() -> dict[str, Any]:
    tokens = [load_orders.submit() for _ in range(3)]
    drained = drain_events()
    reports = build_reports()
    return {"tokens": [t.result() for t in tokens], "events": drained["events"], "reports": reports["items"]}


if __name__ == "__main__":
    ensure_setup()
    print(nightly())
