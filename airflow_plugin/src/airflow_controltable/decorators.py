"""TaskFlow forms of holding a slot: ``@task.controltable_slot`` (recommended), ``slot_held`` and ``hold_slot``.

``@task.controltable_slot("warehouse")`` (registered as a provider task decorator) is the
deferrable :class:`~airflow_controltable.operators.slots.SlotPythonOperator`: the task waits for
the slot in the triggerer (or, when it is expected within ``worker_wait`` seconds, on its worker
first), then runs the function under it on a worker and releases it when the function returns,
raises or is killed::

    @task.controltable_slot("warehouse", conn_id="warehouse_db")
    def load(lease=None):          # optional: the lease, e.g. lease.token for a fencing check
        ...

``slot_held`` / ``hold_slot`` wait *on the worker* (blocking a worker slot while waiting) inside an
ordinary task; they stay for code that must take a slot in the middle of a task::

    @task(execution_timeout=timedelta(hours=2))
    @hold_slot("warehouse", conn_id="warehouse_db")
    def load():
        ...

    @task
    def load_with_token():
        with slot_held("warehouse", slot_mode="shared") as lease:
            write(fencing_token=lease.token)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, Optional, TypeVar, cast

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_controltable.defaults import DEFAULT_MODE, DEFAULT_RENEWED_LEASE, INTERRUPT_ON_LEASE_LOSS
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, ControlTableHook
from airflow_controltable.kill import WorkStopper
from airflow_controltable.operators.slots import SlotPythonOperator
from airflow_controltable.utils import (
    airflow_errors,
    slot_priority,
    start_renewing,
    task_instance_holder,
    translate,
    try_number,
)
from controltable import ControlTableError, Lease, LeaseLost

F = TypeVar("F", bound=Callable[..., Any])


def _release_quietly(lease: Lease, log: Any) -> None:
    try:
        lease.release()
        log.info("controltable: released %r held by %r", lease.resource, lease.holder)
    except ControlTableError as exc:
        log.warning("controltable: release of %r on kill failed: %s", lease.resource, exc)


@contextmanager
def slot_held(
    resource: str,
    *,
    conn_id: str = DEFAULT_CONN_ID,
    holder: Optional[str] = None,
    slots: int = 1,
    slot_mode: str = DEFAULT_MODE,
    wait_timeout: Optional[float] = None,
    lease: float = DEFAULT_RENEWED_LEASE,
    namespace: Optional[str] = None,
    control_schema: Optional[str] = None,
    use_priority_weight: bool = False,
    interrupt_on_lease_loss: bool = INTERRUPT_ON_LEASE_LOSS,
    priority: Optional[int] = None,
) -> Iterator[Lease]:
    """Acquire ``resource`` inside a running task, renew it while the block runs, release on exit or kill.

    The arguments have the slot operator's and ``SlotSensor``'s names and meanings.

    :param holder: default: this task instance (dag, run, task, map index), so retries of the
        same task re-acquire idempotently and nothing else shares the slot by accident.
    :param wait_timeout: seconds to wait in line (None: until the task's ``execution_timeout``);
        then ``ControlTableAcquireTimeout``, which the task's retries apply to.
    :param lease: seconds; renewed every third of it in the background.
    :param priority: the request's place in the queue, as the core's ``priority`` (higher first);
        wins over ``use_priority_weight``.
    :param use_priority_weight: without ``priority``, queue by the task's ``priority_weight`` (higher first).
    :param interrupt_on_lease_loss: a lease found lost or expired by the renewal interrupts the
        block (``LeaseLostInterrupt``, then ``ControlTableLeaseLost``), as the slot operator's
        argument of the same name; ``False`` lets the block run on.
    :raises ControlTableLeaseLost: if the lease was lost while the block ran (renewal failed
        longer than the lease, or released from outside): the block was interrupted, or with
        ``interrupt_on_lease_loss=False`` may have overlapped with the next holder.
    """
    from airflow.sdk import get_current_context

    context = get_current_context()
    task: Any = context["task"]  # the running (unmapped) operator
    holder = holder or task_instance_holder(context)
    hook = ControlTableHook(conn_id, namespace=namespace, schema=control_schema)
    log = hook.log
    with airflow_errors():
        table = hook.get_control_table()
        log.info("controltable: waiting for %d %s slot(s) of %r as %r", slots, slot_mode, resource, holder)
        held = table.acquire(resource, holder=holder, slots=slots, mode=slot_mode, timeout=wait_timeout, lease=lease,
                             attempt=try_number(context),
                             priority=slot_priority(task, use_priority_weight, priority))
    log.info("controltable: acquired %r, fencing token %d", resource, held.token)
    held.interrupt = bool(interrupt_on_lease_loss)  # `with held:` below arms the interrupt (core)
    start_renewing(held)

    previous_on_kill = task.on_kill
    stopper = WorkStopper(f"the task is being killed: stopped the work under the slot of {resource!r}; "
                          "the slot is released now that the work has stopped")

    def on_kill() -> None:
        # Runs in the SIGTERM handler, in the main thread. A block running there is stopped by
        # raising into it (a KeyboardInterrupt, so a running statement is cancelled in the server);
        # the `with held:` below releases once the block has unwound, never while it still writes.
        # A block in another thread cannot be stopped from here: release from a helper thread,
        # giving up after a while rather than hang the kill.
        previous_on_kill()
        stopper.stop()
        if stopper.working:
            helper = threading.Thread(target=_release_quietly, args=(held, log), daemon=True)
            helper.start()
            helper.join(timeout=15)

    task.on_kill = on_kill
    try:
        # Lease.__exit__ stops the renewal and releases; if the block failed, a lost lease only
        # logs and the block's own error propagates; if it succeeded, a lease lost meanwhile raises.
        with held, stopper:
            yield held
    except LeaseLost as exc:
        raise translate(exc) from exc
    finally:
        task.on_kill = previous_on_kill
    log.info("controltable: released %r", resource)


def hold_slot(resource: str, **options: Any) -> Callable[[F], F]:
    """Decorator form of :func:`slot_held`; put it *under* ``@task``. Options are ``slot_held``'s."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with slot_held(resource, **options):
                return fn(*args, **kwargs)

        return cast(F, wrapper)

    return decorate


class _SlotDecoratedOperator(DecoratedOperator, SlotPythonOperator):
    """The operator behind ``@task.controltable_slot``: the function runs under the slot."""

    template_fields: Sequence[str] = ("resource", "holder", "op_args", "op_kwargs")
    custom_operator_name = "@task.controltable_slot"

    def __init__(self, *, python_callable: Callable[..., Any], op_args: Any, op_kwargs: Any, **kwargs: Any) -> None:
        super().__init__(
            kwargs_to_upstream={"python_callable": python_callable, "op_args": op_args, "op_kwargs": op_kwargs},
            python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs, **kwargs,
        )

    def execute_in_slot(self, context: Any, event: Optional[dict[str, Any]] = None) -> Any:
        return self._handle_output(return_value=super().execute_in_slot(context, event))


def controltable_slot_task(
    resource: Any = None,
    python_callable: Optional[Callable[..., Any]] = None,
    multiple_outputs: Optional[bool] = None,
    **kwargs: Any,
) -> TaskDecorator:
    """``@task.controltable_slot("warehouse", ...)``: run the function under a slot, waiting for it deferred.

    Options are :class:`~airflow_controltable.operators.slots.HoldSlotMixin`'s (``slots``,
    ``slot_mode``, ``lease``, ``wait_timeout``, ``conn_id``, ``namespace``...) and any task option.
    A function parameter named ``lease`` receives the lease (token, holder, expiry).
    """
    if callable(resource) and python_callable is None:  # used bare with resource= as a keyword
        python_callable, resource = resource, kwargs.pop("resource", None)
    if resource is None:
        raise TypeError("@task.controltable_slot needs the resource name: @task.controltable_slot(\"warehouse\")")
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_SlotDecoratedOperator,
        resource=resource,
        **kwargs,
    )
