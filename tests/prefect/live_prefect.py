"""A real Prefect 3 deployment for tests: ``prefect server start``, a process work pool and its worker.

The server runs on a free port with its own SQLite database in a temporary PREFECT_HOME; the
worker (``prefect worker start --type process``) runs every flow run in a process of its own,
as users run them. Flows are deployed from a local folder (``flow.from_source(<folder>,
<entrypoint>).deploy(...)``, in a subprocess with the server's settings), triggered and cancelled
through the REST API, and their logs read from it. The ``ControlTableBlock`` the flows load is
registered with ``prefect block register -m prefect_controltable`` and saved under a name.

Every process is started in a session of its own and stopped by its PID (process group), so
nothing else on the machine is touched. ``python`` is the interpreter with Prefect installed
(.venv-prefect); ``pythonpath`` is prepended to the processes' PYTHONPATH, so a cross-orchestrator
test run from another interpreter can start a Prefect deployment beside its Airflow and Dagster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import httpx
from support.live import wait_until

#: The states a flow run ends in.
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "CRASHED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrefectDeployment:
    """A Prefect server, a process work pool with one worker, and deployments of ``flows_dir``'s flows."""

    def __init__(self, home: Path, *, env: dict[str, str], python: str = sys.executable,
                 pythonpath: tuple[str, ...] = (), pool: Optional[str] = None) -> None:
        self.home = Path(home)
        self.python = python
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        self.pool = pool or f"live-{uuid.uuid4().hex[:8]}"
        path = os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")]).strip(os.pathsep)
        self.env = {**os.environ, **env, "PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api,
                    "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.home / 'prefect.db'}",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
                    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.3", "PYTHONPATH": path,
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("PREFECT_PROFILE", None)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.deployments: dict[str, str] = {}
        self.http = httpx.Client(base_url=self.api, timeout=30)

    # -- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.home / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen([self.python, "-m", "prefect", *args], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
        self.procs[name] = proc
        return proc

    def prefect(self, *args: str, timeout: float = 300) -> str:
        """Run a ``prefect`` command against this server; its output (fails naming it on an error)."""
        done = subprocess.run([self.python, "-m", "prefect", *args], env=self.env, cwd=self.home,
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        server = self._spawn("server", "server", "start", "--host", "127.0.0.1", "--port", str(self.port))
        wait_until(lambda: self._healthy() or server.poll() is not None, 180, "the Prefect server to answer",
                   interval=0.5, state=lambda: self.log_tail("server"))
        assert server.poll() is None, f"the Prefect server exited:\n{self.log_tail('server')}"
        self.prefect("work-pool", "create", self.pool, "--type", "process")
        self.start_worker()

    def start_worker(self) -> None:
        """Start (again) the pool's worker; returns once the server has seen it poll."""
        name = f"worker{len([n for n in self.procs if n.startswith('worker')])}"
        self._spawn(name, "worker", "start", "--pool", self.pool, "--type", "process", "--name", name,
                    "--limit", "8")
        self.worker_name = name

        def online() -> bool:
            workers = self._call("POST", f"/work_pools/{self.pool}/workers/filter", json={}).json()
            return any(w["name"] == name and w.get("status") == "ONLINE" for w in workers)

        wait_until(online, 120, f"worker {name} to poll the pool", interval=0.5,
                   state=lambda: self.log_tail(name))

    @property
    def worker(self) -> subprocess.Popen[bytes]:
        return self.procs[self.worker_name]

    def _healthy(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop the worker(s) and the server by their process groups (SIGTERM, then SIGKILL)."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
        self.http.close()

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    # -- blocks and deployments ----------------------------------------------------------------
    def save_block(self, name: str, **fields: Any) -> None:
        """``prefect block register -m prefect_controltable``, then save a ControlTableBlock as ``name``."""
        self.prefect("block", "register", "-m", "prefect_controltable")
        script = ("import json, sys\nfrom prefect_controltable import ControlTableBlock\n"
                  "ControlTableBlock(**json.loads(sys.argv[1])).save(sys.argv[2], overwrite=True)\n")
        done = subprocess.run([self.python, "-c", script, json.dumps(fields), name], env=self.env, cwd=self.home,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def deploy(self, flows_dir: Path, entrypoints: dict[str, str],
               job_variables: Optional[dict[str, Any]] = None) -> None:
        """Deploy each ``name: "file.py:flow"`` from the local folder to the work pool.

        ``job_variables``: the process work pool's job variables of these deployments (``env``,
        ``command``), as a user sets them in ``prefect.yaml`` or ``.deploy(job_variables=...)``.
        """
        script = (
            "import json, sys\nfrom prefect import flow\n"
            "ids = {}\n"
            "for name, entry in json.loads(sys.argv[2]).items():\n"
            "    ids[name] = str(flow.from_source(source=sys.argv[1], entrypoint=entry).deploy(\n"
            "        name=name, work_pool_name=sys.argv[3], print_next_steps=False,\n"
            "        job_variables=json.loads(sys.argv[4])))\n"
            "print('DEPLOYED ' + json.dumps(ids))\n")
        done = subprocess.run([self.python, "-c", script, str(flows_dir), json.dumps(entrypoints), self.pool,
                               json.dumps(job_variables or {})],
                              env=self.env, cwd=self.home, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"deploying failed:\n{done.stdout}\n{done.stderr}"
        line = [ln for ln in done.stdout.splitlines() if ln.startswith("DEPLOYED ")][-1]
        self.deployments.update(json.loads(line[len("DEPLOYED "):]))

    # -- the REST API ------------------------------------------------------------------------
    #: What Prefect's own client retries (prefect.client.base: 429, 502, 503): a loaded server's SQLite
    #: database answers "locked" and the server says 503 (a CI run beside two CPU hogs got one on
    #: create_flow_run). Bounded: at most this many tries, backing off up to 5 s each.
    RETRY_STATUSES = (429, 502, 503)
    TRIES = 12

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One REST call, retried on the statuses Prefect's client retries; raises on any other error."""
        for attempt in range(1, self.TRIES + 1):
            reply = self.http.request(method, path, **kwargs)
            if reply.status_code not in self.RETRY_STATUSES or attempt == self.TRIES:
                reply.raise_for_status()
                return reply
            retry_after = reply.headers.get("Retry-After", "")
            backoff = min(5.0, 0.25 * 2 ** attempt)
            time.sleep(float(retry_after) if retry_after.replace(".", "", 1).isdigit() else backoff)
        raise AssertionError("unreachable")  # the last try returned or raised

    # -- runs --------------------------------------------------------------------------------
    def submit(self, deployment: str, **parameters: Any) -> str:
        """Create a flow run of ``deployment`` (the worker picks it up); its id."""
        reply = self._call("POST", f"/deployments/{self.deployments[deployment]}/create_flow_run",
                           json={"parameters": parameters})
        return str(reply.json()["id"])

    def run(self, run_id: str) -> dict[str, Any]:
        reply = self._call("GET", f"/flow_runs/{run_id}")
        return dict(reply.json())

    def state(self, run_id: str) -> str:
        state = self.run(run_id).get("state") or {}
        return str(state.get("type", "NONE"))

    def cancel(self, run_id: str) -> None:
        """What the UI's Cancel does: propose CANCELLING; the worker then stops the flow-run process."""
        reply = self._call("POST", f"/flow_runs/{run_id}/set_state", json={"state": {"type": "CANCELLING"}})
        assert reply.json()["status"] == "ACCEPT", reply.json()

    def wait_for_runs(self, run_ids: list[str], states: set[str], timeout: float) -> None:
        def ended() -> bool:
            return all(self.state(r) in FINAL for r in run_ids)

        wait_until(ended, timeout, f"{len(run_ids)} flow run(s) to end", interval=1.0,
                   state=lambda: {r: self.state(r) for r in run_ids})
        bad = {r: self.state(r) for r in run_ids if self.state(r) not in states}
        assert not bad, f"flow runs ended in {bad}, expected {states}:\n" + "\n".join(
            self.logs(r)[-3000:] for r in bad)

    def logs(self, run_id: str) -> str:
        reply = self._call("POST", "/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}},
                                                         "sort": "TIMESTAMP_ASC", "limit": 200})
        return "\n".join(entry["message"] for entry in reply.json())


def new_home(prefix: str = "prefect_home_") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
