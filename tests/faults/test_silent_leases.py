"""A lease holder whose network goes silent learns of the loss in time (issue 21, item 2).

The promise: a process holding a lease (slot, event batch, work item) learns that its lease is
gone no later than the lease's expiry plus :data:`~controltable.defaults.TIMEOUT_MARGIN`, with
:class:`LeaseLost` (the database could not be reached before the lease expired, so it must be
presumed taken over), not a :class:`DatabaseUnavailableError` after the kernel's TCP timeouts;
the background renewer interrupts the work within the same bound. And ``WorkList.items(timeout=)``
ends within its timeout plus the margin. The tests assert which error says so (the cause) and print
the times against the promise; a time is asserted only as a hang detector (5x the promise).
The path is silenced by the :class:`FaultProxy` of ``test_silent_network`` (``blackhole``: ACKed
and never answered; ``drop``: nothing gets through).
The times are measured from just before the grant was asked for (the lease can only expire later).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, ContextManager, Iterator

import pytest
from support import event_tables

from controltable import DatabaseUnavailableError, LeaseLost, LeaseLostInterrupt, defaults

from .test_silent_network import _ENV, Silent

pytestmark = [pytest.mark.faults]

#: The lease the holders take (seconds): short, but longer than a healthy round trip by far.
LEASE = 6.0
BOUND = LEASE + defaults.TIMEOUT_MARGIN


@pytest.fixture(params=["postgres", "mysql"])
def silent(request: pytest.FixtureRequest) -> Iterator[Silent]:
    """The shared server behind a proxy that can go silent (see ``test_silent_network``)."""
    url = os.environ.get(_ENV[str(request.param)])
    if not url:
        pytest.skip(f"{_ENV[str(request.param)]} not set")
    s = Silent(url)
    yield s
    s.close()


def _until_lost(call: Callable[[], Any], asked: float) -> tuple[LeaseLost, float]:
    """Call as a holder would (again after each DatabaseUnavailableError) until LeaseLost.

    A call that fails before the lease could have expired (the statement timeout is shorter than
    the lease) must say ``DatabaseUnavailableError``: the lease may outlive the outage.
    """
    while True:
        began = time.monotonic() - asked
        try:
            call()
        except LeaseLost as exc:
            return exc, time.monotonic() - asked
        except DatabaseUnavailableError as exc:
            took = time.monotonic() - asked
            print(f"  DatabaseUnavailableError after {took:.2f} s (lease {LEASE:g} s): {type(exc).__name__}")
            # By cause, not by when the error reached us (a loaded machine may hold the process up
            # between the product's decision and this line: a CI run saw 6.77 s): the product
            # decides after the failure, so a call begun after the lease had certainly expired
            # (``asked`` is after the renewal was sent) can never say unavailable.
            assert began < LEASE, f"a call begun {began:.1f} s after the renewal, past the lease, said: {exc}"
        else:
            raise AssertionError("the call succeeded on a silent path")


def _report(what: str, took: float, bound: float) -> None:
    """Print the figure against the promise; assert only a hang (5x the promise).

    What the promise means is asserted by cause where it is called (``LeaseLost`` saying the
    database could not be reached before the expiry, not a ``DatabaseUnavailableError`` after the
    kernel's TCP timeouts, minutes later); a loaded machine may stretch the time past the bound.
    """
    print(f"{what}: {took:.2f} s (promise {bound:.1f} s)")
    assert took <= 5 * bound, f"hang: {what} took {took:.1f} s, over 5x the promise ({bound:.1f} s)"


@pytest.mark.parametrize("mode", ["blackhole", "drop"])
@pytest.mark.parametrize("action", ["check", "renew"])
def test_a_slot_holder_learns_of_the_loss_by_the_expiry(silent: Silent, mode: str, action: str) -> None:
    asked = time.monotonic()
    lease = silent.ct.acquire("r", holder="me", timeout=5, lease=LEASE)
    lease.renew()  # a renewal that goes through (the estimate moves on with it)
    asked = time.monotonic()  # conservative: the renewal was sent after this
    silent.proxy.silence(mode)
    lost, took = _until_lost(getattr(lease, action), asked)
    assert "could not be reached before the lease expired" in str(lost)
    assert took >= LEASE - 0.5, f"LeaseLost after {took:.1f} s: before the lease could have expired"
    _report(f"slot {action}() on a {mode} path, from the grant", took, BOUND)
    silent.direct.release("r", "me")


@pytest.mark.parametrize("mode", ["blackhole", "drop"])
def test_a_slot_renewal_before_the_expiry_stays_unavailable(silent: Silent, mode: str) -> None:
    """Before the expiry a failure is no loss: DatabaseUnavailableError, which the renewer retries."""
    lease = silent.ct.acquire("r", holder="me", timeout=5, lease=60)
    silent.proxy.silence(mode)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError) as info:
        lease.renew()
    took = time.monotonic() - started
    assert not isinstance(info.value, LeaseLost)
    _report(f"slot renew() on a {mode} path, lease 60 s, from the call", took, 4.0 + defaults.TIMEOUT_MARGIN)
    silent.direct.release("r", "me")


def _interrupted(silent: Silent, block: ContextManager[Any], mode: str, asked: float) -> float:
    """Seconds from ``asked`` until work inside ``block`` (holding a renewed lease) was interrupted,
    the path to the database silenced (``mode``) as the work began."""
    interrupted = None
    with pytest.raises(LeaseLost), block:
        silent.proxy.silence(mode)
        try:
            while time.monotonic() - asked < 60:
                time.sleep(0.05)
        except LeaseLostInterrupt:
            interrupted = time.monotonic() - asked
            raise
    assert interrupted is not None, "the work was never interrupted"
    return interrupted


def _learns_of_the_loss(silent: Silent, held: Any, asked: float) -> float:
    """Seconds from ``asked`` until ``held`` (a batch or an item) renewing on a blackholed path hears
    ``LeaseLost``: it stays ours within the lease, and a check after the loss says so too."""
    silent.proxy.silence("blackhole")
    held.check()  # within the lease: still ours
    lost, took = _until_lost(held.renew, asked)
    assert "could not be reached before the lease expired" in str(lost)
    with pytest.raises(LeaseLost):
        held.check()
    return took


def test_the_renewer_interrupts_the_work_by_the_expiry(silent: Silent) -> None:
    asked = time.monotonic()
    interrupted = _interrupted(silent, silent.ct.slot("r", holder="me", timeout=5, lease=LEASE), "blackhole", asked)
    _report("slot work interrupted by the renewer, from the grant", interrupted, BOUND)
    silent.direct.release("r", "me")


def _claimed(silent: Silent, n: int) -> tuple[Any, float]:
    """A batch of all ``n`` rows of a new event table, claimed through the proxy, and when it was asked for."""
    table = event_tables.create(silent.direct, n)
    silent.tables.append(table.name)
    silent.direct.events(table.name, key="id").prepare()
    events = silent.ct.events(table.name, key="id")
    asked = time.monotonic()
    batch = events.claim(n, owner="me", lease=LEASE)
    assert batch is not None and len(batch) == n
    return batch, asked


def test_a_batch_holder_learns_of_the_loss_by_the_expiry(silent: Silent) -> None:
    batch, asked = _claimed(silent, 3)
    _report("batch renew() on a blackhole path, from the claim", _learns_of_the_loss(silent, batch, asked), BOUND)


def test_a_batch_renewer_interrupts_the_work_by_the_expiry(silent: Silent) -> None:
    batch, asked = _claimed(silent, 2)
    interrupted = _interrupted(silent, batch.renewing(), "drop", asked)
    _report("batch work interrupted by the renewer, from the claim", interrupted, BOUND)


def _worklist(silent: Silent, n: int) -> str:
    name = f"wl_{uuid.uuid4().hex[:8]}"
    silent.direct.worklist(name).populate([f"job-{i}" for i in range(n)], order=1)
    return name


def test_an_item_holder_learns_of_the_loss_by_the_expiry(silent: Silent) -> None:
    name = _worklist(silent, 1)
    wl = silent.ct.worklist(name)
    asked = time.monotonic()
    item = wl.allocate("me", lease=LEASE)
    assert item is not None
    _report("item renew() on a blackhole path, from the allocation", _learns_of_the_loss(silent, item, asked), BOUND)
    silent.direct.worklist(name).drop()


@pytest.mark.parametrize("mode", ["blackhole", "drop"])
def test_worklist_items_with_a_timeout_returns_in_time(silent: Silent, mode: str) -> None:
    name = _worklist(silent, 1)
    assert silent.direct.worklist(name).allocate("other", lease=60) is not None  # the order is busy
    wl = silent.ct.worklist(name)
    assert not wl.status().finished  # a live pooled connection
    silent.proxy.silence(mode)
    timeout = 3.0
    started = time.monotonic()
    try:
        assert list(wl.items("me", timeout=timeout)) == []
    except DatabaseUnavailableError:
        pass
    took = time.monotonic() - started
    _report(f"items(timeout={timeout:g}) on a {mode} path, from the call", took, timeout + defaults.TIMEOUT_MARGIN)
    silent.direct.worklist(name).drop()
