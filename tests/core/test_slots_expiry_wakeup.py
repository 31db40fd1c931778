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

from controltable import ControlTable, DatabaseUnavailableError
from controltable.slots.grants import REAP_GRACE

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
    real_wait = other._wakeups.wait

    def recording_wait(keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        sleeps.append((time.monotonic(), seconds))
        return real_wait(keys, seconds, since)

    monkeypatch.setattr(other._wakeups, "wait", recording_wait)

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


def test_failed_acquire_withdraws_its_entry(ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """An acquire that fails while it waits (here: the database 'gone' at its next look) leaves
    no entry behind, so the next release grants the next live waiter, not the dead entry."""
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=60)
    engine = ct._slots

    def gone(*_: Any, **__: Any) -> Any:
        raise DatabaseUnavailableError("test: the server restarted")

    monkeypatch.setattr(engine, "_look", gone)
    with pytest.raises(DatabaseUnavailableError):
        ct.acquire("r", holder="quitter", timeout=10, waiter_ttl=TTL)
    monkeypatch.undo()
    assert ct.wait_info("r", "quitter") is None, "the failed acquire left its queue entry behind"
    assert ct.try_acquire("r", holder="next", waiter_ttl=TTL) is None
    holder.release()
    lease = ct.try_acquire("r", holder="next", waiter_ttl=TTL)
    assert lease is not None, "the release did not grant the next live waiter"
    lease.release()


def test_withdrawal_that_fails_is_retried_on_reconnect(ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> None:
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=60)
    engine = ct._slots
    real_remove = engine._remove
    down = {"until": time.monotonic() + 1.5}

    def gone(*_: Any, **__: Any) -> Any:
        raise DatabaseUnavailableError("test: the server restarted")

    def remove_when_up(*args: Any, **kwargs: Any) -> Any:
        if time.monotonic() < down["until"]:
            raise DatabaseUnavailableError("test: still down")
        return real_remove(*args, **kwargs)

    monkeypatch.setattr(engine, "_look", gone)
    monkeypatch.setattr(engine, "_remove", remove_when_up)
    with pytest.raises(DatabaseUnavailableError):
        ct.acquire("r", holder="quitter", timeout=10, waiter_ttl=TTL)
    assert ct.wait_info("r", "quitter") is not None  # the database was "down": the entry is still there
    wait_until(lambda: ct.wait_info("r", "quitter") is None, 30,
               "the withdrawal to be retried once the database was back", interval=0.05)
    holder.release()
