"""Helpers for the Airflow tests (a plain module: test modules import it, conftest provides fixtures)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_dags" / "airflow"


def airflow_bin() -> str:
    return str(Path(sys.executable).with_name("airflow"))


def set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **conn: Any) -> str:
    """Define an Airflow connection through its AIRFLOW_CONN_* environment variable."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


def make_context(
    dag_id: str = "test_dag", run_id: str = "manual__1", task_id: str = "task", map_index: int = -1
) -> Any:
    """The parts of a task context the provider reads (dag_run, ti, run_id, dag)."""
    dag_run = SimpleNamespace(dag_id=dag_id, run_id=run_id)
    ti = SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index, try_number=1)
    return {"dag_run": dag_run, "ti": ti, "run_id": run_id, "dag": SimpleNamespace(dag_id=dag_id)}


def load_example(name: str) -> ModuleType:
    """Import a DAG file from the test DAGs folder (copies of the examples and the test DAGs).

    ``dag.test()`` needs the DAG's file in the configured DAGs folder, which conftest fills.
    """
    import os

    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ct_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_states(dag_run: Any) -> dict[str, list[str]]:
    """task_id -> states of its task instances (several for mapped tasks)."""
    states: dict[str, list[str]] = {}
    for ti in dag_run.get_task_instances():
        states.setdefault(ti.task_id, []).append(str(ti.state))
    return states


def record_checks(trigger: Any) -> list[Any]:
    """The results of ``trigger``'s checks from now on, in order (None: not ready yet).

    What a test waits on to show a trigger keeps waiting: a number of checks that found nothing,
    rather than a sleep that passes when no check ran at all. Wraps the check hook that the
    trigger's loop calls (``_ControlTableTrigger._check``, the one method each trigger implements).
    """
    checks: list[Any] = []
    check = trigger._check

    async def recorded() -> Any:
        result = await check()
        checks.append(result)
        return result

    trigger._check = recorded
    return checks


#: A hang detector for the triggers' waits in the tests: several times what a loaded machine takes.
TRIGGER_HANG = 300.0


async def first_event(trigger: Any, timeout: float = TRIGGER_HANG) -> Any:
    """The first event ``trigger.run()`` yields (a trigger that ends without one fails the test)."""
    async def first() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger ended without an event")

    return await asyncio.wait_for(first(), timeout)
