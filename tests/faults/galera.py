"""A throwaway three-node MariaDB Galera cluster on 127.0.0.1, from the installed galera-4 and mariadbd.

Each node has its own data directory (``mariadb-install-db``), socket and free ports (SQL, group
communication, IST, SST). The first node bootstraps the cluster (``--wsrep-new-cluster``), the
others join it by state transfer (``rsync``, which needs the rsync binary). Nodes are stopped by
their PID (``kill_node``: SIGKILL mid-flight; ``start_node`` again: it rejoins by state transfer).
The shared MariaDB server of the machine is never touched.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from support import backends_seen

from .servers import _wait_port, free_port, mariadb_bin

PROVIDER = "/usr/lib/galera/libgalera_smm.so"


def galera_missing() -> Optional[str]:
    """What is missing to run a Galera cluster here (None: nothing)."""
    if mariadb_bin() is None:
        return "mariadbd / mariadb-install-db are not installed"
    if not os.path.exists(PROVIDER):
        return f"the Galera provider {PROVIDER} is not installed (Debian package galera-4)"
    if shutil.which("rsync") is None or shutil.which("wsrep_sst_rsync") is None:
        return "rsync and wsrep_sst_rsync (state transfer of a joining node) are not installed"
    return None


class GaleraNode:
    def __init__(self, root: Path, index: int) -> None:
        backends_seen.THROWAWAY["mysql"] += 1
        self.index = index
        self.dir = root / f"node{index}"
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.port, self.gcomm, self.ist, self.sst = free_port(), free_port(), free_port(), free_port()
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def url(self, database: str = "test") -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"


class GaleraCluster:
    """Three nodes; ``start()`` bootstraps the first and joins the others."""

    def __init__(self, nodes: int = 3) -> None:
        found = mariadb_bin()
        assert found is not None
        self.server_bin, self.install = found
        self.root = Path(tempfile.mkdtemp(prefix="ct-faults-galera-"))
        # As root, the servers run as the mysql user: the rsync daemon a joining node starts for its
        # state transfer runs as "nobody" when started by root, and could not write the data directory.
        self.user = "mysql" if os.geteuid() == 0 else getpass.getuser()  # getlogin() needs a terminal
        self.root.chmod(0o755)
        self.nodes = [GaleraNode(self.root, i) for i in range(nodes)]
        for node in self.nodes:
            if os.geteuid() == 0:
                shutil.chown(node.dir, self.user, self.user)
            subprocess.run(
                [self.install, "--no-defaults", f"--datadir={node.data}", "--auth-root-authentication-method=normal",
                 "--skip-test-db", f"--user={self.user}"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180,
            )

    def _args(self, node: GaleraNode, bootstrap: bool) -> list[str]:
        members = ",".join(f"127.0.0.1:{n.gcomm}" for n in self.nodes)
        args = [
            self.server_bin, "--no-defaults", f"--datadir={node.data}", f"--socket={node.dir / 'mysqld.sock'}",
            f"--port={node.port}", "--bind-address=127.0.0.1", f"--pid-file={node.dir / 'mysqld.pid'}",
            "--skip-grant-tables", "--innodb-buffer-pool-size=48M", "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2", "--max-connections=200", f"--log-error={node.dir / 'error.log'}",
            # What Galera requires: row-based replication, InnoDB, interleaved auto-increment locks.
            "--binlog-format=ROW", "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2",
            "--wsrep-on=ON", f"--wsrep-provider={PROVIDER}", "--wsrep-cluster-name=controltable-test",
            f"--wsrep-cluster-address=gcomm://{members}", f"--wsrep-node-name=node{node.index}",
            f"--wsrep-node-address=127.0.0.1:{node.gcomm}",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst}", "--wsrep-sst-method=rsync",
            f"--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm};"
            f"ist.recv_addr=127.0.0.1:{node.ist};gcache.size=64M;pc.recovery=false",
            "--wsrep-slave-threads=2",
        ]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        if os.geteuid() == 0:
            args.append(f"--user={self.user}")
        return args

    def start_node(self, node: GaleraNode, *, bootstrap: bool = False, timeout: float = 120) -> None:
        """Start ``node`` and wait until it is a synced member of the primary component."""
        env = dict(os.environ, PATH=f"/usr/bin:/usr/sbin:/bin:/sbin:{os.environ.get('PATH', '')}")
        node.proc = subprocess.Popen(self._args(node, bootstrap), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, cwd=node.dir)
        import pymysql

        deadline = time.monotonic() + timeout
        while True:
            if node.proc.poll() is not None:
                raise RuntimeError(f"node{node.index} exited: {(node.dir / 'error.log').read_text()[-3000:]}")
            try:
                conn = pymysql.connect(host="127.0.0.1", port=node.port, user="root", connect_timeout=2)
                try:
                    with conn.cursor() as cur:
                        cur.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
                        row = cur.fetchone()
                finally:
                    conn.close()
                if row is not None and row[1] == "Synced":
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node{node.index} did not sync within {timeout} s: "
                                   f"{(node.dir / 'error.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def start(self) -> None:
        self.start_node(self.nodes[0], bootstrap=True)
        for node in self.nodes[1:]:
            self.start_node(node)
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.nodes[0].port, user="root", autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE IF NOT EXISTS test")
        finally:
            conn.close()

    def cluster_size(self, node: GaleraNode) -> int:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=node.port, user="root", connect_timeout=2)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW STATUS LIKE 'wsrep_cluster_size'")
                row = cur.fetchone()
        finally:
            conn.close()
        return int(row[1]) if row else 0

    def conflicts(self, nodes: Optional[list[GaleraNode]] = None) -> int:
        """Certification failures and brute-force aborts on ``nodes`` (default: all) since they started:
        the write conflicts between nodes a run met (each one a transaction rolled back and retried)."""
        import pymysql

        total = 0
        for node in self.nodes if nodes is None else nodes:
            conn = pymysql.connect(host="127.0.0.1", port=node.port, user="root", connect_timeout=5)
            try:
                with conn.cursor() as cur:
                    cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN "
                                "('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')")
                    total += sum(int(row[1]) for row in cur.fetchall())
            finally:
                conn.close()
        return total

    def kill_node(self, node: GaleraNode) -> None:
        """SIGKILL the node's server process (by PID), mid-flight."""
        assert node.proc is not None and node.proc.poll() is None, f"node{node.index} is not running"
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=60)
        _wait_port(node.port, 30, up=False)

    def close(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
