"""controltable's background threads never take a stop signal meant for the main thread.

A SIGTERM sent while the CLI's main thread blocks the stop signals (to put its handlers back after
the queue) went to a renewer or watchdog thread instead: Python noted it there and then dropped it
with "Signal 15 ignored due to race condition", and `controltable acquire` exited 0 with its grant
held (1 in 6 runs of test_cli_queue_signals under load). Threads started through
``controltable.threads.start`` block the stop signals, so such a signal stays pending for the
process, where the main thread collects it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Callable

import pytest

from controltable import threads

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")


def _blocked_in(thread: threading.Thread) -> set[int]:
    """The signals ``thread`` blocks, read from the kernel (``SigBlk`` of /proc/self/task/<tid>/status)."""
    status = f"/proc/self/task/{thread.native_id}/status"
    if not os.path.exists(status):
        pytest.skip("needs Linux's /proc to read a thread's signal mask")
    with open(status) as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("SigBlk:")), 16)
    return {s for s in range(1, 65) if mask & (1 << (s - 1))}


def _mask_of_thread(start: Callable[[threading.Thread], None]) -> set[int]:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    start(worker)
    try:
        return _blocked_in(worker)
    finally:
        stop.set()
        worker.join(10)


def test_background_threads_block_the_stop_signals() -> None:
    assert _mask_of_thread(threads.start) >= threads.STOP_SIGNALS
    assert not threads.STOP_SIGNALS & _mask_of_thread(lambda t: t.start()), "the hazard: a plain thread takes them"
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == signal.pthread_sigmask(signal.SIG_BLOCK, set()), \
        "the caller's mask is unchanged"


SCRIPT = """
import os, signal, sys, threading
from controltable import threads
seen = []
stop = threading.Event()
worker = threading.Thread(target=stop.wait, daemon=True)
(threads.start if sys.argv[1] == "threads.start" else threading.Thread.start)(worker)
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.kill(os.getpid(), signal.SIGTERM)
got = signal.sigtimedwait([signal.SIGTERM], 10)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
stop.set()
worker.join(10)
print("main" if got is not None else "elsewhere", seen)
"""


def test_a_signal_sent_while_the_main_thread_blocks_it_waits_for_the_main_thread() -> None:
    """What the CLI relies on, in a process of its own (pytest's timeout thread would take the signal):
    with a controltable thread running, a SIGTERM sent while the main thread blocks it is collected
    there (sigtimedwait) and no handler ran it. (With a plain thread the kernel may hand it to that
    thread, a race the main thread usually wins: test_background_threads_block_the_stop_signals
    checks the masks that close it.)"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    ours = subprocess.run([sys.executable, "-c", SCRIPT, "threads.start"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert ours.stdout.strip() == "main []", ours.stdout + ours.stderr
