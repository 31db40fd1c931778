"""Bad input gets a clear error that names the problem and the fix, and loses nothing."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

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
    lease = ct.acquire("w", holder="h", timeout=30)  # a free slot; 30 s: a hang detector (see below)
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


def _item_failed_with(ct: ControlTable, worklist: str, reason: str) -> str:
    """The ``last_error`` stored when the one item of a new work list fails with ``reason``."""
    wl = ct.worklist(worklist)
    wl.populate([{"n": 1}])
    item = wl.allocate("w1")
    assert item is not None
    item.fail(reason)
    [row] = wl.items_list(state="error")
    assert wl.items_list(state="active") == [] and wl.allocate("w2") is None  # failed, not left allocated
    return str(row["last_error"])


def _batch_failed_with(ct: ControlTable, backend_url: str, reason: str) -> str:
    """The error stored when a one-row batch of a new event table fails with ``reason`` (no retries)."""
    name = f"ev_reason_{uuid.uuid4().hex[:8]}"
    engine, md = _event_table(backend_url, name)
    try:
        events = ct.events(name, key="id", max_attempts=1)
        events.prepare()
        batch = events.claim(1)
        assert batch is not None
        assert batch.fail(reason) == 1
        [error] = events.error_rows()
        return str(error["error"])
    finally:
        md.drop_all(engine)
        engine.dispose()


def test_unencodable_text_in_a_fail_reason_is_escaped_not_refused(ct: ControlTable) -> None:
    """A failure reason is the one text a caller cannot be asked to fix in the moment of failing:
    it is stored escaped (one rule for items and batches, see test_fail_reasons_*)."""
    assert _item_failed_with(ct, "texts", "bad \ud800 reason") == "bad \\ud800 reason"


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
def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``controltable ARGS`` in this process (support/cli.py), without the caller's CONTROLTABLE_URL."""
    from support import cli

    got = cli.run(*args, env={"CONTROLTABLE_URL": None, **(env or {})})
    return got.returncode, got.stdout + got.stderr


def _cli_process(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str]:
    """``python -m controltable.cli ARGS`` as a real process: all it prints, the interpreter's and
    warnings' lines too (a password must not be in any of them)."""
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
            code, output = _cli_process("--url", url, "--connect-timeout", "2", *command)
        else:
            code, output = _cli_process("--connect-timeout", "2", *command, env={"CONTROLTABLE_URL": url})
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


# -- issue 21 item 4: errors that were not controltable errors, or named the wrong fix ------------------
def _event_table(backend_url: str, name: str) -> tuple[Any, Any]:
    """A small event table of the test's own (unique name: the servers are shared), with 3 rows."""
    from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert

    engine = create_engine(backend_url)
    md = MetaData()
    table = Table(name, md, Column("id", Integer, primary_key=True), Column("region", String(10)))
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "region": "eu"} for i in (1, 2, 3)])
    return engine, md


def test_status_of_one_name_given_as_a_string(ct: ControlTable) -> None:
    """``status("x6")`` means the resource x6 (not the resources "x" and "6"); other non-lists are refused."""
    ct.set_capacity("x6", 2)
    ct.set_capacity("x", 1)
    assert [s.name for s in ct.status("x6")] == ["x6"]
    assert sorted(s.name for s in ct.status(("x6", "x"))) == ["x", "x6"]
    assert [s.resource for s in ct.stats("x6")] == ["x6"]
    for bad in (6, b"x6", {"x6": 1}, 1.5):
        with pytest.raises(ConfigurationError, match=r"list of names .*e\.g\. \["):
            ct.status(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="resource name must be a string"):
        ct.status(["x6", 7])  # type: ignore[list-item]


@pytest.mark.parametrize("junk", ["junk", "1 +", "no_such_column = 3"])
def test_a_bad_where_filter_says_so_not_not_installed(ct: ControlTable, backend_url: str, junk: str) -> None:
    from sqlalchemy import text

    name = f"ev_junk_{uuid.uuid4().hex[:8]}"
    engine, md = _event_table(backend_url, name)
    try:
        events = ct.events(name, key="id")
        events.prepare()
        for call in (lambda: events.claim(1, where=text(junk)),
                     lambda: ct.events(name, key="id", where=text(junk)).claim(1)):
            with pytest.raises(ConfigurationError, match="where= filter .* refused by the database") as info:
                call()
            assert not isinstance(info.value, NotInstalledError)
            assert "controltable init" not in str(info.value) and "fix the filter" in str(info.value)
        batch = events.claim(5, where=text("region = 'eu'"))  # a good text filter still works
        assert batch is not None and len(batch.keys) == 3
        batch.complete()
    finally:
        md.drop_all(engine)
        engine.dispose()


def test_durations_below_their_lower_bound_are_refused(ct: ControlTable, backend_url: str) -> None:
    from controltable import defaults

    ct.set_capacity("w", 1)
    for kwargs, bound in (({"lease": 1e-9}, defaults.MIN_LEASE), ({"waiter_ttl": 0.01}, defaults.MIN_WAITER_TTL),
                          ({"pickup": 0.001}, defaults.MIN_PICKUP),
                          ({"poll_interval": 1e-9}, defaults.MIN_POLL_SECONDS)):
        arg = next(iter(kwargs))
        with pytest.raises(ConfigurationError, match=rf"{arg} must be at least {bound:g} seconds"):
            ct.acquire("w", holder="h", timeout=0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease must be at least"):
        ct.try_acquire("w", holder="h", lease=1e-9)
    with pytest.raises(ConfigurationError, match="lease must be at least"):
        ct.worklist("wl").allocate("w", lease=1e-9)
    with pytest.raises(ConfigurationError, match="lease must be at least"):
        ct.events("ev", key="id", lease=1e-9)
    # A free slot: timeout=0 would allow its statements only a second of grace, which a loaded CI run
    # used up before the first one (DatabaseUnavailableError). 30 s is a hang detector, not a wait.
    lease = ct.acquire("w", holder="h", lease=60, timeout=30)  # still held at the release, however loaded
    with pytest.raises(ConfigurationError, match="lease must be at least"):
        lease.renew(1e-9)
    lease.release()
    assert ct.status(["w"])[0].holders == []


def test_fail_reasons_over_64_kb_are_cut_by_one_rule_and_the_item_is_failed(ct: ControlTable, backend_url: str) -> None:
    """MariaDB's TEXT holds 64 KB: a longer reason used to fail fail() and leave the item allocated."""
    from controltable import defaults
    from controltable.validation import fail_reason

    huge = "reason: " + "ü名🙂" * 30_000  # 90,000 characters, over 64 KB in any encoding
    expected = fail_reason(huge)
    assert len(expected) <= defaults.FAIL_REASON_LENGTH and "[cut: " in expected
    assert _item_failed_with(ct, "long_reason", huge) == expected
    assert _batch_failed_with(ct, backend_url, huge) == expected  # the same rule: same text stored


def test_a_nul_in_a_fail_reason_is_escaped_on_every_backend(ct: ControlTable, backend_url: str) -> None:
    assert _item_failed_with(ct, "nul_reason", "bad\x00byte") == "bad\\x00byte"
    assert _batch_failed_with(ct, backend_url, "nul\x00in batch") == "nul\\x00in batch"


# -- issue 21 item 5: the control tables are never event tables --------------------------------------------
def test_the_control_tables_are_refused_as_event_tables(backend_url: str, namespace: str) -> None:
    from sqlalchemy import create_engine, inspect

    prefix = f"z{uuid.uuid4().hex[:6]}_"
    ct = ControlTable(backend_url, namespace=namespace, prefix=prefix)
    ct.install()
    other = ControlTable(backend_url, namespace=namespace)  # the default prefix, as a user would try
    other.install()
    engine = create_engine(backend_url)
    try:
        before = {c["name"] for c in inspect(engine).get_columns(f"{prefix}request")}
        for table in ct.tables.tables:
            for owner in (ct, other):
                with pytest.raises(ConfigurationError, match="one of controltable's own control tables") as info:
                    owner.events(table.name, key="id").prepare()
                assert "prepare" not in str(info.value).split("control tables")[1]
                with pytest.raises(ConfigurationError, match="not an event table"):
                    owner.events(table.name, key="id").claim(1)
        with pytest.raises(ConfigurationError, match="not an event table"):
            other.events("ct_request", key="id").prepare_statements()
        assert {c["name"] for c in inspect(engine).get_columns(f"{prefix}request")} == before  # nothing added
        # A user's table merely named like one is an event table as any other.
        name = f"orders_{uuid.uuid4().hex[:6]}_request"
        user_engine, md = _event_table(backend_url, name)
        try:
            events = ct.events(name, key="id")
            events.prepare()
            assert events.claim(1) is not None
        finally:
            md.drop_all(user_engine)
            user_engine.dispose()
    finally:
        ct.tables.metadata.drop_all(engine)
        engine.dispose()
        ct.close()
        other.close()
