"""Work is interrupted when its lease is gone: slot leases, event batches and work items.

The lease is taken away from another connection (released by an operator, reset, reaped and
taken over) while the work runs in a ``with`` block; the background renewer notices at its next
tick and raises ``LeaseLostInterrupt`` in the working thread. Asserted by cause: the interrupt
came after the take and names the lost lease; the work itself is the hang detector (it runs
WORK_SECONDS, over 5x the goal, unless interrupted). The goal (one renewal interval plus the
renewal's round trip) is measured by ``benchmarks/run --only goals``.
"""

from __future__ import annotations

import _thread
import logging
import threading
import time
from typing import Any, Callable

import pytest
from support.live import wait_until

from controltable import ControlTable, DatabaseUnavailableError, LeaseLost, LeaseLostInterrupt

LEASE = 1.5
INTERVAL = LEASE / 3
#: The documented goal: one renewal interval plus the renewal's round trip and the delivery.
GOAL = INTERVAL + 0.5
#: The hang detector: how long the work runs unless interrupted (over 5x any goal here).
WORK_SECONDS = 15.0


def work_until_interrupted(taken: dict[str, float], seconds: float = WORK_SECONDS) -> None:
    """Busy work in short Python steps (an async exception lands between bytecodes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    raise AssertionError(f"hang: the work ran {seconds} s (over 5x the goal) and was never interrupted "
                         f"(taken at {taken})")


def take_later(delay: float, take: Callable[[], None], taken: dict[str, float]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        # Stamped before the take: once it commits, the renewer may interrupt the owner before
        # this thread runs again (a loaded machine), and the bound then still holds from here.
        taken["at"] = time.monotonic()
        take()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def assert_interrupted_by_the_take(raised: BaseException, taken: dict[str, float], caught_at: float,
                                   target: Any) -> None:
    """The interrupt was the take's doing: it came after the take began, and the renewer recorded
    the loss on the interrupted object (so a renewal found the lease gone: nothing else raised)."""
    assert isinstance(raised, LeaseLostInterrupt) and isinstance(raised, LeaseLost), raised
    assert "at" in taken, "interrupted before the lease was taken (before the take began)"
    assert caught_at >= taken["at"]
    assert isinstance(target.lost, LeaseLost), f"interrupted without a recorded loss: {raised}"
    print(f"interrupted {caught_at - taken['at']:.2f} s after the lease was taken (goal {GOAL:g} s)")


def test_slot_work_is_interrupted_when_the_lease_is_taken(ct: ControlTable, backend_url: str, namespace: str) -> None:
    ct.set_capacity("r", 1)
    other = ControlTable(backend_url, namespace=namespace)
    taken: dict[str, float] = {}
    try:
        with pytest.raises(LeaseLostInterrupt) as info, ct.slot("r", holder="a", lease=LEASE) as lease:
            take_later(0.3, lambda: other.release("r", "a"), taken)
            work_until_interrupted(taken)
        assert_interrupted_by_the_take(info.value, taken, time.monotonic(), lease)
        # the slot is free for the next holder, and this process's state is clean
        nxt = other.acquire("r", holder="b", timeout=5)
        nxt.release()
    finally:
        other.close()


def test_work_item_is_interrupted_when_reset_elsewhere(ct: ControlTable, backend_url: str, namespace: str) -> None:
    wl = ct.worklist("interrupt")
    wl.populate([{"n": 1}])
    item = wl.allocate("w", lease=LEASE)
    assert item is not None
    other = ControlTable(backend_url, namespace=namespace)
    taken: dict[str, float] = {}
    try:
        with pytest.raises(LeaseLostInterrupt) as info, item.renewing():
            take_later(0.3, lambda: other.worklist("interrupt").reset(), taken)
            work_until_interrupted(taken)
        assert_interrupted_by_the_take(info.value, taken, time.monotonic(), item)
        assert item._renewer is None
    finally:
        other.close()


def test_batch_is_interrupted_when_taken_over(ct: ControlTable, backend_url: str, namespace: str,
                                               event_table: Callable[..., Any]) -> None:
    ev = event_table(2)
    batch = ev.claim(2, owner="a", lease=LEASE)
    assert batch is not None
    taken: dict[str, float] = {}
    with pytest.raises(LeaseLostInterrupt) as info, batch.renewing():
        take_later(0.3, ev.reset, taken)
        work_until_interrupted(taken)
    assert_interrupted_by_the_take(info.value, taken, time.monotonic(), batch)


def test_expiry_while_renewals_fail_interrupts(ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database unreachable for the whole lease: the lease is taken as expired at its end."""
    wl = ct.worklist("expire")
    wl.populate([{"n": 1}])
    item = wl.allocate("w", lease=1.0)
    assert item is not None

    def unreachable(*_: Any) -> float:
        raise DatabaseUnavailableError("test: the database is unreachable")

    monkeypatch.setattr(wl, "_renew", unreachable)
    started = time.monotonic()
    with pytest.raises(LeaseLostInterrupt) as info, item.renewing():
        work_until_interrupted({})
    took = time.monotonic() - started
    # By cause: the expiry (not a take), and never before the lease could have run out (a lower
    # bound: load only makes it later). How soon after the expiry is the hang detector's concern.
    assert "the lease expired" in str(info.value), info.value
    assert took >= 0.9, f"interrupted after {took:.2f} s, before the 1 s lease could have expired"


def test_opt_out_lets_the_work_finish_and_reports_the_loss_at_exit(ct: ControlTable, backend_url: str,
                                                                    namespace: str) -> None:
    ct.set_capacity("r", 1)
    other = ControlTable(backend_url, namespace=namespace)
    try:
        with pytest.raises(LeaseLost) as info, ct.slot("r", holder="a", lease=LEASE, interrupt=False) as lease:
            other.release("r", "a")
            wait_until(lambda: lease.lost is not None, 5 * WORK_SECONDS,
                       "the renewer to notice the loss (hang detector)", interval=0.01)
            time.sleep(0.3)  # the work runs on: nothing is raised inside the block
            finished = True
        assert finished and not isinstance(info.value, LeaseLostInterrupt)
    finally:
        other.close()


def test_no_interrupt_after_the_block_exited(ct: ControlTable, backend_url: str, namespace: str) -> None:
    wl = ct.worklist("after")
    wl.populate([{"n": 1}])
    item = wl.allocate("w", lease=LEASE)
    assert item is not None
    with item.renewing():
        pass
    # The block is left: the lease is lost now (renewal stopped, taken elsewhere), and a renewer
    # started without a block never interrupts.
    other = ControlTable(backend_url, namespace=namespace)
    try:
        item.start_renewing()
        other.worklist("after").reset()
        wait_until(lambda: item.lost is not None, 5 * WORK_SECONDS,
                   "the renewer to notice the loss (hang detector)", interval=0.01)
        assert isinstance(item.lost, LeaseLost)
        time.sleep(0.3)  # an interrupt, had one been sent, would land in this sleep's loop
        for _ in range(30):
            time.sleep(0.01)
    finally:
        other.close()


def test_interrupt_cancelled_when_the_block_leaves_first(ct: ControlTable) -> None:
    """An interrupt scheduled while the owner is on its way out never lands after the block."""
    wl = ct.worklist("race")
    wl.populate([{"n": 1}])
    item = wl.allocate("w", lease=30)
    assert item is not None
    for _ in range(200):
        # The interrupter is started before arming and waits on a raw lock: releasing it is one
        # C call, so the interrupt can land only in this test's own lines, never inside
        # ``Thread.start`` (an exception there breaks threading's own bookkeeping: KeyError in
        # ``_limbo``, as one CI run saw).
        go = _thread.allocate_lock()
        go.acquire()

        def interrupter(go: Any = go) -> None:
            with go:
                item._interrupt_owner()

        t = threading.Thread(target=interrupter)
        t.start()
        armed = item._arm()
        assert armed
        item.lost = LeaseLost("test")
        try:
            go.release()
            item._disarm()
        except LeaseLostInterrupt:
            item._disarm()  # landed before the disarm: still inside the block
        t.join()
        item.lost = None
        for _ in range(100):  # would raise here if an undelivered interrupt survived the disarm
            pass
    item.complete()


def test_renewal_let_go_interrupts_the_work(ct: ControlTable) -> None:
    """The renewer lets the lease go (``alive()`` false, as for an orphaned process): the work
    must stop too, since the lease will run out under it. Checked every ORPHAN_CHECK_INTERVAL."""
    from controltable.defaults import ORPHAN_CHECK_INTERVAL

    wl = ct.worklist("let_go")
    wl.populate([{"n": 1}])
    item = wl.allocate("w", lease=30)
    assert item is not None
    ended = threading.Event()
    with pytest.raises(LeaseLostInterrupt) as info, item.renewing(alive=lambda: not ended.is_set()):
        take_later(0.2, ended.set, {})
        work_until_interrupted({}, seconds=max(WORK_SECONDS, 5 * (0.2 + ORPHAN_CHECK_INTERVAL + 0.5)))
    # By cause: the owner's alive() turned false first, and the interrupt says so (the lease is
    # 30 s, so neither an expiry nor a renewal could have ended the work within the detector).
    assert ended.is_set(), "interrupted before the owner said the work ended"
    assert "owner said the work ended" in str(info.value)


class _BrokenConsole(logging.Handler):
    """A handler that raises as rich's console does when its pipe is broken (Prefect installs one):
    the case of a process whose supervisor, reading its output, was killed."""

    def emit(self, record: logging.LogRecord) -> None:
        raise SystemExit(1)


def test_a_log_handler_that_raises_does_not_stop_the_interrupt(ct: ControlTable, backend_url: str,
                                                               namespace: str) -> None:
    """The renewer logs the loss, then records it and interrupts: a handler raising (even SystemExit)
    must not end its thread first, or the work runs on past its lease."""
    ct.set_capacity("r", 1)
    other = ControlTable(backend_url, namespace=namespace)
    handler = _BrokenConsole()
    logging.getLogger("controltable").addHandler(handler)
    taken: dict[str, float] = {}
    try:
        with pytest.raises(LeaseLostInterrupt) as info, ct.slot("r", holder="a", lease=LEASE) as lease:
            take_later(0.3, lambda: other.release("r", "a"), taken)
            work_until_interrupted(taken)
        assert_interrupted_by_the_take(info.value, taken, time.monotonic(), lease)
    finally:
        logging.getLogger("controltable").removeHandler(handler)
        other.close()
