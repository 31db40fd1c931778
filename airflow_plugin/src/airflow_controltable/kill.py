"""The kill path: SIGTERM stops a task's work by raising into it, and the marker that says the work ended.

Airflow's SIGTERM handler (a run or task marked failed, cleared, ``execution_timeout``) calls the
operator's ``on_kill`` in the task's main thread and lets the work go on until SIGKILL seconds
later; a statement the work has running goes on in the server even after that, and may commit
after the slot was handed to the next holder. So the three places that run work under a slot (the
slot operators, ``slot_held``, and the listener for tasks a teardown covers) stop it the same way,
here: :meth:`WorkStopper.stop` cancels the work's running statements (the core's
:mod:`controltable.cancel`: MySQL's ``KILL QUERY``) and raises :class:`ControlTableTaskKilled`
into the work, once. The slot is released by whoever holds it, after the work's stack has unwound.

A leaf: it imports only Airflow and the core, so the operators, the decorators and the listener
all import it and none of them imports another for it.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Callable, Optional

from airflow.sdk.exceptions import AirflowTaskTerminated

from controltable.cancel import RunningStatements, track_thread, untrack_thread

__all__ = ["WORK_ENDED_KEY", "ControlTableTaskKilled", "WorkStopper"]

#: The XCom key of the marker (value ``True``) that a covered task's process pushes once its work
#: has ended (:mod:`airflow_controltable.plugins.work_ended`) and ``ReleaseSlotOperator`` reads;
#: Airflow clears a task's XComs when a new try starts.
WORK_ENDED_KEY = "controltable_work_ended"


class ControlTableTaskKilled(AirflowTaskTerminated, KeyboardInterrupt):
    """Raised into the work by ``on_kill`` so that the slot is released only after the work stopped.

    Also a ``KeyboardInterrupt``: that is what database drivers cancel a running statement on
    (psycopg 3 sends the server a cancel request and waits for it to take effect). Any other
    exception leaves the statement running in the server after the client gave up: a load of one
    long statement would commit its write after the slot was released and the next holder started.
    """


class WorkStopper:
    """One piece of work that ``on_kill`` may stop, once: ``with stopper:`` around the work, ``stop()`` in ``on_kill``.

    While the block runs, the statements its thread runs are tracked; :meth:`stop` called in that
    same thread (Airflow's SIGTERM handler runs in the main thread, where the work runs) cancels
    them and raises :class:`ControlTableTaskKilled` there. Called from any other thread, after the
    block, or a second time, it does nothing: raising in a thread that is not the work's would not
    stop the work, only break the caller. :meth:`start`/:meth:`finish` are the two halves of the
    block for a caller whose start and end are separate callbacks (the listener's hooks).
    """

    def __init__(self, message: str, killed: Optional[Callable[[], bool]] = None) -> None:
        #: The ``ControlTableTaskKilled`` message: what was stopped, and when the slot is released.
        self.message = message
        #: Whether a kill came before the block began (``on_kill`` records it): then the block never
        #: starts, since nothing was there to stop when the signal arrived.
        self._killed = killed
        #: True from :meth:`start` until the work finished or was stopped.
        self.working = False
        self._thread: Optional[threading.Thread] = None
        self._statements: Optional[RunningStatements] = None

    def start(self) -> None:
        """The work starts in this thread: track its statements, and let :meth:`stop` raise here."""
        self._statements = RunningStatements()  # this thread's
        track_thread(self._statements)
        self._thread = threading.current_thread()
        self.working = True

    def finish(self) -> None:
        """The work is over (returned, raised or stopped): :meth:`stop` does nothing from now on."""
        self.working = False
        if self._statements is not None:
            untrack_thread(self._statements)
            self._statements = None

    def stop(self) -> None:
        """From ``on_kill``: cancel the work's statements and raise into it, if it still runs in this thread.

        :raises ControlTableTaskKilled: the work was running in this thread (the main thread).
        """
        current = threading.current_thread()
        if self.working and current is self._thread and current is threading.main_thread():
            self.working = False
            if self._statements is not None:
                self._statements.cancel()  # MySQL: KILL QUERY (psycopg cancels on the raise below)
            raise ControlTableTaskKilled(self.message)

    def __enter__(self) -> WorkStopper:
        self.start()
        if self._killed is not None and self._killed():
            self.finish()
            raise ControlTableTaskKilled(self.message)
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], error: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.finish()
