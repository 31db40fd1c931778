"""A throwaway PgBouncer in front of the shared test PostgreSQL, for the pooler tests and benchmarks.

Debian's ``pgbouncer`` (``/usr/sbin/pgbouncer``) is started on a free port with a generated
``pgbouncer.ini`` in a temp directory: the default settings of the package except what a test
pooler needs (where to listen, which server to forward to, trust authentication, the pool mode),
so the pooler the tests meet is the one a new user meets. It is stopped by its PID, never by name.
PgBouncer refuses to run as root; when the tests run as root it runs as the ``postgres`` user.

Use in a test module (or a conftest)::

    from support.pgbouncer import pgbouncer_url  # noqa: F401 - a fixture

    def test_x(pgbouncer_url):
        url = pgbouncer_url("transaction")      # or "session"

Outside pytest (benchmarks): ``with PgBouncer("transaction") as bouncer: bouncer.url``.

When ``CONTROLTABLE_TEST_REQUIRE`` names ``pgbouncer``, a missing binary fails the test instead of
skipping it (CI installs the package). Without a PostgreSQL URL (``CONTROLTABLE_TEST_POSTGRES_URL``)
the tests skip, as every PostgreSQL test does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from support.required import required_names

BINARY = "/usr/sbin/pgbouncer"
MODES = ("transaction", "session")


def binary() -> Optional[str]:
    """The pgbouncer executable, or ``None`` when it is not installed."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    return shutil.which("pgbouncer")


def required() -> bool:
    """Whether CI asked for pgbouncer (``CONTROLTABLE_TEST_REQUIRE`` contains ``pgbouncer``)."""
    return "pgbouncer" in required_names()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PgBouncer:
    """One pgbouncer process in ``mode`` in front of the PostgreSQL at ``upstream_url``.

    ``settings`` adds or overrides ``[pgbouncer]`` keys (strings), e.g. ``{"default_pool_size": "40"}``;
    the tests leave the package defaults alone unless a test is about a setting.
    """

    def __init__(self, mode: str, upstream_url: str, settings: Optional[dict[str, str]] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"pool mode must be one of {MODES}, got {mode!r}")
        exe = binary()
        if exe is None:
            raise FileNotFoundError(f"pgbouncer is not installed ({BINARY}); apt-get install pgbouncer")
        from sqlalchemy.engine import make_url

        self.mode = mode
        self.upstream = make_url(upstream_url)
        self.exe = exe
        self.settings = dict(settings or {})
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"ct-pgbouncer-{mode}-"))
        self.user = "postgres" if os.geteuid() == 0 else None
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        """The upstream URL with host and port replaced by this pooler's (driver, user, db kept)."""
        return str(self.upstream.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False))

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def _write_config(self) -> Path:
        up = self.upstream
        user = up.username or "postgres"
        dbname = up.database or "postgres"
        auth = self.dir / "userlist.txt"
        # trust: no password is checked, but the user must still be listed.
        auth.write_text(f'"{user}" ""\n', encoding="utf-8")
        password = f" password={up.password}" if up.password else ""
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(auth),
            "pool_mode": self.mode,
            "logfile": str(self.dir / "pgbouncer.log"),
            "pidfile": str(self.dir / "pgbouncer.pid"),
            "admin_users": user,
            # The one change from the package's defaults: idle server connections go back to the
            # shared test server after 10 s (600 s by default), so the two poolers of a run do not
            # sit on connections the other test sessions on the machine need.
            "server_idle_timeout": "10",
        }
        settings.update(self.settings)
        ini = self.dir / "pgbouncer.ini"
        lines = ["[databases]", f"{dbname} = host={up.host or '127.0.0.1'} port={up.port or 5432} "
                 f"dbname={dbname} user={user}{password}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        ini.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return ini

    def start(self, timeout: float = 30.0) -> None:
        ini = self._write_config()
        if self.user:
            for path in (self.dir, *self.dir.iterdir()):
                shutil.chown(path, self.user, self.user)
            os.chmod(self.dir, 0o700)
        self.proc = subprocess.Popen(
            [self.exe, str(ini)], user=self.user, cwd=self.dir,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace")
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}): {err[-2000:]} {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not listen on {self.port} within {timeout} s: {self.log()[-2000:]}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the process by its PID (SIGINT: pgbouncer's immediate shutdown) and remove its directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        keep = os.environ.get("CONTROLTABLE_PGBOUNCER_LOG_DIR")
        if keep and (self.dir / "pgbouncer.log").exists():  # for a post-mortem
            shutil.copy(self.dir / "pgbouncer.log", Path(keep) / f"pgbouncer-{self.mode}-{self.port}.log")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def upstream_url() -> Optional[str]:
    """The shared test PostgreSQL the poolers forward to (``CONTROLTABLE_TEST_POSTGRES_URL``)."""
    return os.environ.get("CONTROLTABLE_TEST_POSTGRES_URL") or None


def unavailable_reason() -> Optional[str]:
    """Why the pooler tests cannot run here (``None``: they can); fails instead when CI requires pgbouncer."""
    if binary() is None:
        message = f"pgbouncer is not installed ({BINARY}); apt-get install pgbouncer"
        if required():
            pytest.fail(f"{message} (CONTROLTABLE_TEST_REQUIRE names pgbouncer)", pytrace=False)
        return message
    if upstream_url() is None:
        if required():
            pytest.fail("pgbouncer is required but CONTROLTABLE_TEST_POSTGRES_URL is not set", pytrace=False)
        return "CONTROLTABLE_TEST_POSTGRES_URL not set"
    return None


@pytest.fixture(scope="session")
def pgbouncer_url() -> Iterator[Callable[[str], str]]:
    """``pgbouncer_url(mode)``: the URL of a PgBouncer in ``mode`` ("transaction" or "session").

    One pooler per mode for the whole run, started on first use, stopped by PID at the end.
    """
    started: dict[str, PgBouncer] = {}

    def get(mode: str) -> str:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        if mode not in started:
            url = upstream_url()
            assert url is not None
            bouncer = PgBouncer(mode, url)
            bouncer.start()
            started[mode] = bouncer
        return started[mode].url

    try:
        yield get
    finally:
        for bouncer in started.values():
            bouncer.stop()


@pytest.fixture(params=MODES)
def pool_mode(request: pytest.FixtureRequest) -> str:
    """Parametrises a test over both pool modes."""
    return str(request.param)
