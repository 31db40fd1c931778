"""What ``controltable sql`` prints: the DDL and every statement the engine runs, for any dialect.

The statements are not written out by hand a second time. A short scripted session (install,
contended slots, an event batch, a work list) runs the real code against a throw-away SQLite
database, every statement object it executes is captured, and each is compiled for the target
dialect. So the SQL a DBA reviews for SQL Server or Oracle is exactly what the engine would send
there: the same statement objects through that dialect's compiler.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import Column, Integer, MetaData, String, Table, event
from sqlalchemy.dialects import mssql, mysql, oracle, postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DDLElement
from sqlalchemy.sql import ClauseElement

from .dialects import SUPPORTED_DIALECTS
from .errors import ConfigurationError

_DIALECTS: dict[str, Any] = {
    "postgresql": postgresql.dialect,
    "mssql": mssql.dialect,
    "mysql": mysql.dialect,
    "oracle": oracle.dialect,
    "sqlite": sqlite.dialect,
}


def dialect_for(name: str) -> Dialect:
    if name not in _DIALECTS:
        raise ConfigurationError(f"unknown dialect {name!r}; choose one of {', '.join(SUPPORTED_DIALECTS)}")
    return _DIALECTS[name]()  # type: ignore[no-any-return]


def compile_sql(stmt: Any, dialect: Dialect) -> str:
    if isinstance(stmt, (DDLElement, CreateTable, CreateIndex)):
        return str(stmt.compile(dialect=dialect)).strip()
    return str(stmt.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})).strip()


def control_ddl(dialect_name: str, *, prefix: str = "ct_", schema: Optional[str] = None) -> list[str]:
    """CREATE TABLE / CREATE INDEX for the control tables."""
    from .schema import build_schema

    dialect = dialect_for(dialect_name)
    s = build_schema(prefix, schema)
    out = []
    for table in s.metadata.sorted_tables:
        out.append(compile_sql(CreateTable(table), dialect))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(compile_sql(CreateIndex(index), dialect))
    return out


def captured_statements(
    dialect_name: str, *, events_table: str = "events", key: str = "event_id", order_by: Optional[str] = None
) -> list[tuple[str, list[str]]]:
    """Run the scripted session and return ``[(section, [compiled statements])]`` for the dialect."""
    from .control import ControlTable

    dialect = dialect_for(dialect_name)
    sections: list[tuple[str, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="controltable-sql-") as tmp:
        ct = ControlTable(f"sqlite:///{Path(tmp) / 'capture.db'}", namespace="capture")
        ct.db.target_dialect = dialect_name  # decisions such as LIMIT vs fetch follow the target
        ct.install()
        captured: list[ClauseElement] = []

        def capture(conn: Any, clauseelement: Any, multiparams: Any, params: Any, execution_options: Any) -> None:
            if isinstance(clauseelement, ClauseElement):
                captured.append(clauseelement)

        event.listen(ct.db.engine, "before_execute", capture)

        def section(title: str, fn: Any) -> None:
            captured.clear()
            fn()
            seen: list[str] = []
            for stmt in captured:
                text = compile_sql(stmt, dialect)
                if text not in seen:
                    seen.append(text)
            sections.append((title, seen))

        md = MetaData()
        columns: list[Any] = [Column(key, Integer, primary_key=True), Column("payload", String(100))]
        if order_by and order_by != key:
            columns.append(Column(order_by, Integer))
        Table(events_table, md, *columns)
        md.create_all(ct.db.engine)
        with ct.db.engine.begin() as conn:
            conn.execute(md.tables[events_table].insert(), [{key: i, "payload": f"e{i}"} for i in range(1, 21)])

        section("set_capacity (create or resize a resource)", lambda: ct.set_capacity("warehouse", 1))
        holder: dict[str, Any] = {}

        def acquire() -> None:
            holder["a"] = ct.acquire("warehouse", holder="a", lease=60)

        section("acquire: lock the resource row, reap expired entries, read the queue, grant", acquire)
        section("try_acquire while held: enqueue or refresh a waiter",
                lambda: ct.try_acquire("warehouse", holder="b", lease=60))
        section("renew a lease (fenced by the request key)", lambda: holder["a"].renew())
        section("release a lease", lambda: holder["a"].release())
        section("status", lambda: ct.status())
        section("reap expired holders and waiters", lambda: ct.reap())

        ev = ct.events(events_table, key=key, order_by=order_by)
        ddl: list[Any] = []
        section("events prepare (introspection)", lambda: ddl.extend(ev.prepare_statements()))
        sections.append(("events prepare: claim columns and claim index (DDL)", [
            compile_sql(CreateIndex(s) if not isinstance(s, DDLElement) else s, dialect) for s in ddl
        ]))
        ev.prepare()
        batch: dict[str, Any] = {}
        section("events claim: one short transaction that skips rows other workers hold",
                lambda: batch.setdefault("b", ev.claim(5, owner="w1", lease=60)))
        section("batch complete (fenced on the batch token)", lambda: batch["b"].complete())
        def fail_one() -> None:
            failing = ev.claim(5, owner="w1")
            assert failing is not None
            failing.fail("example")

        section("batch fail (back-off or error state)", fail_one)
        section("events stats", lambda: ev.stats())
        section("events retry_errors", lambda: ev.retry_errors())

        wl = ct.worklist("example")
        section("worklist populate", lambda: wl.populate([{"n": 1}, {"n": 2}], order=100))
        item: dict[str, Any] = {}
        section("worklist allocate: lock the work list row, lowest unfinished order only",
                lambda: item.setdefault("i", wl.allocate("w1")))
        section("work item complete (fenced on the item token)", lambda: item["i"].complete())
        section("worklist status", lambda: wl.status())
        ct.close()
    return sections


def render(dialect_name: str, *, prefix: str = "ct_", schema: Optional[str] = None, **events: Any) -> str:
    """The full script ``controltable sql`` prints."""
    lines = [
        f"-- controltable: DDL and statements for {dialect_name}",
        "-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only",
        "-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).",
        "",
        "-- ===== control tables =====",
    ]
    lines += [f"{s};" for s in control_ddl(dialect_name, prefix=prefix, schema=schema)]
    for title, stmts in captured_statements(dialect_name, **events):
        lines += ["", f"-- ===== {title} ====="]
        lines += [f"{s};" for s in stmts]
    return "\n".join(lines) + "\n"
