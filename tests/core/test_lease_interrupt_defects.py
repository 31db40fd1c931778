"""Defects found in review of the lease-loss interrupt, each pinned by the test that showed it.

Times here are hang detectors only (several times the goal), never assertions of speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from support.live import wait_until

from controltable import ControlTable, LeaseLost, LeaseLostInterrupt
from controltable import interrupt as interrupts
from controltable.renewal import BackgroundRenewal

#: Hang detector for the renewer's first look at ``alive()`` (goal: one orphan-check interval).
HANG = 15.0


def holders(ct: ControlTable, resource: str) -> list[str]:
    return [e.holder for st in ct.status([resource]) for e in st.holders]


def test_release_after_renewal_stopped_on_purpose_gives_the_slot_back(ct: ControlTable) -> None:
    """``alive()`` false stops renewal and records a loss, but the rows are still live: ``release()``
    must still give them back (and then report the stop), not leave the slot held until expiry."""
    ct.set_capacity("r", 1)
    lease = ct.acquire("r", holder="a", lease=60)
    lease.start_renewing(alive=lambda: False)
    wait_until(lambda: lease.lost is not None, HANG, "the renewer to stop (a hang)")
    assert lease.lost is not None and not lease.lost.gone
    assert holders(ct, "r") == ["a"]
    with pytest.raises(LeaseLost) as info:
        lease.release()
    assert info.value is lease.lost
    assert holders(ct, "r") == [], "the slot stays held until its lease expires"


#: Run in a child process: forces the renewer's "count the send, then send it" to be split by the
#: handler of an earlier send (the signal is held blocked meanwhile, so the ordering is certain). A
#: signal then taken as foreign goes to SIGUSR1's default action, which ends the child.
FORCED_ORDER = r"""
import signal, sys
from controltable import interrupt as interrupts
from controltable.errors import LeaseLost, LeaseLostInterrupt
from controltable.renewal import BackgroundRenewal

class Held(BackgroundRenewal):
    def _renew_interval(self):
        return 300.0

unblock_inside = sys.argv[1] == "inside"
signum = interrupts.interrupt_signal()
real_kill = signal.pthread_kill
sends = []

def kill(thread, number):
    sends.append(number)
    if len(sends) == 2:  # the first send's handler runs between the second's count and its kill
        try:
            interrupts._handler(number, None)
        except LeaseLostInterrupt:
            pass
    real_kill(thread, number)

signal.pthread_kill = kill
item = Held()
signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
try:
    with item.interrupting(True):
        item.lost = LeaseLost("test: taken over")
        block = item._arming
        with interrupts._GUARD:
            block.sent = True
            assert interrupts._send(block)
        with interrupts._GUARD:
            interrupts._send(block)
        if unblock_inside:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
            sum(range(1000))  # the pending signal's handler runs here
except LeaseLostInterrupt as exc:
    assert exc.__cause__ is item.lost
else:
    raise AssertionError("the block's exit did not report the loss")
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
assert len(sends) == 2, sends
assert interrupts.main_thread_blocks() == 0
print("survived")
"""


@pytest.mark.parametrize("where", ["inside", "at_exit"])
def test_a_signal_of_ours_is_never_taken_for_a_foreign_one(where: str) -> None:
    """Two sends, the first one's handler run between the second's bookkeeping and its signal: the
    second signal must still be recognised as ours, in the block (handler) and when the last block
    disarms (``_uninstall``), never passed to SIGUSR1's default action (which ended the process)."""
    proc = subprocess.run([sys.executable, "-c", FORCED_ORDER, where], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert proc.returncode == 0 and "survived" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)


def test_a_block_that_fell_back_to_the_async_exception_still_leaves_the_signal_list() -> None:
    """The work replaced our handler inside the block, so the interrupt came as an asynchronous
    exception: the block must still leave the main thread's list, so the handler is uninstalled and
    the next block is interrupted by the signal again (not by the best-effort fallback for good)."""
    signum = interrupts.interrupt_signal()
    before = signal.getsignal(signum)
    item = Held()
    # An asynchronous exception lands in whatever bytecode the main thread runs next: sent while the
    # main thread was still inside ``Thread.start()`` it surfaced as that method's KeyError (CI, stop
    # 39). So the sender waits until the main thread has set this plain flag (no lock, no call into
    # threading) and from then on runs only the polling loop below.
    polling: list[bool] = []

    def send() -> None:
        wait_until(lambda: polling, HANG, "the main thread to start polling (a hang)", interval=0.005)
        interrupts.interrupt(block)

    with pytest.raises(LeaseLostInterrupt) as info, item.interrupting(True):
        block = item._arming
        assert block is not None and block.by_signal
        signal.signal(signum, lambda number, frame: None)  # the work takes the signal for itself
        item.lost = LeaseLost("test: taken over")
        threading.Thread(target=send, daemon=True).start()
        polling.append(True)
        wait_until(lambda: False, HANG, "the asynchronous exception (a hang)", interval=0.01)
    assert isinstance(info.value.__context__, LeaseLostInterrupt), "the asynchronous exception never came"
    assert not block.by_signal, "the interrupt did not take the fallback path"
    signal.signal(signum, before)
    assert interrupts.main_thread_blocks() == 0
    again = Held()
    with again.interrupting(True):
        assert again._arming is not None and again._arming.by_signal, "the next block fell back too"
    assert interrupts.main_thread_blocks() == 0
    assert signal.getsignal(signum) is before


class Held(BackgroundRenewal):
    """A lease holder with no database behind it: only the interrupt's own bookkeeping is exercised."""

    def _renew_interval(self) -> float:
        return 300.0


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_decision_to_stop_passes_through_an_interrupted_block(stop: type[BaseException]) -> None:
    """After an interrupt was sent, an ``Exception`` becomes ``LeaseLostInterrupt``, but Ctrl-C, an exit
    or an orchestrator's cancellation (``BaseException`` only) must reach the caller as itself."""
    item = Held()
    loss = LeaseLost("test: taken over")
    with pytest.raises(stop) as info, item.interrupting(True):
        block = item._arming
        assert block is not None
        item.lost = loss
        with interrupts._GUARD:
            block.sent = block.delivered = True  # as if sent: the handler then leaves it alone
        raise stop()
    assert type(info.value) is stop
    assert getattr(info.value, "lease_lost", None) is loss


#: Run in a child process (a fresh interpreter: tracing is what places the handler, and an earlier
#: test's asynchronous exception must not be around): the handler runs as ``ct.slot()``'s exit
#: begins, as a signal arriving there would run it.
EXIT_RACE = r"""
import sys
from controltable import ControlTable, LeaseLost, LeaseLostInterrupt
from controltable import interrupt as interrupts

ct = ControlTable(sys.argv[1], namespace=sys.argv[2])
block_cm = ct.slot("r", holder="a", lease=60)
exit_code = type(block_cm).__exit__.__code__
lease = block_cm.__enter__()
block = lease._arming
assert block is not None and block.by_signal
lease.lost = LeaseLost("test: renewal stopped", gone=False)
with interrupts._GUARD:
    block.sent = True

def tracer(frame, event, arg):
    if event == "call" and frame.f_code is exit_code:
        sys.settrace(None)
        interrupts._handler(interrupts.interrupt_signal(), frame)  # the signal lands here

raised = []
sys.settrace(tracer)
try:
    block_cm.__exit__(None, None, None)
except LeaseLostInterrupt as exc:
    raised.append(exc)
finally:
    sys.settrace(None)
assert raised and raised[0].__cause__ is lease.lost, ("the exit did not report the loss", raised)
assert interrupts.main_thread_blocks() == 0, "the block is still armed after its exit"
print("armed blocks: 0")
"""


def test_an_interrupt_as_the_slot_block_exits_still_releases(ct: ControlTable, backend_url: str,
                                                             namespace: str) -> None:
    """The handler runs as ``ct.slot()``'s exit begins (the loss came as the work finished). The
    exit must report it and give the slot back there and then: with a generator-based context
    manager it raised in contextlib's exit, before the generator resumed, and the release waited
    for the generator's finalisation (the slot stayed held, the block armed)."""
    ct.set_capacity("r", 1)
    proc = subprocess.run([sys.executable, "-c", EXIT_RACE, backend_url, namespace], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0 and "armed blocks: 0" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
    assert holders(ct, "r") == [], "the slot was not given back by the exit"
