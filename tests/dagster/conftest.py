"""Fixtures for the Dagster integration tests.

Everything here is local to tests/dagster: ``pytest tests/core`` never loads this file, so the
core suite never imports Dagster. Each test gets its own DAGSTER_HOME (through monkeypatch, so
nothing leaks into other test directories) and a ControlTableResource on the ``ct`` fixture's
database and namespace (SQLite, and PostgreSQL/MariaDB when the conftest at the root has them).
"""

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("dagster")
pytest.importorskip("dagster_controltable")

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, insert  # noqa: E402

from dagster_controltable import ControlTableResource  # noqa: E402


@pytest.fixture(autouse=True)
def dagster_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty DAGSTER_HOME (with a dagster.yaml so Dagster does not warn)."""
    home = tmp_path_factory.mktemp("dagster_home")
    (home / "dagster.yaml").write_text("")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def resource(ct: Any, backend_url: str, namespace: str) -> ControlTableResource:
    """A resource on the installed control table of this test's backend and namespace."""
    return ControlTableResource(url=backend_url, namespace=namespace, default_lease=30.0)


@pytest.fixture
def make_events(ct: Any, namespace: str) -> Iterator[Callable[..., str]]:
    """Create a prepared event table with ``n`` rows (ids 1..n); dropped after the test.

    The table name includes the namespace: on PostgreSQL and MariaDB all tests share one database.
    """
    created: list[Table] = []

    def make(n: int, *, prepare: bool = True) -> str:
        name = f"ev_{namespace}_{len(created)}"
        table = Table(
            name,
            MetaData(),
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("kind", String(20), nullable=False),
            Column("amount", Integer, nullable=False),
        )
        table.create(ct.engine)
        created.append(table)
        _add_events(ct, name, range(1, n + 1))
        if prepare:
            ct.events(name, key="id").prepare()
        return name

    yield make
    for table in created:
        table.drop(ct.engine, checkfirst=True)


@pytest.fixture
def timed_events(ct: Any, namespace: str) -> Iterator[Callable[..., str]]:
    """A prepared event table with a ``created_at`` column; rows ``(id, age in seconds)``; dropped after."""
    created: list[Table] = []

    def make(rows: list[tuple[int, float]]) -> str:
        name = f"tev_{namespace}_{len(created)}"
        table = Table(name, MetaData(), Column("id", Integer, primary_key=True, autoincrement=False),
                      Column("created_at", DateTime, nullable=True))
        table.create(ct.engine)
        created.append(table)
        now = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)  # naive UTC, as stored
        with ct.engine.begin() as conn:
            conn.execute(insert(table), [{"id": i, "created_at": now - timedelta(seconds=age)} for i, age in rows])
        ct.events(name, key="id").prepare()
        return name

    yield make
    for table in created:
        table.drop(ct.engine, checkfirst=True)


@pytest.fixture
def add_events(ct: Any) -> Callable[[str, Any], None]:
    """Append events with the given ids to an event table made by ``make_events``."""
    return lambda name, ids: _add_events(ct, name, ids)


def _add_events(ct: Any, name: str, ids: Any) -> None:
    table = Table(name, MetaData(), autoload_with=ct.engine)
    rows = [{"id": i, "kind": "order" if i % 2 else "refund", "amount": i} for i in ids]
    if rows:
        with ct.engine.begin() as conn:
            conn.execute(insert(table), rows)
