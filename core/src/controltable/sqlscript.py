"""What ``controltable sql`` prints: the DDL and every statement the engine runs, for any dialect.

The statements are not written out by hand a second time. A short scripted session (install,
contended slots, an event batch, a work list) runs the real code against a throw-away SQLite
database, every statement object it executes is captured, and each is compiled for the target
dialect, configured as a connected engine configures it for a given server version (so SQL
Server gets ``NVARCHAR(max)``, not the deprecated ``TEXT``, exactly as at run time). So the SQL a
DBA reviews for SQL Server or Oracle is what the engine would send there: the same statement
objects through that dialect's compiler. The printed scripts are kept in ``core/sql/`` as
reviewed golden files; ``python -m controltable.sqlscript core/sql`` rewrites them.

Each statement is printed under the name of the builder that made it (``-- name: claim_select``,
as River and procrastinate name their SQL), so a reviewer reads the SQL and a reader of the Python
finds the statement by that name. The name is the ``__name__`` of the function or method of a
``statements`` module (``controltable.<part>.statements``) that returned the statement, the
outermost one when builders call each other; it is found while the session runs, by watching
those functions return (:class:`_Names`), so no builder carries or lists its name and a renamed
builder renames its statements. A statement no builder made (the database clock's read) is
named by the function that sent it. Where a backend's statement is shaped differently for a
reason, one line says why (``-- mssql: ...``), from the builder's :func:`~controltable.sqlnotes.sql_notes`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple, Optional, Sequence

from sqlalchemy import Column, Integer, MetaData, String, Table, event
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable, DDLElement
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.dml import Insert

from .defaults import DEFAULT_PREFIX
from .dialects import SQL_SERVER_VERSIONS, SUPPORTED_DIALECTS, AnalyzeTable, offline_dialect, traits
from .errors import ConfigurationError
from .sqlnotes import notes_of


def parse_version(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """``"15"`` or ``"19.3"`` as a version tuple (None stays None)."""
    if text is None:
        return None
    try:
        return tuple(int(p) for p in str(text).split("."))
    except ValueError as exc:
        raise ConfigurationError(f"server version {text!r} is not a version number like 15 or 19.3") from exc


def dialect_for(name: str, server_version: Optional[Sequence[int]] = None) -> Dialect:
    """The dialect ``name`` set up as a connected engine sets it up for ``server_version``
    (see :func:`controltable.dialects.offline_dialect`)."""
    if name not in SUPPORTED_DIALECTS:
        raise ConfigurationError(f"unknown dialect {name!r}; choose one of {', '.join(SUPPORTED_DIALECTS)}")
    version = tuple(server_version) if server_version else SQL_SERVER_VERSIONS[name]
    return offline_dialect(name, version)  # type: ignore[no-any-return]


def compile_sql(stmt: Any, dialect: Dialect, column_keys: Optional[list[str]] = None) -> str:
    """One statement as the engine would send it (expanding IN lists and literal states rendered)."""
    if isinstance(stmt, (DDLElement, CreateTable, CreateIndex)):
        return str(stmt.compile(dialect=dialect)).strip()
    kw: dict[str, Any] = {"compile_kwargs": {"render_postcompile": True}}
    if column_keys is not None:
        kw["column_keys"] = column_keys
    return str(stmt.compile(dialect=dialect, **kw)).strip()


def control_ddl(
    dialect_name: str, *, prefix: str = DEFAULT_PREFIX, schema: Optional[str] = None,
    server_version: Optional[Sequence[int]] = None,
) -> list[str]:
    """CREATE TABLE / CREATE INDEX for the control tables."""
    from .schema import build_schema

    dialect = dialect_for(dialect_name, server_version)
    s = build_schema(prefix, schema)
    out = []
    for table in s.metadata.sorted_tables:
        out.append(compile_sql(CreateTable(table), dialect))
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(compile_sql(CreateIndex(index), dialect))
    return out


def _column_keys(stmt: Any, multiparams: Any, params: Any) -> Optional[list[str]]:
    """The columns an INSERT was executed with: compiled without them, SQLAlchemy would list
    every column (an explicit id that fails under SQL Server's IDENTITY_INSERT OFF)."""
    if not isinstance(stmt, Insert) or stmt._values or getattr(stmt, "_multi_values", None):  # noqa: SLF001
        return None
    first: Any = None
    if multiparams:
        first = multiparams[0]
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], dict):
            first = first[0]
    elif params:
        first = params
    return list(first.keys()) if isinstance(first, dict) else None


class Statement(NamedTuple):
    """One printed statement: its SQL, the builder it is named by (None: DDL and comments, which
    name what they create) and that builder's notes (backend -> why it is shaped so there)."""

    sql: str
    name: Optional[str] = None
    notes: dict[str, str] = {}


#: Where a statement remembers the builder code that returned it. Kept in the statement's own
#: ``__dict__``, which SQLAlchemy's generative methods copy: ``stmt.returning(...)`` applied by
#: the caller keeps the builder's name.
_BUILT_BY = "_controltable_built_by"
_PACKAGE = str(Path(__file__).resolve().parent) + os.sep


class _Names:
    """While active, every statement a builder of a ``statements`` module returns (alone, or in a
    tuple such as ``(statement, values)``) is marked with that builder's code; nested builders
    return first, so the outermost one's mark stays. A profile hook (:func:`sys.setprofile`, in
    this thread and in threads started meanwhile) sees each return and its value: the builders
    are neither wrapped nor changed, and cost nothing outside ``controltable sql``."""

    def __init__(self) -> None:
        self._builders: dict[str, bool] = {}

    def _is_builder(self, code: CodeType) -> bool:
        known = self._builders.get(code.co_filename)
        if known is None:
            path = str(Path(code.co_filename).resolve())
            known = self._builders[code.co_filename] = (path.startswith(_PACKAGE)
                                                        and path.endswith(os.sep + "statements.py"))
        return known and not code.co_name.startswith("<")

    def _hook(self, frame: FrameType, event_name: str, arg: Any) -> None:
        if event_name != "return" or arg is None or not self._is_builder(frame.f_code):
            return
        for value in arg if isinstance(arg, tuple) else (arg,):
            if isinstance(value, Executable):
                value.__dict__[_BUILT_BY] = frame.f_code

    def __enter__(self) -> _Names:
        # threading.getprofile() is Python 3.10+; on 3.9 no hook for new threads is set outside this one.
        self._saved = (sys.getprofile(), getattr(threading, "getprofile", lambda: None)())
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._saved[0])
        threading.setprofile(self._saved[1])  # type: ignore[arg-type]  # None clears it


def _name_of(stmt: Any, dialect_name: str) -> tuple[Optional[str], dict[str, str]]:
    """The name and the ``dialect_name`` note of the builder that made ``stmt`` (called while it is
    executed: a statement no builder made is named by the function of controltable that sent it)."""
    code: Optional[CodeType] = getattr(stmt, "__dict__", {}).get(_BUILT_BY)
    if code is not None:
        notes = notes_of(code)
        return code.co_name, ({dialect_name: notes[dialect_name]} if dialect_name in notes else {})
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        inside = str(Path(path).resolve()).startswith(_PACKAGE)
        if inside and not path.endswith(_PASSERS) and not frame.f_code.co_name.startswith("<"):
            return frame.f_code.co_name, {}
        frame = frame.f_back
    return None, {}


#: Modules whose functions pass a statement on rather than decide it (the session, the dialect
#: layer, the transaction runner): a statement without a builder is named by its first caller
#: outside them.
_PASSERS = ("sqlscript.py", "dialects.py", "db.py")


def named_statements(
    dialect_name: str, *, events_table: str = "events", key: str = "event_id", order_by: Optional[str] = None,
    prefix: str = DEFAULT_PREFIX, schema: Optional[str] = None, server_version: Optional[Sequence[int]] = None,
    large_batch: int = 0,
) -> list[tuple[str, list[Statement]]]:
    """Run the scripted session and return ``[(section, [statements])]`` for the dialect, each
    compiled and named by its builder (see the module's docstring).

    ``prefix`` and ``schema`` are the control tables' (the session runs with them, so every
    statement names them). ``large_batch`` adds a claim and a completion of that many rows (for
    checking per-statement row caps; too long to print).
    """
    from .control import ControlTable

    dialect = dialect_for(dialect_name, server_version)
    sections: list[tuple[str, list[Statement]]] = []
    with tempfile.TemporaryDirectory(prefix="controltable-sql-") as tmp, _Names():
        ct = ControlTable(f"sqlite:///{Path(tmp) / 'capture.db'}", namespace="capture", prefix=prefix, schema=schema)
        # A release prunes history now and then (at a random moment per process); the printed script
        # must not depend on that moment, so this session never prunes on release: pruning has its
        # own section below.
        ct._slots.pruner.pause()
        if schema:
            # SQLite's schemas are attached databases: attach one under the schema's name.
            attached = str(Path(tmp) / "schema.db")

            def attach(dbapi_conn: Any, record: Any) -> None:
                dbapi_conn.execute("ATTACH DATABASE ? AS " + f'"{schema}"', (attached,))

            event.listen(ct.db.engine, "connect", attach)
            ct.db.engine.dispose()
        ct.db.target_dialect = dialect_name  # decisions such as LIMIT vs fetch follow the target
        ct.install()
        captured: list[tuple[ClauseElement, Optional[list[str]], tuple[Optional[str], dict[str, str]]]] = []

        def capture(conn: Any, clauseelement: Any, multiparams: Any, params: Any, execution_options: Any) -> None:
            if isinstance(clauseelement, ClauseElement):
                captured.append((clauseelement, _column_keys(clauseelement, multiparams, params),
                                 _name_of(clauseelement, dialect_name)))

        event.listen(ct.db.engine, "before_execute", capture)

        def section(title: str, fn: Any) -> None:
            captured.clear()
            fn()
            seen: list[Statement] = []
            for stmt, keys, (name, notes) in captured:
                named = Statement(compile_sql(stmt, dialect, keys), name, notes)
                if named not in seen:
                    seen.append(named)
            sections.append((title, seen))

        md = MetaData()
        columns: list[Any] = [Column(key, Integer, primary_key=True), Column("payload", String(100))]
        if order_by and order_by != key:
            columns.append(Column(order_by, Integer))
        Table(events_table, md, *columns)
        md.create_all(ct.db.engine)
        rows = max(20, large_batch + 10)
        with ct.db.engine.begin() as conn:
            conn.execute(md.tables[events_table].insert(), [{key: i, "payload": f"e{i}"} for i in range(1, rows + 1)])

        section("set_capacity: lock or create the resource row, then a grant pass (more capacity may admit waiters)",
                lambda: ct.set_capacity("warehouse", 1))
        holder: dict[str, Any] = {}
        section("acquire: lock the resource rows, enqueue under the next ticket, grant pass over holders and head",
                lambda: holder.setdefault("a", ct.acquire("warehouse", holder="a", lease=60)))
        section("try_acquire while held: read its own entry without locks, then enqueue as a waiter (ticketed FIFO)",
                lambda: ct.try_acquire("warehouse", holder="b", lease=60, pickup=60))
        section("renew a lease: extend on the database clock while granted and unexpired (fenced by key and attempt)",
                lambda: holder["a"].renew())
        section("release a lease: lock the resource row, delete the entry, grant pass for the next in line",
                lambda: holder["a"].release())
        ct.set_capacity("twice", 1)
        twice = [ct.acquire("twice", holder="c", lease=60) for _ in range(2)]  # one grant, two leases
        twice[0].release()
        section("release a grant released already (another lease of it): the grant history says how it ended",
                twice[1].release)
        section("status: resources, holders and waiters (no locks)", lambda: ct.status())
        section("reap: resources with entries expired on the database clock (each then reaped under its lock)",
                lambda: ct.reap())
        def run_out(*holders: str) -> None:
            """End the holders' entries on "lapse" an hour ago, by a statement left out of the script.

            The script must not depend on how fast the machine runs the session: with short leases
            and sleeps, a loaded run saw an entry run out before the next step and printed other
            statements. Nothing else runs out here: every lease, waiter entry and pickup of the session
            is a minute or more (b's pickup after a's release, r3's place in the rate-limited queue)."""
            r = ct.tables.request
            event.remove(ct.db.engine, "before_execute", capture)
            try:
                with ct.db.engine.begin() as conn:
                    conn.execute(r.update().where(r.c.namespace == ct.namespace, r.c.resource == "lapse",
                                                  r.c.holder.in_(holders)).values(expires_at=r.c.expires_at - 3600))
            finally:
                event.listen(ct.db.engine, "before_execute", capture)

        def expiry() -> None:
            ct.set_capacity("lapse", 1)
            ct.acquire("lapse", holder="x", lease=60)
            ct.try_acquire("lapse", holder="y", lease=60, waiter_ttl=60)  # queues behind x
            run_out("x", "y")
            ct.try_acquire("lapse", holder="x", lease=60)  # its own request ran out: it goes, x queues again
            ct.try_acquire("lapse", holder="z", lease=60, waiter_ttl=60)
            run_out("z")
            ct.reap()  # z's entry ran out behind x

        section("expiry: an expired holder or waiter is deleted with its expiry re-checked (on SQL Server the "
                "DELETE returns the ids it removed: the row count is never trusted)", expiry)
        section("set_capacity with a rate limit and aging (rewrites the waiters' queue order)",
                lambda: ct.set_capacity("api", 1, rate=(2, 60), aging=30))

        def rate_limited() -> None:
            ct.acquire("api", holder="r1", priority=1).release()
            ct.acquire("api", holder="r2").release()
            ct.try_acquire("api", holder="r3", priority=2, waiter_ttl=600)  # queued: the budget is spent
            ct.try_acquire("api", holder="r3", priority=2, waiter_ttl=600)  # the head's look times the window

        section("rate-limited grants: the window's budget from the grant history; the head times the "
                "next opening", rate_limited)
        section("grant history (newest first)", lambda: ct.history("api"))
        section("stats and stats_series from the grant history",
                lambda: (ct.stats(), ct.stats_series("api", buckets=2)))
        section("prune_history (batches per resource)", lambda: ct.prune_history())

        ev = ct.events(events_table, key=key, order_by=order_by)
        ddl: list[Any] = []
        section("events prepare (introspection)", lambda: ddl.extend(ev.prepare_statements()))
        notes = [
            "-- each statement runs in a transaction of its own, after a lock timeout for DDL",
            "-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);",
            "-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and",
            "-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).",
        ]
        if traits(dialect_name).lock_escalation:  # the options of prepare() on SQL Server
            notes += [
                "-- SQL Server: plain indexes by default. prepare(filtered_indexes=True) makes them filtered",
                "-- (WHERE ct_state = 0 / 1): smaller, but then every INSERT, UPDATE and DELETE on this table",
                "-- fails (error 1934) in sessions with QUOTED_IDENTIFIER or ANSI_NULLS OFF.",
                "-- prepare(disable_lock_escalation=True) adds ALTER TABLE ... SET (LOCK_ESCALATION = DISABLE).",
            ]
        stmts = notes + [compile_sql(CreateIndex(s) if not isinstance(s, DDLElement) else s, dialect) for s in ddl]
        stmts.append(compile_sql(AnalyzeTable(ev.reflect(), histograms=(ev.cols.state,)), dialect))
        sections.append(("events prepare: claim columns, claim indexes, statistics (DDL)",
                         [Statement(s) for s in stmts]))
        ev.prepare()
        batch: dict[str, Any] = {}

        def claim(size: int, name: str) -> Any:
            ev._next_expired_check = 0.0  # the same statements on every run, however slow the machine
            return lambda: batch.setdefault(name, ev.claim(size, owner="w1", lease=60))

        section("events claim: one short transaction that skips rows other workers hold", claim(5, "b"))
        section("batch complete (fenced on the batch token)", lambda: batch["b"].complete())

        def fail_one() -> None:
            ev._next_expired_check = 0.0
            failing = ev.claim(5, owner="w1")
            assert failing is not None
            failing.fail("example")

        section("batch fail (back-off or error state, decided from the stored attempts)", fail_one)

        def renew_release() -> None:
            ev._next_expired_check = 0.0
            held = ev.claim(2, owner="w1")
            assert held is not None
            held.renew()
            held.release()

        section("batch renew and release", renew_release)
        if large_batch:
            ev._next_expired_check = 0.0
            section(f"events claim of {large_batch} rows", claim(large_batch, "large"))
            section(f"batch complete of {large_batch} rows", lambda: batch["large"].complete())
        section("events stats", lambda: ev.stats())
        section("events error rows (the status page)", lambda: ev.error_rows(20))
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


def render(
    dialect_name: str, *, prefix: str = DEFAULT_PREFIX, schema: Optional[str] = None,
    server_version: Optional[Sequence[int]] = None, **events: Any,
) -> str:
    """The full script ``controltable sql`` prints."""
    version = tuple(server_version) if server_version else SQL_SERVER_VERSIONS[dialect_name]
    lines = [
        f"-- controltable: DDL and statements for {dialect_name} (server version {'.'.join(map(str, version))})",
        "-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only",
        "-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).",
        "-- Each statement the engine sends is printed under the name of its builder (`-- name: claim_select`:",
        "-- the function or method of controltable's statements modules, or the function that sent it), with",
        f"-- a `-- {dialect_name}: ...` line where it is shaped differently on {dialect_name} for a reason.",
        "",
        "-- ===== control tables =====",
    ]
    lines += [f"{s};" for s in control_ddl(dialect_name, prefix=prefix, schema=schema, server_version=version)]
    for title, stmts in named_statements(dialect_name, prefix=prefix, schema=schema, server_version=version,
                                         **events):
        lines += ["", f"-- ===== {title} ====="]
        for stmt in stmts:
            if stmt.name is not None:
                lines.append(f"-- name: {stmt.name}")
            lines += [f"-- {backend}: {why}" for backend, why in stmt.notes.items()]
            lines.append(_terminated(stmt.sql))
    return "\n".join(lines) + "\n"


def _terminated(stmt: str) -> str:
    """A statement as a script line: comments as they are, a PL/SQL block ended by ``/`` (as
    SQL*Plus and SQLcl expect), everything else by ``;``."""
    if stmt.startswith("--"):
        return stmt
    if stmt.startswith("BEGIN ") and stmt.endswith("END;"):
        return f"{stmt}\n/"
    return f"{stmt};"


#: The golden files: one printed script per dialect, reviewed like code.
GOLDEN_DIALECTS = SUPPORTED_DIALECTS


def write_golden(directory: Path) -> list[Path]:
    """(Re)write ``<directory>/<dialect>.sql`` for every dialect; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in GOLDEN_DIALECTS:
        path = directory / f"{name}.sql"
        path.write_text(render(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover - the documented regeneration command
    for written_path in write_golden(Path(sys.argv[1] if len(sys.argv) > 1 else "core/sql")):
        print(written_path)
