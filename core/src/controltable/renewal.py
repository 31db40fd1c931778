"""Background renewal for anything held under a lease: slot leases, event batches, work items."""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .errors import LeaseLost

log = logging.getLogger("controltable")


class Renewer(threading.Thread):
    """Calls ``target.renew()`` every ``interval`` seconds; remembers a loss in ``target.lost``.

    A failed renewal that is not a loss (the database briefly unreachable) is retried at the next
    tick: the lease may well outlive the outage.
    """

    def __init__(self, target: BackgroundRenewal, interval: float, name: str) -> None:
        super().__init__(name=f"controltable-renew-{name}", daemon=True)
        self.target = target
        self.interval = interval
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=10)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
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

    def start_renewing(self, interval: Optional[float] = None) -> None:
        """Renew in a daemon thread every ``interval`` seconds (default: a third of the lease).

        A loss is recorded in ``lost`` and raised by the next complete/release (or ``check``).
        """
        if self._renewer is None:
            self._renewer = Renewer(self, interval or max(self._renew_interval(), 0.05), type(self).__name__)
            self._renewer.start()

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
