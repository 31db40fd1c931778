"""Bad input gets a clear error that names the problem and the fix, and loses nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from controltable import (
    ConfigurationError,
    ControlTable,
    DatabaseUnavailableError,
    NotInstalledError,
    UnknownResourceError,
)


def test_unknown_resource(ct: ControlTable) -> None:
    with pytest.raises(UnknownResourceError, match=r"set_capacity\('nope', n\)"):
        ct.acquire("nope", timeout=0)


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "3", True])
def test_capacity_must_be_a_positive_whole_number(ct: ControlTable, capacity: object) -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        ct.set_capacity("w", capacity)  # type: ignore[arg-type]


def test_slots_above_capacity(ct: ControlTable) -> None:
    ct.set_capacity("w", 2)
    with pytest.raises(ConfigurationError, match="can never be granted.*capacity is 2"):
        ct.acquire("w", slots=3, mode="shared", timeout=0)
    assert ct.status(["w"])[0].waiters == []


@pytest.mark.parametrize("slots", [0, -2])
def test_slots_must_be_positive(ct: ControlTable, slots: int) -> None:
    ct.set_capacity("w", 2)
    with pytest.raises(ConfigurationError, match="slots"):
        ct.acquire("w", slots=slots, timeout=0)


@pytest.mark.parametrize("name", ["", "   ", "x" * 201, "tab\there"])
def test_bad_resource_names(ct: ControlTable, name: str) -> None:
    with pytest.raises(ConfigurationError, match="resource name"):
        ct.set_capacity(name, 1)


def test_bad_mode_and_lease(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    with pytest.raises(ConfigurationError, match="mode"):
        ct.acquire("w", mode="read", timeout=0)
    with pytest.raises(ConfigurationError, match="lease"):
        ct.acquire("w", lease=0, timeout=0)
    with pytest.raises(ConfigurationError, match="timeout"):
        ct.acquire("w", timeout=-1)


def test_bad_namespace_and_identifiers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigurationError, match="namespace"):
        ControlTable(url, namespace="")
    with pytest.raises(ConfigurationError, match="schema"):
        ControlTable(url, schema="public; drop table x")
    with pytest.raises(ConfigurationError, match="prefix"):
        ControlTable(url, prefix="ct-")


def test_url_that_is_not_a_url() -> None:
    with pytest.raises(ConfigurationError, match="not a database URL"):
        ControlTable("not a url")


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="in-memory"):
        ControlTable("sqlite://")


def test_missing_driver_names_the_extra() -> None:
    try:
        import pyodbc  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("pyodbc is installed here")
    with pytest.raises(ConfigurationError, match=r"pip install 'controltable\[mssql\]'"):
        ControlTable("mssql+pyodbc://u:p@dsn")


def test_url_that_does_not_connect() -> None:
    ct = ControlTable("mysql+pymysql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(DatabaseUnavailableError, match="cannot reach the database"):
        ct.install()
    with pytest.raises(DatabaseUnavailableError):
        ct.set_capacity("w", 1)


def test_database_without_control_tables(backend_url: str) -> None:
    ct = ControlTable(backend_url, namespace="bad_input", prefix="nothere_")
    with pytest.raises(NotInstalledError, match="controltable init"):
        ct.set_capacity("w", 1)
    with pytest.raises(NotInstalledError, match="controltable init"):
        ct.status()
    assert ct.installed_version() is None
