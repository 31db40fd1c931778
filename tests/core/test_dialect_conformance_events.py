"""The event engine's statements for SQL Server and Oracle, compiled (issue 33, item 6).

Neither server runs here: each rule an expert found by reading the statements is checked on the
compiled SQL, through the builders the engine uses (``controltable.events.statements``) and the
scripted session the golden files print (``controltable.sqlscript``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
from sqlalchemy import CHAR, VARCHAR, Column, Index, Integer, MetaData, Table
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite
from sqlalchemy.schema import CreateIndex
from support.golden import captured_statements

from controltable import dialects
from controltable.defaults import MSSQL_ROWS_PER_STATEMENT
from controltable.events import ClaimColumns, EventStatements, claim_columns
from controltable.events.ddl import claim_indexes

COLS = ClaimColumns()


@cache
def _sections(dialect: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((t, tuple(s)) for t, s in captured_statements(dialect))


def _statements(dialect: str, *title_starts: str) -> list[str]:
    return [s for title, stmts in _sections(dialect) if title.startswith(title_starts)
            for s in stmts if not s.startswith("--")]


def _table(key_type: Any) -> Table:
    return Table("ev", MetaData(), Column("k", key_type, primary_key=True), Column("payload", Integer),
                 *claim_columns())


def _keyed(t: Table) -> list[Any]:
    """Every statement that compares the key with values the client sends."""
    q = _statements_of(t)
    return [q.update_keys(["a", "b"], COLS.values(state=2)), q.keys_where(["a"], [], lock=True),
            q.keys_where(["a"], []), q.rows_by_keys(["a"]), q.expires_of("a"),
            q.page_keys([], "a", MSSQL_ROWS_PER_STATEMENT)]


def _statements_of(t: Table) -> EventStatements:
    """The statements of event table ``t`` (key ``k``) as SQL Server's engine binds them."""
    return EventStatements(t, COLS, "k", "k", dialects.traits("mssql"))


def _sql(stmt: Any, dialect: Any) -> str:
    return str(stmt.compile(dialect=dialect, compile_kwargs={"render_postcompile": True}))


def _ddl(stmt: Any, dialect: Any) -> str:
    return str(stmt.compile(dialect=dialect))


# -- H2: key parameters never convert a VARCHAR/CHAR key column ------------------------------------
@pytest.mark.parametrize(("key_type", "target"), [(VARCHAR(40), "VARCHAR(40)"), (CHAR(12), "CHAR(12)"),
                                                   (mssql.VARCHAR(40, collation="Latin1_General_CI_AS"),
                                                    "VARCHAR(40)")])
def test_mssql_key_parameters_are_cast_to_a_single_byte_key_column(key_type: Any, target: str) -> None:
    """A driver that sends a ``str`` as NVARCHAR (pymssql; pyodbc without setinputsizes) made SQL
    Server convert the VARCHAR/CHAR key column: with FORCESEEK that is error 8622. Each key
    parameter is cast to the column's type in the text, whatever type the driver sends."""
    for stmt in _keyed(_table(key_type)):
        text = _sql(stmt, mssql.dialect())
        comparisons = re.findall(r"ev\.k (?:IN \(([^)]*\)*)\)|= (\S+\)?)|> (\S+\)?))", text)
        assert comparisons, text
        params = re.findall(r"(CAST\(:\w+ AS [A-Z]+\(\d+\)\)|:\w+)", text.split("WHERE", 1)[1])
        key_params = [p for p in params if "k_" in p or "param" in p]
        assert key_params and all(p.startswith("CAST(") and p.endswith(f" AS {target})") for p in key_params), text
        assert "FORCESEEK" in text, text  # still a seek: the column is compared as it is


def test_mssql_unicode_keys_and_other_backends_keep_plain_parameters() -> None:
    for stmt in _keyed(_table(mssql.NVARCHAR(40))):
        assert "CAST(" not in _sql(stmt, mssql.dialect())
    for stmt in _keyed(_table(Integer())):
        assert "CAST(" not in _sql(stmt, mssql.dialect())
    for dialect in (postgresql.dialect(), mysql.dialect(), sqlite.dialect(), oracle.dialect()):
        for stmt in _keyed(_table(VARCHAR(40))):
            assert "CAST(" not in _sql(stmt, dialect), dialect.name


# -- M1: a backfill never resets a row another prepare() already set -----------------------------
def test_backfill_repeats_the_unset_test_on_its_target() -> None:
    """Under RCSI the subquery reads row versions from the statement's start; the target's own
    ``ct_state IS NULL`` is evaluated on the locked current row, so a live claim is left alone."""
    (backfill,) = [s for s in _statements("mssql", "events prepare: claim") if s.startswith("UPDATE events SET")]
    where = backfill.split(" WHERE ", 1)[1]
    subquery_end = where.index(")") + 1
    assert "ct_state IS NULL" in where[:subquery_end]
    assert re.search(r"\) AND events\.ct_state IS NULL", where), backfill


# -- M2: FORCESEEK only where a seek predicate exists ----------------------------------------------
def test_mssql_admin_pages_demand_a_seek_only_after_the_first_page() -> None:
    """reset()'s first page has no predicate at all, and retry_errors()'s ``ct_state = 3`` is in no
    filtered index: FORCESEEK there is error 8622, so reset() and retry_errors() never worked."""
    t = _table(Integer())
    q = _statements_of(t)
    error = q.is_state(3)
    first_reset = _sql(q.page_keys([], None, MSSQL_ROWS_PER_STATEMENT), mssql.dialect())
    first_retry = _sql(q.page_keys([error], None, MSSQL_ROWS_PER_STATEMENT), mssql.dialect())
    later = _sql(q.page_keys([error], 1000, MSSQL_ROWS_PER_STATEMENT), mssql.dialect())
    for first in (first_reset, first_retry):
        assert "FORCESEEK" not in first and "WITH (UPDLOCK, ROWLOCK)" in first, first
    assert "WITH (UPDLOCK, ROWLOCK, FORCESEEK)" in later and "ev.k > " in later, later
    retry = [s for s in _statements("mssql", "events retry_errors") if s.startswith("SELECT TOP")]
    assert retry and not any("FORCESEEK" in s for s in retry), retry


# -- M4: the claim's update by keys is fenced and counted ------------------------------------------
@pytest.mark.parametrize("dialect", ["oracle", "mssql", "mysql"])
def test_claim_updates_by_key_repeat_the_selects_condition(dialect: str) -> None:
    """Oracle locks a skip-locked row only when the cursor fetches it; the UPDATE by keys repeats
    what the select chose (``ct_state = 0`` and the back-off), so a row that is no longer pending
    is never claimed, and the rows claimed are counted (or read back by token)."""
    claim = _statements(dialect, "events claim")
    updates = [s for s in claim if s.startswith("UPDATE events SET ct_state=") and "ct_token=" in s]
    assert updates, claim
    for s in updates:
        assert re.search(r"events\.event_id IN \(.*\) AND events\.ct_state = 0 AND \(events\.ct_available_at IS NULL",
                         s, re.S), s


# -- N4: an index an earlier prepare() built without INCLUDE is rebuilt ----------------------------
def test_mssql_claim_index_without_the_include_list_is_rebuilt() -> None:
    t = _table(Integer())
    wanted = claim_indexes(t, COLS, "ev", "k", "k", "mssql")
    claim = next(ix for ix in wanted if ix.name == "ct_claim_ev")
    old = [{"name": "ct_claim_ev", "column_names": ["ct_state", "k"], "dialect_options": {"mssql_include": []}},
           {"name": "ct_token_ev", "column_names": ["ct_token"], "dialect_options": {"mssql_include": []}}]
    assert dialects.stale_includes(old, wanted) == [claim]
    current = [dict(old[0], dialect_options={"mssql_include": ["ct_expires_at", "ct_available_at"]}), old[1]]
    assert dialects.stale_includes(current, wanted) == []
    assert dialects.stale_includes([{"name": "ct_claim_ev", "column_names": ["ct_state", "k"]}], wanted) == [], \
        "a reflection that does not report INCLUDE (SQLAlchemy 1.4) must not rebuild on every prepare()"
    assert dialects.stale_includes([], wanted) == []  # missing indexes are created, not rebuilt
    offline = _ddl(dialects.RebuildIndex(claim), mssql.dialect())
    online = _ddl(dialects.RebuildIndex(claim, online=True), mssql.dialect())
    assert offline == ("CREATE INDEX ct_claim_ev ON ev (ct_state, k) INCLUDE (ct_available_at, ct_expires_at) "
                       "WITH (DROP_EXISTING = ON)"), offline
    assert online.endswith("WITH (DROP_EXISTING = ON, ONLINE = ON)"), online


def test_filtered_claim_indexes_compare_their_own_include_lists() -> None:
    t = _table(Integer())
    wanted = claim_indexes(t, COLS, "ev", "k", "k", "mssql", filtered_indexes=True)
    have = [{"name": ix.name, "dialect_options": {"mssql_include": list(ix.dialect_options["mssql"]["include"] or [])}}
            for ix in wanted]
    assert dialects.stale_includes(have, wanted) == []
    assert isinstance(wanted[0], Index)


# -- L7: rows inserted with explicit NULL claim columns are claimed (SQL Server) -------------------
def test_mssql_claims_set_rows_inserted_with_null_claim_columns(tmp_path: Any) -> None:
    """SQL Server's claim columns are nullable (a metadata-only prepare()), so a producer that
    inserts explicit NULLs made rows that stats() counted pending and no claim ever took. The SQL
    Server form of the engine, run for real on SQLite: claims set such rows pending and take them."""
    from sqlalchemy import String, insert, select

    from controltable import ControlTable

    ct = ControlTable(f"sqlite:///{tmp_path / 'n.db'}", namespace="n")
    ct.install()
    ct.db.target_dialect = "mssql"
    md = MetaData()
    t = Table("ev", md, Column("id", Integer, primary_key=True), Column("p", String(10)))
    md.create_all(ct.db.engine)
    ev = ct.events("ev", key="id")
    ev.prepare()
    pt = Table("ev", MetaData(), autoload_with=ct.db.engine)
    with ct.db.engine.begin() as conn:
        conn.execute(insert(pt).values(id=1, p="x", ct_state=None, ct_attempts=None))
        conn.execute(insert(t).values(id=2, p="y"))  # the defaults
        conn.execute(insert(pt).values(id=3, p="z", ct_state=0, ct_attempts=None))
    assert ev.stats().pending == 3
    batch = ev.claim(10, owner="w")
    assert batch is not None and batch.keys == [1, 2, 3]
    assert batch.attempts == {1: 1, 2: 1, 3: 1}
    assert batch.complete() == 3
    with ct.db.engine.connect() as conn:
        assert conn.execute(select(pt.c.ct_state).order_by(pt.c.id)).scalars().all() == [2, 2, 2]
    ct.close()


_SETS_UNSET = re.compile(r"UPDATE events SET ct_state=\S+, ct_attempts=\S+ WHERE")


def test_mssql_claims_set_unset_rows_skipping_locked_ones_and_seek_them_when_filtered() -> None:
    claim = _statements("mssql", "events claim")
    backfill = [s for s in claim if _SETS_UNSET.match(s)]
    assert backfill, claim
    assert "WITH (UPDLOCK, ROWLOCK, READPAST)" in backfill[0] and "ct_state IS NULL" in backfill[0], backfill
    filtered = claim_indexes(_table(Integer()), COLS, "ev", "k", "k", "mssql", filtered_indexes=True)
    unset = [ix for ix in filtered if ix.name == "ct_unset_ev"]
    assert unset and "WHERE ct_state IS NULL" in _ddl(CreateIndex(unset[0]), mssql.dialect())
    for dialect in ("postgresql", "mysql", "oracle", "sqlite"):  # NOT NULL claim columns: nothing to set
        assert not any(_SETS_UNSET.match(s) for s in _statements(dialect, "events claim")), dialect
