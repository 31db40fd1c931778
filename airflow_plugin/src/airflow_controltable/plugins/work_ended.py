"""Listener: a task covered by a ``ReleaseSlotOperator`` records that its work has ended in its own process.

The teardown of the sensor + teardown pattern must not hand the slot on while a covered task's work
still runs. A task instance's ``failed`` state alone does not say that: a load that raised reports
``failed`` after its work ended (Airflow's supervisor even stores it only once the task process has
exited), but a user marking the task failed sets the same state while the process still runs, and
Airflow kills that process only a heartbeat and a SIGTERM grace later. So the teardown waits
Airflow's kill grace for a ``failed`` task, unless the task left this marker: an XCom pushed from
the task process's finalizer, which Airflow runs only after ``execute`` has returned or raised in
that process. A task killed before it gets there (SIGKILL) leaves no marker, and the teardown waits.

Registered by the provider's plugin (``ControlTableStatusPlugin.listeners``); it does nothing for a
task with no ``ReleaseSlotOperator`` downstream, and nothing outside a task process.
"""

from __future__ import annotations

import logging
from typing import Any

from pluggy import HookimplMarker

log = logging.getLogger(__name__)

hookimpl = HookimplMarker("airflow")

#: The XCom key of the marker (value ``True``); Airflow clears a task's XComs when a new try starts.
WORK_ENDED_KEY = "controltable_work_ended"


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


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """The task process reached its finalizer after a failure: its work has stopped."""
    try:
        record_work_ended(task_instance)
    except Exception as exc:  # the teardown then waits the kill grace: slower, never unsafe
        log.warning("controltable: could not record that the work of %s ended: %s", task_instance, exc)
