"""The event and work-list engines' shape: statements are pure, dependencies point one way.

The statement builders are checked without a database; the engines' sources are read to check
that SQL is built in one module per engine and that no engine reaches into the control table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite

import controltable
from controltable import ConfigurationError, EventTable, WorkList, dialects
from controltable.clock import clock
from controltable.events import ClaimColumns, EventStatements, claim_columns

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


@pytest.mark.parametrize("dialect", [postgresql.dialect(), mysql.dialect(), sqlite.dialect(), mssql.dialect(),
                                     oracle.dialect()], ids=lambda d: d.name)
def test_claim_statement_builds_without_a_database(dialect: Any) -> None:
    t = Table("ev", MetaData(), Column("id", Integer, primary_key=True), Column("seq", Integer),
              Column("payload", String(20)), *claim_columns("q_"))
    cols = ClaimColumns("q_")
    q = EventStatements(t, cols, "id", "seq", dialects.traits(dialect.name))
    stmt = q.claim_select(10, q.due_pending(clock()))
    text = str(stmt.compile(dialect=dialect))
    assert "q_state" in text and "q_available_at" in text and "ct_" not in text


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
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                # Declarations for the type checker are fine (events/admin.py names what EventTable
                # provides); an import there would hide a dependency the rule above forbids.
                hidden = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not hidden, f"{path.name} hides an import behind TYPE_CHECKING"
        for private in ("._notify(", "._wakeups", "._wait_for_wakeup(", ".ct.", "._ct.", "._slots."):
            assert private not in path.read_text(), f"{path.name} uses {private}"


def test_engines_take_the_runtime_and_refuse_the_control_table(tmp_path: Path) -> None:
    with controltable.ControlTable(f"sqlite:///{tmp_path / 'c.db'}") as ct:
        assert EventTable(ct.runtime, "ev", key="id").runtime is ct.events("ev", key="id").runtime is ct.runtime
        assert WorkList(ct.runtime, "w").runtime is ct.worklist("w").runtime is ct.runtime
        for engine in (lambda: EventTable(ct, "ev", key="id"), lambda: WorkList(ct, "w")):  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError, match=r"not ControlTable: build engines with ct\.events"):
                engine()
