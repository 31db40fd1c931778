"""Airflow test set-up: a throw-away AIRFLOW_HOME with a migrated SQLite metadata DB, once per session.

The environment is set when this conftest is imported, which pytest does before it imports the
test modules here (the first ``import airflow`` reads it). ``pytest tests/core`` never loads this
file, so the core suite never imports Airflow.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="ct-airflow-home-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)
# dag.test() serializes a DAG by parsing the configured DAGs folder, so it holds copies of the
# example DAGs and of the test-only DAGs.
DAGS_FOLDER = AIRFLOW_HOME / "dags"
DAGS_FOLDER.mkdir()
for _source in [*(_HERE.parents[1] / "example_dags" / "airflow").glob("*.py"), _HERE / "dags" / "ct_test_dags.py"]:
    shutil.copy(_source, DAGS_FOLDER / _source.name)
# Airflow puts a DAG bundle's folder on sys.path when it parses or runs its DAGs (BundleDagBag), so
# DAG files import their shared modules by name (``warehouse_example``); in-process parsing here does too.
sys.path.append(str(DAGS_FOLDER))


def readme_dag_source() -> str:
    """The copy-pasteable DAG of the Airflow documentation page (the python block defining a DAG)."""
    text = (_HERE.parents[1] / "docs" / "airflow.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    (block,) = [b for b in blocks if "with DAG(" in b]
    return block


(DAGS_FOLDER / "readme_nightly_load.py").write_text(readme_dag_source())
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
}
if "airflow" in sys.modules:  # pragma: no cover - someone imported Airflow before us
    raise RuntimeError("tests/airflow must configure AIRFLOW_HOME before Airflow is imported")
os.environ.update(AIRFLOW_ENV)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test item, so fixtures can add diagnostics to failed tests."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Run ``airflow db migrate`` once; returns AIRFLOW_HOME."""
    from airflow_helpers import airflow_bin

    result = subprocess.run(
        [airflow_bin(), "db", "migrate"], env={**os.environ, **AIRFLOW_ENV}, capture_output=True, text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    from airflow.sdk.bases.operator import ExecutorSafeguard

    ExecutorSafeguard.test_mode = True  # unit tests call execute() directly
    return AIRFLOW_HOME


@pytest.fixture(autouse=True)
def _clear_hook_cache() -> Iterator[None]:
    yield
    from airflow_controltable.hooks.controltable import clear_cache

    clear_cache()


@pytest.fixture
def conn_id(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, backend_url: str, namespace: str, ct: Any) -> str:
    """A ``controltable`` connection to the test backend and namespace (tables installed by ``ct``)."""
    from airflow_helpers import set_connection

    return set_connection(
        monkeypatch, f"ct_test_{uuid.uuid4().hex[:8]}", conn_type="controltable",
        extra={"url": backend_url, "namespace": namespace},
    )
