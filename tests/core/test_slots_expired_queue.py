"""Issue 33, hole 2: a free slot reaches the first live waiter whatever lies expired before it.

Callers that queued and died (never looking again) leave expired entries at the head of the queue.
The grant pass reads a page of ``capacity + 2`` waiters; before, a round that reaped that page and
granted nobody ended the pass, and the live waiter behind more than a page of them was never
granted (its own look counted the dead entries ahead of it, so it never ran a pass itself either):
a blocking ``acquire(timeout=60)`` raised ``AcquireTimeout``.

Each test synchronises on the database's own view (``status()`` shows the entries expired), and
checks what granted the live waiter: the release's own pass (status read right after the release
returns, before the waiter looks again), or the waiter's first look (it sees itself at the head).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import update
from support.live import wait_until

from controltable import ControlTable
from controltable.slots import passes

#: Hang detectors (the entries are expired once set so; a grant is immediate).
EXPIRY_HANG = 30.0
ACQUIRE_HANG = 30.0


def _queue_dead(ct: ControlTable, n: int) -> None:
    """``n`` callers that queued and died long ago; returns once the database clock shows every
    entry expired.

    Each queues with a TTL that outlasts the queueing of all ``n`` (a short one could lapse while
    the later ones queue on a loaded machine, and their passes would reap it: fewer dead entries
    than the test means), then their entries are set to have run out a minute ago, as the entries
    of processes that died that long ago would have."""
    for i in range(n):
        assert ct.try_acquire("r", holder=f"dead{i}", waiter_ttl=60) is None
    q = ct.tables.request
    with ct.engine.begin() as conn:
        conn.execute(update(q).where(q.c.namespace == ct.namespace, q.c.resource == "r",
                                     q.c.holder.startswith("dead")).values(expires_at=q.c.expires_at - 120))
    wait_until(lambda: all(w.expired for w in _waiters(ct) if w.holder.startswith("dead")), EXPIRY_HANG,
               "the dead callers' queue entries to expire (a hang)")
    assert sum(1 for w in _waiters(ct) if w.holder.startswith("dead")) == n


def _waiters(ct: ControlTable) -> list[Any]:
    (st,) = ct.status(["r"])
    return list(st.waiters)


def _holders(ct: ControlTable) -> list[str]:
    (st,) = ct.status(["r"])
    return [h.holder for h in st.holders]


@pytest.mark.parametrize("capacity,dead", [(1, 8), (2, 13)])
def test_the_release_grants_the_live_waiter_behind_more_than_a_page_of_expired_entries(
        ct: ControlTable, capacity: int, dead: int) -> None:
    ct.set_capacity("r", capacity)
    held = [ct.acquire("r", holder=f"h{i}", lease=120) for i in range(capacity)]
    _queue_dead(ct, dead)  # more than the capacity + 2 a pass reads per page
    assert ct.try_acquire("r", holder="A", waiter_ttl=60) is None
    held[0].release()
    # A has made no call since it queued: only the release's grant pass can have granted it.
    assert "A" in _holders(ct), f"the release did not grant the live waiter behind {dead} expired entries"
    assert not _waiters(ct), "the expired entries before the live waiter were reaped"
    lease = ct.try_acquire("r", holder="A", waiter_ttl=60)
    assert lease is not None and lease.token > max(h.token for h in held)
    lease.release()
    for h in held[1:]:
        h.release()


def test_a_blocking_acquire_behind_expired_entries_is_granted_by_the_release(
        ct: ControlTable, backend_url: str, namespace: str) -> None:
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=120)
    _queue_dead(ct, 8)
    other = ControlTable(backend_url, namespace=namespace)
    got: dict[str, Any] = {}

    def waiter() -> None:
        try:
            got["lease"] = other.acquire("r", holder="A", timeout=ACQUIRE_HANG, waiter_ttl=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion
            got["error"] = exc

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    try:
        wait_until(lambda: any(w.holder == "A" and not w.expired for w in _waiters(ct)), EXPIRY_HANG,
                   "the live waiter to queue (a hang)")
        holder.release()
        assert "A" in _holders(ct), "the release did not grant the live waiter"
        t.join(ACQUIRE_HANG + 10)
        assert not t.is_alive(), "acquire hung past its own timeout"
        assert "error" not in got, f"the live waiter was not granted: {got.get('error')!r}"
        assert got["lease"].token > holder.token
        got["lease"].release()
    finally:
        other.close()


def test_a_live_waiter_behind_more_expired_entries_than_one_pass_reaps_runs_the_next_pass(
        ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass reaps at most ``MAX_ROUNDS`` pages (bounded work per transaction); here one page of
    3: A's own entering reaps 3 of the 8, the release 3 more. The live waiter's own look skips the
    2 expired entries left: it sees itself at the head of a free queue and runs the pass that
    grants it, on that very look."""
    monkeypatch.setattr(passes, "MAX_ROUNDS", 1)
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="h", lease=120)
    _queue_dead(ct, 8)
    assert ct.try_acquire("r", holder="A", waiter_ttl=60) is None
    holder.release()
    left = [w.holder for w in _waiters(ct) if w.holder.startswith("dead")]
    assert len(left) == 8 - 2 * 3, f"two passes of one page of three each, left {left}"
    assert "A" not in _holders(ct)
    lease = ct.try_acquire("r", holder="A", waiter_ttl=60)
    assert lease is not None, "the live waiter did not see itself at the head of the free queue"
    lease.release()
