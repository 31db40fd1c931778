"""Renamed public names keep working: the new name without a warning, the old one with a ``DeprecationWarning``."""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import controltable
from controltable import ConfigurationError, EventTable


def test_table_schema_and_its_deprecated_alias_schema(tmp_path: Path) -> None:
    with controltable.ControlTable(f"sqlite:///{tmp_path / 'c.db'}") as ct:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ev = ct.events("ev", key="id", table_schema="main")
        assert ev.table_schema == "main" and ev.qualified_name == "main.ev"
        with pytest.warns(DeprecationWarning, match="table_schema"):
            old = ct.events("ev", key="id", schema="main")
        assert old.table_schema == "main"
        with pytest.warns(DeprecationWarning, match="table_schema"):
            assert old.schema == "main"
        with pytest.warns(DeprecationWarning), pytest.raises(ConfigurationError, match="once"):
            EventTable(ct, "ev", key="id", schema="a", table_schema="b")
        with pytest.raises(ConfigurationError, match="table_schema"):
            ct.events("ev", key="id", table_schema="bad name")


def test_batch_handle_names_the_table_schema(ct: Any, event_table: Any) -> None:
    """A handle carries ``table_schema`` and, for readers of old handles, ``schema`` too."""
    ev = event_table(3)
    batch = ev.claim(3, owner="w")
    handle = json.loads(json.dumps(batch.handle()))
    assert handle["table_schema"] is None and handle["schema"] is None
    assert ev.batch(handle).keys == batch.keys
    assert batch.release() == 3


def test_work_list_release_reset_and_poll_interval_with_their_old_names(ct: Any) -> None:
    wl = ct.worklist("vocab")
    try:
        wl.populate([1, 2])
        item = wl.allocate("w")
        assert item is not None
        item.release()
        assert wl.status().total("new") == 2
        again = wl.allocate("w")
        assert again is not None
        with pytest.warns(DeprecationWarning, match="release"):
            again.free()
        assert wl.status().total("new") == 2
        done = wl.allocate("w")
        assert done is not None
        done.complete()
        assert wl.reset() == 2 and wl.status().total("new") == 2
        done = wl.allocate("w")
        assert done is not None
        done.complete()
        with pytest.warns(DeprecationWarning, match=r"reset\(\)"):
            assert wl.reset_all() == 2
        with pytest.warns(DeprecationWarning, match="poll_interval"):
            got = [i.id for i in wl.items("w", poll=0.01, timeout=5) if i.complete() is None]
        assert len(got) == 2
        with pytest.raises(ConfigurationError, match="poll_interval"):
            next(wl.items(poll_interval=0))
    finally:
        wl.drop()


@pytest.mark.parametrize(("old", "new", "names"), [
    ("controltable.grants", "controltable.slots.grants", ("decide", "Queue", "Waiter", "queue_key", "order")),
    ("controltable.history", "controltable.slots", ("Rate", "GrantRecord", "ResourceStats", "parse_rate",
                                                     "parse_duration", "check_rate")),
    ("controltable.history", "controltable.clock", ("utc",)),
])
def test_the_earlier_module_paths_still_import_with_a_deprecation_warning(old: str, new: str,
                                                                         names: tuple[str, ...]) -> None:
    """The grant decision and the policy values moved into ``controltable.slots``; the old paths warn."""
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=old.replace(".", r"\.")):
        module = importlib.import_module(old)
    moved = importlib.import_module(new)
    assert {name: getattr(module, name) for name in names} == {name: getattr(moved, name) for name in names}
