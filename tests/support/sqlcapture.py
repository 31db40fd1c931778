"""Capture every statement the engine sends during a test run, and fail the run when one is not in
the golden files (``core/sql/``).

Inert unless ``CONTROLTABLE_CAPTURE_SQL`` names a directory. Then every SQLAlchemy statement
object that controltable's own code executes (not the tests' set-up statements: the caller is found
on the stack) is recorded per running dialect, as its shape (:func:`support.golden.statement_shape`:
binds, IN-list lengths, row counts, prefixes and the user's table names made uniform). Statements
run on SQLite are also compiled for SQL Server and Oracle (the dialects that cannot run here).

At the end of the session, for each dialect, the directory gets ``<dialect>.shapes`` (every shape
sent) and ``<dialect>.missing.sql`` (one full statement per shape that neither ``core/sql/<dialect>.sql``
nor ``core/sql/<dialect>.suite.sql`` holds). A shape missing for a dialect that ran live (sqlite,
postgresql, mysql) fails the run. For SQL Server and Oracle the compiled statements are reported
only (``<dir>/<dialect>.missing.sql``), and they have no ``.suite.sql``: a run on SQLite takes
SQLite's branches (the one-statement claim, no row caps, row counts trusted), so their compiled
texts are partly statements those servers never receive, and a golden file of them would show a
reviewer SQL that is never sent (and could not be enforced). What is enforced for them is the
scripted session of ``controltable sql``, which runs each dialect's own branches and is compared
exactly by ``tests/core/test_dialect_conformance.py``.

``CONTROLTABLE_CAPTURE_SQL_ONLY`` (test files, comma-separated, as pytest names them:
``tests/core/test_events.py,...``) limits the capture to those files' tests, so the suite's main run
captures them as it goes instead of running them a second time for the capture (``scripts/run-tests``).

Under pytest-xdist each worker captures its own tests and hands what it saw to the controller,
which writes the files and judges the run once.

``CONTROLTABLE_CAPTURE_SQL_WRITE=1`` rewrites ``core/sql/<dialect>.suite.sql`` of the live dialects
from the run instead (every shape the suite sent that the scripted golden file lacks), to review
with ``git diff``.
Scope: meant for ``tests/core`` (``-m "not slow"``). A path that only a timing accident would take
(the ``DROP INDEX`` of an index an interrupted concurrent build left invalid, which a loaded run once
sent) gets a test that takes it on purpose, so its shapes are in the suite file by design: the check
fails for a statement nobody reviewed, never for a slow machine, and is never passed by running again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

ENV = "CONTROLTABLE_CAPTURE_SQL"
WRITE_ENV = "CONTROLTABLE_CAPTURE_SQL_WRITE"
ONLY_ENV = "CONTROLTABLE_CAPTURE_SQL_ONLY"
GOLDEN = Path(__file__).resolve().parents[2] / "core" / "sql"
LIVE = ("sqlite", "postgresql", "mysql")
COMPILED = ("mssql", "oracle")

#: dialect -> shape -> one full statement of that shape
_SEEN: dict[str, dict[str, str]] = {}
_ERRORS: dict[str, int] = {}
#: Whether the running test is one whose statements are captured (always, without CONTROLTABLE_CAPTURE_SQL_ONLY).
_CAPTURING = True


def _only() -> Optional[set[str]]:
    value = os.environ.get(ONLY_ENV)
    return {f.strip() for f in value.split(",") if f.strip()} if value else None


def pytest_runtest_logstart(nodeid: str, location: tuple[str, Optional[int], str]) -> None:
    global _CAPTURING
    only = _only()
    if only is not None:
        _CAPTURING = nodeid.split("::")[0] in only


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, Optional[int], str]) -> None:
    global _CAPTURING
    if _only() is not None:
        _CAPTURING = False


def _from_controltable() -> bool:
    """Whether the statement being executed was sent by controltable's code (the first frame
    outside SQLAlchemy belongs to the package), and not while ``controltable sql`` prints
    statements for another dialect (those are built for the target, not the running backend)."""
    frame: Any = sys._getframe(2)
    package = os.sep + "controltable" + os.sep
    while frame is not None:
        name = frame.f_code.co_filename
        if os.sep + "sqlalchemy" + os.sep in name or name.endswith("sqlcapture.py"):
            frame = frame.f_back
            continue
        inside = package in name and (os.sep + "tests" + os.sep) not in name
        break
    else:
        return False
    if not inside:
        return False
    while frame is not None:
        if frame.f_code.co_name == "named_statements" and frame.f_code.co_filename.endswith("sqlscript.py"):
            return False
        frame = frame.f_back
    return True


def _record(dialect: str, text: str) -> None:
    from support.golden import statement_shape

    _SEEN.setdefault(dialect, {}).setdefault(statement_shape(text), text)


def _on_execute(conn: Any, clauseelement: Any, multiparams: Any, params: Any, execution_options: Any) -> None:
    from sqlalchemy.sql import ClauseElement
    from sqlalchemy.sql.elements import TextClause

    from controltable.sqlscript import _column_keys, compile_sql, dialect_for

    if not _CAPTURING or not isinstance(clauseelement, ClauseElement) or not _from_controltable():
        return
    keys = _column_keys(clauseelement, multiparams, params)
    running = conn.dialect.name
    try:
        _record(running, compile_sql(clauseelement, conn.dialect, keys))
    except Exception:  # a statement the capture cannot print: counted, never fails the test
        _ERRORS[running] = _ERRORS.get(running, 0) + 1
    if running != "sqlite" or isinstance(clauseelement, TextClause):
        return  # a text() statement is SQL written for the backend it runs on
    for name in COMPILED:
        try:
            _record(name, compile_sql(clauseelement, dialect_for(name), keys))
        except Exception:
            _ERRORS[name] = _ERRORS.get(name, 0) + 1


def enabled() -> Optional[Path]:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def pytest_configure(config: pytest.Config) -> None:
    global _CAPTURING
    if enabled() is None:
        return
    _CAPTURING = _only() is None
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "before_execute", _on_execute)


def missing_shapes(dialect: str) -> dict[str, str]:
    """Shapes sent for ``dialect`` that the golden files do not hold (shape -> a statement)."""
    from support.golden import golden_shapes

    held = golden_shapes(GOLDEN, dialect)
    return {shape: text for shape, text in _SEEN.get(dialect, {}).items() if shape not in held}


def _write_suite(dialect: str) -> None:
    from controltable.sqlscript import _terminated
    from support.golden import golden_statements, statement_shape

    scripted = {statement_shape(s) for s in golden_statements((GOLDEN / f"{dialect}.sql").read_text(encoding="utf-8"))}
    extra = sorted(shape for shape in _SEEN.get(dialect, {}) if shape not in scripted)
    lines = [f"-- controltable: statements the test suite (tests/core) sends on {dialect} beyond the scripted",
             f"-- session of {dialect}.sql, one line per statement shape (written by tests/support/sqlcapture.py;",
             "-- review like the scripted file). Shapes: ? a bound value, (?*) a list of them, N a row count,",
             "-- ct_ the control tables' prefix, events / events.col the event table and its own columns."]
    lines += [_terminated(shape) for shape in extra]
    (GOLDEN / f"{dialect}.suite.sql").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: take in what a finished worker captured (judged here, once, below)."""
    for dialect, shapes in getattr(node, "workeroutput", {}).get("sqlcapture", {}).items():
        seen = _SEEN.setdefault(dialect, {})
        for shape, statement in shapes.items():
            seen.setdefault(shape, statement)
    for dialect, count in getattr(node, "workeroutput", {}).get("sqlcapture_errors", {}).items():
        _ERRORS[dialect] = _ERRORS.get(dialect, 0) + count


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = enabled()
    worker = getattr(session.config, "workeroutput", None)
    if out is not None and worker is not None:  # a pytest-xdist worker: its controller judges the whole run
        worker["sqlcapture"] = _SEEN
        worker["sqlcapture_errors"] = _ERRORS
        return
    if out is None or not _SEEN:
        return
    out.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for dialect in sorted(_SEEN):
        (out / f"{dialect}.shapes").write_text("\n".join(sorted(_SEEN[dialect])) + "\n", encoding="utf-8")
        if os.environ.get(WRITE_ENV) == "1" and dialect in LIVE:
            _write_suite(dialect)
            continue
        missing = missing_shapes(dialect)
        (out / f"{dialect}.missing.sql").write_text("".join(f"{t};\n\n" for t in missing.values()), encoding="utf-8")
        if missing and dialect in LIVE:
            failed.append(f"{dialect}: {len(missing)} statement shape(s) not in core/sql "
                          f"(see {out}/{dialect}.missing.sql)")
    if failed:
        session.config.stash[_FAILED] = failed
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_FAILED = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if enabled() is None:
        return
    sent = ", ".join(f"{d} {len(s)}" for d, s in sorted(_SEEN.items()))
    terminalreporter.write_line(f"sql capture: statement shapes sent: {sent or 'none'}")
    for line in config.stash.get(_FAILED, []):
        terminalreporter.write_line(f"sql capture FAILED: {line}", red=True)
