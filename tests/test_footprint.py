"""The footprint sampler (``support/footprint.py``) counts the run's connections, only the run's, and fails
a run above its limit.

A local listening socket stands in for a shared server (the sampler only looks at TCP connections to an
address and port), so these tests need no database and cannot be disturbed by other users of the real
servers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest
from support import footprint
from support.footprint import OUTSIDE, RUN_ENV, Sampler, Server

#: A child that opens N connections to PORT, says "ready" and holds them until its stdin closes.
HOLDER = """
import socket, sys
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
print("ready", flush=True)
sys.stdin.read()
"""

#: A command run under ``footprint.run``: opens N connections, then holds them until the sampler has
#: looked twice more (its ``looks`` file), so it is seen holding them however loaded the machine is.
SEEN_HOLDER = """
import os, socket, sys, time
conns = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
path = os.path.join(os.environ["CONTROLTABLE_FOOTPRINT_DIR"], "looks")
def looks():
    try:
        return int(open(path).read() or 0)
    except (OSError, ValueError):
        return 0
first, deadline = looks(), time.monotonic() + 120
while looks() < first + 2:
    assert time.monotonic() < deadline, "hang: the sampler took no look in 120 s"
    time.sleep(0.05)
"""


@pytest.fixture
def listener() -> Iterator[Server]:
    """A server stand-in on a free port that accepts every connection and keeps it open."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield Server("postgres", frozenset({"127.0.0.1"}), sock.getsockname()[1])
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    sock.close()


def hold(port: int, n: int, env: Optional[dict[str, str]] = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_counts_the_runs_processes_and_names_their_tests(listener: Server, tmp_path: Path) -> None:
    run_id = "run-under-test"
    root = hold(listener.port, 3)                                # the command itself: in the run
    stranger = hold(listener.port, 2)                            # another job on the same server: not
    marked = hold(listener.port, 4, dict(os.environ, **{RUN_ENV: run_id}))  # daemonised by the run: in it
    try:
        (tmp_path / str(root.pid)).write_text("tests/core/test_x.py::test_a", encoding="utf-8")
        sampler = Sampler([listener], root.pid, run_id, str(tmp_path))
        sample = sampler.sample()
        assert sample.held["postgres"] == {"tests/core/test_x.py::test_a": 3, OUTSIDE: 4}
        assert sample.total("postgres") == 7
    finally:
        for proc in (root, stranger, marked):
            proc.communicate()


def test_connections_to_other_ports_are_not_counted(listener: Server) -> None:
    """A throwaway server listens on a port of its own: its connections are not the shared server's."""
    other = Server("postgres", listener.addresses, listener.port + 1 if listener.port < 65535 else 1)
    root = hold(listener.port, 3)
    try:
        assert Sampler([other], root.pid, "r", None).sample().total("postgres") == 0
    finally:
        root.communicate()


def test_a_run_above_the_limit_fails_and_names_the_peak(listener: Server, capsys: pytest.CaptureFixture[str]) -> None:
    command = [sys.executable, "-c", SEEN_HOLDER, str(listener.port), "3"]
    started = time.monotonic()
    assert footprint.run(command, limit=2, interval=0.1, servers=[listener]) == 1
    assert time.monotonic() - started < 150, "hang: the sampled command did not end"
    out = capsys.readouterr().out
    assert f"postgres (127.0.0.1:{listener.port}): peak 3" in out
    assert "OVER THE LIMIT" in out and "FAILED: the run held more than 2 connections" in out


def test_a_run_within_the_limit_keeps_the_commands_status(listener: Server,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    command = [sys.executable, "-c", SEEN_HOLDER, str(listener.port), "3"]
    assert footprint.run(command, limit=3, interval=0.1, servers=[listener]) == 0
    assert "peak 3" in capsys.readouterr().out
    assert footprint.run([sys.executable, "-c", "raise SystemExit(5)"], limit=3, interval=0.1,
                         servers=[listener]) == 5
