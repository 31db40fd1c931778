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


# -- numbers: non-finite and out-of-range values are refused everywhere -------------------------------
BAD_SECONDS = [float("inf"), float("-inf"), float("nan"), 1e30, 10**40, -1.0]


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_non_finite_and_huge_durations_are_refused(ct: ControlTable, value: float) -> None:
    ct.set_capacity("w", 1)
    for kwargs in ({"lease": value}, {"waiter_ttl": value}, {"timeout": value}, {"poll_interval": value}):
        with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
            ct.acquire("w", holder="h", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease"):
        ct.try_acquire("w", holder="h", lease=value)
    lease = ct.acquire("w", holder="h", timeout=0)
    with pytest.raises(ConfigurationError, match="lease"):
        lease.renew(value)
    lease.release()
    assert ct.status(["w"])[0].holders == [] and ct.status(["w"])[0].waiters == []


@pytest.mark.parametrize("value", [2**31, 2**63, 10**30, 0, -5])
def test_whole_numbers_beyond_an_integer_column_are_refused(ct: ControlTable, value: int) -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        ct.set_capacity("w", value)
    ct.set_capacity("w", 1)
    with pytest.raises(ConfigurationError, match="slots"):
        ct.acquire("w", slots=value, timeout=0)
    with pytest.raises(ConfigurationError, match="order"):
        ct.worklist("wl").populate([1], order=value)
    with pytest.raises(ConfigurationError, match="size"):
        ct.events("ev", key="id").claim(value)


def test_work_list_order_and_priority_bounds(ct: ControlTable) -> None:
    from controltable import defaults

    wl = ct.worklist("bounds")
    assert wl.populate([1], order=defaults.MIN_ORDER, priority=defaults.MIN_PRIORITY) == 1
    assert wl.populate([2], order=defaults.MAX_ORDER, priority=defaults.MAX_PRIORITY) == 1
    for order in (0, -1, defaults.MAX_ORDER + 1, 1.5, "1", True):
        with pytest.raises(ConfigurationError, match="order"):
            wl.populate([3], order=order)  # type: ignore[arg-type]
    for priority in (defaults.MIN_PRIORITY - 1, defaults.MAX_PRIORITY + 1, float("nan")):
        with pytest.raises(ConfigurationError, match="priority"):
            wl.populate([3], priority=priority)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeout"):
        next(wl.items(timeout=float("nan")))
    with pytest.raises(ConfigurationError, match="poll"):
        next(wl.items(poll_interval=float("inf")))
    assert [o.order for o in wl.status().orders] == [defaults.MIN_ORDER, defaults.MAX_ORDER]


# -- names and text ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["\ud800", "ok\udfffok", "nul\x00", "line\nbreak"])
def test_unencodable_names_are_configuration_errors(ct: ControlTable, name: str) -> None:
    with pytest.raises(ConfigurationError):
        ct.set_capacity(name, 1)
    with pytest.raises(ConfigurationError):
        ct.acquire("w", holder=name, timeout=0)
    with pytest.raises(ConfigurationError):
        ct.worklist(name)
    with pytest.raises(ConfigurationError):
        ControlTable("sqlite:///x.db", namespace=name)


def test_unencodable_text_reaching_the_database_is_a_configuration_error(ct: ControlTable) -> None:
    wl = ct.worklist("texts")
    wl.populate([{"a": 1}])
    item = wl.allocate("w1")
    assert item is not None
    with pytest.raises(ConfigurationError):
        item.fail("bad \ud800 reason")
    item.complete()


@pytest.mark.parametrize("where", ["ct_state = 'x'; drop table x", 42, b"raw"])
def test_where_must_be_an_expression_or_callable(ct: ControlTable, where: object) -> None:
    with pytest.raises(ConfigurationError, match="where="):
        ct.events("ev", key="id", where=where)
    with pytest.raises(ConfigurationError, match="where="):
        ct.events("ev", key="id").claim(1, where=where)  # type: ignore[arg-type]


def test_where_callables_that_raise_or_return_junk(ct: ControlTable, backend_url: str) -> None:
    from sqlalchemy import Column, Integer, MetaData, Table, create_engine

    engine = create_engine(backend_url)
    md = MetaData()
    Table("ev_where", md, Column("id", Integer, primary_key=True))
    md.create_all(engine)
    try:
        events = ct.events("ev_where", key="id")
        events.prepare()

        def boom(t: object) -> object:
            raise RuntimeError("user bug")

        with pytest.raises(ConfigurationError, match="where= callable raised RuntimeError"):
            events.claim(1, where=boom)
        with pytest.raises(ConfigurationError, match="boolean expression"):
            events.claim(1, where=lambda t: "id > 3")
        assert events.claim(1, where=lambda t: t.c.id > 3) is None
    finally:
        md.drop_all(engine)
        engine.dispose()


# -- passwords and the command line ---------------------------------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if k != "CONTROLTABLE_URL"}
    full.update(env or {})
    out = subprocess.run([sys.executable, "-m", "controltable.cli", *args], env=full, capture_output=True,
                         text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("url", [
    "u:pw-Secret-77@h/db",
    "postgresql+psycopg://u:pw-Secret-77@127.0.0.1:1/db",
    "mysql+pymysql://u:pw-Secret-77@127.0.0.1:1/db",
    "postgresql+psycopg://u:pw-Secret-77@127.0.0.1:1/db?sslmode=bogus",
    "nosuchdialect://u:pw-Secret-77@h/db",
])
def test_the_cli_never_prints_a_password(url: str) -> None:
    for n, command in enumerate((["status"], ["init"], ["capacity", "list"])):
        if n % 2 == 0:
            code, output = _cli("--url", url, "--connect-timeout", "2", *command)
        else:
            code, output = _cli("--connect-timeout", "2", *command, env={"CONTROLTABLE_URL": url})
        assert code in (2, 4), output
        assert "pw-Secret-77" not in output and "error:" in output


def test_cli_nan_timeout_exits_2_at_once(tmp_path: Path) -> None:
    import time

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert _cli("--url", url, "init")[0] == 0
    start = time.monotonic()
    code, output = _cli("--url", url, "run", "--timeout", "nan", "--resource", "r", "--", "true")
    assert code == 2 and "timeout" in output
    code, output = _cli("--url", url, "--statement-timeout", "inf", "status")
    assert code == 2 and "statement-timeout" in output
    code, output = _cli("--url", url, "capacity", "set", "r", str(2**31))
    assert code == 2 and "capacity" in output
    assert time.monotonic() - start < 60  # each call returns at once (generous bound for a loaded machine)
