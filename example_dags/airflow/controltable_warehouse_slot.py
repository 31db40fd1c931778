"""Hold the warehouse slot around a load, released by a teardown even when the load fails.

Setup: a connection ``controltable_default`` pointing at the control database, e.g. the embedded
SQLite control table::

    export AIRFLOW_CONN_CONTROLTABLE_DEFAULT='{"conn_type": "controltable",
        "extra": {"url": "sqlite:////tmp/controltable.db", "namespace": "default"}}'

Every DAG run (of this or any other DAG, Airflow deployment, Dagster job or shell script using the
same namespace) waits in FIFO order for the one ``warehouse`` slot. The sensor is deferrable, so
waiting costs no worker slot; the slot belongs to the DAG run until ``release_warehouse`` frees it.
The load writes its fencing token next to its data so a stale writer (whose lease expired) could be
rejected by the warehouse.

Params: ``fail`` makes the load fail (the teardown still releases the slot), ``load_seconds`` is
how long the pretend load takes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, task
from warehouse_example import CONN_ID, RESOURCE, ensure_resource, pretend_load

from airflow_controltable.operators.slots import ReleaseSlotOperator
from airflow_controltable.sensors.slots import SlotSensor

with DAG(
    dag_id="controltable_warehouse_slot",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=4,
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

    acquire = SlotSensor(
        task_id="acquire_warehouse",
        resource=RESOURCE,
        conn_id=CONN_ID,
        deferrable=True,  # wait in the triggerer, not on a worker
        poke_interval=2,
        timeout=6 * 3600,
        # lease: the default (6 h) must outlast the load; set it to the load's execution_timeout + margin
    )

    @task
    def load(lease: dict[str, Any]) -> dict[str, Any]:
        """The work under the slot. A real load would pass ``lease['token']`` to the warehouse."""
        return pretend_load(lease["token"], on_failure="the teardown still releases the slot")

    release = ReleaseSlotOperator(task_id="release_warehouse", resource=RESOURCE, conn_id=CONN_ID)

    ensure() >> acquire
    load(acquire.output) >> release.as_teardown(setups=acquire)


if __name__ == "__main__":
    dag.test()
