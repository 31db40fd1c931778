"""The event and work-list engines' shape: statements are pure, dependencies point one way, one vocabulary.

The statement builders and decisions are checked without a database; the renamed public names
are checked to work under their new names and, with a ``DeprecationWarning``, under the old ones.
"""

from __future__ import annotations

import ast
import json
import re
import socket
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite

import controltable
from controltable import ConfigurationError, EventTable, WorkList
from controltable.defaults import NAME_LENGTH
from controltable.events import PENDING, ClaimColumns, claim_columns
from controltable.events import statements as ev_sql
from controltable.events.decisions import backoff_schedule
from controltable.holders import process_holder_id
from controltable.worklist import status_from_counts

PACKAGE = Path(controltable.__file__).parent


# -- statements: pure builders over a claim-columns object -----------------------------------------
def test_claim_columns_name_every_claim_column_once() -> None:
    cols = ClaimColumns("cx_")
    assert cols.state == "cx_state" and cols.token == "cx_token"
    assert cols.names() == [c.name for c in claim_columns("cx_")]
    assert cols.values(state=1, done_at=None) == {"cx_state": 1, "cx_done_at": None}
    with pytest.raises(KeyError, match="not a claim column"):
        cols.values(stat=1)
    assert cols.is_claim_column("cx_owner") and not cols.is_claim_column("payload")


def _table(prefix: str = "ct_") -> Table:
    return Table("ev", MetaData(), Column("id", Integer, primary_key=True), Column("seq", Integer),
                 Column("payload", String(20)), *claim_columns(prefix))


@pytest.mark.parametrize("dialect", [postgresql.dialect(), mysql.dialect(), sqlite.dialect(), mssql.dialect(),
                                     oracle.dialect()], ids=lambda d: d.name)
def test_claim_statement_builds_without_a_database(dialect: Any) -> None:
    t, cols = _table("q_"), ClaimColumns("q_")
    stmt = ev_sql.claim_select(t, "id", "seq", dialect.name, 10, ev_sql.due_pending(t, cols, ev_sql.clock()))
    text = str(stmt.compile(dialect=dialect))
    assert "q_state" in text and "q_available_at" in text and "ct_" not in text


def test_fail_values_back_off_then_error_in_sql() -> None:
    t, cols = _table(), ClaimColumns()
    schedule = backoff_schedule(3, 10.0, 15.0)
    values = ev_sql.fail_values(t, cols, "boom", max_attempts=3, schedule=schedule, max_backoff=15.0)
    assert set(values) == {"ct_state", "ct_owner", "ct_token", "ct_expires_at", "ct_available_at", "ct_error"}
    compiled = str(values["ct_available_at"].compile(dialect=postgresql.dialect(),
                                                     compile_kwargs={"literal_binds": True}))
    assert "10.0" in compiled and "15.0" in compiled, compiled


def test_no_statement_spells_a_claim_column_by_hand() -> None:
    """Claim columns are named through ``ClaimColumns`` only: no ``f"{prefix}..."`` in the engine."""
    spelled = {p.name: p.read_text().count('f"{self.prefix}') for p in (PACKAGE / "events").glob("*.py")}
    assert {k: n for k, n in spelled.items() if n} == {"statements.py": 1}, "only ClaimColumns.name spells one"


@pytest.mark.parametrize("engine", ["events", "worklist", "slots"])
def test_workflows_build_no_sql_and_read_the_clock_in_one_place(engine: str) -> None:
    """Every statement of an engine is built in its ``statements`` module (``ddl`` for DDL); the
    workflow only runs them. The database clock is spelled once, in ``controltable.clock``."""
    builders = re.compile(r"(?<![\w.])(select|insert|update|delete|union_all|text)\(")
    for path in (PACKAGE / engine).glob("*.py"):
        source = path.read_text()
        assert "db_now(" not in source, f"{engine}/{path.name}: read the clock through controltable.clock"
        if path.name in ("statements.py", "ddl.py"):
            continue
        tree = ast.parse(source)
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").startswith("sqlalchemy") for alias in node.names}
        assert not imported & {"select", "insert", "update", "delete", "union_all", "text", "and_", "or_"}, (
            f"{engine}/{path.name} imports SQL builders: build statements in {engine}/statements.py")
        assert not builders.findall(source), f"{engine}/{path.name} builds SQL inline"


# -- dependencies point one way ------------------------------------------------------------------
@pytest.mark.parametrize("package", ["events", "worklist", "slots"])
def test_engines_do_not_import_the_control_table_or_its_private_members(package: str) -> None:
    where = PACKAGE / package
    for path in ([where] if where.suffix == ".py" else where.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("control", "controltable.control") and not (
                    node.level in (1, 2) and node.module == "control"), f"{path.name} imports control"
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name):
                assert node.test.id != "TYPE_CHECKING", f"{path.name} hides an import behind TYPE_CHECKING"
        for private in ("._notify(", "._wakeups", "._wait_for_wakeup(", ".ct.", "._ct.", "._slots."):
            assert private not in path.read_text(), f"{path.name} uses {private}"


def test_engines_take_the_runtime_or_the_control_table(tmp_path: Path) -> None:
    with controltable.ControlTable(f"sqlite:///{tmp_path / 'c.db'}") as ct:
        by_runtime = EventTable(ct.runtime, "ev", key="id")
        by_ct = EventTable(ct, "ev", key="id")
        assert by_runtime.runtime is by_ct.runtime is ct.runtime
        assert ct.events("ev", key="id").runtime is ct.runtime
        assert WorkList(ct, "w").runtime is ct.worklist("w").runtime is ct.runtime
        with pytest.raises(ConfigurationError, match="ControlTable or its Runtime"):
            EventTable(object(), "ev", key="id")
        with pytest.warns(DeprecationWarning, match="runtime"):
            assert by_ct.ct is ct.runtime
        assert by_ct.ct.engine is ct.engine  # old code reading events.ct.engine keeps working


# -- one vocabulary: new names, old ones as deprecated aliases ------------------------------------
def test_table_schema_and_its_deprecated_alias_schema(tmp_path: Path) -> None:
    with controltable.ControlTable(f"sqlite:///{tmp_path / 'c.db'}") as ct:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ev = ct.events("ev", key="id", table_schema="main")
        assert ev.table_schema == "main" and ev.qualified_name == "main.ev"
        with pytest.warns(DeprecationWarning, match="table_schema"):
            old = ct.events("ev", key="id", schema="main")
        assert old.table_schema == "main"
        with pytest.warns(DeprecationWarning, match="table_schema"):
            assert old.schema == "main"
        with pytest.warns(DeprecationWarning), pytest.raises(ConfigurationError, match="once"):
            EventTable(ct, "ev", key="id", schema="a", table_schema="b")
        with pytest.raises(ConfigurationError, match="table_schema"):
            ct.events("ev", key="id", table_schema="bad name")


def test_batch_handle_names_the_table_schema(ct: Any, event_table: Any) -> None:
    ev = event_table(3)
    batch = ev.claim(3, owner="w")
    handle = json.loads(json.dumps(batch.handle()))
    assert handle["table_schema"] is None and handle["schema"] is None
    assert ev.batch(handle).keys == batch.keys
    assert batch.release() == 3


def test_work_list_release_reset_and_poll_interval_with_their_old_names(ct: Any) -> None:
    wl = ct.worklist("vocab")
    try:
        wl.populate([1, 2])
        item = wl.allocate("w")
        assert item is not None
        item.release()
        assert wl.status().total("new") == 2
        again = wl.allocate("w")
        assert again is not None
        with pytest.warns(DeprecationWarning, match="release"):
            again.free()
        assert wl.status().total("new") == 2
        done = wl.allocate("w")
        assert done is not None
        done.complete()
        assert wl.reset() == 2 and wl.status().total("new") == 2
        done = wl.allocate("w")
        assert done is not None
        done.complete()
        with pytest.warns(DeprecationWarning, match=r"reset\(\)"):
            assert wl.reset_all() == 2
        with pytest.warns(DeprecationWarning, match="poll_interval"):
            got = [i.id for i in wl.items("w", poll=0.01, timeout=5) if i.complete() is None]
        assert len(got) == 2
        with pytest.raises(ConfigurationError, match="poll_interval"):
            next(wl.items(poll_interval=0))
    finally:
        wl.drop()


def test_default_owners_are_holder_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 400)
    first, second = process_holder_id(), process_holder_id()
    assert len(first) <= NAME_LENGTH and first != second, "long host names are hashed, never truncated into one"


def test_work_list_status_is_a_pure_decision() -> None:
    st = status_from_counts("w", [(100, "done", 2, 0), (200, "error", 1, 0), (200, "active", 1, 1),
                                  (300, "new", 4, 0)])
    assert st.current_order == 200 and st.blocked_by_errors, "only an errored item and an expired one"
    st = status_from_counts("w", [(200, "error", 1, 0), (200, "active", 1, 0)])
    assert not st.blocked_by_errors, "a live active item may still finish"
    assert status_from_counts("w", [(100, "done", 3, 0)]).finished
    assert PENDING == 0


def test_cli_release_command_and_its_deprecated_name_free(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from controltable.cli import cli

    url = f"sqlite:///{tmp_path / 'c.db'}"
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Any:
        return runner.invoke(cli, ["--url", url, "--namespace", "vocab", *args], input=input, catch_exceptions=False)

    assert run("init").exit_code == 0
    assert run("worklist", "populate", "w", input="[1, 2]").exit_code == 0
    with controltable.ControlTable(url, namespace="vocab") as ct:
        for command in ("release", "free"):
            item = ct.worklist("w").allocate("sh")
            assert item is not None
            got = run("worklist", command, "w", str(item.id), "--token", str(item.token))
            assert got.exit_code == 0, got.output
            assert ("deprecated" in got.output) is (command == "free")
            assert ct.worklist("w").status().total("new") == 2
    assert "free" not in run("worklist", "--help").output, "the old name is hidden from the help"
    assert run("events", "stats", "nope", "--key", "id", "--table-schema", "main").exit_code != 0


# -- the event engine's decisions, without a database ---------------------------------------------
def test_backoff_schedule_doubles_up_to_the_cap() -> None:
    assert backoff_schedule(5, 30.0, 3600.0) == [(1, 30.0), (2, 60.0), (3, 120.0), (4, 240.0)]
    assert backoff_schedule(50, 10.0, 25.0) == [(1, 10.0), (2, 20.0), (3, 25.0)], "stops at the cap"
    assert backoff_schedule(1, 10.0, 25.0) == [], "one attempt: straight to error"
    assert backoff_schedule(3, 0.0, 0.0) == [(1, 0.0)]


def test_poisoned_keys_are_expired_claims_at_max_attempts() -> None:
    from controltable.events.decisions import poisoned_keys

    rows = [{"id": 1, "s": 1, "a": 3}, {"id": 2, "s": 1, "a": 2}, {"id": 3, "s": 0, "a": 9}]
    assert poisoned_keys(rows, "id", "s", "a", 3) == [1], "pending rows are never poisoned"


def test_read_handle_works_out_the_lease_of_old_and_new_handles() -> None:
    from controltable.events.decisions import read_handle

    new = read_handle({"keys": [1], "token": "7", "owner": "w", "lease": 20, "claimed_at": 5, "expires_at": 9}, 60)
    assert (new.token, new.lease, new.claimed_at) == (7, 20.0, 5.0)
    assert read_handle({"keys": [1], "token": 7, "owner": "w", "claimed_at": 100, "expires_at": 130}, 60).lease == 30
    assert read_handle({"keys": [1], "token": 7, "owner": "w"}, 60).lease == 60
    for bad in ({"keys": [1]}, {"keys": [1], "token": "x", "owner": "w"}, [1, 2], None):
        with pytest.raises(ConfigurationError, match="not a batch handle"):
            read_handle(bad, 60)  # type: ignore[arg-type]


@pytest.mark.parametrize(("old", "new", "names"), [
    ("controltable.grants", "controltable.slots.grants", ("decide", "Queue", "Waiter", "queue_key", "order")),
    ("controltable.history", "controltable.slots", ("Rate", "GrantRecord", "ResourceStats", "parse_rate",
                                                     "parse_duration", "check_rate")),
    ("controltable.history", "controltable.clock", ("utc",)),
])
def test_the_earlier_module_paths_still_import_with_a_deprecation_warning(old: str, new: str,
                                                                         names: tuple[str, ...]) -> None:
    """The grant decision and the policy values moved into ``controltable.slots``; the old paths warn."""
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.")):
        module = importlib.import_module(old)
    moved = importlib.import_module(new)
    assert {name: getattr(module, name) for name in names} == {name: getattr(moved, name) for name in names}
