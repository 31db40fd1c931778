"""The fault suite's marker: ``-m faults`` selects it, ``-m "not faults"`` leaves it out."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault injection against throwaway servers (restarts, cut COMMITs)")
