"""Fixtures for the Prefect integration tests (run under .venv-prefect, their own lane of scripts/run-tests).

Local to tests/prefect: the core suite never imports Prefect. The in-process tests share one
``prefect_test_harness`` (a temporary Prefect server and database for the session); each test
gets a ControlTableBlock on the ``ct`` fixture's database and namespace.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

pytest.importorskip("prefect")
pytest.importorskip("prefect_controltable")

from prefect_controltable import ControlTableBlock  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test that starts the shared Prefect server counts its start-up in its own time: every test
    that may be the first gets the start-up's hang detector added to its own pytest-timeout."""
    from support.live import PREFECT_HARNESS_TEST_TIMEOUT

    for item in items:
        if "prefect_server" in getattr(item, "fixturenames", ()):
            own = item.get_closest_marker("timeout")  # the test's own hang detectors come on top of the start-up
            extra = float(own.args[0]) if own is not None and own.args else 0.0
            item.add_marker(pytest.mark.timeout(PREFECT_HARNESS_TEST_TIMEOUT + extra))


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    """One temporary Prefect server (its own SQLite database) for the in-process tests."""
    from prefect.testing.utilities import prefect_test_harness
    from support.live import PREFECT_SERVER_START_HANG

    with prefect_test_harness(server_startup_timeout=PREFECT_SERVER_START_HANG):
        yield


@pytest.fixture
def block(prefect_server: None, ct: Any, backend_url: str, namespace: str) -> ControlTableBlock:
    """A block on the installed control table of this test's backend and namespace."""
    return ControlTableBlock(url=backend_url, namespace=namespace, default_lease=30.0)
