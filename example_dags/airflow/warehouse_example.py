"""What the two warehouse example DAGs share: the resource, the table the pretend load writes, and
the set-up and load steps. Not a DAG itself (Airflow parses it from the DAGs folder and finds none).

``controltable_warehouse_load.py`` holds the slot inside the load task, ``controltable_warehouse_slot.py``
around it with a sensor and a teardown; both run the same load, so it is written once here.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import get_current_context
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

from airflow_controltable.hooks.controltable import ControlTableHook

RESOURCE = "warehouse"
CONN_ID = "controltable_default"

#: Where the pretend load writes: one row per load with its fencing token.
loads = Table(
    "example_warehouse_loads",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False),
    Column("fencing_token", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
)


def ensure_resource() -> None:
    """Create the control tables and the resource (once is enough; the CLI can do it too)."""
    table = ControlTableHook(CONN_ID).get_control_table()
    table.install()
    table.set_capacity(RESOURCE, 1)
    loads.create(table.engine, checkfirst=True)


def pretend_load(token: int, on_failure: str) -> dict[str, Any]:
    """The work under the slot: sleep ``params.load_seconds``, fail when ``params.fail`` (with
    ``on_failure`` saying what happens to the slot), then write one row with the fencing token,
    as a real load would hand the token to the warehouse."""
    context = get_current_context()
    params = context["params"]
    started = time.time()
    time.sleep(float(params["load_seconds"]))
    if params["fail"]:
        raise RuntimeError(f"the load failed (params.fail); {on_failure}")
    finished = time.time()
    with ControlTableHook(CONN_ID).get_control_table().engine.begin() as conn:
        conn.execute(insert(loads).values(run_id=context["run_id"], fencing_token=token,
                                          started_at=started, finished_at=finished))
    return {"token": token, "started_at": started, "finished_at": finished}
