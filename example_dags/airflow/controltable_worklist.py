"""Run an ordered work list: every item of one order finishes before the next order starts.

Setup: a connection ``controltable_default`` (see ``controltable_warehouse_slot.py``). The first
task fills a work list of this run (extract at order 100, transform at 200, publish at 300). Each
stage allocates the items of the current order, maps one worker task per item, and completes
them; the next stage's allocation only hands out the next order once all of the previous are done.
Workers of other DAG runs or Dagster jobs pulling from the same list interleave safely.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, chain, get_current_context, task

from airflow_controltable.hooks.controltable import ControlTableHook
from airflow_controltable.operators.worklist import AllocateWorkItemOperator, CompleteWorkItemOperator

CONN_ID = "controltable_default"
WORKLIST = "example-{{ run_id }}"

PLAN = {
    100: [{"step": "extract", "source": s} for s in ("orders", "customers", "products")],
    200: [{"step": "transform", "model": m} for m in ("sales", "churn")],
    300: [{"step": "publish", "target": "dashboard"}],
}

with DAG(
    dag_id="controltable_worklist",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["controltable", "example"],
) as dag:

    @task
    def populate() -> int:
        """Fill this run's work list (a real one might be filled once by a planner or the CLI)."""
        table = ControlTableHook(CONN_ID).get_control_table()
        table.install()
        worklist = table.worklist(f"example-{get_current_context()['run_id']}")
        return sum(worklist.populate(items, order=order) for order, items in PLAN.items())

    @task(map_index_template="{{ item['payload']['step'] }} {{ item['id'] }}")
    def run_item(item: dict[str, Any]) -> dict[str, Any]:
        """One worker: do the item's work and pass the handle on for completion."""
        print(f"order {item['order']}: running {item['payload']}")
        return item

    stages: list[Any] = [populate()]
    for order in PLAN:
        allocate = AllocateWorkItemOperator(
            task_id=f"allocate_{order}", worklist=WORKLIST, max_items=10, conn_id=CONN_ID, lease=1800,
        )
        ran = run_item.override(task_id=f"run_{order}").expand(item=allocate.output)
        complete = CompleteWorkItemOperator.partial(task_id=f"complete_{order}", conn_id=CONN_ID).expand(handle=ran)
        stages += [allocate, complete]
    chain(*stages)


if __name__ == "__main__":
    dag.test()
