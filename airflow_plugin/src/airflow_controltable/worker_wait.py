"""Waiting for a slot on the worker before deferring: when it pays (a pure decision) and the bounded wait itself.

A deferred task pays twice before its work starts again: its trigger may fire only once Airflow's
scheduler has handled the deferring process's exit (:mod:`airflow_controltable.resume_race`: up to
``[workers] min_heartbeat_interval`` plus a scheduler loop after the deferral), and the resumed
task is scheduled, queued and started as a new process that parses the DAG file again. For a slot
that comes within seconds (the task is next in line behind a short load) that round trip is the
whole wait, and it is several times what an Airflow pool takes to start its next task. So a task
whose slot is expected soon waits for it where it already runs, woken by the release's push, for
at most ``worker_wait`` seconds, keeping its queue place (FIFO as before: the grant is made by the
releasing transaction, in queue order); it defers only when the wait is expected to be long or
runs out. Meanwhile it occupies its worker slot, as a sensor in poke mode does.

"Soon" is judged from where the request stands (:func:`worker_wait_budget`): how many rounds of
the resource's capacity are ahead of it, times how long the resource's slots are typically held
(the median of its recent grants, :func:`typical_hold`), with a margin for holds that vary
(``WORKER_WAIT_MARGIN``); with no recent grants to go by, only a
request at most ``WORKER_WAIT_ROUNDS`` rounds from the front waits on the worker.

A task that deferred (it started far back) gets the same chance once it is the head of its queue:
its trigger (``SlotTrigger(resume_near=...)``) fires a ``"near"`` event when the same rule, with the
head's one round and a known typical hold, expects the grant soon, and the task resumes to wait on
its worker while the holders finish, once per request.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable, Optional

from airflow_controltable.defaults import WORKER_WAIT_MARGIN, WORKER_WAIT_ROUNDS

__all__ = ["typical_hold", "wait_for_grant", "worker_wait_budget"]


def typical_hold(records: Iterable[Any]) -> Optional[float]:
    """The median seconds a grant of the resource was held, over ``records`` (the core's ``GrantRecord``s).

    Only grants that ended by a release count (a hold that ended by expiry says how long a dead
    holder blocked, not how long work takes); None when there is none.
    """
    holds = [(r.ended_at - r.granted_at).total_seconds() for r in records
             if r.outcome == "released" and r.ended_at is not None and r.granted_at is not None]
    return max(statistics.median(holds), 0.0) if holds else None


def worker_wait_budget(
    *, position: Optional[int], capacity: int, slots: int, exclusive: bool, worker_wait: float,
    hold: Optional[float],
) -> float:
    """Seconds to wait for the slot on the worker before deferring; 0 to defer at once (a pure decision).

    ``position`` is the request's place among the waiters (1: the head; None: not waiting, e.g.
    granted meanwhile or withdrawn); ``hold`` the resource's :func:`typical_hold`. The request needs
    about ``ceil(position * slots / capacity)`` rounds of releases (``position`` for an exclusive
    request, which runs alone). With a typical hold, it waits on the worker when those rounds are
    expected within ``worker_wait / WORKER_WAIT_MARGIN`` (a wait that runs out just before the grant
    costs the most); without one, when they are at most ``WORKER_WAIT_ROUNDS``. The wait is
    ``worker_wait`` either way (the bound; the push ends it at the grant).
    """
    if worker_wait <= 0 or position is None or position < 1 or capacity < 1:
        return 0.0
    rounds = position if exclusive else math.ceil(position * max(slots, 1) / capacity)
    if hold is None:
        return float(worker_wait) if rounds <= WORKER_WAIT_ROUNDS else 0.0
    return float(worker_wait) if rounds * hold * WORKER_WAIT_MARGIN <= worker_wait else 0.0


def wait_for_grant(
    table: Any, keys: list[str], check: Callable[[], Any], seconds: float, *, poll: float, refresh: float,
) -> Any:
    """Call ``check()`` (a ``try_acquire`` that keeps the queue place) until it returns a lease or ``seconds`` pass.

    Woken by the pushes for ``keys`` (the request's grant and head keys) through the table's one
    listener; without push it checks every ``poll`` seconds, with push every ``refresh`` seconds
    (keeping the queue entry alive). The first moment push is seen active the request is checked
    again at once: a grant pushed before the listener listened is not missed. Returns the lease,
    or None when the time ran out (the place is kept: the caller defers).
    """
    woken = threading.Event()
    try:
        remove: Optional[Callable[[], None]] = table.add_wakeup_listener(keys, woken.set)
    except Exception:  # no push here (or the listener cannot start): polling alone
        remove = None
    deadline = time.monotonic() + seconds
    listening = False
    try:
        while True:
            woken.clear()  # before the check: a push during the check is not lost
            lease = check()
            if lease is not None:
                return lease
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            active = remove is not None and bool(table.push_active)
            if active and not listening:
                listening = True  # just started listening: look once more before relying on pushes
                continue
            woken.wait(min(left, refresh if active else poll))
    finally:
        if remove is not None:
            remove()
