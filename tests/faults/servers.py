"""Throwaway database servers for the fault tests: started in a temp directory on a free port, stopped by PID.

The shared servers of the machine are never touched: each server here has its own data
directory, socket and port, and is restarted (cleanly or brutally) only by the test that owns it.
PostgreSQL refuses to run as root, so when the tests run as root its binaries run as the
``postgres`` system user over a data directory handed to that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from support import backends_seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, up: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            reachable = s.connect_ex(("127.0.0.1", port)) == 0
        if reachable == up:
            return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not go {'up' if up else 'down'} within {timeout} s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def postgres_bin() -> Optional[Path]:
    """The newest PostgreSQL server binaries installed (``/usr/lib/postgresql/<v>/bin``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def mariadb_bin() -> Optional[tuple[str, str]]:
    server = shutil.which("mariadbd") or (os.path.exists("/usr/sbin/mariadbd") and "/usr/sbin/mariadbd") or None
    install = shutil.which("mariadb-install-db")
    return (str(server), install) if server and install else None


class ThrowawayServer:
    """A database server process this test run owns; ``restart(mode)`` is the fault."""

    kind = ""
    #: The two restart modes the fault runs use: (clean, brutal).
    restart_modes: tuple[str, str] = ("", "")

    def __init__(self) -> None:
        backends_seen.THROWAWAY["mysql" if self.kind == "mariadb" else self.kind] += 1
        self.dir = Path(tempfile.mkdtemp(prefix=f"ct-faults-{self.kind}-"))
        self.port = free_port()
        self.restarts: list[tuple[str, float]] = []

    @property
    def pid(self) -> Optional[int]:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def url(self, port: Optional[int] = None) -> str:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def start(self) -> None:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def stop(self, mode: str) -> None:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def restart(self, mode: str, down_for: float = 0.5) -> None:
        self.stop(mode)
        time.sleep(down_for)
        self.start()
        self.restarts.append((mode, time.time()))

    def close(self) -> None:
        """Stop the server by its PID (whatever state it is in) and remove its directory."""
        pid = self.pid
        if pid is not None and _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 30)
        shutil.rmtree(self.dir, ignore_errors=True)


class ThrowawayPostgres(ThrowawayServer):
    kind = "postgres"
    restart_modes = ("fast", "immediate")

    def __init__(self) -> None:
        super().__init__()
        bindir = postgres_bin()
        assert bindir is not None
        self.bin = bindir
        self.data = self.dir / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            shutil.chown(self.dir, self.user, self.user)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync",
                  "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n"
                # fsync off survives a crash of the server process (the OS keeps the pages), which is
                # all these restarts do. synchronous_commit stays on: with it off, an immediate stop
                # loses acknowledged commits, and a "done" event would come back as pending.
                "fsync = off\nfull_page_writes = off\nmax_connections = 100\n"
                "shared_buffers = 32MB\n"
            )

    def _run(self, *cmd: str, timeout: float = 120) -> None:
        subprocess.run(cmd, check=True, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=timeout, cwd=self.dir)

    @property
    def pid(self) -> Optional[int]:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def url(self, port: Optional[int] = None) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port or self.port}/postgres"

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "120",
                  "start")
        _wait_port(self.port, 60)

    def stop(self, mode: str) -> None:
        """``fast``: disconnect everybody, shut down cleanly; ``immediate``: no shutdown (crash recovery next)."""
        pid = self.pid
        assert pid is not None, "the server is not running"
        os.kill(pid, {"fast": signal.SIGINT, "immediate": signal.SIGQUIT, "smart": signal.SIGTERM}[mode])
        if not _wait_gone(pid, 60):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 30)
        # An immediate stop leaves backends to notice the postmaster is gone; wait until the port is free.
        _wait_port(self.port, 30, up=False)


class ThrowawayMariaDB(ThrowawayServer):
    kind = "mariadb"
    restart_modes = ("shutdown", "sigkill")

    def __init__(self) -> None:
        super().__init__()
        found = mariadb_bin()
        assert found is not None
        self.server_bin, install = found
        self.data = self.dir / "data"
        self.socket = self.dir / "mysqld.sock"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        subprocess.run(
            [install, "--no-defaults", f"--datadir={self.data}", "--auth-root-authentication-method=normal",
             "--skip-test-db", "--user=root" if os.geteuid() == 0 else f"--user={os.getlogin()}"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180,
        )

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def url(self, port: Optional[int] = None) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{port or self.port}/mysql"

    def start(self) -> None:
        args = [
            self.server_bin, "--no-defaults", f"--datadir={self.data}", f"--socket={self.socket}",
            f"--port={self.port}", "--bind-address=127.0.0.1", f"--pid-file={self.dir / 'mysqld.pid'}",
            "--skip-grant-tables", "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=48M",
            # 2: the log reaches the OS at every commit, so a SIGKILL of the server loses nothing.
            "--innodb-flush-log-at-trx-commit=2", "--max-connections=200", "--skip-log-bin",
            f"--log-error={self.dir / 'error.log'}",
        ]
        if os.geteuid() == 0:
            args.append("--user=root")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited: {(self.dir / 'error.log').read_text()[-2000:]}")
            try:
                import pymysql

                pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str) -> None:
        """``shutdown``: a clean shutdown (SIGTERM); ``sigkill``: the process dies mid-flight (crash recovery next)."""
        assert self.proc is not None and self.proc.poll() is None, "the server is not running"
        self.proc.send_signal(signal.SIGTERM if mode == "shutdown" else signal.SIGKILL)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        _wait_port(self.port, 30, up=False)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
