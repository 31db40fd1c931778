"""What the tests against running deployments (Airflow, Dagster, the status page) share: waiting, the server."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from typing import Any, Callable, Optional

import pytest
from sqlalchemy import create_engine, text

from support import backends_seen, throwaway


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2,
               state: Optional[Callable[[], Any]] = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout`` s.

    The one way tests synchronise on what happened (a waiter shown queued, a server answering)
    instead of sleeping. ``timeout`` is a hang detector, never a speed goal: make it several times
    what the event normally takes. ``state``, if given, is called for the failure message.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            where = f": {state()}" if state is not None else ""
            raise AssertionError(f"hang: timed out after {timeout:g} s waiting for {what}{where}")
        time.sleep(interval)


async def await_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05,
                      state: Optional[Callable[[], Any]] = None) -> Any:
    """The asyncio twin of :func:`wait_until`, for tests whose checks run on an event loop.

    ``predicate`` (and ``state``) may be a coroutine function (a check through the asyncio API, or a
    sync one moved off the loop with ``asyncio.to_thread``): the loop keeps running the code under
    test between checks, which a blocking poll would stop. ``timeout`` is a hang detector, as there.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            where = ""
            if state is not None:
                shown = state()
                where = f": {await shown if inspect.isawaitable(shown) else shown}"
            raise AssertionError(f"hang: timed out after {timeout:g} s waiting for {what}{where}")
        await asyncio.sleep(interval)


def parent_of(pid: int) -> Optional[int]:
    """The parent process id of ``pid``, None once it has exited.

    How a test knows an orphan has been re-parented: its renewer checks ``getppid()`` before each
    renewal, so from then on no renewal starts (one sent before may still commit).
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


#: How long a temporary Prefect server (``prefect_test_harness``) may take to answer: a hang detector.
#: It starts in a few seconds on a quiet machine; a loaded CI run (two CPU hogs beside five lanes)
#: took over 120 s, and the harness counts only its own 0.1 s sleeps toward the limit, so it waits
#: longer than this. A test that starts it gets pytest-timeout's PREFECT_HARNESS_TEST_TIMEOUT.
PREFECT_SERVER_START_HANG = 600
PREFECT_HARNESS_TEST_TIMEOUT = PREFECT_SERVER_START_HANG + 600


def wait_for_file(path: Any, timeout: float, what: str, parse: Callable[[str], Any] = str,
                  interval: float = 0.05) -> Any:
    """Wait until another process has written ``path`` and return ``parse`` of its text.

    A file that exists may still be empty or half written (the writer opens it, then writes), so
    the wait ends only when the text is non-empty and ``parse`` accepts it (a ``ValueError``, such
    as a JSON decode error, means "not written yet"). ``timeout`` is a hang detector.
    """

    def written() -> Any:
        try:
            text_ = path.read_text()
        except FileNotFoundError:
            return None
        if not text_.strip():
            return None
        try:
            return (parse(text_),)
        except ValueError:
            return None

    return wait_until(written, timeout, what, interval=interval)[0]


def postgres_reachable(url: str) -> Optional[str]:
    """None if the server answers, else the reason."""
    try:
        engine = create_engine(url, connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def postgres_url(purpose: str) -> str:
    """The PostgreSQL server URL a deployment test keeps its metadata on.

    Skips when none is configured or it does not answer, and fails instead when CI requires
    PostgreSQL (``CONTROLTABLE_TEST_REQUIRE``), so a missing server never passes silently.
    """
    url = os.environ.get("CONTROLTABLE_TEST_POSTGRES_URL")
    problem = "CONTROLTABLE_TEST_POSTGRES_URL is not set" if not url else postgres_reachable(url)
    if problem:
        message = f"{purpose} need PostgreSQL: {problem}"
        if "postgres" in os.environ.get("CONTROLTABLE_TEST_REQUIRE", ""):
            pytest.fail(message)
        pytest.skip(message)
    assert url is not None
    backends_seen.DEPLOYMENTS["postgres"] += 1
    return url


def deployment_postgres_url(purpose: str) -> str:
    """A throwaway PostgreSQL for a running Airflow or Dagster and its control table.

    A deployment's daemons (scheduler, triggerer, dag-processor, api-server; a Dagster daemon and
    webserver) and its tasks hold 15 to 20 connections for the whole module, nearly half of what the
    suite may hold on the shared server (``support/footprint.py``): they get a PostgreSQL of their own
    (``support/throwaway.py``), the same server binaries on a free port. Its binaries missing fail the
    run when CI requires PostgreSQL, and skip ``purpose`` elsewhere.
    """
    url = throwaway.url("postgres", purpose)
    backends_seen.DEPLOYMENTS["postgres"] += 1
    return url
