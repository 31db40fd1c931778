"""Hold a slot for exactly the run of one task: ``slot_held`` (context manager) and ``hold_slot`` (decorator).

For a single task this beats a sensor plus a release teardown: the lease is short and renewed in
the background while the task runs, so a dead worker frees the slot within one lease; the slot
is released when the body finishes or raises, and also from the task's ``on_kill`` (Airflow calls
it on SIGTERM, e.g. when the task is cleared or marked failed, and on ``execution_timeout``)::

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional, TypeVar, cast

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, ControlTableHook
from airflow_controltable.utils import DEFAULT_RENEWED_LEASE, airflow_errors, task_instance_holder, translate
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
    slot_mode: str = "exclusive",
    timeout: Optional[float] = None,
    lease: float = DEFAULT_RENEWED_LEASE,
    namespace: Optional[str] = None,
    control_schema: Optional[str] = None,
) -> Iterator[Lease]:
    """Acquire ``resource`` inside a running task, renew it while the block runs, release on exit or kill.

    :param holder: default: this task instance (dag, run, task, map index), so retries of the
        same task re-acquire idempotently and nothing else shares the slot by accident.
    :param timeout: seconds to wait in line (None: until the task's ``execution_timeout``).
    :param lease: seconds; renewed every third of it in the background.
    :raises ControlTableLeaseLost: if the lease was lost while the block ran (renewal failed
        longer than the lease): the work may have overlapped with the next holder.
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
        held = table.acquire(resource, holder=holder, slots=slots, mode=slot_mode, timeout=timeout, lease=lease)
    log.info("controltable: acquired %r, fencing token %d", resource, held.token)
    held.start_renewing()

    previous_on_kill = task.on_kill

    def on_kill() -> None:
        # Runs in the SIGTERM handler, possibly interrupting a database call of this thread:
        # release from a helper thread and give up after a while rather than hang the kill.
        helper = threading.Thread(target=_release_quietly, args=(held, log), daemon=True)
        helper.start()
        helper.join(timeout=15)
        previous_on_kill()

    task.on_kill = on_kill
    try:
        # Lease.__exit__ stops the renewal and releases; if the block failed, a lost lease only
        # logs and the block's own error propagates; if it succeeded, a lease lost meanwhile raises.
        with held:
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
