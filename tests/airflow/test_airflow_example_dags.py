"""The example DAGs, run end to end with ``dag.test()`` / ``airflow dags test`` against a SQLite control table.

Includes a failing load whose teardown still releases the slot, and two DAG runs from two Airflow
deployments contending for a capacity-1 resource, checked for non-overlap from recorded intervals.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from airflow_helpers import EXAMPLES, airflow_bin, load_example, set_connection, task_states
from support.live import wait_until

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture
def control_url(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """``controltable_default`` pointing at an embedded SQLite control table of this test."""
    url = f"sqlite:///{tmp_path / 'control.db'}"
    set_connection(monkeypatch, "controltable_default", conn_type="controltable", extra={"url": url})
    return url


def table_for(url: str) -> Any:
    from controltable import ControlTable

    return ControlTable(url)


def live_holders(url: str, resource: str) -> list[str]:
    with table_for(url) as ct:
        return [h.holder for st in ct.status([resource]) for h in st.holders if not h.expired]


EXAMPLE_IDS = {
    "controltable_warehouse_load", "controltable_warehouse_slot", "controltable_event_batches", "controltable_worklist"
}


def test_example_dags_parse() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == EXAMPLE_IDS
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(EXAMPLES)}
    # Parsed as the DAG processor parses a bundle (its folder on sys.path, for warehouse_example).
    out = subprocess.run([airflow_bin(), "dags", "list", "--local", "--bundle-name", "dags-folder", "-o", "json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    listed = json.loads(out.stdout[out.stdout.index("[{"):])
    assert {d["dag_id"] for d in listed} == EXAMPLE_IDS


def test_warehouse_slot_dag_succeeds_and_releases(control_url: str) -> None:
    dag = load_example("controltable_warehouse_slot").dag
    dr = dag.test(run_conf={"load_seconds": 0.2})
    assert dr.state == "success", task_states(dr)
    assert all(states == ["success"] for states in task_states(dr).values())
    assert live_holders(control_url, "warehouse") == []
    with table_for(control_url) as ct, ct.engine.connect() as conn:
        rows = conn.exec_driver_sql("select run_id, fencing_token from example_warehouse_loads").all()
    assert rows == [(dr.run_id, 1)]


def test_recommended_pattern_dag_holds_and_releases(control_url: str) -> None:
    dag = load_example("controltable_warehouse_load").dag
    dr = dag.test(run_conf={"load_seconds": 0.2})
    assert dr.state == "success", task_states(dr)
    assert live_holders(control_url, "warehouse") == []
    with table_for(control_url) as ct, ct.engine.connect() as conn:
        rows = conn.exec_driver_sql("select run_id, fencing_token from example_warehouse_loads").all()
    assert rows == [(dr.run_id, 1)]
    failed = dag.test(run_conf={"fail": True, "load_seconds": 0.1})
    assert failed.state == "failed" and task_states(failed)["load"] == ["failed"]
    assert live_holders(control_url, "warehouse") == []  # released in the failing task's own process
    with table_for(control_url) as ct:
        assert ct.status(["warehouse"])[0].last_token == 2


def test_failed_load_still_releases_the_slot_in_the_teardown(control_url: str) -> None:
    dag = load_example("controltable_warehouse_slot").dag
    dr = dag.test(run_conf={"fail": True, "load_seconds": 0.1})
    states = task_states(dr)
    assert dr.state == "failed"
    assert states["load"] == ["failed"]
    assert states["acquire_warehouse"] == ["success"]
    assert states["release_warehouse"] == ["success"]  # the teardown ran despite the failure
    # A load that raised is not a killed one: its process recorded that the work ended, and the
    # teardown released without waiting Airflow's kill grace (at least 13 s).
    (release,) = [ti for ti in dr.get_task_instances() if ti.task_id == "release_warehouse"]
    # By cause: it released before the kill grace (at least 13 s) could have run out, which is what it
    # would have waited without the recorded end; not "within 5 s" (a loaded machine stretches it).
    assert release.duration is not None and release.duration < 13, (
        f"the teardown took {release.duration:.1f} s: it waited out Airflow's kill grace")
    assert live_holders(control_url, "warehouse") == []
    with table_for(control_url) as ct:
        assert ct.status(["warehouse"])[0].last_token == 1  # it had been acquired


def _clone_airflow_home(src: Path, dst: Path) -> None:
    dst.mkdir()
    with sqlite3.connect(src / "airflow.db") as source, sqlite3.connect(dst / "airflow.db") as target:
        source.backup(target)


def test_two_deployments_contend_for_one_slot_and_never_overlap(
    airflow_db: Path, control_url: str, tmp_path: Path
) -> None:
    """Two `airflow dags test` processes, each its own deployment (metadata DB), share one control table.

    The test holds the slot until both runs are seen queued behind it (``status()``), so both really
    contend however far apart a loaded machine starts the two processes (a CI run started one after
    the other's 5 s load had ended, and nobody waited).
    """
    with table_for(control_url) as ct:
        ct.install()
        ct.set_capacity("warehouse", 1)
        blocker = ct.acquire("warehouse", holder="test-blocker", lease=600)
    procs = []
    for name in ("east", "west"):
        home = tmp_path / f"home_{name}"
        _clone_airflow_home(airflow_db, home)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CONTROLTABLE__DEPLOYMENT_ID": name,
        }
        procs.append(subprocess.Popen(
            [airflow_bin(), "dags", "test", "controltable_warehouse_slot", "-c", json.dumps({"load_seconds": 5})],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    try:
        with table_for(control_url) as ct:
            wait_until(lambda: len(ct.status(["warehouse"])[0].waiters) == 2, 240,
                       "both deployments' runs to queue behind the test's holder",
                       state=lambda: [p.poll() for p in procs])
            blocker_token = blocker.token
            assert ct.release("warehouse", "test-blocker") == 1
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-4000:]

    with table_for(control_url) as ct, ct.engine.connect() as conn:
        loads = conn.exec_driver_sql(
            "select fencing_token, started_at, finished_at from example_warehouse_loads order by started_at").all()
    assert len(loads) == 2
    (token1, start1, end1), (token2, start2, end2) = loads
    assert end1 - start1 >= 5 and end2 - start2 >= 5
    assert end1 <= start2, f"the loads overlapped: {loads}"
    assert blocker_token < token1 < token2  # each later holder got a newer fencing token
    assert live_holders(control_url, "warehouse") == []
    assert all("acquire_warehouse" in out and "deferring" in out for out in outputs)  # both really waited


def test_event_batch_dag_drains_the_table(control_url: str) -> None:
    dag = load_example("controltable_event_batches").dag
    dr = dag.test(run_conf={"new_events": 25})
    states = task_states(dr)
    assert dr.state == "success", states
    assert states["process"] == ["success"] * 3 and states["complete_batch"] == ["success"] * 3
    with table_for(control_url) as ct:
        stats = ct.events("example_events", key="id").stats()
    assert stats.done == 25 and stats.pending == 0 and stats.claimed == 0


def test_worklist_dag_runs_orders_in_sequence(control_url: str) -> None:
    dag = load_example("controltable_worklist").dag
    dr = dag.test()
    states = task_states(dr)
    assert dr.state == "success", states
    assert states["run_100"] == ["success"] * 3 and states["run_200"] == ["success"] * 2
    with table_for(control_url) as ct:
        wl = ct.worklist(f"example-{dr.run_id}")
        assert wl.status().finished
        items = wl.items_list()
    assert len(items) == 6 and {i["state"] for i in items} == {"done"}
    by_order: dict[int, list[dict[str, Any]]] = {}
    for item in items:
        by_order.setdefault(item["exec_order"], []).append(item)
    for before, after in ((100, 200), (200, 300)):
        assert max(i["finished_at"] for i in by_order[before]) <= min(i["started_at"] for i in by_order[after])


def test_hold_slot_decorator_renews_and_releases_on_failure_and_kill(control_url: str) -> None:
    dag = load_example("ct_test_dags").hold_slot_dag
    dr = dag.test()
    states = task_states(dr)
    assert states == {"setup": ["success"], "holds": ["success"], "killed": ["success"], "fails": ["failed"]}
    ti = {t.task_id: t for t in dr.get_task_instances()}
    # on_kill stopped the block by raising into it; the slot stayed held until the block had unwound.
    assert ti["killed"].xcom_pull(task_ids="killed") == [1, 0]
    assert live_holders(control_url, "solo") == []  # released after the failure too
    with table_for(control_url) as ct:
        assert ct.status(["solo"])[0].last_token == 3  # each of the three tasks was granted the slot


def test_reschedule_mode_sensor_waits_for_another_holder(control_url: str) -> None:
    with table_for(control_url) as ct:
        ct.install()
        ct.set_capacity("lab", 1)
        ct.acquire("lab", holder="dagster:job-42", timeout=0)
    timer = threading.Timer(2.0, lambda: table_for(control_url).release("lab", "dagster:job-42"))
    dag = load_example("ct_test_dags").reschedule_dag
    timer.start()
    dr = dag.test()
    timer.join()
    assert dr.state == "success", task_states(dr)
    with table_for(control_url) as ct:
        assert ct.status(["lab"])[0].last_token == 2  # granted after the other holder's token 1
    assert live_holders(control_url, "lab") == []


def test_readme_dag_runs_as_pasted(control_url: str) -> None:
    """The DAG of docs/airflow.md, pasted into a file unchanged, runs and releases its slot."""
    dag = load_example("readme_nightly_load").dag
    dr = dag.test()
    assert dr.state == "success", task_states(dr)
    assert task_states(dr)["load"] == ["success"]
    assert live_holders(control_url, "warehouse") == []
    with table_for(control_url) as ct:
        assert ct.status(["warehouse"])[0].last_token == 1
