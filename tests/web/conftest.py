"""Fixtures of the status-page tests (see ``web_helpers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest.importorskip("starlette", reason="the web extra is not installed: pip install 'controltable[web]'")

from web_helpers import launch_chromium  # noqa: E402


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with launch_chromium() as browser:
        yield browser
