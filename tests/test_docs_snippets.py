"""Every Python snippet of README.md, the packages' READMEs and docs/*.md runs as written.

Each page's fenced ```python blocks run in order in one namespace (as a reader follows the page), in
a temporary directory, on an SQLite database there. What the snippets leave to the reader is provided
by this file, and nothing else:

- ``load``, ``process``, ``rebuild_orders`` and ``run``: the reader's own work (they record their calls);
- ``ct``: a ``ControlTable("sqlite:///controltable.db")``, installed, with a ``warehouse`` of capacity 3
  (what the README's first lines set up; pages after it start from there);
- the event table ``rainfall_events`` (``event_id`` primary key, ``mm``) with 1,200 rows, and a ``queue``
  table with ``to_queue(rows)`` for the snippet that writes to it in the batch's transaction.

A snippet that cannot run on its own (an Airflow DAG file, a fragment of one) is preceded in the markdown by
``<!-- snippet: no-run (the reason) -->``; those are counted here, so a new one is a decision in review.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "core" / "README.md", ROOT / "airflow_plugin" / "README.md",
                ROOT / "dagster_plugin" / "README.md", *(ROOT / "docs").glob("*.md")])
#: The snippets that do not run, per page: each is a fragment of a DAG or needs servers of its own.
NO_RUN_EXPECTED = {
    "docs/airflow.md": 2,
    "docs/production-databases.md": 1,
}
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
_NO_RUN = re.compile(r"<!--\s*snippet:\s*no-run\s*\(([^)]+)\)\s*-->\s*$")
EVENTS = 1200


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


def _namespace(tmp_path: Path) -> dict[str, Any]:
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

    ct = ControlTable("sqlite:///controltable.db")
    ct.install()
    ct.set_capacity("warehouse", 3)
    metadata = MetaData()
    events = Table("rainfall_events", metadata, Column("event_id", Integer, primary_key=True), Column("mm", Float))
    queue = Table("queue", metadata, Column("event_id", Integer, primary_key=True), Column("mm", Float))
    metadata.create_all(ct.engine)
    with ct.engine.begin() as conn:
        conn.execute(insert(events), [{"event_id": n, "mm": n / 10} for n in range(1, EVENTS + 1)])

    def to_queue(rows: Any) -> list[dict[str, Any]]:
        return [{"event_id": row["event_id"], "mm": row["mm"]} for row in rows]

    return {"__name__": "__snippet__", "ct": ct, "load": load, "process": process, "rebuild_orders": rebuild_orders,
            "run": run, "queue": queue, "to_queue": to_queue, "_calls": calls}


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [p for p in PAGES if any(s.no_run is None for s in snippets(p))], ids=_ids)
def test_every_python_snippet_of_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = snippets(page)
    runnable = [s for s in found if s.no_run is None]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTROLTABLE_URL", raising=False)
    monkeypatch.setenv("CONTROLTABLE_URL", "sqlite:///controltable.db")  # for EnvVar("CONTROLTABLE_URL")
    namespace = _namespace(tmp_path)
    try:
        for snippet in runnable:
            if re.search(r"^\s*(from|import) dagster", snippet.code, re.M):
                pytest.importorskip("dagster_controltable")
            try:
                exec(compile(snippet.code, f"{snippet.page}:{snippet.line}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"the snippet at {snippet.page} line {snippet.line} fails as written: "
                                     f"{type(exc).__name__}: {exc}") from exc
    finally:
        namespace["ct"].close()
    if "rainfall_events" in "".join(s.code for s in runnable) and ".claim(" in "".join(s.code for s in runnable):
        from sqlalchemy import text

        from controltable import ControlTable

        check = ControlTable("sqlite:///controltable.db")
        try:
            with check.engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM rainfall_events WHERE ct_state <> 2")).scalar()
            assert left == 0, f"{_ids(page)}: the drain loop left {left} events unprocessed"
        finally:
            check.close()


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
