"""Starting controltable's background threads with the stop signals blocked, so they reach the main thread.

Why: the kernel gives a process-directed signal (SIGTERM from ``kill``, a supervisor's SIGINT or
SIGHUP) to any thread that does not block it. Python runs handlers only in the main thread, but it
notes the signal in whichever thread the kernel chose; when the main thread has just blocked the
stop signals to swap handlers (the CLI's queue handling), a SIGTERM noted in a renewer or watchdog
thread is then run by the handler put back, or dropped with "Signal 15 ignored due to race
condition", and a command could exit 0 with its grant still held. Threads started here inherit a
mask that blocks those signals, so a signal sent while the main thread blocks them stays pending
for the process, where the main thread collects it (``signal.sigpending``/``sigtimedwait``).
"""

from __future__ import annotations

import signal
import threading

#: The signals that end a command, handled by the main thread only (see ``cli.slot_commands``).
STOP_SIGNALS = frozenset(s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGHUP")) if s)


def start(thread: threading.Thread) -> None:
    """``thread.start()`` with :data:`STOP_SIGNALS` blocked in the new thread (inherited from the caller's
    mask, which is restored at once); a plain start where the platform has no ``pthread_sigmask``."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        thread.start()
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
