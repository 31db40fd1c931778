"""Apache Airflow 3 provider for controltable.

Airflow pools live in one deployment's metadata database and count task instances by state, so a
task leaving deferral (back to the scheduled state, which pools do not count) can be undercounted.
This provider keeps the slots (and event batches and ordered work lists) in controltable's control
tables inside your own database, shared with other Airflow deployments, Dagster and shell jobs.

Public names are re-exported lazily so that importing the package (the provider manager does it
for ``get_provider_info``) does not import Airflow's task machinery.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ControlTableHook": "airflow_controltable.hooks.controltable",
    "DEFAULT_CONN_ID": "airflow_controltable.hooks.controltable",
    "SlotSensor": "airflow_controltable.sensors.slots",
    "PendingEventsSensor": "airflow_controltable.sensors.events",
    "ReleaseSlotOperator": "airflow_controltable.operators.slots",
    "SlotPythonOperator": "airflow_controltable.operators.slots",
    "HoldSlotMixin": "airflow_controltable.operators.slots",
    "ControlTableTaskKilled": "airflow_controltable.kill",
    "controltable_slot_task": "airflow_controltable.decorators",
    "ClaimBatchOperator": "airflow_controltable.operators.events",
    "CompleteBatchOperator": "airflow_controltable.operators.events",
    "FailBatchOperator": "airflow_controltable.operators.events",
    "AllocateWorkItemOperator": "airflow_controltable.operators.worklist",
    "CompleteWorkItemOperator": "airflow_controltable.operators.worklist",
    "FailWorkItemOperator": "airflow_controltable.operators.worklist",
    "SlotTrigger": "airflow_controltable.triggers.slot",
    "PendingEventsTrigger": "airflow_controltable.triggers.events",
    "hold_slot": "airflow_controltable.decorators",
    "slot_held": "airflow_controltable.decorators",
    "dag_run_holder": "airflow_controltable.utils",
    "DEFAULT_SLOT_LEASE": "airflow_controltable.defaults",
}

__all__ = sorted(_EXPORTS) + ["__version__", "get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    """Provider metadata for Airflow's provider manager (see ``get_provider_info.py``)."""
    from airflow_controltable.get_provider_info import get_provider_info as _info

    return _info()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'airflow_controltable' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
