"""Every Python snippet of README.md, the packages' READMEs and docs/*.md runs as written.

Each page's fenced ```python blocks run in order in one namespace (as a reader follows the page), in
a temporary directory, on an SQLite database there, and again on every live backend the page's
snippets offer (a page whose text names ``postgresql+psycopg://`` runs on PostgreSQL too, ``mysql`` or
``mariadb`` on MariaDB), each time in a throwaway database of its own on the shared server, the
SQLite URL of the snippets replaced by that database's. What the snippets leave to the reader is
provided by this file, and nothing else:

- ``load``, ``process``, ``rebuild_orders`` and ``run``: the reader's own work (they record their calls);
- for a page whose snippets import Prefect: a temporary Prefect server (``prefect_test_harness``) for its
  flows and blocks; such a page is skipped where Prefect is not installed (the main environment), and
  runs in the Prefect lane of ``scripts/run-tests`` (``.venv-prefect``);
- ``ct``: a ``ControlTable("sqlite:///controltable.db")`` (or the live database), installed, with a
  ``warehouse`` of capacity 3 (what the README's first lines set up; pages after it start from there);
- the event table ``rainfall_events`` (``event_id`` primary key, ``mm``) with 1,200 rows, unless the
  page creates it itself (the README does: its own table must work on every backend offered), and a ``queue``
  table with ``to_queue(rows)`` for the snippet that writes to it in the batch's transaction.

A snippet that cannot run on its own (an Airflow DAG file, a fragment of one) is preceded in the markdown by
``<!-- snippet: no-run (the reason) -->``; those are counted here, so a new one is a decision in review.
"""

from __future__ import annotations

import os
import re
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from support.live import PREFECT_HARNESS_TEST_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "core" / "README.md", ROOT / "airflow_plugin" / "README.md",
                ROOT / "dagster_plugin" / "README.md", ROOT / "prefect_plugin" / "README.md",
                *(ROOT / "docs").glob("*.md")])
#: The snippets that do not run, per page: each is a fragment of a DAG or needs servers of its own.
NO_RUN_EXPECTED = {
    "README.md": 1,
    "docs/airflow.md": 2,
    "docs/production-databases.md": 1,
}
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
_NO_RUN = re.compile(r"<!--\s*snippet:\s*no-run\s*\(([^)]+)\)\s*-->\s*$")
EVENTS = 1200
#: The URL the snippets are written with, replaced on a live backend by its throwaway database's.
SNIPPET_URL = "sqlite:///controltable.db"
#: Where the live servers are (as tests/conftest.py reads them; the ``backend`` fixture skips without).
SERVER_ENV = {"postgres": "CONTROLTABLE_TEST_POSTGRES_URL", "mysql": "CONTROLTABLE_TEST_MYSQL_URL"}
#: What in a page's snippets offers a live backend (the comment next to the SQLite URL).
OFFERS = {"postgres": re.compile(r"postgres(ql)?(\+\w+)?://", re.I),
          "mysql": re.compile(r"\b(mysql|mariadb)(\+\w+)?://", re.I)}
#: A page that creates the event table itself (then the reader's table is the page's).
_MAKES_EVENTS = re.compile(r"CREATE TABLE[^\n]*rainfall_events|Table\(\s*[\"']rainfall_events[\"']", re.I)


@dataclass
class Snippet:
    page: str
    line: int
    code: str
    no_run: str | None  # the reason given in the markdown


def snippets(page: Path) -> list[Snippet]:
    text = page.read_text(encoding="utf-8")
    out = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        marker = _NO_RUN.search(before[-1]) if before else None
        line = text.count("\n", 0, match.start()) + 2
        out.append(Snippet(str(page.relative_to(ROOT)), line, match.group(1), marker.group(1) if marker else None))
    return out


def offered(page: Path) -> set[str]:
    """The backends a page's runnable snippets offer: SQLite always, and every URL their text names."""
    code = "".join(s.code for s in snippets(page) if s.no_run is None)
    return {"sqlite"} | {backend for backend, pattern in OFFERS.items() if pattern.search(code)}


@contextmanager
def throwaway_database(backend: str) -> Iterator[str]:
    """A database of its own on the shared server (the snippets name fixed tables), dropped after."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    server = os.environ.get(SERVER_ENV[backend])
    assert server, f"{SERVER_ENV[backend]} is not set (the backend fixture skips then)"
    name = f"ct_snippets_{uuid.uuid4().hex[:10]}"
    quoted = f'"{name}"' if backend == "postgres" else f"`{name}`"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        try:
            yield make_url(server).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                force = " WITH (FORCE)" if backend == "postgres" else ""
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")
    finally:
        admin.dispose()


def _namespace(url: str, *, with_events: bool = True) -> dict[str, Any]:
    from sqlalchemy import Column, Float, Integer, MetaData, Table, insert

    from controltable import ControlTable

    calls: list[tuple[str, Any]] = []

    def load(fencing_token: int | None = None, **kwargs: Any) -> None:
        assert fencing_token is None or fencing_token >= 1
        calls.append(("load", fencing_token))

    def process(rows: Any) -> None:
        calls.append(("process", len(rows)))

    def rebuild_orders() -> None:
        calls.append(("rebuild_orders", None))

    def run(payload: Any) -> None:
        calls.append(("run", payload))

    ct = ControlTable(url)
    ct.install()
    ct.set_capacity("warehouse", 3)
    metadata = MetaData()
    events = Table("rainfall_events", metadata, Column("event_id", Integer, primary_key=True), Column("mm", Float))
    queue = Table("queue", metadata, Column("event_id", Integer, primary_key=True), Column("mm", Float))
    if not with_events:
        metadata.remove(events)
    metadata.create_all(ct.engine)
    if with_events:
        with ct.engine.begin() as conn:
            conn.execute(insert(events), [{"event_id": n, "mm": n / 10} for n in range(1, EVENTS + 1)])

    def to_queue(rows: Any) -> list[dict[str, Any]]:
        return [{"event_id": row["event_id"], "mm": row["mm"]} for row in rows]

    return {"__name__": "__snippet__", "ct": ct, "load": load, "process": process, "rebuild_orders": rebuild_orders,
            "run": run, "queue": queue, "to_queue": to_queue, "_calls": calls}


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


_PREFECT_IMPORT = re.compile(r"^\s*(from|import) prefect", re.M)


def _page_param(page: Path) -> Any:
    """A page whose snippets run a temporary Prefect server counts its start-up in the test's own time."""
    if any(_PREFECT_IMPORT.search(s.code) for s in snippets(page) if s.no_run is None):
        return pytest.param(page, marks=pytest.mark.timeout(PREFECT_HARNESS_TEST_TIMEOUT))
    return page


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES if any(s.no_run is None for s in snippets(p))],
                         ids=_ids)
def test_every_python_snippet_of_the_page_runs(page: Path, backend: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if backend not in offered(page):
        pytest.skip(f"{_ids(page)} offers no {backend} URL")
    monkeypatch.chdir(tmp_path)
    if backend == "sqlite":
        _run_page(page, SNIPPET_URL, monkeypatch)
    else:
        with throwaway_database(backend) as url:
            _run_page(page, url, monkeypatch)


def _run_page(page: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runnable = [s for s in snippets(page) if s.no_run is None]
    monkeypatch.setenv("CONTROLTABLE_URL", url)  # for EnvVar("CONTROLTABLE_URL")
    code = "".join(s.code for s in runnable)
    prefect_page = _PREFECT_IMPORT.search(code) is not None
    if prefect_page:
        pytest.importorskip("prefect_controltable")
        from prefect.testing.utilities import prefect_test_harness
        from support.live import PREFECT_SERVER_START_HANG
    namespace = _namespace(url, with_events=not _MAKES_EVENTS.search(code))
    try:
        with prefect_test_harness(server_startup_timeout=PREFECT_SERVER_START_HANG) if prefect_page else nullcontext():
            for snippet in runnable:
                if re.search(r"^\s*(from|import) dagster", snippet.code, re.M):
                    pytest.importorskip("dagster_controltable")
                code = snippet.code.replace(f'"{SNIPPET_URL}"', repr(url))
                try:
                    exec(compile(code, f"{snippet.page}:{snippet.line}", "exec"), namespace)
                except Exception as exc:
                    raise AssertionError(f"the snippet at {snippet.page} line {snippet.line} fails as written on "
                                         f"{url.split(':')[0]}: {type(exc).__name__}: {exc}") from exc
    finally:
        namespace["ct"].close()
        for value in list(namespace.values()):  # the snippets' own ControlTables: a database is dropped after
            if value is not namespace["ct"] and type(value).__name__ == "ControlTable":
                value.close()
    if "rainfall_events" in "".join(s.code for s in runnable) and ".claim(" in "".join(s.code for s in runnable):
        from sqlalchemy import text

        from controltable import ControlTable

        check = ControlTable(url)
        try:
            with check.engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM rainfall_events WHERE ct_state <> 2")).scalar()
                total = conn.execute(text("SELECT count(*) FROM rainfall_events")).scalar()
            assert left == 0, f"{_ids(page)}: the drain loop left {left} events unprocessed"
            assert total, f"{_ids(page)}: the event table is empty: the drain loop proved nothing"
        finally:
            check.close()


def test_the_pages_that_name_server_urls_run_there_too() -> None:
    assert offered(ROOT / "README.md") == {"sqlite", "postgres", "mysql"}
    assert offered(ROOT / "docs" / "slots.md") == {"sqlite", "postgres", "mysql"}
    assert offered(ROOT / "docs" / "events.md") == {"sqlite"}


@pytest.mark.skipif(not os.environ.get("CONTROLTABLE_TEST_INSTALLED"), reason="only in `make dist`'s clean venv")
def test_the_snippets_ran_against_the_installed_wheels() -> None:
    """`make dist` sets CONTROLTABLE_TEST_INSTALLED: the snippets must have met the wheels, not the checkout."""
    import airflow_controltable
    import controltable
    import dagster_controltable

    for module in (controltable, airflow_controltable, dagster_controltable):
        assert ROOT not in Path(str(module.__file__)).resolve().parents, module.__file__


def test_the_snippets_that_do_not_run_are_few_and_say_why() -> None:
    counted = {}
    for page in PAGES:
        skipped = [s for s in snippets(page) if s.no_run is not None]
        for s in skipped:
            assert len(s.no_run.strip()) > 5, f"{s.page} line {s.line}: say why the snippet cannot run"
        if skipped:
            counted[_ids(page)] = len(skipped)
    assert counted == NO_RUN_EXPECTED


def test_the_extraction_finds_the_snippets_and_their_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n<!-- snippet: no-run (needs Airflow) -->\n"
                    "```python\nimport airflow\n```\n\n```bash\nls\n```\n", encoding="utf-8")
    original = globals()["ROOT"]
    globals()["ROOT"] = tmp_path
    try:
        got = snippets(page)
    finally:
        globals()["ROOT"] = original
    assert [(s.code, s.no_run, s.line) for s in got] == [("x = 1\n", None, 4), ("import airflow\n", "needs Airflow", 9)]
    assert sum(len(snippets(p)) for p in PAGES) >= 15  # the pages do have snippets: the test above is not empty
    assert os.path.exists(ROOT / "README.md")
