"""A queue entry's expiry wakes the next live waiter at once, and a failed acquire leaves no entry.

Two dead waiters (queued once, never looking again: processes that died in the queue) stand
ahead of a live one. The release grants the first dead one on its behalf; its pickup deadline
lapses, then the second's. Before, the live waiter (behind a dead head) slept until its next
refresh (half the waiter TTL, 15 s here); now every waiter times the earliest expiry ahead of
it and runs the grant pass itself once that is overdue, so it is granted about two pickup
windows after the release. Asserted by what the live waiter decided (every sleep it began after
the release ended by the expiry ahead, never by its refresh), not by how soon it was granted.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import pytest
from support.live import wait_until

from controltable import ControlTable, DatabaseUnavailableError, Lease
from controltable.slots import SlotEngine
from controltable.slots.entering import Entering, Peek
from controltable.slots.grants import REAP_GRACE
from controltable.slots.passes import GrantPasses, Request

PICKUP = 1.0
TTL = 30.0
#: The hang detector: the acquire's timeout, over 5x the two pickup windows plus grace it takes.
HANG = 30.0


def test_live_waiter_behind_dead_entries_is_granted_when_their_pickups_lapse(
        ct: ControlTable, backend_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=60)
    for dead in ("dead1", "dead2"):
        assert ct.try_acquire("r", holder=dead, waiter_ttl=TTL, pickup=PICKUP) is None
    other = ControlTable(backend_url, namespace=namespace)
    got: dict[str, Any] = {}
    sleeps: list[tuple[float, float]] = []  # (when the live waiter began a sleep, how long it asked for)
    real_wait = other.wakeups.wait

    def recording_wait(keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        sleeps.append((time.monotonic(), seconds))
        return real_wait(keys, seconds, since)

    monkeypatch.setattr(other.wakeups, "wait", recording_wait)

    def live() -> None:
        try:
            lease = other.acquire("r", holder="live", timeout=HANG, waiter_ttl=TTL, pickup=PICKUP)
            got["at"] = time.monotonic()
            lease.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion
            got["error"] = exc

    t = threading.Thread(target=live, daemon=True)
    t.start()
    try:
        wait_until(lambda: ct.wait_info("r", "live") is not None and sleeps, 30,
                   "the live waiter to queue and sleep", interval=0.02)
        released = time.monotonic()
        holder.release()
        t.join(timeout=HANG + 10)
        assert "error" not in got, f"hang: the live waiter was not granted within {HANG:g} s: {got.get('error')}"
        # Every sleep it began after the release was timed by the pickup expiring ahead of it (plus
        # the grace of a waiter behind the head and the jitter), never by its refresh (TTL / 2).
        after = [seconds for at, seconds in sleeps if at >= released]
        ceiling = (PICKUP + REAP_GRACE + 0.05) * 1.25
        assert after and max(after) <= ceiling < TTL / 2, (
            f"the live waiter slept past the expiry ahead of it: asked for {after} s (ceiling {ceiling:.2f} s)")
        print(f"granted {got['at'] - released:.2f} s after the release (two pickup windows of {PICKUP:g} s)")
    finally:
        other.close()


class ServerGone(Entering):
    """Entering whose looks at the own entry fail as if the server restarted (the wait's next look)."""

    def look(self, req: Request, refresh: bool) -> Peek:
        raise DatabaseUnavailableError("test: the server restarted")


def acquire(engine: SlotEngine, holder: str) -> Lease:
    """``ControlTable.acquire``'s call of the engine (its defaults), with a timeout as hang detector."""
    return engine.waiter.acquire("r", holder=holder, slots=1, mode="shared", timeout=10, lease=60, waiter_ttl=TTL,
                                 poll_interval=0.05)


def test_failed_acquire_withdraws_its_entry(ct: ControlTable) -> None:
    """An acquire that fails while it waits (here: the database 'gone' at its next look) leaves
    no entry behind, so the next release grants the next live waiter, not the dead entry."""
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=60)
    engine = SlotEngine(ct.runtime, entering=ServerGone(GrantPasses.of(ct.runtime)))
    with pytest.raises(DatabaseUnavailableError):
        acquire(engine, "quitter")
    assert ct.wait_info("r", "quitter") is None, "the failed acquire left its queue entry behind"
    assert ct.try_acquire("r", holder="next", waiter_ttl=TTL) is None
    holder.release()
    lease = ct.try_acquire("r", holder="next", waiter_ttl=TTL)
    assert lease is not None, "the release did not grant the next live waiter"
    lease.release()


def test_withdrawal_that_fails_is_retried_on_reconnect(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=60)

    class DownAWhile(ServerGone):
        """Looks fail, and so do removals until ``up_at``: the withdrawal must be retried later."""

        up_at = time.monotonic() + 1.5

        def remove(self, req: Request, key: str, deadline: Optional[float] = None) -> int:
            if time.monotonic() < self.up_at:
                raise DatabaseUnavailableError("test: still down")
            return super().remove(req, key, deadline)

    engine = SlotEngine(ct.runtime, entering=DownAWhile(GrantPasses.of(ct.runtime)))
    with pytest.raises(DatabaseUnavailableError):
        acquire(engine, "quitter")
    assert ct.wait_info("r", "quitter") is not None  # the database was "down": the entry is still there
    wait_until(lambda: ct.wait_info("r", "quitter") is None, 30,
               "the withdrawal to be retried once the database was back", interval=0.05)
    holder.release()
