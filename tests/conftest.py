"""Backends for the whole suite: SQLite always, PostgreSQL and MariaDB/MySQL when their URLs are set.

Environment:
  CONTROLTABLE_TEST_POSTGRES_URL   e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test
  CONTROLTABLE_TEST_MYSQL_URL      e.g. mysql+pymysql://root@127.0.0.1:3306/test
  CONTROLTABLE_TEST_REQUIRE        comma list (postgres,mysql): a missing or unreachable one fails
                                   the run instead of being skipped (CI sets this).

Tests take the ``backend_url`` fixture (parametrised over the live backends) or ``ct`` (an
installed ControlTable in a namespace of its own). A summary line says which backends ran.
"""

from __future__ import annotations

import ast
import gc
import os
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from support import backends_seen, throwaway
from support.required import required_names

BACKENDS = ("sqlite", "postgres", "mysql")
_ENV = {"postgres": "CONTROLTABLE_TEST_POSTGRES_URL", "mysql": "CONTROLTABLE_TEST_MYSQL_URL"}
_UNREACHABLE: dict[str, str] = {}


def required_backends() -> set[str]:
    return required_names()


def server_url(backend: str) -> str | None:
    return os.environ.get(_ENV[backend]) or None


def _check_reachable(backend: str, url: str) -> str | None:
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        engine.dispose()
        return None
    except Exception as exc:  # pragma: no cover - reported below
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def _serialise_ast_parse() -> None:
    """Make :func:`ast.parse` one call at a time, with the garbage collector paused (CPython < 3.13).

    CPython's AST constructor keeps its recursion counter in interpreter-wide state (python/cpython
    gh-106905): a second ``ast.parse`` that starts while one runs (another thread's traceback, whose
    carets Python 3.11 finds with ``ast.parse``, or a ``__del__`` the garbage collector runs in the
    middle of a parse) makes the first fail with "SystemError: AST constructor recursion depth
    mismatch". pytest parses to format a failing test's traceback, so the crash replaced a failure's
    report with an INTERNALERROR and hid which test failed (a loaded CI run's SQLAlchemy 1.4 lane).
    The imports below removed two such parses; this removes the race itself, for the test processes.
    """
    if sys.version_info >= (3, 13) or getattr(ast.parse, "_controltable_serialised", False):
        return
    lock = threading.RLock()
    parse = ast.parse

    def serialised(*args: Any, **kwargs: Any) -> Any:
        with lock:
            collecting = gc.isenabled()
            gc.disable()
            try:
                return parse(*args, **kwargs)
            finally:
                if collecting:
                    gc.enable()

    serialised._controltable_serialised = True  # type: ignore[attr-defined]
    ast.parse = serialised  # type: ignore[assignment]


_serialise_ast_parse()


def _import_lazy_plugins_now() -> None:
    """Import all of anyio and hypothesis here, in the main thread, before any test runs.

    anyio (4.16) imports its submodules lazily, on first use, in whichever thread uses them; under
    pytest that import also parses the module to rewrite its asserts (anyio is a pytest plugin). A
    Starlette test client's portal thread opening a file did that while another thread parsed, and
    CPython 3.11's AST constructor, whose recursion counter is shared by the interpreter's threads,
    failed the test with "SystemError: AST constructor recursion depth mismatch" (python/cpython
    gh-106905; a loaded CI run, tests/web/test_web_app.py). Nothing here parses in a thread later.
    hypothesis's plugin imports hypothesis at the session's end when no test did; that parse was
    re-entered by a garbage-collected aiomysql connection's ``__del__`` failing on its closed loop,
    with the same SystemError, after every test had passed.
    """
    try:
        import hypothesis  # noqa: F401 - imported for its side effect: parsed now, not at the end
    except ImportError:  # the Prefect environment has no hypothesis (nor its plugin)
        pass
    try:
        import anyio
    except ImportError:  # pragma: no cover - the web extra is not installed
        return
    for name in dir(anyio):
        getattr(anyio, name, None)


def pytest_configure(config: pytest.Config) -> None:
    _import_lazy_plugins_now()
    config.addinivalue_line("markers", "backends(*names): run only on these backends")
    config.addinivalue_line("markers", "slow: multi-process stress tests (they run on throwaway servers)")
    config.addinivalue_line(
        "markers", "throwaway_server: holds more connections than the shared servers can spare; its "
        "backend_url is a throwaway PostgreSQL/MariaDB of the session's (every slow test has it)"
    )
    config.addinivalue_line(
        "markers", "pooler: runs through a throwaway PgBouncer (support/pgbouncer.py); set on every test using "
        "the pgbouncer_url fixture, so the quick loop (scripts/run-tests --check) can leave them to the full suite"
    )
    config.pluginmanager.import_plugin("support.sqlcapture")  # inert unless CONTROLTABLE_CAPTURE_SQL is set
    for backend in ("postgres", "mysql"):
        url = server_url(backend)
        if url is None:
            if backend in required_backends():
                raise pytest.UsageError(
                    f"{backend} is required (CONTROLTABLE_TEST_REQUIRE) but {_ENV[backend]} is not set"
                )
            continue
        problem = _check_reachable(backend, url)
        if problem is not None:
            if backend in required_backends():
                raise pytest.UsageError(f"{backend} is required but unreachable at {url}: {problem}")
            _UNREACHABLE[backend] = problem


def live_backends() -> list[str]:
    return ["sqlite"] + [b for b in ("postgres", "mysql") if server_url(b) and b not in _UNREACHABLE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A multi-process stress test holds tens of connections: it runs on throwaway servers. A test
    through a throwaway PgBouncer is marked ``pooler`` (by its fixture, wherever the test lives)."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("throwaway_server"):
            item.add_marker(pytest.mark.throwaway_server)
        if "pgbouncer_url" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("pooler"):
            item.add_marker(pytest.mark.pooler)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("backends")
        allowed = set(marker.args) if marker else set(BACKENDS)
        params = [b for b in BACKENDS if b in allowed]
        metafunc.parametrize("backend", params, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    if name != "sqlite":
        if server_url(name) is None:
            pytest.skip(f"{_ENV[name]} not set")
        if name in _UNREACHABLE:
            pytest.skip(f"{name} unreachable: {_UNREACHABLE[name]}")
    backends_seen.TESTS[name] += 1
    return name


@pytest.fixture
def backend_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The database of ``backend`` for one test: a file for SQLite, else the shared server, or a
    throwaway one for a test marked ``throwaway_server`` (every ``slow`` one is)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'controltable.db'}"
    if request.node.get_closest_marker("throwaway_server"):
        return throwaway.url(backend)
    url = server_url(backend)
    assert url is not None
    return url


@pytest.fixture
def namespace() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ct(backend_url: str, namespace: str) -> Iterator[Any]:
    from controltable import ControlTable

    table = ControlTable(backend_url, namespace=namespace)
    table.install()
    yield table
    table.close()


def _note_test(text: str) -> None:
    """Tell the footprint sampler (``support/footprint.py``) which test this process runs now.

    The sampler attributes each connection to the test whose process tree holds it, which is how a
    peak on the shared servers names its tests. Inert unless the run is sampled.
    """
    folder = os.environ.get("CONTROLTABLE_FOOTPRINT_DIR")
    if folder:
        try:
            Path(folder, str(os.getpid())).write_text(text, encoding="utf-8")
        except OSError:  # the sampler has ended and removed its folder; nothing to tell
            pass


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _note_test(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _note_test("")
    throwaway.close()
    out = getattr(session.config, "workeroutput", None)
    if out is not None:  # a pytest-xdist worker (`make check`): its counts go to the summary the controller prints
        out["backends_seen"] = backends_seen.export()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: add a finished worker's backend counts to this run's summary."""
    backends_seen.merge(getattr(node, "workeroutput", {}).get("backends_seen", {}))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    ran = backends_seen.summary(BACKENDS)
    missing = [b for b in ("postgres", "mysql") if not backends_seen.used(b)]
    terminalreporter.write_sep("=", "controltable backends")
    terminalreporter.write_line(f"backends run live: {ran}")
    for b in missing:
        why = _UNREACHABLE.get(b) or (f"{_ENV[b]} not set" if not server_url(b) else "no test selected")
        terminalreporter.write_line(f"backend not run: {b} ({why})")
    terminalreporter.write_line("SQL Server and Oracle: compiled-SQL tests only (no server here)")



#: The signals whose process-wide handling a test can change and a later test's child process inherits.
_SHARED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_dispositions() -> Iterator[None]:
    """Each test starts with the signal handling a terminal gives, and what it changes is put back.

    Two things broke a CLI signal test once the main lane ran over pytest-xdist workers (test files in
    another order): a non-interactive shell starts a background command (``make test &`` in
    ``.ci/run``, the lanes of ``scripts/run-tests``) with SIGINT ignored, and Dagster's in-process
    sensor and run code maps SIGTERM to SIGINT's handler and leaves it so; a later test's child
    process then inherited SIGTERM ignored, and the SIGTERM it was sent was dropped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    before = {s: signal.getsignal(s) for s in _SHARED_SIGNALS}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) != handler and handler is not None:
            signal.signal(s, handler)
