"""Shared by the status-page tests: a real uvicorn server in a thread, and headless Chromium.

The browser is Debian's ``chromium`` package driven by Playwright (``executable_path``): nothing
downloads a browser. Without it the browser tests skip, unless ``CONTROLTABLE_TEST_REQUIRE``
names ``browser`` (CI does), which makes its absence a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

CHROMIUM = os.environ.get("CONTROLTABLE_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """uvicorn serving ``app`` on a free loopback port until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the status page server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def browser_required() -> bool:
    return "browser" in os.environ.get("CONTROLTABLE_TEST_REQUIRE", "")


@contextmanager
def launch_chromium() -> Iterator[Any]:
    """A Playwright browser on Debian's chromium; skips (or fails when required) without one.

    Scope it to a module, never to the session: while Playwright's sync API runs it marks an asyncio
    loop as running on the main thread, which would break later tests that call ``asyncio.run``.
    """
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    problem: Optional[str] = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "playwright is not installed (make .venv/.all-installed installs it)"
    if problem is None and not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        problem = f"{CHROMIUM} is missing: apt-get install -y chromium"
    if problem is not None:
        if browser_required():
            pytest.fail(f"the browser tests are required (CONTROLTABLE_TEST_REQUIRE) but {problem}")
        pytest.skip(problem)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path
