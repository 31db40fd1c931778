"""Delivering :class:`~controltable.errors.LeaseLostInterrupt` into work whose lease is gone.

Work held under a lease runs in a ``with`` block that *arms* the interrupt (``slot()``, ``with
lease:``, ``batch.renewing()``, ``item.renewing()``, ``lease.interrupting()``). When the
background renewer finds the lease lost it calls :func:`interrupt`, which

1. cancels in the server the statements the block's thread has running (:mod:`controltable.cancel`:
   psycopg's cancel request, SQLite's ``interrupt()``, MySQL's ``KILL QUERY``), so a long statement
   ends and its effect is rolled back, and
2. stops the thread:

   * the **main thread** (an Airflow task, a Dagster step, a script, ``controltable run``) gets a
     signal (:data:`~controltable.defaults.INTERRUPT_SIGNAL`, SIGUSR1) sent to it with
     ``pthread_kill``. A blocking system call (``time.sleep``, a socket read, ``waitpid``, a
     driver's wait for its reply) returns ``EINTR``, and Python runs the handler installed while
     a block is armed (PEP 475), which raises ``LeaseLostInterrupt``. The handler runs in the main
     thread between bytecodes, as does disarming, so it never raises into a block that has ended;
     it also never raises inside controltable's own entry and exit code (it leaves the interrupt
     to the exit, which reports it), and the renewer sends the signal again until the interrupt
     is delivered or the block ends. The previous handler is restored once no block is armed; a
     signal that is not ours goes to it.
   * **any other thread** gets the exception asynchronously (``PyThreadState_SetAsyncExc``): best
     effort, delivered only when the thread runs Python bytecode again (not inside a blocking
     call), and it can land anywhere, in a library's bookkeeping too. The same fallback serves the
     main thread where handlers cannot be installed (a sub-interpreter, or the signal taken).

Whatever ``Exception`` the block raises after an interrupt was sent (a driver's "query cancelled",
an error of a connection the interrupt left mid-statement) reaches the caller as
``LeaseLostInterrupt``: its ``__cause__`` is the loss and its ``__context__`` (and message) that
error, for the lease's loss is the news and the driver's error only its effect. A decision to stop
(``KeyboardInterrupt``, ``SystemExit``, an orchestrator's ``BaseException`` cancellation) passes
unchanged, the loss attached.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
from types import CodeType, FrameType
from typing import Any, Callable, Optional, TypeVar

from . import defaults
from .cancel import RunningStatements, track_thread, untrack_thread
from .errors import ConfigurationError, LeaseLost, LeaseLostInterrupt

log = logging.getLogger("controltable")

#: Guards every arm, send and disarm: the renewer sends only into an armed block, and a disarmed
#: one has any undelivered asynchronous exception cancelled before the lock is let go.
_GUARD = threading.Lock()
#: How often (seconds) the renewer sends the signal again while an interrupt is not delivered (it
#: arrived while the main thread ran controltable's own entry or exit code, which it leaves alone).
RESEND_INTERVAL = 0.05
#: How long the renewer waits for the server-side cancel before it signals anyway (seconds).
CANCEL_WAIT = 0.5

F = TypeVar("F", bound=Callable[..., Any])
#: Code the signal handler never raises into: arming, disarming and the exits that report the loss.
_PROTECTED: set[CodeType] = set()


def protected(fn: F) -> F:
    """Mark ``fn`` as entry or exit code of an armed block: a signal landing in it is left to the exit."""
    _PROTECTED.add(fn.__code__)
    return fn


class Arming:
    """One armed block: whose lease, which thread, and what happened to its interrupt."""

    __slots__ = ("owner", "thread", "by_signal", "on_list", "armed", "sent", "delivered", "statements", "ended")

    def __init__(self, owner: Any, thread: int, by_signal: bool) -> None:
        self.owner = owner
        self.thread = thread
        #: Whether the interrupt reaches the thread by a signal (else an asynchronous exception).
        self.by_signal = by_signal
        #: Whether it is on ``_MAIN_BLOCKS`` (kept apart from ``by_signal``, which the fallback
        #: clears: the block must still leave the list, or the handler is never uninstalled).
        self.on_list = by_signal
        self.armed = True
        #: The renewer decided to interrupt (under ``_GUARD``); the exit then reports the loss.
        self.sent = False
        #: The handler raised the interrupt into the block (main thread only).
        self.delivered = False
        #: The statements the block's thread runs, cancelled in the server on a loss.
        self.statements = RunningStatements(thread)
        #: Set when the block is disarmed: the renewer stops sending at once.
        self.ended = threading.Event()

    def error(self) -> LeaseLostInterrupt:
        lost: Optional[LeaseLost] = getattr(self.owner, "lost", None)
        if lost is None:
            return LeaseLostInterrupt()
        exc = LeaseLostInterrupt(f"the work was interrupted because its lease is gone: {lost}", lost.keys)
        exc.__cause__ = lost
        return exc


# -- the main thread's signal ---------------------------------------------------------------------
#: The main thread's armed blocks that use the signal, innermost last. Changed only by the main
#: thread (under ``_GUARD``), read by the handler, which runs in the main thread too.
_MAIN_BLOCKS: list[Arming] = []
#: The signal our handler is installed for, and the handler it replaced (restored when the last
#: main-thread block disarms).
_installed: Optional[tuple[int, Any]] = None
#: Signals of ours sent and not yet seen by the handler (raised under ``_GUARD``, lowered by the
#: handler). A count, not a flag: the renewer counts a send and then sends it, and the handler of
#: an earlier send may run in between; a flag it cleared would make the next signal look foreign
#: (and SIGUSR1's default ends the process). Sends the kernel merged into one delivery leave it too
#: high while blocks are armed, which only makes a foreign signal look like ours: it is reset when
#: the last block disarms.
_outstanding = 0


def say(level: int, msg: str, *args: Any) -> None:
    """Log from the renewer's thread without letting a handler stop it.

    The renewer must record a loss and interrupt the work after logging it; a handler that raises
    (rich's console, which Prefect installs, raises ``SystemExit`` when its pipe is broken, as it
    is in a process whose supervisor was killed) would otherwise end the thread first, and the
    orphan would work on past its lease.
    """
    try:
        log.log(level, msg, *args)
    except BaseException:  # noqa: BLE001 - a log line is never worth the lease's guarantee
        pass


def interrupt_signal() -> int:
    """The signal number of :data:`~controltable.defaults.INTERRUPT_SIGNAL`."""
    name = defaults.INTERRUPT_SIGNAL
    number = getattr(signal, name, None) if isinstance(name, str) else None
    if not isinstance(number, int) or name in ("SIGKILL", "SIGSTOP"):
        raise ConfigurationError(
            f"defaults.INTERRUPT_SIGNAL = {name!r} is not a signal this platform can catch; name one such "
            "as 'SIGUSR1' or 'SIGUSR2' that nothing else in the process uses")
    return int(number)


def _in_protected(frame: Optional[FrameType]) -> bool:
    """Whether the main thread runs code the interrupt must not land in (the renewer sends again).

    Our own entry and exit code, and a finalizer (``__del__``, run by a garbage collection that
    may happen anywhere, a ``compile()`` included): Python swallows an exception raised there
    ("Exception ignored in"), so the interrupt would be lost, and it would abandon the C code
    that collected (CPython 3.11's AST conversion then keeps a wrong recursion depth).
    """
    while frame is not None:
        if frame.f_code in _PROTECTED or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    """In the main thread: raise the interrupt into the innermost armed block whose lease is gone."""
    global _outstanding
    # Ours while a send is counted, or while any block was sent an interrupt: never passed on
    # then, for the handler we replaced may be the default action that ends the process.
    ours = _outstanding > 0 or any(block.sent for block in _MAIN_BLOCKS)
    _outstanding = max(_outstanding - 1, 0)
    if not ours:
        _chain(signum, frame)
        return
    for block in reversed(_MAIN_BLOCKS):
        if block.armed and block.sent and not block.delivered:
            if _in_protected(frame):
                return  # entering or leaving a block: the exit reports it; else the renewer resends
            block.delivered = True
            raise block.error()


def _chain(signum: int, frame: Optional[FrameType]) -> None:
    """A signal somebody else sent: do what the handler we replaced would have done."""
    previous = _installed[1] if _installed is not None else signal.SIG_DFL
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):  # its default action (SIGUSR1: end the process)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _install() -> bool:
    """Install the handler (main thread); False where this interpreter cannot (then: async exception)."""
    global _installed
    if _installed is not None:
        return signal.getsignal(_installed[0]) is _handler
    if not hasattr(signal, "pthread_kill") or threading.current_thread() is not threading.main_thread():
        return False
    signum = interrupt_signal()
    try:
        previous = signal.signal(signum, _handler)
    except (ValueError, OSError) as exc:  # a sub-interpreter, or an embedding application's rules
        log.info("controltable: cannot install the lease-loss signal handler (%s); using asynchronous exceptions", exc)
        return False
    _installed = (signum, previous)
    return True


def _run_pending() -> None:
    """A Python call: signal handlers already tripped run here (they find nothing to do)."""


def _uninstall() -> None:
    """Restore the replaced handler (main thread, under ``_GUARD``: no signal of ours can be sent now).

    A signal of ours still pending (sent just before the last block disarmed) is taken off the
    queue first with the signal blocked, so it never reaches the restored handler (SIGUSR1's
    default would end the process). One of somebody else's is passed on after the restore.
    """
    global _installed, _outstanding
    if _installed is None:
        return
    signum, previous = _installed
    foreign = False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        while signal.sigtimedwait([signum], 0) is not None:
            foreign = foreign or _outstanding == 0
            _outstanding = max(_outstanding - 1, 0)
        _run_pending()
        _outstanding = 0
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        _installed = None
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    if foreign:
        signal.pthread_kill(threading.main_thread().ident or 0, signum)


# -- arming ---------------------------------------------------------------------------------------
@protected
def arm(owner: Any) -> Arming:
    """Arm the interrupt for the calling thread's block over ``owner``'s lease."""
    thread = threading.get_ident()
    with _GUARD:
        by_signal = thread == threading.main_thread().ident and _install()
        block = Arming(owner, thread, by_signal)
        if by_signal:
            _MAIN_BLOCKS.append(block)
    track_thread(block.statements)
    return block


@protected
def disarm(block: Arming) -> bool:
    """Disarm (in the block's thread): no interrupt reaches it after this. Whether one was sent."""
    untrack_thread(block.statements)
    with _GUARD:
        block.armed = False
        if block.on_list:
            block.on_list = False
            if block in _MAIN_BLOCKS:
                _MAIN_BLOCKS.remove(block)
            if not _MAIN_BLOCKS:
                _uninstall()
        if block.sent and not block.by_signal:
            _raise_in_thread(block.thread, None)  # cancel it if not delivered yet
    block.ended.set()
    return block.sent


def _raise_in_thread(ident: int, exc: Optional[type[BaseException]]) -> int:
    """Schedule ``exc`` in thread ``ident`` (``None``: cancel a scheduled one); threads affected."""
    return int(ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exc) if exc is not None else None))


def _send(block: Arming) -> bool:
    """Under ``_GUARD``: send the signal once more; False once the block is disarmed or reached."""
    global _outstanding
    if not block.armed or block.delivered:
        return False
    if _installed is None or signal.getsignal(_installed[0]) is not _handler:
        # Our handler was replaced inside the block: the asynchronous exception is what is left.
        block.by_signal = False
        block.delivered = True
        _raise_in_thread(block.thread, LeaseLostInterrupt)
        return False
    _outstanding += 1
    signal.pthread_kill(block.thread, _installed[0])
    return True


def interrupt(block: Optional[Arming], stopping: Optional[threading.Event] = None) -> bool:
    """From the renewer: cancel the block's statements and interrupt its thread, once; whether it did.

    For the main thread the signal is sent again every :data:`RESEND_INTERVAL` seconds until the
    handler raised it into the work, the block was left, or ``stopping`` is set.
    """
    if block is None:
        return False
    with _GUARD:
        if not block.armed or block.sent:
            return False
        block.sent = True
    cancelled = block.statements.cancel(wait=CANCEL_WAIT)
    say(logging.WARNING, "controltable: interrupting the work of %s: its lease is gone (%s)%s",
        type(block.owner).__name__, getattr(block.owner, "lost", None),
        f"; cancelled {cancelled} running statement(s)" if cancelled else "")
    with _GUARD:
        if not block.armed:
            return True
        if not block.by_signal:
            _raise_in_thread(block.thread, LeaseLostInterrupt)
            return True
        again = _send(block)
    while again and not (stopping is not None and stopping.is_set()):
        if block.ended.wait(RESEND_INTERVAL):
            break
        with _GUARD:
            again = _send(block)
    return True


@protected
def outcome(block: Arming, exc: Optional[BaseException]) -> Optional[BaseException]:
    """What the block's exit raises: ``None`` to let ``exc`` (or nothing) through unchanged.

    Once an interrupt was sent, the block's end reports the loss as a ``LeaseLostInterrupt`` whose
    ``__cause__`` is the loss: the block's own interrupt, or in place of any other exception (a
    driver's error the cancel caused: kept as ``__context__`` and named in the message), or when
    the block ended normally (the loss came as it finished, or the work swallowed the interrupt).
    A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
    ``GeneratorExit``, an orchestrator's cancellation) is a decision to stop that outranks the
    loss: it passes unchanged, the loss attached as :attr:`lease_lost` and in a note.
    """
    if not disarm(block):
        return None
    if exc is not None and not isinstance(exc, Exception):
        lost = getattr(block.owner, "lost", None)
        try:
            exc.lease_lost = lost  # type: ignore[attr-defined]
        except AttributeError:  # a class with __slots__: the note is what is left
            pass
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"controltable: the lease was lost while the work ran: {lost}")
        return None
    if isinstance(exc, LeaseLostInterrupt):
        lost = getattr(block.owner, "lost", None)
        if exc.__cause__ is None and lost is not None and lost is not exc:
            replacement = block.error()
            replacement.__context__ = exc
            return replacement
        return None
    replacement = block.error()
    if exc is not None:  # the loss stays the cause; what the work raised is the context, and said
        replacement.__context__ = exc
        replacement.args = (f"{replacement.args[0]} (the work ended with {type(exc).__name__}: {exc})",)
    return replacement


def main_thread_blocks() -> int:
    """How many main-thread blocks are armed now (for tests and diagnostics)."""
    return len(_MAIN_BLOCKS)


__all__ = ["Arming", "arm", "disarm", "interrupt", "interrupt_signal", "main_thread_blocks", "outcome", "protected"]
