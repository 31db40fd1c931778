"""The dictionary Airflow's provider manager reads through the ``apache_airflow_provider`` entry point.

It must stay import-light and schema-valid: a bad provider info breaks ``airflow providers list``
for every provider, not just this one.
"""

from __future__ import annotations

from typing import Any

#: The connection form's standard fields. The SQLAlchemy URL is the Host field, relabelled: Airflow
#: shows standard fields at the top of the form and folds the extras under "Extra Fields", so the
#: one field every connection needs is where a user looks first. The URL is also accepted in the
#: ``url`` extra (the JSON form of AIRFLOW_CONN_..., and connections saved that way).
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["port", "schema", "login"],
    "relabeling": {"host": "SQLAlchemy URL", "password": "Password (fills the URL's password)"},
    "placeholders": {
        "host": "postgresql+psycopg://airflow@db.example:5432/warehouse or sqlite:////var/lib/airflow/ct.db",
        "password": "optional: kept out of the URL and the extras",
    },
}


def get_provider_info() -> dict[str, Any]:
    """Describe the provider: its connection type, hooks, operators, sensors, triggers and task decorator."""
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
            {"integration-name": "ControlTable", "python-modules": ["airflow_controltable.triggers.slot",
                                                                  "airflow_controltable.triggers.events"]}
        ],
        "connection-types": [
            {
                "connection-type": "controltable",
                "hook-class-name": "airflow_controltable.hooks.controltable.ControlTableHook",
                "hook-name": "ControlTable",
                # Airflow 3.2+ reads the form from here (hooks' get_ui_field_behaviour needs the FAB
                # provider): the URL in the Host field, relabelled, the password in the Password
                # field, the rest extras.
                "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
                "conn-fields": {
                    "namespace": {
                        "label": "Namespace",
                        "description": "Everyone who must coordinate (Airflow, Dagster, scripts) uses the same one",
                        "schema": {"type": ["string", "null"], "default": "default"},
                    },
                    "schema": {
                        "label": "Control-table schema",
                        "description": "Database schema of the control tables (empty: the connection's default)",
                        "schema": {"type": ["string", "null"]},
                    },
                    "prefix": {
                        "label": "Table prefix",
                        "schema": {"type": ["string", "null"], "default": "ct_"},
                    },
                    "listen_url": {
                        "label": "Direct URL for push wake-ups",
                        "description": (
                            "PostgreSQL behind a pooler in transaction mode (PgBouncer, RDS Proxy): a direct URL of "
                            "the server for the wake-up listener only; work still uses the URL above"
                        ),
                        "schema": {"type": ["string", "null"]},
                    },
                    "install": {
                        "label": "Create the control tables on first use",
                        "description": "Needs DDL rights; otherwise run `controltable init` once",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                },
            }
        ],
        # No "plugins" here: the status-page plugin is registered once, by the `airflow.plugins` entry
        # point (pyproject.toml). Airflow 3 loads entry-point plugins in every configuration, provider
        # info's "plugins" only with [core] lazy_discover_providers off, and then both: "Plugin
        # 'controltable' already registered" on every user's home page.
        "task-decorators": [
            {"name": "controltable_slot", "class-name": "airflow_controltable.decorators.controltable_slot_task"}
        ],
    }
