"""The statement capture (``tests/support/sqlcapture.py``) and the shapes it compares with the golden files.

The capture itself runs when ``CONTROLTABLE_CAPTURE_SQL`` is set (it then fails the run on a statement
shape the golden files lack); these tests check its parts without a capture run: the shape of a
statement, the parsing of the golden files, and the verdict on a shape held or not held.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.golden import golden_shapes, golden_statements, statement_shape

from controltable.sqlscript import GOLDEN_DIALECTS

GOLDEN = Path(__file__).resolve().parents[2] / "core" / "sql"


def test_shape_makes_what_varies_between_two_sends_uniform() -> None:
    a = ("SELECT ev_1a2b.id, ev_1a2b.payload, ev_1a2b.ct_state FROM ev_1a2b WITH (UPDLOCK) "
         "WHERE ev_1a2b.id IN (:id_1_1, :id_1_2, :id_1_3) AND zz_request.namespace = :namespace_1")
    b = ("SELECT events.event_id, events.ct_state FROM events WITH (UPDLOCK) "
         "WHERE events.event_id IN (:event_id_1_1) AND ct_request.namespace = :namespace_7")
    assert statement_shape(a) == statement_shape(b)
    assert "IN (?*)" in statement_shape(a) and "events.col" in statement_shape(a)
    assert statement_shape("SELECT TOP 5 x FROM events") == statement_shape("SELECT TOP 1000 x FROM events")
    # The MySQL script prints format-style binds, PyMySQL sends pyformat: one shape (a history prune
    # sent live once in a CI run was reported missing although core/sql/mysql.sql holds it).
    assert statement_shape("SELECT ct_resource.rate_per FROM ct_resource WHERE ct_resource.name = %s") == \
        statement_shape("SELECT ct_resource.rate_per FROM ct_resource WHERE ct_resource.name = %(name_1)s")
    assert statement_shape("CREATE INDEX v1ab_request_key_ix ON v1ab_request (request_key)") == \
        "CREATE INDEX ct_request_key_ix ON ct_request (request_key)"
    # What differs between two builders stays different: states, columns, hints.
    assert statement_shape("UPDATE events SET ct_state=:s WHERE events.ct_state = 1") != \
        statement_shape("UPDATE events SET ct_state=:s WHERE events.ct_state = 3")
    assert statement_shape("SELECT x FROM events WITH (FORCESEEK)") != statement_shape("SELECT x FROM events")
    assert statement_shape("SELECT ct_request.resource FROM ct_request") != \
        statement_shape("SELECT ct_request.holder FROM ct_request")


def test_a_locking_clause_is_not_read_as_a_table() -> None:
    """``FOR UPDATE SKIP LOCKED``: SKIP was taken for the user's table and made ``events``."""
    shape = statement_shape("SELECT ev_1a.id FROM ev_1a WHERE ev_1a.ct_state = 0 ORDER BY ev_1a.id "
                            "FOR UPDATE SKIP LOCKED")
    assert shape == "SELECT events.col FROM events WHERE events.ct_state = 0 ORDER BY events.col FOR UPDATE SKIP LOCKED"
    assert statement_shape("SELECT x FROM ev_1a FOR UPDATE NOWAIT").endswith("FOR UPDATE NOWAIT")
    assert statement_shape("SELECT x FROM ev_1a FOR UPDATE OF ev_1a.x SKIP LOCKED").endswith(
        "FOR UPDATE OF events.col SKIP LOCKED")
    assert statement_shape("UPDATE ev_1a SET ct_state=%s") == "UPDATE events SET ct_state=?"


@pytest.mark.parametrize("dialect", GOLDEN_DIALECTS)
def test_golden_files_parse_into_shapes_that_are_stable(dialect: str) -> None:
    from support.sqlcapture import COMPILED

    scripted = golden_statements((GOLDEN / f"{dialect}.sql").read_text(encoding="utf-8"))
    assert len(scripted) > 100, "the scripted session's statements were not all found"
    assert not any(s.lstrip().startswith("--") for s in scripted)
    suite_path = GOLDEN / f"{dialect}.suite.sql"
    if dialect in COMPILED:
        # Compiled from SQLite's branches, never enforced: no golden file shows them as sent.
        assert not suite_path.exists(), f"{suite_path}: SQL Server and Oracle have no suite file"
        suite: list[str] = []
    else:
        assert suite_path.exists(), f"{suite_path} is missing; write it with CONTROLTABLE_CAPTURE_SQL_WRITE=1"
        suite = golden_statements(suite_path.read_text(encoding="utf-8"))
    for stmt in scripted + suite:
        shape = statement_shape(stmt)
        assert statement_shape(shape) == shape, stmt[:200]
    held = {statement_shape(s) for s in scripted}
    assert not [s for s in suite if statement_shape(s) in held], "the suite file repeats scripted statements"


def test_a_statement_the_golden_files_lack_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from support import sqlcapture

    known = golden_statements((GOLDEN / "postgresql.sql").read_text(encoding="utf-8"))[5]
    novel = "DELETE FROM ct_request WHERE ct_request.holder LIKE %(holder_1)s"
    monkeypatch.setattr(sqlcapture, "_SEEN", {"postgresql": {statement_shape(s): s for s in (known, novel)}})
    assert list(sqlcapture.missing_shapes("postgresql").values()) == [novel]
    assert golden_shapes(GOLDEN, "postgresql") >= {statement_shape(known)}


def test_a_write_run_writes_suite_files_for_the_live_dialects_only(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """SQL Server and Oracle statements compiled from the SQLite run are reported in the capture
    directory, never written as a golden file (they follow SQLite's branches)."""
    import types

    from support import sqlcapture

    golden = tmp_path / "golden"
    golden.mkdir()
    for dialect in ("mssql", "sqlite"):
        (golden / f"{dialect}.sql").write_text((GOLDEN / f"{dialect}.sql").read_text(encoding="utf-8"),
                                               encoding="utf-8")
    novel = "DELETE FROM ct_request WHERE ct_request.holder = ?"
    monkeypatch.setattr(sqlcapture, "GOLDEN", golden)
    monkeypatch.setattr(sqlcapture, "_SEEN", {d: {statement_shape(novel): novel} for d in ("mssql", "sqlite")})
    monkeypatch.setenv(sqlcapture.ENV, str(tmp_path / "out"))
    monkeypatch.setenv(sqlcapture.WRITE_ENV, "1")
    session = types.SimpleNamespace(config=types.SimpleNamespace(stash={}), exitstatus=0)
    sqlcapture.pytest_sessionfinish(session, 0)  # type: ignore[arg-type]
    assert statement_shape(novel) in (golden / "sqlite.suite.sql").read_text(encoding="utf-8")
    assert not (golden / "mssql.suite.sql").exists()
    assert novel in (tmp_path / "out" / "mssql.missing.sql").read_text(encoding="utf-8")
    assert session.exitstatus == 0


@pytest.mark.parametrize("workers", [(), ("-n", "2", "--dist", "loadfile")], ids=["one-process", "xdist"])
def test_the_capture_can_be_limited_to_some_test_files(tmp_path: Path, workers: tuple[str, ...]) -> None:
    """``CONTROLTABLE_CAPTURE_SQL_ONLY``: the suite's main run captures the golden-SQL files' tests as it
    runs them; another file's statements are not captured (so they cannot fail the check). The same
    spread over pytest-xdist workers, as the main run is (each worker hands its capture to the controller)."""
    import os
    import subprocess
    import sys

    if workers:
        pytest.importorskip("xdist")  # not in the SQLAlchemy 1.4 environment
    tests = Path(__file__).resolve().parents[1]
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "test_a.py").write_text(
        "from controltable import ControlTable\n\n"
        "def test_a(tmp_path):\n"
        "    ct = ControlTable(f'sqlite:///{tmp_path}/a.db', namespace='a')\n"
        "    ct.install()\n"
        "    ct.close()\n", encoding="utf-8")
    (tmp_path / "test_b.py").write_text(
        "from controltable import ControlTable\n\n"
        "def test_b(tmp_path):\n"
        "    ct = ControlTable(f'sqlite:///{tmp_path}/b.db', namespace='b')\n"
        "    ct.install()\n"
        "    ct.set_capacity('warehouse', 2)\n"
        "    ct.acquire('warehouse', holder='h', timeout=0).release()\n"
        "    ct.close()\n", encoding="utf-8")

    def shapes(only: str | None) -> set[str]:
        out = tmp_path / f"capture-{only}"
        env = dict(os.environ, CONTROLTABLE_CAPTURE_SQL=str(out),
                   PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
        env.pop("CONTROLTABLE_CAPTURE_SQL_ONLY", None)
        if only is not None:
            env["CONTROLTABLE_CAPTURE_SQL_ONLY"] = only
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "support.sqlcapture",
                   *workers, "test_a.py", "test_b.py"]
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert "2 passed" in run.stdout, run.stdout + run.stderr
        return set((out / "sqlite.shapes").read_text(encoding="utf-8").splitlines())

    everything, only_a = shapes(None), shapes("test_a.py")
    assert only_a, "the listed file's statements were not captured"
    assert only_a < everything, "the other file's statements were captured too"


def test_under_xdist_the_controller_judges_what_the_workers_captured(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker hands its shapes to the controller and writes nothing; the controller's verdict fails
    the run on a shape no golden file holds, as a run without workers would."""
    import types

    from support import sqlcapture

    novel = "DELETE FROM ct_request WHERE ct_request.holder LIKE %(holder_1)s"
    monkeypatch.setenv(sqlcapture.ENV, str(tmp_path / "out"))
    monkeypatch.setattr(sqlcapture, "_SEEN", {"postgresql": {statement_shape(novel): novel}})
    worker = types.SimpleNamespace(config=types.SimpleNamespace(stash={}, workeroutput={}), exitstatus=0)
    sqlcapture.pytest_sessionfinish(worker, 0)  # type: ignore[arg-type]
    assert worker.exitstatus == 0 and not (tmp_path / "out").exists()

    monkeypatch.setattr(sqlcapture, "_SEEN", {})
    sqlcapture.pytest_testnodedown(types.SimpleNamespace(workeroutput=worker.config.workeroutput), None)
    controller = types.SimpleNamespace(config=types.SimpleNamespace(stash={}), exitstatus=0)
    sqlcapture.pytest_sessionfinish(controller, 0)  # type: ignore[arg-type]
    assert controller.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert novel in (tmp_path / "out" / "postgresql.missing.sql").read_text(encoding="utf-8")
