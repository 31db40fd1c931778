"""Fenced updates of slots and work items confirmed by a follow-up select (how SQL Server runs them).

On SQL Server ``rowcount`` is not trusted (NOCOUNT, triggers), so every fenced update of the
control tables is confirmed by a select of the rows as the update leaves them. These tests run the
real code path with that switch forced on, so a confirming select that matched the wrong rows
(or none) would turn a held lease into ``LeaseLost`` or a lost one into success.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support import event_tables

from controltable import LeaseLost


@pytest.fixture
def distrust_rowcount(ct: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database's traits say its row counts cannot be trusted (as SQL Server's): every fenced
    update is confirmed by its select, every control-table delete counted by the rows it returns."""
    monkeypatch.setattr(ct.db, "traits", replace(ct.db.traits, trusts_rowcount=False))


def test_slot_renew_and_pickup_confirmed(ct: Any, distrust_rowcount: None) -> None:
    ct.set_capacity("r", 1)
    lease = ct.acquire("r", holder="a", lease=30)
    before = lease.expires_at
    lease.renew(60)
    assert lease.expires_at > before
    again = ct.acquire("r", holder="a", lease=30)  # idempotent re-acquire goes through the pickup update
    assert again.token == lease.token
    lease.release()


def test_slot_renew_after_loss_is_lease_lost(ct: Any, distrust_rowcount: None) -> None:
    ct.set_capacity("r", 1)
    lease = ct.acquire("r", holder="a", lease=1)
    event_tables.wait_past(ct, lease.expires_at.timestamp())  # the lease is over by the database clock
    ct.reap()
    with pytest.raises(LeaseLost):
        lease.renew(30)


def test_work_item_finish_and_renew_confirmed(ct: Any, distrust_rowcount: None) -> None:
    wl = ct.worklist("confirm")
    wl.populate([{"n": 1}, {"n": 2}, {"n": 3}], order=1)
    a = wl.allocate(owner="w", lease=30)
    assert a is not None
    a.renew(60)
    a.complete()
    a.complete()  # a repeat under the same token is recognised as already done
    b = wl.allocate(owner="w", lease=30)
    assert b is not None
    b.fail("boom")
    c = wl.allocate(owner="w", lease=30)
    assert c is not None
    c.release()
    st = wl.status()
    assert st.total("done") == 1 and st.total("error") == 1 and st.total("new") == 1


def test_work_item_renew_after_reallocation_is_lease_lost(ct: Any, distrust_rowcount: None) -> None:
    wl = ct.worklist("confirm_lost")
    wl.populate([{"n": 1}], order=1)
    a = wl.allocate(owner="w1", lease=1)
    assert a is not None
    event_tables.wait_past(ct, a.expires_at.timestamp())  # the lease is over by the database clock
    b = wl.allocate(owner="w2", lease=30)  # the expired item is handed out again under a new token
    assert b is not None and b.id == a.id and b.token != a.token
    with pytest.raises(LeaseLost):
        a.renew(30)
    with pytest.raises(LeaseLost):
        a.complete()
    b.complete()
