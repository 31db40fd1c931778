"""A throwaway PostgreSQL primary and streaming standby for the failover tests, and their slot worker.

The pair is built the way an operator builds one by hand: ``initdb`` for the primary,
``pg_basebackup -R`` for the standby (which writes ``primary_conninfo`` and ``standby.signal``),
each on its own free port and directory, stopped by PID. ``kill_primary`` is the fault: SIGKILL of
the postmaster and of every backend it had (a backend outliving its postmaster could still
commit), then ``promote`` (``pg_ctl promote``) turns the standby into the new primary.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Optional

from support import backends_seen

from .servers import ThrowawayPostgres, _pid_alive, _wait_gone, _wait_port, free_port


def _children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (the postmaster's backends and auxiliary processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its closing parenthesis.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class _Standby(ThrowawayPostgres):
    """A server whose data directory ``pg_basebackup`` fills (no ``initdb``): the primary's binaries and user."""

    def __init__(self, primary: ThrowawayPostgres) -> None:  # noqa: D107 - no initdb, unlike the parent
        backends_seen.THROWAWAY["postgres"] += 1
        self.dir = primary.dir / "standby"
        self.dir.mkdir()
        self.bin, self.user = primary.bin, primary.user
        if self.user:
            shutil.chown(self.dir, self.user, self.user)
        self.port = free_port()
        self.restarts = []
        self.data = self.dir / "data"


class ReplicatedPostgres:
    """A primary and one streaming standby; ``synchronous``: the primary waits for the standby's flush."""

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.primary = ThrowawayPostgres()
        with open(self.primary.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 5\nwal_keep_size = '256MB'\n")
            if synchronous:
                # remote_flush (synchronous_commit = on): a commit returns once the standby has the WAL.
                conf.write("synchronous_standby_names = '*'\nsynchronous_commit = on\n")
        self.standby: Optional[_Standby] = None
        try:
            self._start()
        except BaseException:  # a half-started pair: stop what runs, by PID
            self.close()
            raise
        self.killed_at: Optional[float] = None

    def _start(self) -> None:
        self.primary.start()
        self.standby = _Standby(self.primary)
        self.standby._run(str(self.primary.bin / "pg_basebackup"), "-D", str(self.standby.data), "-R",
                          "-X", "stream", "-c", "fast", "-h", "127.0.0.1", "-p", str(self.primary.port),
                          "-U", "postgres")
        with open(self.standby.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"port = {self.standby.port}\nunix_socket_directories = '{self.standby.dir}'\n"
                       "hot_standby = on\n"
                       # pg_basebackup copied the primary's settings: once promoted, this server has no
                       # standby of its own, and waiting for one would hang every commit.
                       "synchronous_standby_names = ''\n")
        self.standby.start()

    def url(self, database: str = "postgres") -> str:
        """The libpq multi-host URL an application uses: whichever server accepts writes."""
        return (f"postgresql+psycopg://postgres@/{database}?host=127.0.0.1:{self.primary.port}"
                f"&host=127.0.0.1:{self.standby.port}&target_session_attrs=read-write")

    def wait_streaming(self, timeout: float = 60) -> None:
        """Until the primary sees its standby streaming (and, if synchronous, as its sync standby)."""
        import psycopg

        deadline = time.monotonic() + timeout
        want = "sync" if self.synchronous else "async"
        while time.monotonic() < deadline:
            with psycopg.connect(host="127.0.0.1", port=self.primary.port, user="postgres", dbname="postgres",
                                 autocommit=True) as conn:
                rows = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
            if any(r[0] == "streaming" and r[1] == want for r in rows):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the standby did not start streaming ({want}) within {timeout} s")

    def kill_primary(self) -> float:
        """SIGKILL the primary's postmaster and every process it started; returns the instant (time.time())."""
        pid = self.primary.pid
        assert pid is not None and _pid_alive(pid), "the primary is not running"
        victims = [pid, *_children(pid)]
        self.killed_at = time.time()
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for victim in victims:
            _wait_gone(victim, 30)
        _wait_port(self.primary.port, 30, up=False)
        return self.killed_at

    def promote(self) -> float:
        """``pg_ctl promote -w`` on the standby; returns the instant it accepts writes."""
        self.standby._run(str(self.standby.bin / "pg_ctl"), "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        return time.time()

    def close(self) -> None:
        if self.standby is not None:
            self.standby.close()  # its directory is inside the primary's
        self.primary.close()
