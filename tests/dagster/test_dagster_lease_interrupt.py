"""A step's work stops when the lease it holds is gone (issue 21 item 6), on every Dagster surface.

The slot of ``ControlTableResource.slot()``, the batch of ``build_batch_op`` and the item of
``build_worklist_op`` are taken away from another connection while the step works (released by
an operator, the table or list reset); the core's background renewer notices at its next tick and
raises ``LeaseLostInterrupt`` in the step's thread, and the step fails naming the lease loss.
Measured from the moment the lease was taken: within one renewal interval plus 1 s.
"""

import time
from typing import Any, Callable

import pytest
from dagster import AssetExecutionContext, OpExecutionContext, asset, job, materialize
from support.interrupt_clock import LEASE, Clock
from support.live import wait_until

from controltable import ControlTable
from dagster_controltable import ControlTableResource, build_batch_op, build_worklist_op

pytestmark = pytest.mark.backends("sqlite", "postgres", "mysql")


def _failure_text(result: Any) -> str:
    events = result.get_step_failure_events()
    assert events, "expected a failed step"
    error = events[0].step_failure_data.error
    return f"{error.message} {error.cause.message if error.cause else ''}"


@pytest.fixture
def other(ct: Any, backend_url: str, namespace: str) -> Any:
    """A second connection: whoever takes the lease away (an operator, another process)."""
    table = ControlTable(backend_url, namespace=namespace)
    yield table
    table.close()


def test_slot_released_from_outside_interrupts_the_asset(ct: Any, resource: ControlTableResource,
                                                         other: ControlTable) -> None:
    ct.set_capacity("warehouse", 1)
    clock = Clock()

    @asset
    def load(context: AssetExecutionContext, controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", lease=LEASE) as lease:
            clock.take_later(0.3, lambda: other.release("warehouse", lease.holder))
            clock.work()

    result = materialize([load], resources={"controltable": resource}, raise_on_error=False)
    assert not result.success
    clock.assert_in_time()
    text = _failure_text(result)
    assert "lease lost, work interrupted" in text and "'warehouse'" in text, text
    # the slot is free for the next holder
    nxt = other.acquire("warehouse", holder="next", timeout=5)
    nxt.release()


def test_opt_out_lets_the_work_run_on_and_fails_at_the_release(ct: Any, backend_url: str, namespace: str,
                                                               other: ControlTable) -> None:
    ct.set_capacity("warehouse", 1)
    resource = ControlTableResource(url=backend_url, namespace=namespace, interrupt_on_lease_loss=False)
    finished: list[bool] = []

    @asset
    def load(controltable: ControlTableResource) -> None:
        with controltable.slot("warehouse", lease=LEASE) as lease:
            other.release("warehouse", lease.holder)
            wait_until(lambda: lease.lost is not None, 30, "the renewer to notice the loss", interval=0.01)
            time.sleep(0.3)  # nothing is raised inside the block
            finished.append(True)

    result = materialize([load], resources={"controltable": resource}, raise_on_error=False)
    assert finished == [True]
    text = _failure_text(result)
    assert "lease lost" in text and "interrupted" not in text.split("Fix:")[0], text


def test_batch_taken_over_interrupts_the_batch_op(ct: Any, resource: ControlTableResource, other: ControlTable,
                                                  make_events: Callable[..., str]) -> None:
    table = make_events(3)
    clock = Clock()

    def process(context: OpExecutionContext, batch: Any) -> None:
        clock.take_later(0.3, other.events(table, key="id").reset)
        clock.work()

    op = build_batch_op(process, table=table, key="id", size=3, lease=LEASE, max_batches=1)

    @job(resource_defs={"controltable": resource})
    def drain() -> None:
        op()

    result = drain.execute_in_process(raise_on_error=False)
    assert not result.success
    clock.assert_in_time()
    text = _failure_text(result)
    assert "lease lost, work interrupted" in text and f"of {table!r}" in text, text
    # the rows are not failed or completed by the interrupted step: the reset left them pending
    assert other.events(table, key="id").claim(3, owner="next", lease=30) is not None


def test_work_item_reset_elsewhere_interrupts_the_worklist_op(ct: Any, resource: ControlTableResource,
                                                              other: ControlTable) -> None:
    ct.worklist("nightly").populate([{"day": 1}])
    clock = Clock()

    def process(context: OpExecutionContext, item: Any) -> None:
        clock.take_later(0.3, other.worklist("nightly").reset)
        clock.work()

    op = build_worklist_op(process, worklist="nightly", lease=LEASE, timeout=0)

    @job(resource_defs={"controltable": resource})
    def work() -> None:
        op()

    result = work.execute_in_process(raise_on_error=False)
    assert not result.success
    clock.assert_in_time()
    text = _failure_text(result)
    assert "lease lost, work interrupted" in text and "'nightly'" in text, text
    # the item was not marked as error by the interrupted step: the list is not blocked
    status = other.worklist("nightly").status()
    assert not status.blocked_by_errors
