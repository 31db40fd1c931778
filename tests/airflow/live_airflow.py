"""A real Airflow 3 deployment for tests and benchmarks: scheduler, triggerer, dag-processor, api-server.

LocalExecutor, a throwaway PostgreSQL *database* (``CREATE DATABASE`` with a unique name on the
given server, dropped afterwards) for the metadata, and a temporary ``AIRFLOW_HOME``. Runs are
triggered through the REST API; what happened is read from the metadata database (task
instances) and from the control tables (the test DAGs record their work intervals there).

Every process is started in a session of its own and stopped by its process group id, so nothing
else on the machine is touched. Used by ``test_airflow_live.py`` and ``benchmarks/airflow_live.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import Boolean, Column, Float, Integer, MetaData, String, Table, create_engine, text
from sqlalchemy.engine import make_url
from support.live import postgres_reachable, wait_until  # noqa: F401 - re-exported for the tests

HERE = Path(__file__).resolve().parent
COMPONENTS = ("scheduler", "triggerer", "dag-processor", "api-server")


def live_intervals(namespace: str) -> Table:
    """The table the live DAGs record their loads in (``ct_live_dags.intervals``, created by the harness user)."""
    return Table(
        f"live_intervals_{namespace}", MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True), Column("pattern", String(20), nullable=False),
        Column("run_id", String(250), nullable=False), Column("try_number", Integer, nullable=False),
        Column("token", Integer), Column("deferred", Boolean, nullable=False),
        Column("granted_by", String(10)), Column("granted", Float),
        Column("started", Float, nullable=False), Column("finished", Float), Column("closed", Boolean, nullable=False),
    )


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def state_mismatches(scheduler_log: str) -> list[str]:
    """Lines where the scheduler failed a task whose process it thought had ended (the deferral race)."""
    return [line[:600] for line in scheduler_log.splitlines()
            if "but the task instance's state attribute is" in line or "state mismatch" in line]


def workload_failures(scheduler_log: str, limit: int = 3, lines: int = 40) -> list[str]:
    """The first ``limit`` "Workload execution failed" reports of the LocalExecutor's workers, with their traceback.

    A task process that dies before its task runs (its start call to the execution API, its DAG file's
    import) leaves no task log; the worker's traceback in the scheduler's log is the only record of why.
    """
    found: list[str] = []
    log_lines = scheduler_log.splitlines()
    for i, line in enumerate(log_lines):
        if "Workload execution failed" in line:
            found.append("\n".join(part[:600] for part in log_lines[i:i + lines]))
            if len(found) == limit:
                break
    return found


#: Airflow's own defaults of what the harness speeds up (scheduler and triggerer loops), for a
#: deployment that must run as a user's does (the heartbeat waits a trigger may do included).
SCHEDULER_DEFAULTS = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "5",
    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "1",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "5",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveAirflow:
    """Start, drive and stop one Airflow deployment; see the module docstring."""

    def __init__(
        self,
        *,
        server_url: str,
        control_url: str,
        namespace: str,
        dag_files: Iterable[Path],
        parallelism: int = 16,
        extra_env: Optional[dict[str, str]] = None,
    ) -> None:
        self.server_url = make_url(server_url)
        self.control_url = control_url
        self.namespace = namespace
        self.home = Path(tempfile.mkdtemp(prefix="ct-live-airflow-"))
        self.dags = self.home / "dags"
        self.dags.mkdir()
        for path in dag_files:
            shutil.copy(path, self.dags / Path(path).name)
        self.db_name = f"ct_af_{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        meta = self.server_url.set(drivername="postgresql+psycopg", database=self.db_name)
        self.metadata_url = meta.render_as_string(hide_password=False)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._token: Optional[str] = None
        self._meta_engine: Any = None
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": str(parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_url,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": self.base,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__API_AUTH__JWT_EXPIRATION_TIME": "86400",
            "AIRFLOW__CORE__FERNET_KEY": "",
            # Fast scheduling: the tests measure the slot, not Airflow's loop delays.
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "300",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "600",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            # Airflow's default order of magnitude: a task marked failed is SIGTERMed at the next heartbeat
            # and SIGKILLed 5 s later, the window a teardown must not release in.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "10",
            # A task process's calls to the execution API (its start first) give up after 5 attempts of
            # Airflow's default 5 s each: on a machine at load average 20 the one api-server answered later,
            # and loads failed before they ran ("finished with state failed, but ... queued"). Airflow's
            # documented setting for a loaded machine; a hang detector, not a speed.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_CONTROLTABLE_DEFAULT": json.dumps(
                {"conn_type": "controltable", "extra": {"url": control_url, "namespace": namespace}}
            ),
            "CT_LIVE_NAMESPACE": namespace,
            **(extra_env or {}),
        }
        self.bin = str(Path(sys.executable).with_name("airflow"))

    # -- lifecycle ----------------------------------------------------------------------------------
    def _admin(self, sql: str) -> None:
        admin = self.server_url.set(drivername="postgresql+psycopg", database="postgres")
        engine = create_engine(admin, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 10})
        try:
            with engine.connect() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()

    def start(self, timeout: float = 240.0) -> LiveAirflow:
        self._admin(f'CREATE DATABASE "{self.db_name}"')  # a generated name, not user input
        migrate = subprocess.run([self.bin, "db", "migrate"], env=self.env, capture_output=True, text=True,
                                 timeout=timeout)
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}")
        for name in COMPONENTS:
            self.start_component(name)
        self.wait_until(self._api_up, timeout, "the api-server to answer")
        return self

    def start_component(self, name: str) -> None:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        args = [self.bin, name] + (["--port", str(self.port)] if name == "api-server" else [])
        self.procs[name] = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def stop_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)  # the process group this harness created for it
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        for name in list(self.procs):
            self.stop_component(name)
        if self._meta_engine is not None:
            self._meta_engine.dispose()
        for _ in range(5):
            try:
                self._admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
                break
            except Exception:
                time.sleep(1)
        if not os.environ.get("CT_LIVE_KEEP_HOME"):  # keep the logs for a post-mortem when asked
            shutil.rmtree(self.home, ignore_errors=True)

    def logs(self, name: str, tail: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def log_size(self, name: str) -> int:
        path = self.home / f"{name}.log"
        return path.stat().st_size if path.exists() else 0

    def log_since(self, name: str, offset: int) -> str:
        path = self.home / f"{name}.log"
        if not path.exists():
            return ""
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def diagnostics(self, tail: int = 6000) -> str:
        """The end of the scheduler's and triggerer's logs and every state mismatch: for failure messages."""
        parts = [f"--- {name}.log (last {tail} characters)\n{self.logs(name, tail)}"
                 for name in ("scheduler", "triggerer")]
        parts.append("--- state mismatches:\n" + "\n".join(state_mismatches(self.logs("scheduler", 50_000_000))))
        parts.append("--- task processes that failed before or outside their task (the executor's own words):\n"
                     + "\n".join(workload_failures(self.logs("scheduler", 50_000_000))))
        parts.append(f"--- AIRFLOW_HOME: {self.home} (kept when CT_LIVE_KEEP_HOME=1)")
        return "\n".join(parts)

    def resume_lags(self) -> list[float]:
        """Per deferral: seconds from the task's deferral to the scheduler receiving that process's exit event.

        The window in which a trigger that fires would let the scheduler fail the resumed task.
        """
        defers: list[tuple[float, tuple[str, ...]]] = []
        for path in self.home.glob("logs/dag_id=*/run_id=*/task_id=*/attempt=*.log"):
            key = tuple(p.split("=", 1)[1].removesuffix(".log") for p in path.parts[-4:])
            for line in path.read_text(errors="replace").splitlines():
                if "Pausing task as DEFERRED" in line:
                    try:
                        defers.append((_epoch(json.loads(line)["timestamp"]), key))
                    except (ValueError, KeyError):
                        pass
        events: dict[tuple[str, ...], list[float]] = {}
        pattern = re.compile(r"dag_id='([^']+)', task_id='([^']+)', run_id='([^']+)', try_number=(\d+)")
        for line in self.logs("scheduler", 50_000_000).splitlines():
            if "Received executor event with state success" in line:
                found = pattern.search(line)
                if found:
                    dag_id, task_id, run_id, try_number = found.groups()
                    events.setdefault((dag_id, run_id, task_id, try_number), []).append(_epoch(line.split()[0]))
        lags = []
        for at, key in defers:
            later = [t for t in events.get(key, []) if t >= at]
            if later:
                lags.append(min(later) - at)
        return sorted(lags)

    # -- REST API ----------------------------------------------------------------------------------
    def _api_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5) as resp:
                return resp.status == 200
        except Exception:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited:\n{self.logs(name)}") from None
            return False

    def token(self) -> str:
        if self._token is None:
            req = urllib.request.Request(f"{self.base}/auth/token", method="GET")
            with urllib.request.urlopen(req, timeout=10) as resp:
                self._token = json.loads(resp.read())["access_token"]
        return self._token

    def api(self, method: str, path: str, body: Optional[dict[str, Any]] = None, tries: int = 3) -> Any:
        """One REST call; a timeout (a busy api-server on a loaded machine) is retried for reads only."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(1, tries + 1):
            req = urllib.request.Request(f"{self.base}/api/v2{path}", data=data, method=method)
            req.add_header("Content-Type", "application/json")
            req.add_header("Authorization", f"Bearer {self.token()}")
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    raw = resp.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                raise RuntimeError(f"{method} {path} -> {exc.code}: {exc.read()[:2000]!r}") from exc
            except (TimeoutError, urllib.error.URLError):
                if method != "GET" or attempt == tries:
                    raise
                time.sleep(1)
        raise AssertionError("unreachable")

    def wait_for_dags(self, dag_ids: Iterable[str], timeout: float = 120.0) -> None:
        def parsed() -> bool:
            found = {d["dag_id"] for d in self.api("GET", "/dags?limit=1000")["dags"]}
            return set(dag_ids) <= found

        self.wait_until(parsed, timeout, f"the DAGs {sorted(dag_ids)} to be parsed")

    def trigger(self, dag_id: str, conf: Optional[dict[str, Any]] = None, run_id: Optional[str] = None) -> str:
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return str(self.api("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def run_states(self, dag_id: str) -> dict[str, str]:
        """run_id -> state of every run of ``dag_id`` (one metadata query, light on a busy deployment)."""
        rows = self.metadata("SELECT run_id, state FROM dag_run WHERE dag_id = :d", d=dag_id)
        return {r["run_id"]: str(r["state"]) for r in rows}

    def wait_for_runs(self, dag_id: str, run_ids: Iterable[str], timeout: float, sampler: Any = None) -> dict[str, str]:
        """Wait until the runs are finished; returns run_id -> state. ``sampler()`` is called every loop."""
        pending = set(run_ids)
        states: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if sampler is not None:
                sampler()
            current = self.run_states(dag_id)
            for run_id in list(pending):
                state = current.get(run_id)
                if state in ("success", "failed"):
                    states[run_id] = state
                    pending.discard(run_id)
            if time.monotonic() > deadline:
                raise AssertionError(f"runs {sorted(pending)} of {dag_id} not finished after {timeout} s; "
                                     f"states so far {states}\n{self.diagnostics()}")
            time.sleep(0.3)
        return states

    def task_logs(self, dag_id: str, run_id: str, tail: int = 3000) -> str:
        """The task (and trigger) logs of one run, for assertion messages."""
        out = []
        for log in sorted(self.home.glob(f"logs/dag_id={dag_id}/run_id={run_id}/**/*.log")):
            out.append(f"--- {log.relative_to(self.home)}\n{log.read_text(errors='replace')[-tail:]}")
        sched = [line for line in self.logs("scheduler", tail=2_000_000).splitlines()
                 if run_id in line and ("error" in line.lower() or "FAILED" in line or "mismatch" in line)]
        out.append("--- scheduler:\n" + "\n".join(sched[-10:]))
        return "\n".join(out)

    # -- the metadata database -------------------------------------------------------------------------
    def metadata(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        """Read the metadata database (the harness's own reads; the DAGs never touch it)."""
        if self._meta_engine is None:
            self._meta_engine = create_engine(self.metadata_url, pool_size=1)
        with self._meta_engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text(sql), params)]

    def task_states(self, dag_id: str) -> dict[tuple[str, str, int], str]:
        rows = self.metadata(
            "SELECT run_id, task_id, map_index, state FROM task_instance WHERE dag_id = :d", d=dag_id
        )
        return {(r["run_id"], r["task_id"], r["map_index"]): str(r["state"]) for r in rows}

    wait_until = staticmethod(wait_until)
