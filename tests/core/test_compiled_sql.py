"""SQL Server and Oracle cannot run here: the statements the engine runs are compiled for them
through the same code path (``controltable sql``) and checked for the locking they need; and the
golden files name every statement by its builder, with the builder's own notes on why."""

from __future__ import annotations

import re
import time
import types
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from support.golden import changed_statements, golden_named

from controltable.errors import ConfigurationError
from controltable.events import EventStatements
from controltable.sqlnotes import notes_of, sql_notes
from controltable.sqlscript import GOLDEN_DIALECTS, Statement, control_ddl, named_statements, render
from controltable.worklist import WorkListStatements

GOLDEN = Path(__file__).resolve().parents[2] / "core" / "sql"


@cache
def _named(dialect: str) -> tuple[tuple[str, tuple[Statement, ...]], ...]:
    return tuple((title, tuple(stmts)) for title, stmts in named_statements(dialect))


def section(dialect: str, title_start: str) -> list[str]:
    for title, stmts in _named(dialect):
        if title.startswith(title_start):
            return [s.sql for s in stmts]
    raise AssertionError(f"no section {title_start!r}")


def test_mssql_locks_resource_rows_with_hints() -> None:
    acquire = section("mssql", "acquire")
    lock = [s for s in acquire if "FROM ct_resource" in s and "JOIN" not in s]
    assert lock and all("WITH (UPDLOCK, ROWLOCK)" in s for s in lock)
    assert not any("FOR UPDATE" in s for s in acquire), "SQL Server has no FOR UPDATE"


def test_mssql_claim_skips_locked_rows_with_readpast() -> None:
    claim = section("mssql", "events claim")
    select = [s for s in claim if s.startswith("SELECT TOP")]
    assert select, claim
    assert "WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK)" in select[0]
    assert "FOR UPDATE" not in select[0]


def test_mssql_worklist_allocation_locks_the_list() -> None:
    allocate = section("mssql", "worklist allocate")
    assert any("FROM ct_worklist WITH (UPDLOCK, ROWLOCK)" in s for s in allocate)


def test_oracle_claim_uses_skip_locked_without_fetch_first() -> None:
    claim = section("oracle", "events claim")
    select = [s for s in claim if "FOR UPDATE" in s]
    assert select and "FOR UPDATE SKIP LOCKED" in select[0]
    # ORA-02014: FOR UPDATE cannot be combined with FETCH FIRST / ROWNUM limits.
    assert "FETCH FIRST" not in select[0] and "ROWNUM" not in select[0]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_postgres_and_mysql_claim_with_skip_locked_and_limit(dialect: str) -> None:
    claim = section(dialect, "events claim")
    select = [s for s in claim if "SKIP LOCKED" in s]
    assert select and "LIMIT" in select[0]


@pytest.mark.parametrize("dialect", ["postgresql", "mssql", "mysql", "oracle", "sqlite"])
def test_every_dialect_renders_ddl_and_clock(dialect: str) -> None:
    text = render(dialect)
    assert "ct_request" in text and "ct_resource" in text
    assert "db_now" not in text.replace("db_now_1", ""), "the clock must compile to the dialect's own SQL"


def test_clock_per_dialect() -> None:
    assert "statement_timestamp()" in render("postgresql")
    assert "UTC_TIMESTAMP(6)" in render("mysql")
    assert "SYSUTCDATETIME()" in render("mssql")
    assert "SYSTIMESTAMP" in render("oracle")


def test_partial_claim_index_where_supported() -> None:
    pg = "\n".join(section("postgresql", "events prepare: claim"))
    assert re.search(r"CREATE INDEX ct_pending_events ON events \(event_id\) WHERE ct_state = 0", pg)
    assert re.search(r"CREATE INDEX ct_claimed_events ON events \(event_id\) WHERE ct_state = 1", pg)
    ms = "\n".join(s for s in section("mssql", "events prepare: claim") if s.startswith("CREATE INDEX"))
    # SQL Server: plain indexes by default (filtered ones break writers with old SET options).
    assert "CREATE INDEX ct_claim_events ON events (ct_state, event_id)" in ms and "WHERE" not in ms
    my = "\n".join(section("mysql", "events prepare: claim"))
    assert re.search(r"CREATE INDEX \S+ ON events \(ct_state, event_id\)", my)


def test_epoch_columns_are_double_precision() -> None:
    ddl = "\n".join(control_ddl("mysql"))
    assert "expires_at FLOAT(53)" in ddl or "expires_at DOUBLE" in ddl


# -- the golden files, by name -----------------------------------------------------------------------
#: As test_dialect_conformance's whole-file comparison: SQLAlchemy 1.4 compiles the same statements
#: with other details (casts, bind names, statement order of its session), so the files are SA 2's.
PRINTED_BY_SA2 = pytest.mark.skipif(sqlalchemy.__version__.startswith("1."),
                                    reason="the golden files are printed by SQLAlchemy 2")


@PRINTED_BY_SA2
@pytest.mark.parametrize("dialect", GOLDEN_DIALECTS)
def test_every_statement_the_engine_sends_is_named(dialect: str) -> None:
    """Every statement of the scripted session outside the DDL carries a name, and the file a
    reviewer reads prints it above the statement."""
    unnamed = [(title, s.sql[:80]) for title, stmts in _named(dialect) if "(DDL)" not in title
               for s in stmts if s.name is None]
    assert not unnamed, unnamed
    printed = golden_named((GOLDEN / f"{dialect}.sql").read_text(encoding="utf-8"))
    named = {s.name for _title, stmts in _named(dialect) for s in stmts}
    assert named <= {name for name, _sql in printed}, "a name the session gives is missing from the golden file"


def test_statements_are_named_by_their_builders_with_their_notes() -> None:
    """The SQL Server claim is printed under the builder's ``__name__`` with the one line its
    ``sql_notes`` give for SQL Server; a backend without a note for a builder prints none."""
    claims = [s for title, stmts in _named("mssql") if title.startswith("events claim:") for s in stmts
              if s.sql.startswith("SELECT TOP")]
    assert claims and all(s.name == EventStatements.claim_select.__name__ for s in claims), claims
    note = notes_of(EventStatements.claim_select.__code__)["mssql"]
    assert all(s.notes == {"mssql": note} for s in claims)
    text = (GOLDEN / "mssql.sql").read_text(encoding="utf-8")
    assert f"-- name: claim_select\n-- mssql: {note}\nSELECT TOP 5 " in text
    lock = [s for title, stmts in _named("mysql") if title.startswith("worklist allocate") for s in stmts
            if s.name == WorkListStatements.lock_list.__name__]
    assert lock and all(s.notes == {} for s in lock), "MySQL's FOR UPDATE needs no note"


def test_a_renamed_builder_renames_its_statements(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name comes from the builder's code, not a list: a builder renamed (here its code given
    another name) prints its statements under the new name."""
    fn = WorkListStatements.next_item
    renamed = types.FunctionType(fn.__code__.replace(co_name="take_next"), fn.__globals__, "take_next",
                                 fn.__defaults__, fn.__closure__)
    monkeypatch.setattr(WorkListStatements, "next_item", renamed)
    names = {s.name for title, stmts in named_statements("sqlite") if title.startswith("worklist allocate")
             for s in stmts}
    assert "take_next" in names and "next_item" not in names, names


@PRINTED_BY_SA2
@pytest.mark.parametrize("dialect", GOLDEN_DIALECTS)
def test_the_golden_file_holds_each_statement_under_its_name(dialect: str) -> None:
    """Compared statement by statement: a changed statement is reported by the builder's name."""
    golden = (GOLDEN / f"{dialect}.sql").read_text(encoding="utf-8")
    printed = render(dialect)
    assert not changed_statements(golden, printed), (
        f"statements printed for {dialect} changed: {changed_statements(golden, printed)}; if intended, "
        "regenerate with `python -m controltable.sqlscript core/sql` and review `git diff core/sql`")
    altered = printed.replace(" WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK)", " WITH (UPDLOCK, ROWLOCK)", 1)
    if altered != printed:  # SQL Server's claim lost its skip of locked rows
        assert changed_statements(golden, altered) == ["claim_select #1"]


def test_notes_name_a_backend_in_one_line() -> None:
    with pytest.raises(ConfigurationError, match="not a backend"):
        sql_notes(sqlserver="hints")
    with pytest.raises(ConfigurationError, match="one line"):
        sql_notes(mssql="two\nlines")


@PRINTED_BY_SA2
def test_the_script_does_not_depend_on_the_machines_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripted session runs real calls on the database clock: on a slow machine nothing may run out
    that runs out nowhere else (a loaded CI run printed other statements when its 1 s leases lapsed
    between two steps). Every ``try_acquire`` of the session is made 1.1 s late here, and every
    ``reap`` a default pickup window late (a grant waiting for its pickup must not lapse either)."""
    from controltable.control import ControlTable
    from controltable.defaults import DEFAULT_PICKUP

    try_acquire, reap = ControlTable.try_acquire, ControlTable.reap

    def late(self: ControlTable, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.1)
        return try_acquire(self, *args, **kwargs)

    def late_reap(self: ControlTable) -> int:
        time.sleep(DEFAULT_PICKUP + 0.5)
        return reap(self)

    monkeypatch.setattr(ControlTable, "try_acquire", late)
    monkeypatch.setattr(ControlTable, "reap", late_reap)
    golden = (GOLDEN / "sqlite.sql").read_text(encoding="utf-8")
    assert not changed_statements(golden, render("sqlite"))
