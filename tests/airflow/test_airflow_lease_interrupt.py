"""A task's work stops when the slot lease it holds is gone (issue 21 item 6), on the Airflow surfaces.

``SlotPythonOperator`` (any ``HoldSlotMixin`` operator, ``@task.controltable_slot``) and
``slot_held`` / ``@hold_slot``: the slot is released from another connection while the callable
works; the core's background renewer notices at its next tick and raises ``LeaseLostInterrupt``
in the working thread, and the task fails with ``ControlTableLeaseLost`` (retryable). Measured
from the moment the lease was taken: within one renewal interval plus 1 s. The event and work-list
operators run no user work while holding a batch or item (they claim, complete or fail handles),
so there is nothing of theirs to interrupt.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from airflow_helpers import make_context
from support.interrupt_clock import LEASE, Clock
from support.live import wait_until

from controltable import ControlTable, LeaseLostInterrupt

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.backends("sqlite", "postgres", "mysql")]


@pytest.fixture
def other(ct: Any, backend_url: str, namespace: str) -> Any:
    """A second connection: whoever takes the lease away (an operator, a teardown, another process)."""
    table = ControlTable(backend_url, namespace=namespace)
    yield table
    table.close()


def operator(conn_id: str, fn: Any, **kwargs: Any) -> Any:
    from airflow.sdk.bases.operator import ExecutorSafeguard

    from airflow_controltable.operators.slots import SlotPythonOperator

    ExecutorSafeguard.test_mode = True
    return SlotPythonOperator(task_id="load", python_callable=fn, conn_id=conn_id, resource="warehouse",
                              lease=LEASE, poll_interval=0.05, **kwargs)


def holders(ct: Any) -> list[str]:
    return [h.holder for st in ct.status(["warehouse"]) for h in st.holders if not h.expired]


def test_slot_operator_work_is_interrupted_when_the_slot_is_released_elsewhere(
    conn_id: str, ct: Any, other: ControlTable,
) -> None:
    from airflow_controltable.exceptions import ControlTableLeaseLost

    ct.set_capacity("warehouse", 1)
    clock = Clock()

    def work(lease: Any = None) -> None:
        clock.take_later(0.3, lambda: other.release("warehouse", lease.holder))
        clock.work()

    with pytest.raises(ControlTableLeaseLost, match="interrupted") as info:
        operator(conn_id, work).execute(make_context(run_id="run_a", task_id="load"))
    clock.assert_in_time()
    assert isinstance(info.value.__cause__, LeaseLostInterrupt)
    assert holders(ct) == []  # nothing left behind: the next holder gets the slot at once
    other.acquire("warehouse", holder="next", timeout=5).release()


def test_slot_operator_opt_out_lets_the_work_finish(conn_id: str, ct: Any, other: ControlTable) -> None:
    from airflow_controltable.exceptions import ControlTableLeaseLost

    ct.set_capacity("warehouse", 1)
    finished: list[bool] = []

    def work(lease: Any = None) -> None:
        other.release("warehouse", lease.holder)
        wait_until(lambda: lease.lost is not None, 30, "the renewer to notice the loss", interval=0.01)
        time.sleep(0.3)  # nothing is raised inside the work
        finished.append(True)

    with pytest.raises(ControlTableLeaseLost) as info:
        operator(conn_id, work, interrupt_on_lease_loss=False).execute(make_context(run_id="run_a", task_id="load"))
    assert finished == [True]
    assert not isinstance(info.value.__cause__, LeaseLostInterrupt)


def test_slot_held_block_is_interrupted_when_the_slot_is_released_elsewhere(
    conn_id: str, ct: Any, other: ControlTable,
) -> None:
    from airflow.sdk.execution_time.context import set_current_context

    from airflow_controltable.decorators import slot_held
    from airflow_controltable.exceptions import ControlTableLeaseLost

    ct.set_capacity("warehouse", 1)
    clock = Clock()
    context = make_context(run_id="run_a", task_id="load")
    context["task"] = type("Task", (), {"on_kill": lambda self: None})()
    with (set_current_context(context),  # type: ignore[arg-type]
          pytest.raises(ControlTableLeaseLost),
          slot_held("warehouse", conn_id=conn_id, lease=LEASE) as lease):
        clock.take_later(0.3, lambda: other.release("warehouse", lease.holder))
        clock.work()
    clock.assert_in_time()
    assert holders(ct) == []
