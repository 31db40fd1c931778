"""How a step waits for slots: FIFO inside the step (``block``) or by retrying it (``retry``), and where it stands."""

import math
import time
from typing import Any, Callable, Optional, TypeVar

from dagster import Failure, RetryRequested

from controltable import ControlTable, ControlTableError, Lease
from controltable.waiting_text import Resource, names, names_list, where

from . import defaults, retry_watch
from .run_watch import RunRequests
from .step import StepIdentity
from .text import timestamp

T = TypeVar("T")
#: ``fail(exc, action)``: the resource's ``Failure`` for a controltable error (``ControlTableResource.failure``).
Fail = Callable[[BaseException, str], Failure]

WAIT_MODES = ("block", "retry")
#: ``slot(wait="retry")``: seconds between a busy step's retries, and how many retries before it fails
#: (kept under these names for existing imports; the values live in :mod:`.defaults`).
DEFAULT_RETRY_INTERVAL = defaults.RETRY_INTERVAL
DEFAULT_MAX_RETRIES = defaults.MAX_RETRIES


def retry_waiter_ttl(retry_interval: float) -> float:
    """How long a retry-mode step's queue place survives without a retry: one interval plus 30 s.

    The place must outlive the gap between two tries (the interval plus the time Dagster needs
    to start the step again); it need not cover more, because a cancelled or failed run's places
    are withdrawn by the resource's teardown and the cleanup sensor rather than left to expire.
    """
    return retry_interval + defaults.RETRY_WAITER_TTL_MARGIN


def head_retry_interval(retry_interval: float) -> float:
    """The wait before the next try of a retry-mode step at the head of the queue: a tenth, 1 to 5 s.

    The head is next to be granted; retrying it sooner keeps a freed slot from idling for a
    whole retry interval (the grant made for it waits up to ``retry_interval`` for the pickup).
    Not faster than once a second: every try is a step retry in Dagster's event log (and, with
    the multiprocess executor, a new step process).
    """
    return min(retry_interval, max(defaults.HEAD_RETRY_MIN, min(defaults.HEAD_RETRY_MAX, retry_interval / 10.0)))


def _call(fail: Fail, action: str, fn: Callable[[], T]) -> T:
    """Run one core call, translating its errors into a ``Failure`` naming ``action``."""
    try:
        return fn()
    except ControlTableError as exc:
        raise fail(exc, action) from exc


def block(
    ct: ControlTable, resource: Resource, who: Optional[str], step: StepIdentity, requests: RunRequests, fail: Fail,
    *, slots: int, mode: str, timeout: Optional[float], lease: float, waiter_ttl: float, priority: int = 0,
) -> tuple[Lease, float, Optional[int]]:
    """Wait inside the step, FIFO, for the slots; returns the lease, the seconds waited and the first queue position."""
    label = names(resource)
    started = time.monotonic()
    position: Optional[int] = None
    requests.track(resource, who)
    if who is not None:  # one poll first, to tell the user where they stand before waiting
        first = _call(fail, f"acquiring {label}", lambda: ct.try_acquire(
            resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=waiter_ttl,
            attempt=step.attempt, priority=priority))
        if first is not None:
            return first, time.monotonic() - started, None
        position, where_text = where(ct, resource, who)
        step.log.info(f"controltable: waiting for {label}: {where_text}")
    try:
        granted = ct.acquire(resource, holder=who, slots=slots, mode=mode, timeout=timeout, lease=lease,
                             waiter_ttl=waiter_ttl, attempt=step.attempt, priority=priority)
    except ControlTableError as exc:
        raise fail(exc, f"waiting for {label}") from exc
    except BaseException:  # the run was cancelled while we waited: leave the queue at once
        if who is not None:
            requests.withdraw(ct, resource, who)
        raise
    return granted, time.monotonic() - started, position


def try_or_retry(
    ct: ControlTable, resource: Resource, who: Optional[str], step: StepIdentity, requests: RunRequests, fail: Fail,
    *, slots: int, mode: str, lease: float, waiter_ttl: Optional[float], retry_interval: float,
    max_retries: int, priority: int = 0, before_retry: Callable[[float, Optional[float]], None],
) -> tuple[Lease, float, Optional[int]]:
    """Poll once: the lease if granted, else ``RetryRequested`` keeping the queue place (or a ``Failure``
    when the retries are used up). ``before_retry(seconds, pickup)`` arranges the watch over the place."""
    label = names(resource)
    if who is None:
        raise Failure(description=(
            f"slot({label}, wait='retry') needs a step identity to keep its queue place across retries; "
            "use it inside an op/asset or pass holder= explicitly"))
    ttl = waiter_ttl if waiter_ttl is not None else retry_waiter_ttl(retry_interval)
    if ttl <= retry_interval:
        raise Failure(description=(
            f"waiter_ttl ({ttl:g} s) must be longer than retry_interval ({retry_interval:g} s), or the queue "
            "place expires between retries"))
    # Where this step stands decides how long a grant made for it may wait: at the head the
    # next retry comes soon and the grant waits a whole retry interval; further back a grant
    # waits only the core's short default, then passes on. A new request is the head if
    # nobody waits yet.
    if step.own_process:  # a try runs: its place is its own again (see retry_watch)
        retry_watch.pause_watcher(who)
    before = wait_infos(ct, resource, who, fail)
    at_head = all(i.position <= 1 for i in before) if before else nobody_waiting(ct, resource, fail)
    # (never shorter than the core's shortest pickup: a very short retry interval still works)
    pickup = max(retry_interval, defaults.MIN_PICKUP) if at_head else None
    requests.track(resource, who)
    granted = _call(fail, f"acquiring {label}", lambda: ct.try_acquire(
        resource, holder=who, slots=slots, mode=mode, lease=lease, waiter_ttl=ttl, attempt=step.attempt,
        priority=priority, **({"pickup": pickup} if pickup is not None else {})))
    waited_s = waited(ct, before)
    if granted is not None:
        # the position it had at its previous try (0: a grant was waiting for it; it waited all the same)
        return granted, waited_s, (max(i.position for i in before) or 1) if before else None
    position, where_text = where(ct, resource, who)
    # The budget is time (max_retries whole intervals), not Dagster retries: a step at the
    # head tries more often than once an interval and must not use its budget up faster.
    budget = max_retries * retry_interval
    head = head_retry_interval(retry_interval)
    cap = max_retries * max(1, math.ceil(retry_interval / head))
    if waited_s >= budget or step.retry_number >= cap:
        requests.withdraw(ct, resource, who)
        raise Failure(
            description=(f"{label} was still busy after {waited_s:.0f} s of retries (max_retries={max_retries} x "
                         f"retry_interval={retry_interval:g} s; {where_text}); raise max_retries or the capacity, "
                         "or see `controltable status`"),
            allow_retries=False,
        )
    seconds = head if position == 1 else retry_interval
    step.log.info(f"controltable: {label} busy: {where_text}; retrying the step in {seconds:g} s "
                  f"(retry {step.retry_number + 1}, waited {waited_s:.1f} s of {budget:g} s), keeping the queue "
                  "place")
    before_retry(seconds, pickup)
    raise RetryRequested(max_retries=cap, seconds_to_wait=seconds)


def wait_infos(ct: ControlTable, resource: Resource, who: str, fail: Fail) -> list[Any]:
    """The core's wait information of ``who`` on each resource (empty if it has no entry yet)."""
    infos = []
    for name in names_list(resource):
        try:
            info = ct.wait_info(name, who)
        except ControlTableError as exc:
            raise fail(exc, f"reading the queue of {name!r}") from exc
        if info is not None:
            infos.append(info)
    return infos


def nobody_waiting(ct: ControlTable, resource: Resource, fail: Fail) -> bool:
    """Whether no live waiter queues for any of the resources."""
    try:
        return all(not [w for w in st.waiters if not w.expired] for st in ct.status(names_list(resource)))
    except ControlTableError as exc:
        raise fail(exc, f"reading the queue of {names(resource)}") from exc


def waited(ct: ControlTable, infos: list[Any]) -> float:
    """Seconds since the earliest ``waiting_since`` among ``infos`` on the database clock (0 if none)."""
    since = [i.waiting_since for i in infos if getattr(i, "waiting_since", None) is not None]
    if not since:
        return 0.0
    try:
        now = ct.now()
    except ControlTableError:
        return 0.0
    return max(0.0, now - min(timestamp(t) for t in since))
