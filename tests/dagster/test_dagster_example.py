"""The example definitions: they validate with the Dagster CLI, and their jobs run against SQLite.

The CLI runs go through subprocesses with their own DAGSTER_HOME and CONTROLTABLE_URL (the
multiprocess executor, as a user would run them); the rest runs in-process for speed.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context

from controltable import ControlTable

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = ROOT / "example_dags" / "dagster" / "definitions.py"
DAGSTER = Path(sys.executable).with_name("dagster")


def _env(home: Path, url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DAGSTER_HOME=str(home), CONTROLTABLE_URL=url, CONTROLTABLE_NAMESPACE="example_test")
    return env


def _cli(*args: str, home: Path, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DAGSTER), *args], env=_env(home, url), cwd=str(home), capture_output=True,
                          text=True, timeout=180)


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example module, loaded fresh with this test's control-table URL."""
    url = f"sqlite:///{tmp_path / 'controltable.db'}"
    monkeypatch.setenv("CONTROLTABLE_URL", url)
    monkeypatch.setenv("CONTROLTABLE_NAMESPACE", "example_test")
    spec = importlib.util.spec_from_file_location("controltable_dagster_example", DEFINITIONS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_url = url
    return module


def test_definitions_validate(dagster_home: Path, tmp_path: Path) -> None:
    proc = _cli("definitions", "validate", "-f", str(DEFINITIONS), home=dagster_home,
                url=f"sqlite:///{tmp_path / 'ct.db'}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Validation successful" in proc.stdout + proc.stderr


def test_definitions_validate_fails_for_a_broken_file(dagster_home: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(DEFINITIONS.read_text().replace("defs = Definitions(", "defs = Definitions(nonsense=1, "))
    proc = _cli("definitions", "validate", "-f", str(broken), home=dagster_home, url="sqlite:///x.db")
    assert proc.returncode != 0


def test_job_execute_drains_the_event_table(dagster_home: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ct.db'}"
    proc = _cli("job", "execute", "-f", str(DEFINITIONS), "-j", "drain_demo_events", home=dagster_home, url=url)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "completed batch" in output
    with ControlTable(url, namespace="example_test") as ct:
        stats = ct.events("demo_events", key="id").stats()
    assert stats.done == 20 and stats.pending == 0 and stats.claimed == 0


def test_example_jobs_in_process(example: Any) -> None:
    defs = example.defs
    warehouse = defs.resolve_job_def("warehouse_reports").execute_in_process(instance=DagsterInstance.ephemeral())
    assert warehouse.success
    tokens = sorted(
        warehouse.asset_materializations_for_node(name)[0].metadata["fencing_token"].value
        for name in ("orders_report", "customers_report")
    )
    assert tokens == [1, 2]  # one at a time through the capacity-1 slot
    (check,) = warehouse.get_asset_check_evaluations()  # the demo table's check ran with its asset
    assert check.check_name == "demo_events_drained" and check.passed
    assert defs.resolve_job_def("work_through_steps").execute_in_process().success


def test_example_sensor_requests_the_drain_job(example: Any) -> None:
    with DagsterInstance.ephemeral() as instance:
        emitted = example.defs.resolve_job_def("emit_events").execute_in_process(instance=instance)
        assert emitted.success
        sensor = example.demo_events_sensor
        with build_sensor_context(instance=instance, resources={"controltable": example.controltable}) as ctx:
            result = sensor(ctx)
        assert isinstance(result, SensorResult)
        (request,) = result.run_requests
        assert request.tags["controltable/claimable"] == "30"  # 20 demo events + 10 emitted
        drained = example.defs.resolve_job_def("drain_demo_events").execute_in_process(instance=instance)
        assert drained.output_for_node("process_demo_events")["events"] == 30


README_SECTION = ROOT / "docs" / "dagster.md"  # the Dagster page of the documentation


def _blocks(language: str) -> list[str]:
    text = README_SECTION.read_text()
    parts = text.split(f"```{language}\n")[1:]
    return [p.split("```")[0] for p in parts]


def test_readme_example_is_copy_pasteable(dagster_home: Path, tmp_path: Path) -> None:
    """The Dagster page's defs.py, after its set-up commands, validates and runs."""
    (code,) = _blocks("python")
    defs_file = tmp_path / "defs.py"
    defs_file.write_text(code)
    url = f"sqlite:///{tmp_path / 'controltable.db'}"
    setup = _blocks("bash")[0]
    assert "controltable init" in setup and "capacity set warehouse 1" in setup
    with ControlTable(url) as ct:  # what the page's set-up commands do
        ct.install()
        ct.set_capacity("warehouse", 1)
        with ct.engine.begin() as conn:
            from sqlalchemy import text

            conn.execute(text("CREATE TABLE events (id INTEGER PRIMARY KEY, payload TEXT)"))
            conn.execute(text("INSERT INTO events (id, payload) VALUES (1, 'a'), (2, 'b'), (3, 'c')"))
        ct.events("events", key="id").prepare()
    proc = _cli("definitions", "validate", "-f", str(defs_file), home=dagster_home, url=url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli("job", "execute", "-f", str(defs_file), "-j", "drain_events", home=dagster_home, url=url)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    proc = _cli("asset", "materialize", "-f", str(defs_file), "--select", "orders_report", home=dagster_home,
                url=url)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    with ControlTable(url) as ct:
        assert ct.events("events", key="id").stats().done == 3
        assert ct.status(["warehouse"])[0].last_token == 1
