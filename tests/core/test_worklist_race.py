"""An old holder's finish against an allocation of the same expired item: one wins, never both.

The allocation reads the next item without a row lock (the list lock serialises allocations, not
finishes). An old holder whose lease ran out may finish the item while the allocation's UPDATE
waits on the row. The race is made deterministic with a row lock held from an outside connection:
both statements queue behind it in a known order, then the lock goes. On SQLite a writer holds
the whole database, so the two orders are simply run one after the other.

- finish queued first: the finish commits; the allocation's UPDATE finds the item no longer as it
  read it and hands out the next item instead (the item is done once, under the old token).
- allocation queued first: the allocation commits under a new token; the finish is fenced out
  and raises ``LeaseLost`` (the item is active under the new holder).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, Optional

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Connection
from support.live import wait_until

from controltable import LeaseLost

LEASE = 1.0


class Outcome:
    """What a call made in a thread returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            self.error = exc

    def start(self) -> Outcome:
        self.thread.start()
        return self

    def join(self) -> Outcome:
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "a call was still blocked 30 s after the row lock went"
        return self


def waiters_behind(probe: Connection, backend: str, holder: Connection, item_id: int) -> int:
    """Sessions waiting, directly or through another waiter, on the outside connection's row lock."""
    if backend == "mysql":
        # InnoDB's lock-wait tables lag and miss waiters; the statements waiting on the item's
        # row are the ones still running an UPDATE of that row (its id is unique across lists).
        rows = probe.execute(text(
            "SELECT info FROM information_schema.processlist WHERE command = 'Query' AND info LIKE 'UPDATE %'")).all()
        probe.rollback()
        return sum(1 for (info,) in rows if re.search(rf"\.id = {item_id}\b", info or ""))
    pid = int(holder.scalar(text("SELECT pg_backend_pid()")))
    rows = probe.execute(text(
        "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")).all()
    probe.rollback()  # PostgreSQL keeps one statistics snapshot per transaction
    behind = {pid}
    grew = True
    while grew:
        grew = False
        for waiter, blockers in rows:
            if waiter not in behind and set(blockers) & behind:
                behind.add(int(waiter))
                grew = True
    return len(behind) - 1


def wait_for_waiters(probe: Connection, backend: str, holder: Connection, item_id: int, n: int,
                     call: Outcome) -> None:
    def queued() -> bool:
        assert call.thread.is_alive(), f"the call did not wait on the row lock: {call.error!r} {call.value!r}"
        return waiters_behind(probe, backend, holder, item_id) >= n

    wait_until(queued, 60, f"{n} sessions to queue behind the outside row lock", interval=0.02)


def expired_item(ct: Any, name: str) -> tuple[Any, Any]:
    """A list of two items whose first is allocated to an old holder whose lease has run out."""
    wl = ct.worklist(name)
    wl.populate([{"n": 1}, {"n": 2}], order=1)
    old = wl.allocate(owner="old", lease=LEASE)
    assert old is not None and old.payload == {"n": 1}
    time.sleep(LEASE + 0.3)
    return wl, old


def finish(old: Any, how: str) -> None:
    if how == "complete":
        old.complete()
    else:
        old.fail("boom")


def item_row(wl: Any, item_id: int) -> dict[str, Any]:
    rows = {r["id"]: r for r in wl.items_list()}
    return rows[item_id]


def run_raced(ct: Any, backend: str, backend_url: str, wl: Any, old: Any, how: str,
              first: str) -> tuple[Outcome, Outcome]:
    """Queue the finish and the allocation behind an outside row lock in the order ``first`` names."""
    finish_call = Outcome(lambda: finish(old, how))
    alloc_call = Outcome(lambda: wl.allocate(owner="new", lease=30))
    if backend == "sqlite":
        for call in ((finish_call, alloc_call) if first == "finish" else (alloc_call, finish_call)):
            call.start().join()
        return finish_call, alloc_call
    engine = create_engine(backend_url)
    items = ct.runtime.tables.item
    try:
        with engine.connect() as holder, engine.connect() as probe:
            tx = holder.begin()
            holder.execute(select(items.c.id).where(items.c.id == old.id).with_for_update()).all()
            ordered = (finish_call, alloc_call) if first == "finish" else (alloc_call, finish_call)
            for n, call in enumerate(ordered, start=1):
                call.start()
                wait_for_waiters(probe, backend, holder, old.id, n, call)
            tx.rollback()
        finish_call.join()
        alloc_call.join()
    finally:
        engine.dispose()
    return finish_call, alloc_call


@pytest.mark.parametrize("how", ["complete", "fail"])
def test_finish_queued_first_wins_and_allocation_moves_on(ct: Any, backend: str, backend_url: str, how: str) -> None:
    wl, old = expired_item(ct, f"race_f_{how}")
    finished, allocated = run_raced(ct, backend, backend_url, wl, old, how, first="finish")
    assert finished.error is None, f"the old holder's {how}() committed first and must succeed: {finished.error!r}"
    assert allocated.error is None, allocated.error
    new = allocated.value
    assert new is not None and new.id != old.id and new.payload == {"n": 2}, new
    row = item_row(wl, old.id)
    assert row["state"] == ("done" if how == "complete" else "error"), row
    assert row["token"] == old.token and row["owner"] == "old", row


@pytest.mark.parametrize("how", ["complete", "fail"])
def test_allocation_queued_first_wins_and_finish_is_lease_lost(ct: Any, backend: str, backend_url: str,
                                                               how: str) -> None:
    wl, old = expired_item(ct, f"race_a_{how}")
    finished, allocated = run_raced(ct, backend, backend_url, wl, old, how, first="allocate")
    assert allocated.error is None, allocated.error
    new = allocated.value
    assert new is not None and new.id == old.id and new.token > old.token, new
    assert isinstance(finished.error, LeaseLost), f"the fenced-out {how}() must raise LeaseLost: {finished.error!r}"
    row = item_row(wl, old.id)
    assert row["state"] == "active" and row["token"] == new.token and row["owner"] == "new", row
    new.complete()
    assert item_row(wl, old.id)["state"] == "done"
