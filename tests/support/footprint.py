"""The suite's footprint on the shared servers: how many connections a run holds to them at once.

The shared PostgreSQL and MariaDB allow 100 connections each and serve other people too, so the suite
promises to hold at most ``--limit`` (40) at once. This module runs a command (``scripts/run-tests``
runs its lanes under it) and samples, every ``--interval`` seconds from its own thread, the TCP
connections the command's processes hold to each shared server, then prints the peak per server, the
tests holding them at that moment and the heaviest tests, and fails the run when a peak is above the
limit::

    python tests/support/footprint.py --limit 40 -- python -m pytest tests/core/test_events.py

Why the client side and not ``pg_stat_activity``: the servers are shared, so a server-side count
includes everybody else's sessions, and a run would fail for what another job holds. A connection
belongs to the run when the process holding it descends from the command or carries the run's
environment marker (``CONTROLTABLE_FOOTPRINT_RUN``, which also covers a server a test daemonised,
such as a PgBouncer or a standby whose parent exited). Throwaway servers listen on other ports, so
their connections are not counted. A pytest process started under the sampler writes the test it is
running to ``CONTROLTABLE_FOOTPRINT_DIR/<pid>`` (the root conftest does), which attributes every
connection to the test whose process tree holds it.

Sampling sees the connections open at each sample; a burst shorter than the interval can be missed,
which is why heavy tests are found by their own peaks over many samples, not by one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import psutil

RUN_ENV = "CONTROLTABLE_FOOTPRINT_RUN"
DIR_ENV = "CONTROLTABLE_FOOTPRINT_DIR"
#: The environment variables naming the shared servers (the same ones the root conftest reads).
SERVER_ENV = {"postgres": "CONTROLTABLE_TEST_POSTGRES_URL", "mysql": "CONTROLTABLE_TEST_MYSQL_URL"}
_DEFAULT_PORT = {"postgres": 5432, "mysql": 3306}
OUTSIDE = "(outside any test)"
LOOKS = "looks"


@dataclass(frozen=True)
class Server:
    """A shared server as the clients reach it: TCP to one of ``addresses`` on ``port``."""

    name: str
    addresses: frozenset[str]
    port: int

    def __str__(self) -> str:
        return f"{self.name} ({sorted(self.addresses)[0]}:{self.port})"


def server_from_url(name: str, url: str) -> Server:
    """The server a SQLAlchemy URL points at; a host name is resolved, since sockets carry addresses."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    host = parsed.host or "127.0.0.1"
    port = int(parsed.port or _DEFAULT_PORT[name])
    import socket

    addresses = {host}
    try:
        addresses |= {str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        pass
    if addresses & {"127.0.0.1", "::1", "localhost"}:
        addresses |= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
    return Server(name, frozenset(addresses), port)


def servers_from_env() -> list[Server]:
    """The shared servers the tests are configured with (``CONTROLTABLE_TEST_*_URL``)."""
    return [server_from_url(name, os.environ[env]) for name, env in SERVER_ENV.items() if os.environ.get(env)]


@dataclass
class Sample:
    """One look: per server, how many connections each test (or ``OUTSIDE``) held."""

    at: float
    held: dict[str, Counter[str]]

    def total(self, server: str) -> int:
        return sum(self.held.get(server, Counter()).values())


@dataclass
class Footprint:
    """What the sampler saw over a run: the peak sample per server and each test's own peak."""

    servers: list[Server]
    samples: int = 0
    started: float = field(default_factory=time.time)
    peak: dict[str, Sample] = field(default_factory=dict)
    per_test: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        self.samples += 1
        for server in self.servers:
            held = sample.held.get(server.name, Counter())
            best = self.peak.get(server.name)
            if best is None or sample.total(server.name) > best.total(server.name):
                self.peak[server.name] = sample
            tests = self.per_test.setdefault(server.name, Counter())
            for test, n in held.items():
                tests[test] = max(tests[test], n)

    def peak_of(self, server: str) -> int:
        best = self.peak.get(server)
        return best.total(server) if best else 0

    def report(self, limit: int, top: int = 10) -> list[str]:
        """The lines printed at the end of the run."""
        lines = [f"connections to the shared servers (sampled {self.samples} times; limit {limit} at once):"]
        for server in self.servers:
            peak = self.peak_of(server.name)
            verdict = "OVER THE LIMIT" if peak > limit else "within the limit"
            when = ""
            if server.name in self.peak and peak:
                when = f", at +{self.peak[server.name].at - self.started:.0f} s"
            lines.append(f"  {server}: peak {peak}{when} ({verdict})")
            if peak:
                held = self.peak[server.name].held.get(server.name, Counter())
                lines.append("    held at the peak by: " + "; ".join(f"{t} {n}" for t, n in held.most_common(top)))
                heaviest = self.per_test.get(server.name, Counter()).most_common(top)
                lines.append("    heaviest tests (their own peak):")
                lines.extend(f"      {n:3d}  {t}" for t, n in heaviest)
        return lines


class Sampler:
    """Counts the connections the run's processes hold to each server, from a thread of its own."""

    def __init__(self, servers: list[Server], root_pid: int, run_id: str, tests_dir: Optional[str],
                 interval: float = 0.5) -> None:
        self.servers = servers
        self.root_pid = root_pid
        self.run_id = run_id
        self.tests_dir = tests_dir
        self.interval = interval
        self.footprint = Footprint(servers)
        self._marked: dict[tuple[int, float], bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="footprint-sampler", daemon=True)
        self.errors: Counter[str] = Counter()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> Footprint:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.footprint

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.footprint.add(self.sample())
            except Exception as exc:  # a failed look is reported at the end, never fatal to the run
                self.errors[f"{type(exc).__name__}: {exc}"] += 1
            self._tell_looks()
            self._stop.wait(self.interval)

    def _tell_looks(self) -> None:
        """Write the number of looks taken to ``<tests_dir>/looks``: a process that must be seen holding
        its connections (the sampler's own test) waits for this number to move, not for a time."""
        if self.tests_dir:
            path = os.path.join(self.tests_dir, LOOKS)
            try:
                with open(path + ".tmp", "w", encoding="utf-8") as fh:
                    fh.write(str(self.footprint.samples))
                os.replace(path + ".tmp", path)
            except OSError:
                pass

    def _has_marker(self, proc: psutil.Process) -> bool:
        """Whether ``proc`` carries this run's marker; cached per process (pid and start time)."""
        try:
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            return False
        if key not in self._marked:
            try:
                self._marked[key] = proc.environ().get(RUN_ENV) == self.run_id
            except psutil.Error:  # another user's process (the servers themselves), or gone
                self._marked[key] = False
        return self._marked[key]

    def _current_tests(self) -> dict[int, str]:
        """pid of each pytest process of the run -> the test it is running now."""
        tests: dict[int, str] = {}
        if not self.tests_dir:
            return tests
        for name in os.listdir(self.tests_dir):
            if not name.isdigit():
                continue
            try:
                with open(os.path.join(self.tests_dir, name), encoding="utf-8") as fh:
                    tests[int(name)] = fh.read().strip() or OUTSIDE
            except (OSError, ValueError):
                continue
        return tests

    def sample(self) -> Sample:
        parent: dict[int, int] = {}
        for proc in psutil.process_iter(["ppid"]):
            parent[proc.pid] = proc.info["ppid"] or 0
        tests = self._current_tests()

        def owner(pid: int) -> Optional[str]:
            """The test holding ``pid``'s connections, OUTSIDE, or None when not the run's process."""
            seen, cur, in_tree = 0, pid, False
            test: Optional[str] = None
            while cur and seen < 64:
                if test is None and cur in tests:
                    test = tests[cur]
                if cur == self.root_pid:
                    in_tree = True
                    break
                cur, seen = parent.get(cur, 0), seen + 1
            if not in_tree:
                try:
                    in_tree = self._has_marker(psutil.Process(pid))
                except psutil.Error:
                    in_tree = False
            if not in_tree:
                return None
            return test or OUTSIDE

        held: dict[str, Counter[str]] = {s.name: Counter() for s in self.servers}
        owners: dict[int, Optional[str]] = {}
        for conn in psutil.net_connections(kind="tcp"):
            if conn.pid is None or conn.status != psutil.CONN_ESTABLISHED or not conn.raddr:
                continue
            for server in self.servers:
                if conn.raddr.port == server.port and conn.raddr.ip in server.addresses:
                    if conn.pid not in owners:
                        owners[conn.pid] = owner(conn.pid)
                    test = owners[conn.pid]
                    if test is not None:
                        held[server.name][test] += 1
        return Sample(time.time(), held)


def run(command: list[str], limit: int, interval: float, servers: Optional[list[Server]] = None) -> int:
    """Run ``command`` under the sampler; its exit status, or 1 when a peak is over ``limit``."""
    servers = servers if servers is not None else servers_from_env()
    run_id = uuid.uuid4().hex
    tests_dir = tempfile.mkdtemp(prefix="controltable-footprint-")
    env = dict(os.environ, **{RUN_ENV: run_id, DIR_ENV: tests_dir})
    child = subprocess.Popen(command, env=env)
    sampler = Sampler(servers, child.pid, run_id, tests_dir, interval)
    sampler.start()

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the child's group too
    status = child.wait()
    footprint = sampler.stop()
    shutil.rmtree(tests_dir, ignore_errors=True)
    print("\n".join(["", "== footprint on the shared servers", *footprint.report(limit)]), flush=True)
    for error, n in sampler.errors.most_common():
        print(f"  sampler: {n} failed looks: {error}", flush=True)
    over = [s for s in servers if footprint.peak_of(s.name) > limit]
    if over:
        print(f"FAILED: the run held more than {limit} connections at once to "
              f"{', '.join(str(s) for s in over)}; give the heavy tests above a throwaway server "
              "(tests/faults/servers.py) or smaller pools", flush=True)
        return status or 1
    return status


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--limit", type=int, default=40, help="most connections to one shared server at once")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run (footprint.py [--limit N] -- COMMAND ...)")
    return run(command, args.limit, args.interval)


if __name__ == "__main__":
    sys.exit(main())
