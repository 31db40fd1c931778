"""The requests this process made, withdrawn when the run is cancelled or failed (the in-process watcher).

At teardown, and between the tries of a retry-mode step in the run worker (in-process executor),
where Dagster sleeps through the retry wait; the detached watcher for a step process of the
multiprocess executor is :mod:`dagster_controltable.retry_watch`, started from here.
"""

import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Union

from controltable import ControlTable
from controltable.waiting_text import names_list

from . import defaults, retry_watch
from .run_status import RUN_ENDED_BADLY

log = logging.getLogger("dagster_controltable")


class RunRequests:
    """The (resource name, holder) of every request this process made and has not released, and the
    thread that withdraws them when the run is cancelled while its steps wait to retry."""

    def __init__(self) -> None:
        # What teardown withdraws when the run was cancelled or failed.
        self.entries: dict[tuple[str, str], None] = {}
        self.watcher: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.between_retries = False

    def track(self, resource: Union[str, Mapping[str, int]], who: Optional[str]) -> None:
        if who is not None:
            for name in names_list(resource):
                self.entries[(name, who)] = None

    def untrack(self, resource: Union[str, Mapping[str, int]], who: Optional[str]) -> None:
        for name in names_list(resource):
            self.entries.pop((name, str(who)), None)

    def forget(self, name: str, who: str) -> None:
        self.entries.pop((name, who), None)

    def withdraw(self, ct: ControlTable, resource: Union[str, Mapping[str, int]], who: str) -> None:
        """Give up ``who``'s places (or slots) on ``resource`` now, best effort."""
        for name in names_list(resource):
            try:
                ct.release(name, who)
            except Exception as exc:  # best effort: the waiter entry expires on its own anyway
                log.warning("controltable: could not withdraw %s from %r: %s", who, name, exc)
            self.entries.pop((name, who), None)

    def withdraw_if_run_ended(self, ct: Optional[ControlTable], instance: Any, run_id: Optional[str], logger: Any,
                              *, retries: int = 0, when: str = "at teardown") -> int:
        """Withdraw the requests when run ``run_id`` is canceling, canceled or failed; returns how many.

        ``retries``: read the status again (every 0.1 s) while it does not say so yet, for a
        caller that knows a termination is on its way (an interrupt arrived).
        """
        if not self.entries or run_id is None or ct is None or instance is None:
            return 0
        for attempt in range(retries + 1):
            try:
                run = instance.get_run_by_id(run_id)
            except Exception as exc:  # no status: leave the entries to the sensor or their TTL
                log.warning("controltable: could not read the status of run %s: %s", run_id, exc)
                return 0
            if run is not None and run.status in RUN_ENDED_BADLY:
                break
            if attempt < retries:
                time.sleep(defaults.WATCH_TICK)
        else:
            return 0
        withdrawn = 0
        for name, who in list(self.entries):
            try:
                withdrawn += ct.release(name, who)
            except Exception as exc:  # best effort: the sensor or the TTL removes it otherwise
                log.warning("controltable: could not withdraw %s from %r: %s", who, name, exc)
            self.entries.pop((name, who), None)
        if withdrawn:
            (logger or log).info(f"controltable: run {run_id} is {run.status.value}: withdrew {withdrawn} "
                                 f"slot request(s) {when}")
        return withdrawn

    def try_starts(self) -> None:
        """A try of a step is running: the between-retries watcher stands down (it never withdraws under a try)."""
        with self.lock:
            self.between_retries = False

    def retry_wait_begins(self, withdraw_if_run_ended: Optional[Callable[[int, str], int]],
                          connected: Callable[[], bool], run_id: Optional[str]) -> None:
        """Withdraw this run's queue places the moment it is cancelled while its steps wait to retry.

        In the run worker (in-process executor) Dagster sleeps through a retry wait and notices a
        cancellation only when the sleep ends. A daemon thread watches meanwhile: Dagster's
        termination arrives as an interrupt this process records, and the run's status is read
        every few seconds in case it arrives another way; on CANCELING/CANCELED/FAILURE the
        thread withdraws what this process asked for (``withdraw_if_run_ended(retries, when)``;
        ``None``: no Dagster instance to read the status from). It ends when nothing is left to watch.
        """
        with self.lock:
            self.between_retries = True
        if withdraw_if_run_ended is None or (self.watcher is not None and self.watcher.is_alive()):
            return
        self.watcher = threading.Thread(target=self._watch_loop, args=(withdraw_if_run_ended, connected, run_id),
                                        name="controltable-run-watch", daemon=True)
        self.watcher.start()

    def _watch_loop(self, withdraw_if_run_ended: Callable[[int, str], int], connected: Callable[[], bool],
                    run_id: Optional[str]) -> None:
        last_check = time.monotonic()
        while self.between_retries and self.entries and connected():
            time.sleep(defaults.WATCH_TICK)
            interrupted = interrupt_received()
            if not interrupted and time.monotonic() - last_check < defaults.WATCH_STATUS_EVERY:
                continue
            last_check = time.monotonic()
            # Under the lock, and only while no try is running: a step that is trying (or holds)
            # handles its own cancellation, and must never lose a slot it works under.
            with self.lock:
                if not self.between_retries:
                    return
                try:
                    when = "on its termination signal" if interrupted else "between retries"
                    retries = defaults.WATCH_INTERRUPT_RETRIES if interrupted else 0
                    if withdraw_if_run_ended(retries, when):
                        return
                except Exception as exc:  # the teardown and the cleanup sensor remain
                    log.warning("controltable: watching run %s failed: %s", run_id, exc)
                    return


def watch_from_outside(instance: Any, run_id: Optional[str], control: dict[str, Any], who: str, names: str,
                       resources: list[str], seconds: float, pickup: Optional[float]) -> None:
    """This step's process ends now (multiprocess executor): a detached watcher withdraws its place
    if the run is cancelled before the next try (:mod:`dagster_controltable.retry_watch`).

    ``control``: the control table's ``url``, ``namespace``, ``schema`` and ``prefix``.
    """
    if instance is None or run_id is None:
        return
    try:
        from dagster._serdes import serialize_value

        settings = {**control, "run_id": run_id, "holder": who, "resources": resources,
                    "instance_ref": serialize_value(instance.get_ref())}
        until = time.time() + seconds + (pickup or 0.0) + retry_watch.WATCH_MARGIN
        retry_watch.ensure_watcher(settings, who, until)
    except Exception as exc:  # the cleanup sensor and the place's TTL remain
        log.warning("controltable: could not start the watcher of %s's place on %s: %s", who, names, exc)


def interrupt_received() -> bool:
    """Whether Dagster recorded an interrupt (its termination signal) that it has not acted on yet."""
    try:
        from dagster._utils.interrupts import check_captured_interrupt
    except ImportError:  # pragma: no cover - private API moved; the status check still works
        return False
    try:
        return bool(check_captured_interrupt())
    except Exception:  # pragma: no cover
        return False
