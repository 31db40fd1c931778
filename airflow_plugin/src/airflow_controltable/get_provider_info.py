"""The dictionary Airflow's provider manager reads through the ``apache_airflow_provider`` entry point.

It must stay import-light and schema-valid: a bad provider info breaks ``airflow providers list``
for every provider, not just this one.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Describe the provider: its connection type, hooks, operators, sensors and triggers."""
    return {
        "package-name": "airflow-provider-controltable",
        "name": "ControlTable",
        "description": (
            "Resource slots (FIFO semaphores and reader/writer locks with leases and fencing tokens), "
            "event batch claiming and ordered work lists kept in control tables inside your own database, "
            "shared across Airflow deployments, Dagster and shell jobs."
        ),
        "integrations": [
            {
                "integration-name": "ControlTable",
                "external-doc-url": "https://github.com/controltable/controltable",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": "ControlTable", "python-modules": ["airflow_controltable.hooks.controltable"]}
        ],
        "operators": [
            {
                "integration-name": "ControlTable",
                "python-modules": [
                    "airflow_controltable.operators.slots",
                    "airflow_controltable.operators.events",
                    "airflow_controltable.operators.worklist",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "ControlTable",
                "python-modules": ["airflow_controltable.sensors.slots", "airflow_controltable.sensors.events"],
            }
        ],
        "triggers": [
            {"integration-name": "ControlTable", "python-modules": ["airflow_controltable.triggers.controltable"]}
        ],
        "connection-types": [
            {
                "connection-type": "controltable",
                "hook-class-name": "airflow_controltable.hooks.controltable.ControlTableHook",
                "hook-name": "ControlTable",
            }
        ],
    }
