"""SQL Server and Oracle cannot run here: the statements the engine runs are compiled for them
through the same code path (``controltable sql``) and checked for the locking they need."""

from __future__ import annotations

import re

import pytest

from controltable.sqlscript import captured_statements, control_ddl, render


def section(dialect: str, title_start: str) -> list[str]:
    for title, stmts in captured_statements(dialect):
        if title.startswith(title_start):
            return stmts
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
