"""A small watcher process for a retry-mode step of the multiprocess executor, between its tries.

With ``wait="retry"`` a step that finds its slot busy raises ``RetryRequested`` and its process
exits; its queue place stays (same holder on every try). Under the multiprocess executor nothing of
the run is then left to notice a cancellation: Dagster's run worker just sleeps out the retry wait,
and the run-cleanup sensor ticks every few seconds at best. Meanwhile the cancelled run's place
keeps its turn, and a grant made for it holds the slot until its pick-up lapses.

So the step, before it raises, makes sure one watcher runs for its holder: this module, started
detached (``python -m dagster_controltable.retry_watch``, its settings on stdin so no URL shows in
``ps``). It reads the run's status from the Dagster instance every ``WATCH_TICK`` seconds and, when
the run is canceling, canceled or failed, withdraws the step's queue place (or the grant made for
it): within a fraction of a second of the cancel, even though no step process exists. It ends
then, or when the run ends otherwise, or at its deadline (the next try's start plus a margin),
which every later retry of the same step pushes on instead of starting another watcher.

Never under a running try: the step's next try pauses the watcher and waits until the watcher
has acknowledged the pause (one tick) before it touches its queue place, so a slot a try picked
up and works under is never withdrawn from under it; the try then handles a cancellation itself,
as a step that holds does, and un-pauses the watcher when it raises ``RetryRequested`` again. So a
step at the head of its queue, retried every few seconds, keeps one watcher process.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from dagster_controltable import defaults

#: Seconds a watcher outlives the retry wait it was started for: a new step process's start-up on a
#: loaded machine, after which the step's next try (or its next watcher) takes over.
WATCH_MARGIN = 30.0


def state_file(holder: str) -> Path:
    """Where the watcher of ``holder`` keeps its pid and deadline (one watcher per holder and host)."""
    digest = hashlib.sha256(holder.encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"controltable-retry-watch-{digest}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped by the step process that started it) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _write(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def ensure_watcher(settings: dict[str, Any], holder: str, until: float) -> bool:
    """Have a watcher for ``holder`` run until ``until`` (epoch seconds); True when one was started.

    ``settings``: the control table (``url``, ``namespace``, ``schema``, ``prefix``), the run id, the
    ``holder`` and its ``resources``, and the serialized Dagster instance reference (``instance_ref``).
    """
    path = state_file(holder)
    state = _read(path)
    if state is not None and _alive(int(state.get("pid", 0))):
        _write(path, {**state, "until": max(float(state.get("until", 0)), until), "paused": 0})
        return False
    proc = subprocess.Popen(  # noqa: S603 - this interpreter, this package
        [sys.executable, "-m", "dagster_controltable.retry_watch"], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    _write(path, {"pid": proc.pid, "until": until})
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({**settings, "state": str(path)}).encode())
    proc.stdin.close()
    return True


def ack_file(holder: str) -> Path:
    """Where ``holder``'s watcher says it is ready (``{"ready": pid}``, once started) and
    acknowledges a pause (``"paused"``); written by the watcher only."""
    return state_file(holder).with_suffix(".ack")


def pause_watcher(holder: str, timeout: float = defaults.WATCHER_PAUSE_TIMEOUT) -> None:
    """A try of ``holder`` starts: make its watcher stand down, and wait until it has (bounded).

    A watcher that does not acknowledge within ``timeout`` is stopped instead; either way it acts no
    more until the try hands the place back to it (:func:`ensure_watcher`).
    """
    path = state_file(holder)
    state = _read(path)
    if state is None:
        return
    pid = int(state.get("pid", 0))
    if pid <= 0 or not _alive(pid):
        path.unlink(missing_ok=True)
        return
    seq = time.time_ns()
    _write(path, {**state, "paused": seq})
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        ack = _read(ack_file(holder)) or {}
        if ack.get("paused") == seq:
            return
        time.sleep(0.02)
    if _alive(pid):
        stop_watcher(holder)


def stop_watcher(holder: str, timeout: float = defaults.WATCHER_STOP_TIMEOUT) -> None:
    """Stop ``holder``'s watcher, if one runs, and wait (bounded) until it has exited."""
    path = state_file(holder)
    state = _read(path)
    if state is None:
        return
    pid = int(state.get("pid", 0))
    if pid > 0 and _alive(pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    path.unlink(missing_ok=True)
    ack_file(holder).unlink(missing_ok=True)


def watch(settings: dict[str, Any]) -> int:
    """The watcher's loop; returns the requests withdrawn."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value

    from controltable import ControlTable
    from dagster_controltable.run_status import RUN_ENDED_BADLY

    path = Path(settings["state"])
    ack = path.with_suffix(".ack")
    run_id = str(settings["run_id"])
    instance = DagsterInstance.from_ref(deserialize_value(settings["instance_ref"], InstanceRef))
    # Ready: what is slow to start (the imports, the instance) is done; the ack file says so, for
    # whoever wants to know that a cancellation from now on is seen within a tick.
    _write(ack, {"ready": os.getpid()})
    try:
        while True:
            state = _read(path) or {}
            if time.time() > float(state.get("until", 0)):
                return 0
            if state.get("paused"):  # a try runs: acknowledge, and leave its place alone
                _write(ack, {"ready": os.getpid(), "paused": state["paused"]})
                time.sleep(defaults.WATCH_TICK)
                continue
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished and run.status not in RUN_ENDED_BADLY:
                return 0
            if run.status in RUN_ENDED_BADLY:
                with ControlTable(settings["url"], namespace=settings["namespace"], schema=settings.get("schema"),
                                  prefix=settings.get("prefix", "ct_")) as ct:
                    return sum(ct.release(name, settings["holder"]) for name in settings["resources"])
            time.sleep(defaults.WATCH_TICK)
    finally:
        last = _read(path)
        if last is not None and int(last.get("pid", 0)) == os.getpid():
            path.unlink(missing_ok=True)
            ack.unlink(missing_ok=True)
        instance.dispose()


def main() -> None:
    watch(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    main()
