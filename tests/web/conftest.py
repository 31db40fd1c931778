"""Fixtures of the status-page tests (see ``tests/support/browser.py``)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed: pip install 'controltable[web]'")

from support.browser import launch_chromium  # noqa: E402


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with launch_chromium() as browser:
        yield browser
