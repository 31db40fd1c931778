"""Push wake-ups (PostgreSQL LISTEN/NOTIFY) with polling as the fallback."""

from __future__ import annotations

import threading
import time

import pytest

from controltable import ControlTable

pytestmark = pytest.mark.backends("postgres")


def wait_in_thread(ct: ControlTable, holder: str, granted_at: list[float],
                   received: list[int] | None = None) -> threading.Thread:
    def run() -> None:
        lease = ct.acquire("r", holder=holder, timeout=30)
        granted_at.append(time.monotonic())
        if received is not None:
            received.append(ct._wakeups.received)  # before our own release notifies ourselves
        lease.release()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_waiter_wakes_on_notify(backend_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release's notification wakes the waiting acquire, which then finds its grant.

    Proven by what ended the waiter's last sleep (a wake-up, not its timeout: with push its
    fallback poll is seconds apart), not by the handoff's time alone: on a loaded machine the
    release itself may take a while (a CI run saw 3.4 s from the call to the grant, with the
    notification received). The handoff is still bounded, from the release's return."""
    holder_ct = ControlTable(backend_url, namespace=namespace)
    holder_ct.install()
    holder_ct.set_capacity("r", 1)
    waiter_ct = ControlTable(backend_url, namespace=namespace)
    waits: list[tuple[float, bool]] = []  # (when the waiter's sleep ended, whether a wake-up ended it)
    real_wait = waiter_ct._wakeups.wait

    def recording_wait(keys: list[str], seconds: float, since: tuple[int, ...] | None = None) -> bool:
        woken = real_wait(keys, seconds, since)
        waits.append((time.monotonic(), woken))
        return woken

    monkeypatch.setattr(waiter_ct._wakeups, "wait", recording_wait)
    lease = holder_ct.acquire("r", holder="holder", timeout=0)
    granted: list[float] = []
    t = wait_in_thread(waiter_ct, "waiter", granted)
    time.sleep(3.0)  # long enough for the waiter's fallback poll interval to reach its 1 s ceiling
    assert waiter_ct._wakeups.active
    before = waiter_ct._wakeups.received
    released = time.monotonic()
    lease.release()
    returned = time.monotonic()
    t.join(30)
    assert granted, "waiter was never granted"
    assert waiter_ct._wakeups.received > before, "no notification arrived"
    timeline = (f"release took {returned - released:.3f} s, granted {granted[0] - released:.3f} s after the "
                f"call; the waiter's sleeps ended at {[(round(at - released, 3), woken) for at, woken in waits]}")
    ended = [woken for at, woken in waits if at >= released and at <= granted[0]]
    assert ended and ended[-1], f"the waiter's last sleep was not ended by the notification: {timeline}"
    assert granted[0] - returned < 1.0, f"the waiter was granted late: {timeline}"
    holder_ct.close()
    waiter_ct.close()


def test_lost_notification_still_ends_in_a_grant(backend_url: str, namespace: str) -> None:
    holder_ct = ControlTable(backend_url, namespace=namespace)
    holder_ct.install()
    holder_ct.set_capacity("r", 1)
    holder_ct._wakeups.enabled = False  # this process never sends notifications: they are "lost"
    waiter_ct = ControlTable(backend_url, namespace=namespace)
    lease = holder_ct.acquire("r", holder="holder", timeout=0)
    granted: list[float] = []
    received: list[int] = []
    t = wait_in_thread(waiter_ct, "waiter", granted, received)
    time.sleep(2.0)
    before = waiter_ct._wakeups.received
    lease.release()
    released = time.monotonic()  # from the release's return: its own time is not the waiter's
    t.join(30)
    assert granted and received == [before], "no notification may have woken the waiter"
    assert granted[0] - released < 2.5, "polling fallback must still grant within its interval"
    holder_ct.close()
    waiter_ct.close()


def test_worklist_allocator_wakes_when_the_order_finishes(backend_url: str, namespace: str) -> None:
    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    wl = ct.worklist("wake")
    wl.populate([{"n": 1}], order=100)
    wl.populate([{"n": 2}], order=200)
    first = wl.allocate("a")
    assert first is not None
    other = ControlTable(backend_url, namespace=namespace)
    got: list[tuple[float, int]] = []

    def allocate() -> None:
        for item in other.worklist("wake").items("b", poll_interval=5.0, timeout=20):
            got.append((time.monotonic(), item.order))
            item.complete()

    t = threading.Thread(target=allocate)
    t.start()
    time.sleep(1.0)
    first.complete()
    done = time.monotonic()  # from the completion's return: its own time is not the allocator's
    t.join(30)
    assert got and got[0][1] == 200
    assert got[0][0] - done < 1.0, "the allocator slept through the notification"
    ct.close()
    other.close()


def test_waiting_claim_wakes_when_a_producer_notifies(backend_url: str, namespace: str) -> None:
    from sqlalchemy import Column, Integer, MetaData, Table

    ct = ControlTable(backend_url, namespace=namespace)
    md = MetaData()
    t = Table(f"ev_{namespace[-8:]}", md, Column("id", Integer, primary_key=True))
    md.create_all(ct.engine)
    try:
        ev = ct.events(t.name, key="id")
        ev.prepare()
        got: list[tuple[float, int]] = []

        def claimer() -> None:
            other = ControlTable(backend_url, namespace=namespace)
            batch = other.events(t.name, key="id").claim(10, owner="waiter", wait=30, max_poll_interval=10)
            got.append((time.monotonic(), len(batch) if batch else 0))
            if batch:
                batch.complete()
            other.close()

        th = threading.Thread(target=claimer)
        th.start()
        time.sleep(3.0)  # the claimer's back-off has grown to seconds by now
        assert not got
        with ct.engine.begin() as conn:
            conn.execute(t.insert(), [{"id": i} for i in range(1, 6)])
        ev.notify()
        produced = time.monotonic()  # from the notification's return: its own time is not the claimer's
        th.join(30)
        assert got and got[0][1] == 5
        assert got[0][0] - produced < 1.0, "the waiting claim slept through the producer's notification"
    finally:
        md.drop_all(ct.engine)
        ct.close()


@pytest.mark.backends("sqlite", "mysql")
def test_waiting_claim_polls_where_there_is_no_push(backend_url: str, namespace: str) -> None:
    from sqlalchemy import Column, Integer, MetaData, Table

    ct = ControlTable(backend_url, namespace=namespace)
    ct.install()
    md = MetaData()
    t = Table(f"ev_{namespace[-8:]}", md, Column("id", Integer, primary_key=True))
    md.create_all(ct.engine)
    try:
        ev = ct.events(t.name, key="id")
        ev.prepare()
        t0 = time.monotonic()
        assert ev.claim(5, owner="w", wait=0.5) is None
        assert time.monotonic() - t0 >= 0.45
        with ct.engine.begin() as conn:
            conn.execute(t.insert(), [{"id": 1}])
        batch = ev.claim(5, owner="w", wait=5)
        assert batch is not None and batch.keys == [1]
        batch.complete()
    finally:
        md.drop_all(ct.engine)
        ct.close()
