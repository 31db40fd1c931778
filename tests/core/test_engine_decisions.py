"""The engines' decisions without a database: poisoned keys, batch handles, work-list status, default owners."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, insert

import controltable
from controltable import ConfigurationError
from controltable.defaults import NAME_LENGTH
from controltable.events import PENDING
from controltable.events.decisions import poisoned_keys, read_handle
from controltable.holders import process_holder_id
from controltable.worklist import status_from_counts

#: A holder id made from a host name too long for the column: its start, "~" and a hash of it all.
HASHED_HOLDER_ID = re.compile(r"h+~[0-9a-f]{16}")


def test_poisoned_keys_are_expired_claims_at_max_attempts() -> None:
    assert PENDING == 0, "the stored state of a pending row"
    rows = [{"id": 1, "s": 1, "a": 3}, {"id": 2, "s": 1, "a": 2}, {"id": 3, "s": 0, "a": 9}]
    assert poisoned_keys(rows, "id", "s", "a", 3) == [1], "pending rows are never poisoned"


def test_read_handle_works_out_the_lease_of_old_and_new_handles() -> None:
    new = read_handle({"keys": [1], "token": "7", "owner": "w", "lease": 20, "claimed_at": 5, "expires_at": 9}, 60)
    assert (new.token, new.lease, new.claimed_at) == (7, 20.0, 5.0)
    assert read_handle({"keys": [1], "token": 7, "owner": "w", "claimed_at": 100, "expires_at": 130}, 60).lease == 30
    assert read_handle({"keys": [1], "token": 7, "owner": "w"}, 60).lease == 60
    for bad in ({"keys": [1]}, {"keys": [1], "token": "x", "owner": "w"}, [1, 2], None):
        with pytest.raises(ConfigurationError, match="not a batch handle"):
            read_handle(bad, 60)  # type: ignore[arg-type]


def test_work_list_status_is_a_pure_decision() -> None:
    st = status_from_counts("w", [(100, "done", 2, 0), (200, "error", 1, 0), (200, "active", 1, 1),
                                  (300, "new", 4, 0)])
    assert st.current_order == 200 and st.blocked_by_errors, "only an errored item and an expired one"
    st = status_from_counts("w", [(200, "error", 1, 0), (200, "active", 1, 0)])
    assert not st.blocked_by_errors, "a live active item may still finish"
    assert status_from_counts("w", [(100, "done", 3, 0)]).finished


def test_default_owners_are_holder_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 400)
    first, second = process_holder_id(), process_holder_id()
    assert len(first) <= NAME_LENGTH and first != second, "long host names are hashed, never truncated into one"
    assert HASHED_HOLDER_ID.fullmatch(first), first
    # Who names no owner or holder gets such an id of its own: a work item, an event batch, a slot.
    with controltable.ControlTable(f"sqlite:///{tmp_path / 'c.db'}") as ct:
        ct.install()
        wl = ct.worklist("owners")
        wl.populate([1, 2])
        items = [wl.allocate(), wl.allocate()]
        owners = [item.owner for item in items if item is not None]
        ct.set_capacity("r", 2)
        holders = [ct.acquire("r", timeout=0).holder for _ in range(2)]
        table = Table("ev", MetaData(), Column("id", Integer, primary_key=True, autoincrement=False))
        table.create(ct.engine)
        with ct.engine.begin() as conn:
            conn.execute(insert(table), [{"id": 1}, {"id": 2}])
        ev = ct.events("ev", key="id")
        ev.prepare()
        batches = [ev.claim(1), ev.claim(1)]
        claimers = [batch.owner for batch in batches if batch is not None]
    for made in (owners, holders, claimers):
        assert len(made) == 2 and len(set(made)) == 2, made
        assert all(HASHED_HOLDER_ID.fullmatch(name) and len(name) <= NAME_LENGTH for name in made), made
