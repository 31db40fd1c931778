"""Helpers shared by the hook, operators, sensors and triggers: holder ids and error translation."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

from airflow_controltable.exceptions import (
    ControlTableAirflowError,
    ControlTableConfigError,
    ControlTableLeaseLost,
    ControlTableUnavailable,
)
from controltable import (
    AcquireTimeout,
    ConfigurationError,
    ControlTableError,
    DatabaseUnavailableError,
    LeaseLost,
    NotInstalledError,
    UnknownResourceError,
)

#: Default lease of a slot taken by :class:`~airflow_controltable.sensors.slots.SlotSensor`.
#: Nothing renews it between the sensor and the release teardown, so it must outlast the tasks in
#: between (their run time plus queueing). The teardown normally frees the slot at once; the lease
#: only decides how long a slot stays blocked when no teardown runs at all (the DAG run was
#: deleted or marked failed by hand, the deployment died). Six hours covers typical warehouse
#: loads; set ``lease=`` to your work's ``execution_timeout`` plus a margin.
DEFAULT_SLOT_LEASE = 6 * 3600.0

#: Lease of a slot held by :func:`~airflow_controltable.decorators.slot_held`: renewed in the
#: background every third of it while the task runs, so a short lease frees the slot quickly after
#: a worker dies without delaying anything while it lives.
DEFAULT_RENEWED_LEASE = 300.0

#: Lease of a slot held by the deferrable slot operator and ``@task.controltable_slot`` while the work
#: runs: renewed by the task's own process every third of it, so a worker that dies (or a process
#: that is orphaned) frees the slot within this many seconds, and a trigger's pick-up covers the
#: time Airflow takes to resume the task on a worker.
DEFAULT_HELD_LEASE = 60.0

#: How long the queue place of a deferred task survives without a check. It covers the time from
#: the worker's first try to the trigger's first check (the triggerer picks new triggers up within
#: seconds) and a triggerer restart; a dead waiter costs nothing meanwhile, since a grant made on
#: its behalf lapses after ``pickup`` seconds.
DEFAULT_DEFERRED_WAITER_TTL = 180.0

#: With push wake-ups, a waiting trigger still re-checks this often (seconds) to keep its queue
#: entry alive and to cover a lost notification; never more than a quarter of the waiter's ttl.
DEFAULT_REFRESH_INTERVAL = 30.0

#: Poll interval of a trigger on a backend without push (seconds).
DEFAULT_TRIGGER_POLL_INTERVAL = 2.0

#: Seconds after a task defers before its trigger may fire. Airflow 3.3's scheduler fails a task
#: whose trigger fired so fast that the task was queued again before the scheduler processed the
#: exit of the process that deferred ("finished with state success, but the task instance's state
#: attribute is queued"); with push wake-ups a grant can come that fast. The grant is held meanwhile,
#: so this only delays grants that arrive within seconds of the deferral. Measured on a loaded
#: machine: 5 s was not always enough. ``[controltable] resume_settle`` overrides it.
DEFAULT_RESUME_SETTLE = 10.0

SLOT_MODES = ("exclusive", "shared")

MAX_ID = 200


def bounded_id(*parts: object) -> str:
    """Join ``parts`` into an id of at most 200 characters (the core's limit), stable across processes.

    Long dag ids or run ids are shortened with a hash suffix instead of failing, and every task of
    the run computes the same value, which is what lets a later task release the sensor's slot.
    """
    raw = ":".join(str(p) for p in parts)
    if len(raw) <= MAX_ID:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{raw[:MAX_ID - 17]}~{digest}"


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


def resume_not_before() -> float:
    """Epoch seconds before which a trigger deferred now may not fire (see ``DEFAULT_RESUME_SETTLE``)."""
    import time

    settle = DEFAULT_RESUME_SETTLE
    try:
        from airflow.sdk import conf

        settle = float(conf.get("controltable", "resume_settle", fallback=str(DEFAULT_RESUME_SETTLE)))
    except Exception:  # no Airflow configuration available
        pass
    return time.time() + max(settle, 0.0)


def dag_run_holder(context: Mapping[str, Any]) -> str:
    """The default holder: the DAG run, so any task of the same run can release what another acquired.

    ``airflow:<dag_id>:<run_id>``, or ``airflow@<deployment_id>:<dag_id>:<run_id>`` when a
    deployment id is configured; shortened with a hash when longer than 200 characters.
    """
    dag_run = context.get("dag_run")
    dag_id = getattr(dag_run, "dag_id", None) or context["dag"].dag_id
    run_id = getattr(dag_run, "run_id", None) or context["run_id"]
    deployment = deployment_id()
    return bounded_id(f"airflow@{deployment}" if deployment else "airflow", dag_id, run_id)


def task_instance_holder(context: Mapping[str, Any]) -> str:
    """A holder (or batch/item owner) unique to this task instance, including its map index."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    deployment = deployment_id()
    prefix = f"airflow@{deployment}" if deployment else "airflow"
    return bounded_id(prefix, ti.dag_id, ti.run_id, ti.task_id, map_index if map_index is not None else -1)


def check_wait_args(slot_mode: Any, resource: Any) -> None:
    """Reject a bad ``slot_mode`` or resource name before anything waits on it."""
    if slot_mode not in SLOT_MODES:
        raise ControlTableConfigError(
            f"slot_mode must be 'shared' (a counting slot, the default) or 'exclusive' (alone on the resource), "
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


def slot_priority(task: Any, use_priority_weight: bool) -> int:
    """The slot request's priority: the task's ``priority_weight`` when opted in, else 0 (plain FIFO).

    Airflow's weight rule (e.g. ``downstream``) is not applied here: the task's own weight is what
    the user set on it. Clamped to the core's priority range.
    """
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


def translate(exc: ControlTableError) -> ControlTableAirflowError:
    """Turn a core error into the Airflow exception that fails (or retries) the task appropriately."""
    if isinstance(exc, LeaseLost):
        return ControlTableLeaseLost(str(exc))
    if isinstance(exc, DatabaseUnavailableError):
        return ControlTableUnavailable(str(exc))
    if isinstance(exc, (UnknownResourceError, ConfigurationError, NotInstalledError, AcquireTimeout)):
        return ControlTableConfigError(str(exc))
    return ControlTableAirflowError(str(exc))


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
