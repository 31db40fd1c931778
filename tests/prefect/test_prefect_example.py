"""example_dags/prefect/flows.py runs as its docstring says: the nightly flow against a SQLite control table."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from controltable import ControlTable

EXAMPLE = Path(__file__).resolve().parents[2] / "example_dags" / "prefect" / "flows.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("prefect_example_flows", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_flow_holds_slots_drains_events_and_works_the_list(
    prefect_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"sqlite:///{tmp_path / 'controltable.db'}"
    monkeypatch.setenv("CONTROLTABLE_URL", url)
    monkeypatch.setenv("CONTROLTABLE_BLOCK", "example-test")
    example = _load()
    example.ensure_setup()
    result = example.nightly()
    assert len(result["tokens"]) == 3 and len(set(result["tokens"])) == 3
    assert result["events"] == 50
    assert result["reports"] == 3
    ct = ControlTable(url)
    try:
        (st,) = ct.status(["warehouse"])
        assert (st.capacity, st.holders, st.waiters) == (2, [], [])
        assert ct.events("demo_events", key="event_id").stats().done == 50
    finally:
        ct.close()
