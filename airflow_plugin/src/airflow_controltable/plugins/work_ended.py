"""Listener: a task covered by a ``ReleaseSlotOperator`` records that its work has ended in its own process.

The teardown of the sensor + teardown pattern must not hand the slot on while a covered task's work
still runs. A task instance's ``failed`` state alone does not say that: a load that raised reports
``failed`` after its work ended (Airflow's supervisor even stores it only once the task process has
exited), but a user marking the task failed sets the same state while the process still runs, and
Airflow kills that process only a heartbeat and a SIGTERM grace later. So the teardown waits
Airflow's kill grace for a ``failed`` task, unless the task left this marker: an XCom pushed from
the task process's finalizer, which Airflow runs only after ``execute`` has returned or raised in
that process. A task killed before it gets there (SIGKILL) leaves no marker, and the teardown waits.

The same listener makes SIGTERM stop such a task's work by raising into it (:func:`stop_work_on_kill`),
so that a statement it has running is cancelled instead of committing after the release.

Registered by the provider's plugin (``ControlTableStatusPlugin.listeners``); it does nothing for a
task with no ``ReleaseSlotOperator`` downstream, and nothing outside a task process.
"""

from __future__ import annotations

import logging
from typing import Any

from pluggy import HookimplMarker

from airflow_controltable.kill import WORK_ENDED_KEY, WorkStopper

log = logging.getLogger(__name__)

hookimpl = HookimplMarker("airflow")

def _covered_by_teardown(task: Any) -> bool:
    """Whether a ``ReleaseSlotOperator`` is downstream of ``task`` (only those read the marker)."""
    from airflow_controltable.operators.slots import ReleaseSlotOperator

    dag = getattr(task, "dag", None)
    if dag is None:
        return False
    return any(isinstance(dag.get_task(t), ReleaseSlotOperator)
               for t in task.get_flat_relative_ids(upstream=False))


def record_work_ended(task_instance: Any) -> bool:
    """Push the marker for ``task_instance`` when a teardown will read it; True when pushed."""
    if not type(task_instance).__module__.startswith("airflow.sdk"):
        return False  # the scheduler's or api-server's TaskInstance: no task process here
    task = getattr(task_instance, "task", None)
    if task is None or not _covered_by_teardown(task):
        return False
    task_instance.xcom_push(key=WORK_ENDED_KEY, value=True)
    return True


def stop_work_on_kill(task_instance: Any) -> bool:
    """Make SIGTERM stop the work of a task covered by a teardown, as the slot operators do; True when set.

    Airflow's SIGTERM handler only calls the operator's ``on_kill`` and lets the work go on until
    SIGKILL; a statement the work has running then goes on in the server even after that, and may
    commit after the teardown handed the slot on. Wrapped here, ``on_kill`` raises
    :class:`~airflow_controltable.kill.ControlTableTaskKilled` (a ``KeyboardInterrupt``:
    psycopg cancels the running statement on it) into the work; the process then reaches its
    finalizer and records the end of its work, and the teardown releases.
    """
    from airflow_controltable.operators.slots import HoldSlotMixin

    if not type(task_instance).__module__.startswith("airflow.sdk"):
        return False
    task = getattr(task_instance, "task", None)
    if task is None or isinstance(task, HoldSlotMixin) or not _covered_by_teardown(task):
        return False  # a slot operator stops its own work on kill
    original = task.on_kill
    stopper = WorkStopper(f"the task is being killed: stopped its work so that the slot its run holds is released "
                          f"only after it ({task.task_id})")

    def on_kill() -> None:
        try:
            original()
        finally:
            stopper.stop()

    task.on_kill = on_kill
    task._controltable_working = stopper  # the end hooks below turn the raise off
    stopper.start()  # the work runs in this thread, after this hook
    return True


def _work_over(task_instance: Any) -> None:
    task: Any = getattr(task_instance, "task", None)
    stopper = getattr(task, "_controltable_working", None)
    if task is not None and stopper is not None:
        task._controltable_working = None
        stopper.finish()


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    """Before the work starts in the task process: SIGTERM is to stop it (see :func:`stop_work_on_kill`)."""
    try:
        stop_work_on_kill(task_instance)
    except Exception as exc:
        log.warning("controltable: could not arrange for the work of %s to stop on kill: %s", task_instance, exc)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    _work_over(task_instance)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """The task process reached its finalizer after a failure: its work has stopped."""
    _work_over(task_instance)
    try:
        record_work_ended(task_instance)
    except Exception as exc:  # the teardown then waits the kill grace: slower, never unsafe
        log.warning("controltable: could not record that the work of %s ended: %s", task_instance, exc)
