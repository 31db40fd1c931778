"""DAGs used only by the tests: the hold_slot decorator / slot_held context manager, and a reschedule sensor.

They live at module level in a file of their own because ``dag.test()`` serializes a DAG by
parsing its file.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_controltable import ReleaseSlotOperator, SlotSensor, hold_slot, slot_held
from airflow_controltable.hooks.controltable import ControlTableHook


def _holders(resource: str) -> list[str]:
    table = ControlTableHook().get_control_table()
    return [h.holder for st in table.status([resource]) for h in st.holders if not h.expired]


with DAG("ct_test_hold_slot", schedule=None, start_date=datetime(2024, 1, 1), catchup=False) as hold_slot_dag:

    @task
    def setup() -> None:
        table = ControlTableHook().get_control_table()
        table.install()
        table.set_capacity("solo", 1)

    @task
    @hold_slot("solo", lease=2.0)  # renewed every 0.67 s: a renewal may be 1.3 s late on a loaded machine
    def holds() -> str:
        time.sleep(2.5)  # longer than the lease: only the background renewal keeps it
        (holder,) = _holders("solo")
        assert holder.endswith(":holds:-1"), holder
        return holder

    @task
    def killed() -> list[Any]:
        seen: list[Any] = []
        try:
            with slot_held("solo") as lease:
                assert lease.is_held()
                try:
                    get_current_context()["task"].on_kill()  # what Airflow's SIGTERM handler calls
                    seen.append("the block went on after the kill")
                finally:
                    seen.append(len(_holders("solo")))  # still held while the block unwinds
        except KeyboardInterrupt:  # ControlTableTaskKilled; caught here only to report what happened
            seen.append(len(_holders("solo")))
        return seen

    @task
    @hold_slot("solo")
    def fails() -> None:
        raise RuntimeError("work failed")

    setup() >> holds() >> killed() >> fails()


with DAG("ct_test_reschedule", schedule=None, start_date=datetime(2024, 1, 1), catchup=False) as reschedule_dag:
    acquire = SlotSensor(task_id="acquire", resource="lab", mode="reschedule", poke_interval=1, timeout=60)
    release = ReleaseSlotOperator(task_id="release", resource="lab")
    acquire >> release.as_teardown(setups=acquire)
