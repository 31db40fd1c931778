"""A real Dagster deployment for the live tests: code server, daemon and webserver on PostgreSQL storage.

One :class:`Deployment` is one Dagster instance: its own DAGSTER_HOME (a temporary folder) whose
``dagster.yaml`` puts run, event-log and schedule storage in a throwaway PostgreSQL database
(created with a unique name on the test server, dropped afterwards) and configures the queued
run coordinator. It starts ``dagster api grpc`` (the code location in ``definitions.py``),
``dagster-daemon run`` and ``dagster-webserver``, and launches and terminates runs through the
webserver's GraphQL API, as a user's UI or script would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine, text
from sqlalchemy.engine import make_url
from support.live import wait_until  # noqa: F401 - re-exported for the tests

DEFINITIONS = Path(__file__).with_name("definitions.py")
BIN = Path(sys.executable).parent
LOCATION = "live"
REPOSITORY = "__repository__"
#: The storage URL scheme for dagster-postgres: SQLAlchemy 2.1 maps a plain ``postgresql://`` to
#: psycopg 3, which dagster-postgres does not support; psycopg2 is what it is built and tested on.
STORAGE_SCHEME = os.environ.get("LIVE_STORAGE_SCHEME", "postgresql+psycopg2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])




def create_event_tables(engine: Any, name: str) -> None:
    """The event table ``name`` the drain job works on, and ``<name>_log`` where it logs every key it did."""
    meta = MetaData()
    Table(name, meta, Column("id", Integer, primary_key=True, autoincrement=False), Column("payload", String(20)))
    Table(f"{name}_log", meta, Column("event_id", Integer, nullable=False),
          Column("token", BigInteger, nullable=False), Column("run_id", String(64), nullable=False))
    meta.create_all(engine)


class ThrowawayDatabase:
    """A PostgreSQL database with a unique name on the server of ``server_url``; dropped by ``drop()``."""

    def __init__(self, server_url: str, label: str) -> None:
        self.server = make_url(server_url)
        self.name = f"ct_dagster_{label}_{uuid.uuid4().hex[:10]}"
        admin = create_engine(self.server.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))  # the name is ours: letters, digits, _
        admin.dispose()

    def url(self, drivername: str) -> str:
        return self.server.set(drivername=drivername, database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        admin = create_engine(self.server.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        admin.dispose()


class Deployment:
    """One Dagster instance: code server, daemon and webserver, with their logs in ``home``."""

    def __init__(self, home: Path, storage_url: str, env: dict[str, str]) -> None:
        self.home = home
        self.storage_url = storage_url
        self.env = {**os.environ, **env, "DAGSTER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.grpc_port = free_port()
        self.web_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._client: Any = None
        self._instance: Any = None

    # -- life cycle ------------------------------------------------------------------------------
    def write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "dagster.yaml").write_text(json.dumps({
            "storage": {"postgres": {"postgres_url": self.storage_url}},
            "run_coordinator": {
                "module": "dagster.core.run_coordinator",
                "class": "QueuedRunCoordinator",
                "config": {"max_concurrent_runs": 20, "dequeue_interval_seconds": 1},
            },
            "telemetry": {"enabled": False},
        }, indent=2))  # JSON is YAML
        (self.home / "workspace.yaml").write_text(json.dumps({"load_from": [{"grpc_server": {
            "host": "127.0.0.1", "port": self.grpc_port, "location_name": LOCATION}}]}))

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(list(args), env=self.env, cwd=str(self.home), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 180.0) -> None:
        self.write_config()
        self._spawn("grpc", str(BIN / "dagster"), "api", "grpc", "-h", "127.0.0.1", "-p", str(self.grpc_port),
                    "-f", str(DEFINITIONS), "--location-name", LOCATION)
        wait_until(lambda: self._port_open(self.grpc_port), timeout, "the code server", interval=0.5)
        workspace = str(self.home / "workspace.yaml")
        self._spawn("daemon", str(BIN / "dagster-daemon"), "run", "-w", workspace)
        self._spawn("webserver", str(BIN / "dagster-webserver"), "-w", workspace, "-h", "127.0.0.1", "-p",
                    str(self.web_port))
        wait_until(self._webserver_ready, timeout, "the webserver", interval=0.5)
        wait_until(self._daemon_ready, timeout, "the daemon's first heartbeats", interval=1.0)

    def _port_open(self, port: int) -> bool:
        self.check_alive()
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def _webserver_ready(self) -> bool:
        if not self._port_open(self.web_port):
            return False
        try:
            self.graphql("{ version }")
            return True
        except Exception:
            return False

    def _daemon_ready(self) -> bool:
        self.check_alive()
        beats = self.instance.get_daemon_heartbeats()
        return {"QUEUED_RUN_COORDINATOR", "SENSOR"} <= set(beats)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """Stop our processes (each in its own session, so run workers they started go too)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None

    # -- runs ------------------------------------------------------------------------------------
    @property
    def instance(self) -> Any:
        """This deployment's DagsterInstance, opened in the test process (reads the same storage)."""
        if self._instance is None:
            from dagster import DagsterInstance
            from dagster._core.instance.ref import InstanceRef

            old = os.environ.get("DAGSTER_HOME")
            try:
                os.environ["DAGSTER_HOME"] = str(self.home)
                self._instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home)))
            finally:
                if old is None:
                    os.environ.pop("DAGSTER_HOME", None)
                else:
                    os.environ["DAGSTER_HOME"] = old
        return self._instance

    @property
    def client(self) -> Any:
        if self._client is None:
            from dagster_graphql import DagsterGraphQLClient

            self._client = DagsterGraphQLClient("127.0.0.1", port_number=self.web_port, timeout=60)
        return self._client

    def graphql(self, query: str, variables: Optional[dict[str, Any]] = None) -> Any:
        return self.client._execute(query, variables)

    def submit(self, job: str, op_config: dict[str, Any]) -> str:
        """Launch ``job`` through GraphQL (queued, then started by the daemon); returns the run id."""
        return str(self.client.submit_job_execution(
            job, repository_location_name=LOCATION, repository_name=REPOSITORY,
            run_config={"ops": {"hold": {"config": op_config}}} if op_config else {}))

    def terminate(self, run_id: str) -> None:
        """``terminateRun`` through GraphQL, as the UI's Terminate button does."""
        self.client.terminate_run(run_id)

    def status(self, run_id: str) -> str:
        run = self.instance.get_run_by_id(run_id)
        return str(run.status.value) if run is not None else "UNKNOWN"

    def wait_for_runs(self, run_ids: list[str], statuses: set[str], timeout: float) -> dict[str, str]:
        finished = {"SUCCESS", "FAILURE", "CANCELED"}

        def done() -> Optional[dict[str, str]]:
            self.check_alive()
            now = {r: self.status(r) for r in run_ids}
            return now if all(s in finished for s in now.values()) else None

        result = wait_until(done, timeout, f"runs {run_ids} to finish", interval=1.0)
        bad = {r: s for r, s in result.items() if s not in statuses}
        if bad:
            raise AssertionError(f"runs ended {bad}; expected {statuses}\n{self.run_logs(list(bad))}")
        return dict(result)

    def run_logs(self, run_ids: list[str], chars: int = 3000) -> str:
        out = []
        for run_id in run_ids:
            records = self.instance.all_logs(run_id)
            lines = []
            for r in records:
                event = r.dagster_event
                line = f"{event.event_type_value if event else 'LOG'}: {r.user_message}"
                if event is not None and event.event_type_value == "STEP_FAILURE":
                    line += f" {event.step_failure_data.error.message}"
                lines.append(line)
            out.append(f"--- run {run_id}\n" + "\n".join(lines)[-chars:])
        return "\n".join(out)
