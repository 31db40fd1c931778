"""Background renewal for anything held under a lease: slot leases, event batches, work items.

A renewer keeps a lease alive only while the work it covers can still be going on. Two signals
say it cannot: the owner says so (``alive()`` returns false), or the process was orphaned (the
parent it started under is gone, e.g. an Airflow task supervisor or a Dagster run worker that was
SIGKILLed). Then the renewer stops and lets the lease run out on the database clock, so the slot,
batch or item comes back to others within one lease instead of when the orphan finally ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from .defaults import ORPHAN_CHECK_INTERVAL, STOP_RENEWING_WHEN_ORPHANED
from .errors import LeaseLost

log = logging.getLogger("controltable")


def parent_gone(original_ppid: int) -> bool:
    """True once this process's parent is no longer ``original_ppid`` (it died; we were re-parented).

    POSIX re-parents an orphan to init or to the nearest subreaper, so a changed ``getppid()``
    is the portable sign, with no race against PID reuse. A process started by PID 1 (a container's
    entry point) has no parent to lose.
    """
    return original_ppid > 1 and os.getppid() != original_ppid


class Renewer(threading.Thread):
    """Calls ``target.renew()`` every ``interval`` seconds; remembers a loss in ``target.lost``.

    A failed renewal that is not a loss (the database briefly unreachable) is retried at the next
    tick: the lease may well outlive the outage. Between renewals the renewer looks at least every
    :data:`~controltable.defaults.ORPHAN_CHECK_INTERVAL` seconds whether it should stop (orphaned,
    or ``alive()`` false); stopping that way records a :class:`LeaseLost` in ``target.lost`` so the
    owner's next complete/release/check reports that the lease was let go.
    """

    def __init__(
        self,
        target: BackgroundRenewal,
        interval: float,
        name: str,
        *,
        stop_when_orphaned: bool = False,
        alive: Optional[Callable[[], bool]] = None,
    ) -> None:
        super().__init__(name=f"controltable-renew-{name}", daemon=True)
        self.target = target
        self.interval = interval
        self.alive = alive
        #: The parent this process had when renewal started (None: orphan detection is off).
        self.parent_pid: Optional[int] = os.getppid() if stop_when_orphaned else None
        #: Why the renewer stopped by itself ("orphaned", "owner ended the work"), if it did.
        self.stopped_because: Optional[str] = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=10)

    def _reason_to_stop(self) -> Optional[str]:
        if self.parent_pid is not None and parent_gone(self.parent_pid):
            return f"the process was orphaned (parent {self.parent_pid} is gone)"
        if self.alive is not None:
            try:
                if not self.alive():
                    return "its owner said the work ended"
            except Exception as exc:  # a broken callback must not keep a lease alive forever
                return f"the owner's alive() check failed ({type(exc).__name__}: {exc})"
        return None

    def run(self) -> None:
        watching = self.parent_pid is not None or self.alive is not None
        step = min(self.interval, ORPHAN_CHECK_INTERVAL) if watching else self.interval
        next_renewal = time.monotonic() + self.interval
        while not self._stop_event.wait(max(min(step, next_renewal - time.monotonic()), 0.0)):
            reason = self._reason_to_stop()
            if reason is not None:
                self.stopped_because = reason
                log.warning("controltable: stopped renewing %s: %s; the lease will expire", self.name, reason)
                self.target.lost = LeaseLost(f"renewal stopped because {reason}; the lease was left to expire")
                return
            if time.monotonic() < next_renewal:
                continue
            next_renewal = time.monotonic() + self.interval
            try:
                self.target.renew()
            except LeaseLost as exc:
                log.error("controltable: %s", exc)
                self.target.lost = exc
                return
            except Exception as exc:
                log.warning("controltable: lease renewal failed, will retry: %s", exc)


class BackgroundRenewal:
    """Mixin: ``start_renewing()`` keeps the object's lease alive from a daemon thread."""

    lost: Optional[LeaseLost] = None
    _renewer: Optional[Renewer] = None

    def renew(self, lease: Optional[float] = None) -> Any:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def _renew_interval(self) -> float:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def start_renewing(
        self,
        interval: Optional[float] = None,
        *,
        stop_when_orphaned: Optional[bool] = None,
        alive: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Renew in a daemon thread every ``interval`` seconds (default: a third of the lease).

        A loss is recorded in ``lost`` and raised by the next complete/release (or ``check``).

        ``stop_when_orphaned``: stop renewing (and let the lease expire) once the parent process
        this process started under is gone. Default
        :data:`~controltable.defaults.STOP_RENEWING_WHEN_ORPHANED` (off), because a plain script or
        a ``nohup`` job legitimately outlives the shell that started it, and letting its lease go
        would hand its slot to a second holder while it still works. Worker processes that a
        supervisor owns (Airflow task runners, Dagster step processes) pass ``True``: when the
        supervisor is killed, nobody will record the outcome, and the slot must come back within
        one lease rather than when the orphan finally ends.

        ``alive``: a callback checked as often as the orphan test; renewal stops when it returns
        false (or raises), e.g. ``lambda: not finished.is_set()`` or a run-status check.
        """
        if self._renewer is None:
            orphan = STOP_RENEWING_WHEN_ORPHANED if stop_when_orphaned is None else bool(stop_when_orphaned)
            self._renewer = Renewer(
                self, interval or max(self._renew_interval(), 0.05), type(self).__name__,
                stop_when_orphaned=orphan, alive=alive,
            )
            self._renewer.start()

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

