"""Helpers shared by the hook, operators, sensors and triggers: holder ids, argument checks, error translation.

The provider's defaults live in :mod:`airflow_controltable.defaults`, and the deferral's facts
(``deferral_facts``, ``resume_settle``) in :mod:`airflow_controltable.resume_race`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

from airflow_controltable.defaults import MAX_ID, SLOT_MODES
from airflow_controltable.exceptions import (
    ControlTableAcquireTimeout,
    ControlTableAirflowError,
    ControlTableConfigError,
    ControlTableConnectionError,
    ControlTableFailure,
    ControlTableLeaseLost,
    ControlTableRetryableError,
    ControlTableUnavailable,
)
from controltable import ControlTableError, error_outcome
from controltable.holders import holder_id


def deployment_id() -> str:
    """``[controltable] deployment_id`` (env ``AIRFLOW__CONTROLTABLE__DEPLOYMENT_ID``), or empty.

    Two Airflow deployments that share a namespace and run the same ``dag_id`` produce the same
    run ids (``scheduled__<date>``), so their default holders would collide and both would "hold"
    the slot. Give each deployment its own id to keep them apart.
    """
    try:
        from airflow.sdk import conf

        return str(conf.get("controltable", "deployment_id", fallback="") or "").strip()
    except Exception:  # no Airflow configuration available (plain Python use)
        return ""


def dag_run_holder(context: Mapping[str, Any]) -> str:
    """The default holder: the DAG run, so any task of the same run can release what another acquired.

    ``airflow:<dag_id>:<run_id>``, or ``airflow@<deployment_id>:<dag_id>:<run_id>`` when a
    deployment id is configured; shortened with a hash when longer than 200 characters.
    """
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or context["dag"].dag_id
    run_id = getattr(dag_run, "run_id", None) or context["run_id"]
    deployment = deployment_id()
    return holder_id(f"airflow@{deployment}" if deployment else "airflow", dag_id, run_id, limit=MAX_ID)


def task_instance_holder(context: Mapping[str, Any]) -> str:
    """A holder (or batch/item owner) unique to this task instance, including its map index."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    deployment = deployment_id()
    prefix = f"airflow@{deployment}" if deployment else "airflow"
    return holder_id(prefix, ti.dag_id, ti.run_id, ti.task_id, map_index if map_index is not None else -1,
                     limit=MAX_ID)


def check_wait_args(slot_mode: Any, resource: Any) -> None:
    """Reject a bad ``slot_mode`` or resource name before anything waits on it."""
    if slot_mode not in SLOT_MODES:
        raise ControlTableConfigError(
            f"slot_mode must be 'shared' (the default) or 'exclusive' (alone on the resource), "
            f"got {slot_mode!r} (a sensor's own `mode` is 'poke' or 'reschedule')"
        )
    if not resource or not isinstance(resource, str):
        raise ControlTableConfigError(f"resource must be a non-empty name, got {resource!r}")


def try_number(context: Mapping[str, Any]) -> Optional[int]:
    """The task instance's try number: the core's ``attempt``, so a retry or a cleared run gets a new token.

    Airflow keeps the try number when a deferred task resumes and raises it for a retry or a
    clear, which is exactly when the old attempt's late writes must be rejectable.
    """
    value = getattr(context.get("ti"), "try_number", None)
    return int(value) if isinstance(value, int) and value >= 1 else None


def slot_priority(task: Any, use_priority_weight: bool, priority: Optional[int] = None) -> int:
    """The slot request's priority: ``priority`` when given, else the task's ``priority_weight`` when
    opted in, else 0 (plain FIFO).

    An explicit ``priority`` is the core's argument as given (the core checks its range). Airflow's
    weight rule (e.g. ``downstream``) is not applied to ``priority_weight``: the task's own weight is
    what the user set on it, clamped to the core's priority range.
    """
    if priority is not None:
        return priority
    if not use_priority_weight:
        return 0
    from controltable.defaults import MAX_PRIORITY, MIN_PRIORITY

    weight = getattr(task, "priority_weight", 0)
    value = int(weight) if isinstance(weight, (int, float)) and not isinstance(weight, bool) else 0
    return max(MIN_PRIORITY, min(MAX_PRIORITY, value))


def start_renewing(lease: Any) -> None:
    """Renew ``lease`` from this process, stopping if the process is orphaned (its supervisor died).

    An orphaned task process is one Airflow has given up on: it may be retried elsewhere, so its
    slot must come back within one lease rather than be renewed by a process nobody watches.
    """
    try:
        lease.start_renewing(stop_when_orphaned=True)
    except TypeError:  # a core without orphan detection
        lease.start_renewing()


#: The Airflow exception of each family of the core's error table (:func:`controltable.error_outcome`).
FAMILY_EXCEPTIONS: dict[str, type[ControlTableAirflowError]] = {
    "lease_lost": ControlTableLeaseLost,
    "timeout": ControlTableAcquireTimeout,
    "unavailable": ControlTableUnavailable,
    "conflict": ControlTableRetryableError,
    "connection": ControlTableConnectionError,
    "configuration": ControlTableConfigError,
    "failure": ControlTableFailure,
}


def translate(exc: ControlTableError) -> ControlTableAirflowError:
    """Turn a core error into the Airflow exception that retries or fails the task, as the core's table says.

    :func:`controltable.error_outcome` (the core's one error table, which the Dagster integration
    and the CLI read too) names the error's family: a retryable one (database unreachable or busy,
    slot not granted in time, lease lost, a clash with a concurrent change) becomes an exception
    Airflow retries per the task's ``retries``; anything else (bad login, missing database or
    privileges, unknown resource, bad arguments) fails the task at once (``AirflowFailException``),
    since only a person can fix it.
    """
    return FAMILY_EXCEPTIONS.get(error_outcome(exc).family, ControlTableFailure)(str(exc))


def trigger_failure(event: Optional[Mapping[str, Any]], what: str) -> ControlTableAirflowError:
    """The exception for a trigger's error event: retried when the trigger's error was retryable."""
    message = f"{what} failed: {(event or {}).get('message', 'no event')}"
    if (event or {}).get("retryable"):
        return ControlTableRetryableError(message)
    return ControlTableConfigError(message)


@contextmanager
def airflow_errors() -> Iterator[None]:
    """Re-raise core errors as Airflow exceptions with the core's message (which names the fix)."""
    try:
        yield
    except ControlTableError as exc:
        raise translate(exc) from exc


def load_handles(value: Any, kind: str) -> list[dict[str, Any]]:
    """Accept one handle, a list of handles, or their JSON text (from a string template)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ControlTableConfigError(f"{kind} handle is not JSON: {value[:200]!r}") from exc
    if isinstance(value, Mapping):
        return [dict(value)]
    if isinstance(value, (list, tuple)) and all(isinstance(v, Mapping) for v in value):
        return [dict(v) for v in value]
    raise ControlTableConfigError(
        f"expected a {kind} handle (a dict from the claiming task's XCom) or a list of them, got {value!r}"
    )
