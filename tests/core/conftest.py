"""Fixtures shared by the event-table and work-list tests: tables, prepared event tables, worker processes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import MetaData, Table
from support import event_tables
from support.event_workers import Workers


@pytest.fixture
def tables(ct: Any) -> Iterator[Callable[..., Table]]:
    """``make(*columns, prefix="ev", **kw)``: a test table through SQLAlchemy Core, dropped after the test."""
    made: list[str] = []

    def make(*columns: Any, prefix: str = "ev", **kw: Any) -> Table:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        table = Table(name, MetaData(), *columns, **kw)
        table.create(ct.engine)
        made.append(name)
        return table

    yield make
    for name in reversed(made):
        event_tables.drop(ct, name)


@pytest.fixture
def event_table(ct: Any) -> Iterator[Callable[..., Any]]:
    """``make(n=0, prepare=True, **options)``: the standard event table with rows 1..n, as an
    ``EventTable`` keyed on ``id`` (prepared unless ``prepare=False``); dropped after the test."""
    made: list[str] = []

    def make(n: int = 0, *, prepare: bool = True, **options: Any) -> Any:
        table = event_tables.create(ct, n)
        made.append(table.name)
        ev = ct.events(table.name, key="id", **options)
        if prepare:
            ev.prepare()
        return ev

    yield make
    for name in reversed(made):
        event_tables.drop(ct, name)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Workers]:
    """Worker processes (``support/event_workers.py``) started by one test, killed at its end."""
    w = Workers(tmp_path)
    yield w
    w.close()
