"""The pooler suite: the contracts through a real PgBouncer (``-m pooler`` selects it).

The fixtures come from :mod:`support.pgbouncer`: ``pgbouncer_url(mode)`` starts one PgBouncer per
pool mode for the run, in front of the shared test PostgreSQL.
"""

from __future__ import annotations

import pytest
from support.pgbouncer import pgbouncer_url, pool_mode  # noqa: F401 - fixtures


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pooler: the contracts through a connection pooler (PgBouncer)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/pooler/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.pooler)
