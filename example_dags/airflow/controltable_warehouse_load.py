"""The recommended pattern: the load task itself holds the warehouse slot, waiting for it deferred.

Setup: a connection ``controltable_default`` (see ``controltable_warehouse_slot.py``).

``@task.controltable_slot("warehouse")`` asks for the slot when the task starts. If the slot is
taken (by another run, another Airflow deployment, a Dagster job or a shell script in the same
namespace), the task defers: it waits in the triggerer, woken by the database's notifications,
holding no worker slot. When granted it resumes on a worker, runs the load under the slot with a
short lease renewed by its own process, and releases the slot when the load returns, fails or is
killed. A retry gets a new, higher fencing token, which the load writes beside its data so the
warehouse could reject a stale writer.

Params: ``fail`` makes the load fail (the slot is still released at once), ``load_seconds`` is how
long the pretend load takes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task
from warehouse_example import CONN_ID, RESOURCE, ensure_resource, pretend_load

with DAG(
    dag_id="controltable_warehouse_load",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=8,
    params={
        "fail": Param(False, type="boolean", description="make the load fail"),
        "load_seconds": Param(2.0, type="number", description="duration of the pretend load"),
    },
    tags=["controltable", "example"],
) as dag:

    @task(task_id="ensure_resource")
    def ensure() -> None:
        """Create the control tables and the resource (once is enough; the CLI can do it too)."""
        ensure_resource()

    @task.controltable_slot(RESOURCE, conn_id=CONN_ID, slot_mode="exclusive", wait_timeout=6 * 3600)
    def load(lease: Any = None) -> dict[str, Any]:
        """The work under the slot; ``lease.token`` is the fencing token to hand to the warehouse."""
        return pretend_load(lease.token, on_failure="the slot is released all the same")

    ensure() >> load()


if __name__ == "__main__":
    dag.test()
