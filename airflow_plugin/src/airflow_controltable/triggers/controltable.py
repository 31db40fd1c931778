"""Triggers that wait in the triggerer, holding no worker slot: ``SlotTrigger`` and ``PendingEventsTrigger``.

A trigger only *checks and acquires*. Both are idempotent: ``try_acquire`` with the same holder
(and attempt) keeps the same FIFO place and returns the same lease, so a trigger that runs twice
(triggerer failover) or an event delivered twice grants the slot once.

Waking up: every trigger of a triggerer process that uses the same connection and namespace shares
ONE :class:`~controltable.ControlTable` (the hook's process-wide cache), so they share its one
listening connection. A trigger registers a callback for the wake-up keys of its request
(``add_wakeup_listener``); the listener thread calls it on a push and the callback hands over to the
event loop with ``loop.call_soon_threadsafe``. The trigger then re-checks at once. Without push
(SQLite, MySQL, a listener that is reconnecting) the trigger polls every ``poll_interval``; with
push it still re-checks every ``refresh_interval`` to keep its queue entry alive and to cover a
lost notification. Database calls are short and run in the default thread pool
(``asyncio.to_thread``); no trigger ever blocks a thread while it waits.

Firing safely: Airflow 3.3's scheduler fails a task resumed from deferral if it handles the
executor's (stale) "success" event of the process that deferred only after it queued the resumed
task (see :mod:`airflow_controltable.defaults`). That event comes at the latest ``[workers]
min_heartbeat_interval`` after the deferring process exited, and the scheduler reads it on its next
loop. So a trigger given the deferral's facts (``deferral``) fires no sooner than ``settle`` seconds
after that process exited: watched through its pid when the triggerer runs on the same host (and
can see the process alive), else assumed ``DEFAULT_EXIT_ALLOWANCE`` seconds after the deferral;
and then until the scheduler has heartbeated twice after the exit report was due (read from
Airflow's health endpoint, when it answers), since a busy scheduler's loop can outlast any fixed
margin. The heartbeats are watched from the exit on, beside the wait, by one reader per triggerer
(:class:`SchedulerBeats`): a grant that comes after that fires at once. A grant is held meanwhile
(its pick-up lease covers it), so only grants that come within seconds of a deferral wait.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any, Callable, Optional

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_controltable.defaults import (
    DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL,
    DEFAULT_EXIT_ALLOWANCE,
    DEFAULT_MODE,
    DEFAULT_REFRESH_INTERVAL,
    DEFAULT_TRIGGER_POLL_INTERVAL,
    SCHEDULER_CATCH_UP_LIMIT,
    SCHEDULER_HEARTBEAT_POLL,
)
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.utils import check_wait_args
from controltable import DatabaseUnavailableError
from controltable.errors import is_retryable

log = logging.getLogger(__name__)


#: How often the trigger looks whether the deferring process has exited (seconds).
EXIT_WATCH_INTERVAL = 0.25


def process_alive(pid: int, created: Optional[float]) -> bool:
    """Whether process ``pid`` (started at ``created``, when known) still runs on this host; a zombie has exited."""
    try:
        import psutil

        proc = psutil.Process(int(pid))
        if created is not None and abs(proc.create_time() - float(created)) > 0.5:
            return False  # the pid was reused by another process
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except Exception:  # gone (NoSuchProcess), not ours to see (AccessDenied), or no psutil
        return False


def in_deferring_process(deferral: dict[str, Any]) -> bool:
    """Whether this trigger runs in the very process that deferred (``dag.test()`` / ``airflow dags test``).

    There the trigger runs inline, no executor reports the deferral's exit, and the process never
    exits while the trigger waits: nothing to wait for.
    """
    return deferral.get("host") == socket.gethostname() and deferral.get("pid") == os.getpid()


def exit_time(
    deferral: dict[str, Any], first_seen_alive: bool, now: float, exited_seen: Optional[float],
    first_look: Optional[float] = None,
) -> float:
    """When the deferring process exited, as far as the trigger can tell (a pure decision, unit tested).

    ``first_look`` is when the trigger first looked for the process on this host (None: it could
    not look, the process runs on another host); ``exited_seen`` is when it saw the process gone
    after having seen it alive. A process already gone at the first look exited before it; one the
    trigger could not look for is assumed gone ``DEFAULT_EXIT_ALLOWANCE`` seconds after the
    deferral. Airflow kills a process that lingers ``linger`` seconds after its task ended, so no
    exit is later than that (plus the same allowance).
    """
    at = float(deferral.get("at") or 0.0)
    latest = at + float(deferral.get("linger") or 0.0) + DEFAULT_EXIT_ALLOWANCE
    if not first_seen_alive:
        if first_look is None:
            return at + DEFAULT_EXIT_ALLOWANCE
        return min(max(first_look, at), latest)
    if exited_seen is None:
        return min(max(now, at), latest)
    return min(exited_seen, latest)


def fire_not_before(deferral: Optional[dict[str, Any]], not_before: Optional[float], exited: Optional[float]) -> float:
    """Epoch seconds before which the trigger must not fire: ``settle`` after the exit, and ``not_before``."""
    earliest = float(not_before or 0.0)
    if deferral is not None and exited is not None:
        earliest = max(earliest, exited + float(deferral.get("settle") or 0.0))
    return earliest


def scheduler_caught_up(report_due: float, heartbeats: list[float]) -> bool:
    """Whether the scheduler has surely read an executor report queued by ``report_due`` (a pure decision).

    ``heartbeats`` are the scheduler's distinct heartbeat times as observed, oldest first. A
    heartbeat is written at the end of a scheduler loop, and every loop reads the executor's
    reports; so once a heartbeat later than ``report_due`` has been seen, the loop that ends with
    the next heartbeat started after the report was queued, and has read and handled it.
    """
    later = [h for h in heartbeats if h > report_due]
    return len(later) >= 2


def health_url() -> Optional[str]:
    """Airflow's health endpoint (it names the scheduler's latest heartbeat), from this process's configuration."""
    try:
        from urllib.parse import urlsplit

        from airflow.sdk import conf

        base = conf.get("core", "execution_api_server_url", fallback="") or conf.get("api", "base_url", fallback="")
        parts = urlsplit(str(base))
        if not parts.scheme or not parts.netloc:
            return None
        return f"{parts.scheme}://{parts.netloc}/api/v2/monitor/health"
    except Exception:
        return None


def read_scheduler_heartbeat(url: str) -> Optional[float]:
    """The scheduler's latest heartbeat (epoch seconds) from the health endpoint, or None if unavailable."""
    import json
    import urllib.request
    from datetime import datetime

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - Airflow's own api-server
            body = json.loads(resp.read())
        stamp = (body.get("scheduler") or {}).get("latest_scheduler_heartbeat")
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() if stamp else None
    except Exception:
        return None


class SchedulerBeats:
    """The scheduler's heartbeats as this triggerer's event loop has seen them: one reader for all triggers.

    Each deferred trigger needs to know when the scheduler has read its deferral's exit report
    (:func:`scheduler_caught_up`). Observing that only once the slot is granted made every grant wait
    for the scheduler's next heartbeat or two, even a grant made long after the deferral, when the
    race cannot happen any more. So a trigger registers as soon as it knows when its deferring
    process exited, and one reader per event loop polls Airflow's health endpoint while any trigger
    is registered (every ``SCHEDULER_HEARTBEAT_POLL`` s, however many triggers wait): a grant that
    comes after the scheduler caught up fires at once; only one that comes within a few heartbeats
    of its deferral waits.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.beats: list[float] = []  # distinct heartbeats seen, oldest first (the last few)
        self.waiting = 0
        self.unavailable = False
        self._reader: Optional[asyncio.Task[None]] = None

    async def _read(self) -> None:
        while self.waiting > 0:
            beat = await asyncio.to_thread(read_scheduler_heartbeat, self.url)
            if beat is None:
                self.unavailable = True  # no health endpoint: the settle alone applies
                return
            if not self.beats or beat != self.beats[-1]:
                self.beats = [*self.beats[-31:], beat]
            await asyncio.sleep(SCHEDULER_HEARTBEAT_POLL)

    async def caught_up(self, report_due: float, limit: float) -> Optional[bool]:
        """Wait (at most ``limit`` s) until the scheduler surely read a report due at ``report_due``;
        None when the heartbeat cannot be read."""
        self.waiting += 1
        try:
            if self._reader is None or self._reader.done():
                self.unavailable = False
                self._reader = asyncio.ensure_future(self._read())
            deadline = time.time() + limit
            while not scheduler_caught_up(report_due, self.beats):
                if self.unavailable:
                    return None
                if time.time() >= deadline:
                    return False
                await asyncio.sleep(min(SCHEDULER_HEARTBEAT_POLL / 2, max(deadline - time.time(), 0.0)))
            return True
        finally:
            self.waiting -= 1


_BEATS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SchedulerBeats] = weakref.WeakKeyDictionary()


def scheduler_beats(url: str) -> SchedulerBeats:
    """The running event loop's :class:`SchedulerBeats` (the triggerer runs every trigger in one loop)."""
    loop = asyncio.get_running_loop()
    beats = _BEATS.get(loop)
    if beats is None or beats.url != url:
        beats = _BEATS[loop] = SchedulerBeats(url)
    return beats


def lease_payload(lease: Any) -> dict[str, Any]:
    """What a granted slot puts in XCom: enough for any later task to find or check it."""
    return {
        "resource": lease.resource,
        "holder": lease.holder,
        "token": lease.token,
        "tokens": dict(lease.tokens),
        "slots": lease.slots,
        "mode": lease.mode,
        "attempt": getattr(lease, "attempt", None),
        "lease_seconds": lease.lease_seconds,
        "expires_at": lease.expires_at.isoformat(),
    }


class _ControlTableTrigger(UsesControlTable, BaseTrigger):
    """Shared plumbing: the connection arguments, the shared table, and the push-or-poll wait loop."""

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = DEFAULT_TRIGGER_POLL_INTERVAL,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        not_before: Optional[float] = None,
        deferral: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.poll_interval = float(poll_interval)
        self.refresh_interval = max(float(refresh_interval), self.poll_interval)
        #: Wall-clock (epoch seconds) after which the trigger gives up with a "timeout" event.
        self.deadline = deadline
        #: Wall-clock (epoch seconds) before which no event is fired (see the module docstring).
        self.not_before = not_before
        #: The deferring process's facts (``utils.deferral_facts()``): fire ``settle`` s after it exited.
        self.deferral = dict(deferral) if deferral else None
        self._seen_alive = False
        self._exited_seen: Optional[float] = None
        self._first_look: Optional[float] = None
        self._watch_done = deferral is None
        self._ct: Any = None
        #: How the last wake-ups came (for tests and logs): checks made, and how many a push caused.
        self.checks = 0
        self.pushed = 0

    def _conn_kwargs(self) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "namespace": self.namespace,
            "control_schema": self.control_schema,
            "poll_interval": self.poll_interval,
            "refresh_interval": self.refresh_interval,
            "deadline": self.deadline,
            "not_before": self.not_before,
            "deferral": self.deferral,
        }

    def _shared_table(self) -> Any:
        """The process-wide control table (and so listener) of this connection and namespace."""
        if self._ct is None:
            self._ct = self._table()
        return self._ct

    def _wakeup_keys(self, table: Any) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check(self) -> Optional[dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _on_timeout(self) -> None:
        """Called (in a thread) when the deadline passes: withdraw whatever the wait left behind."""

    async def _subscribe(self, loop: asyncio.AbstractEventLoop, woken: asyncio.Event) -> Optional[Callable[[], None]]:
        """Register for pushes; None when the table offers none (polling only)."""

        def on_push() -> None:  # called from the listener thread
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop closed (triggerer shutting down)
                pass

        try:
            table = await asyncio.to_thread(self._shared_table)
            keys = self._wakeup_keys(table)
            return await asyncio.to_thread(table.add_wakeup_listener, keys, on_push)
        except Exception as exc:  # no push: polling still works
            log.info("controltable: no push wake-ups for this trigger (%s); polling every %.1f s", exc,
                     self.poll_interval)
            return None

    async def _push_active(self) -> bool:
        try:
            return bool(await asyncio.to_thread(lambda: self._shared_table().push_active))
        except Exception:
            return False

    async def _interval(self, subscribed: bool) -> float:
        """Seconds until the next check unless a push comes first."""
        if subscribed and await self._push_active():
            return self.refresh_interval
        return self.poll_interval

    async def _watch_exit(self) -> None:
        """Note when the deferring process exits (same host only); runs beside the wait from the start."""
        deferral = self.deferral
        try:
            if (deferral is None or deferral.get("host") != socket.gethostname() or not deferral.get("pid")
                    or in_deferring_process(deferral)):
                return
            latest = float(deferral.get("at") or 0) + float(deferral.get("linger") or 0) + DEFAULT_EXIT_ALLOWANCE
            self._first_look = time.time()
            while time.time() < latest:
                alive = await asyncio.to_thread(process_alive, int(deferral["pid"]), deferral.get("created"))
                if not alive:
                    if self._seen_alive:
                        self._exited_seen = time.time()
                    return
                self._seen_alive = True
                await asyncio.sleep(EXIT_WATCH_INTERVAL)
        finally:
            self._watch_done = True

    def _exited(self) -> float:
        assert self.deferral is not None
        return exit_time(self.deferral, self._seen_alive, time.time(), self._exited_seen, self._first_look)

    async def _settle(self, watcher: Optional[asyncio.Task[None]], observer: Optional[asyncio.Task[None]]) -> None:
        """Wait until firing cannot make Airflow's scheduler fail the resumed task (module docstring)."""
        exited: Optional[float] = None
        if self.deferral is not None and not in_deferring_process(self.deferral):
            if watcher is not None:
                await watcher  # bounded by the deferral's linger
            exited = self._exited()
        earliest = fire_not_before(self.deferral, self.not_before, exited)
        delay = earliest - time.time()
        if delay > 0:
            log.info("controltable: firing in %.1f s, once Airflow has seen the deferring process exit", delay)
            await asyncio.sleep(delay)
        if observer is not None:
            started = time.time()
            await observer  # bounded by SCHEDULER_CATCH_UP_LIMIT; done long ago for a late grant
            if time.time() - started > 1.0:
                log.info("controltable: waited %.1f s for the scheduler to read the deferral's exit",
                         time.time() - started)

    async def _observe_scheduler(self, watcher: Optional[asyncio.Task[None]]) -> None:
        """From the deferring process's exit on, until the scheduler has surely read its exit report."""
        assert self.deferral is not None
        if watcher is not None:
            await watcher
        await self._scheduler_catch_up(self._exited() + float(self.deferral.get("wake") or 0.0))

    async def _scheduler_catch_up(self, report_due: float) -> None:
        """Wait (bounded) until the scheduler has surely read the exit report: a busy scheduler's loop
        can take longer than the settle's margin. Without a health endpoint, the settle alone applies."""
        url = health_url()
        if url is None:
            return
        if await scheduler_beats(url).caught_up(report_due, SCHEDULER_CATCH_UP_LIMIT) is False:
            log.warning("controltable: the scheduler did not heartbeat twice in %.0f s; firing anyway",
                        SCHEDULER_CATCH_UP_LIMIT)

    async def _wait(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the first non-None result of ``self._check()``; errors become error events."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch_exit()) if self.deferral is not None else None
        # The scheduler's heartbeats are watched from the deferral's exit on, beside the wait: a grant
        # that comes after the scheduler has read the exit report then fires without waiting.
        observer = (asyncio.ensure_future(self._observe_scheduler(watcher))
                    if self.deferral is not None and not in_deferring_process(self.deferral) else None)
        remove = await self._subscribe(loop, woken)
        try:
            while True:
                woken.clear()  # before the check, so a push during the check is not lost
                self.checks += 1
                try:
                    result = await asyncio.to_thread(self._check)
                except DatabaseUnavailableError as exc:
                    # The queue place survives for waiter_ttl; keep trying rather than fail the task.
                    log.warning("controltable: database unavailable, will retry: %s", exc)
                    result = None
                except Exception as exc:  # report every other failure (bad resource, connection) to the task
                    await self._settle(watcher, observer)
                    yield {"status": "error", "message": f"{type(exc).__name__}: {exc}",
                           "retryable": is_retryable(exc)}
                    return
                if result is not None:
                    await self._settle(watcher, observer)
                    yield result
                    return
                interval = await self._interval(remove is not None)
                if self.deadline is not None:
                    left = self.deadline - time.time()
                    if left <= 0:
                        await asyncio.to_thread(self._on_timeout)
                        await self._settle(watcher, observer)
                        yield {"status": "timeout", "message": "gave up waiting: the task's wait timeout passed"}
                        return
                    interval = min(interval, left)
                try:
                    await asyncio.wait_for(woken.wait(), interval)
                    self.pushed += 1
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in (observer, watcher):
                if task is not None and not task.done():
                    task.cancel()
            if remove is not None:
                remove()


class SlotTrigger(_ControlTableTrigger):
    """Wait in FIFO order for a slot and acquire it; yields one event with the lease.

    The grant is picked up here (``try_acquire``) with ``lease`` seconds, so it does not lapse
    while the task is being resumed on a worker; the worker re-acquires idempotently with the same
    holder and attempt and renews from then on. ``waiter_ttl`` must be comfortably longer than the
    interval between checks: the queue place expires if the trigger stops checking (triggerer down)
    for longer than that. ``pickup`` must cover the polling interval when there is no push.
    """

    def __init__(
        self,
        *,
        resource: str,
        holder: str,
        slots: int = 1,
        slot_mode: str = DEFAULT_MODE,
        lease: float,
        waiter_ttl: float,
        attempt: Optional[int] = None,
        pickup: Optional[float] = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = DEFAULT_TRIGGER_POLL_INTERVAL,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        withdraw_on_timeout: bool = True,
        not_before: Optional[float] = None,
        priority: int = 0,
        deferral: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval, refresh_interval=refresh_interval, deadline=deadline,
                         not_before=not_before, deferral=deferral)
        self.priority = int(priority)
        self.resource = resource
        self.holder = holder
        self.slots = slots
        self.slot_mode = slot_mode
        self.lease = float(lease)
        self.waiter_ttl = float(waiter_ttl)
        self.attempt = attempt
        self.pickup = pickup
        self.withdraw_on_timeout = withdraw_on_timeout
        # A check at most every quarter of the waiter's time to live keeps its queue entry alive.
        self.refresh_interval = min(self.refresh_interval, max(self.waiter_ttl / 4.0, self.poll_interval))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_controltable.triggers.controltable.SlotTrigger",
            {
                "resource": self.resource,
                "holder": self.holder,
                "slots": self.slots,
                "slot_mode": self.slot_mode,
                "lease": self.lease,
                "waiter_ttl": self.waiter_ttl,
                "attempt": self.attempt,
                "pickup": self.pickup,
                "withdraw_on_timeout": self.withdraw_on_timeout,
                "priority": self.priority,
                **self._conn_kwargs(),
            },
        )

    def _wakeup_keys(self, table: Any) -> list[str]:
        return list(table.wakeup_keys(self.resource, self.holder))

    def _check(self) -> Optional[dict[str, Any]]:
        options: dict[str, Any] = {"attempt": self.attempt, "priority": self.priority}
        if self.pickup is not None:
            options["pickup"] = self.pickup
        lease = self._shared_table().try_acquire(
            self.resource, holder=self.holder, slots=self.slots, mode=self.slot_mode,
            lease=self.lease, waiter_ttl=self.waiter_ttl, **options,
        )
        if lease is None:
            return None
        return {"status": "granted", **lease_payload(lease)}

    def _on_timeout(self) -> None:
        if self.withdraw_on_timeout:
            try:
                self._shared_table().release(self.resource, self.holder)
            except Exception as exc:  # the entry expires after waiter_ttl anyway
                log.warning("controltable: could not withdraw %r from %r: %s", self.holder, self.resource, exc)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        check_wait_args(self.slot_mode, self.resource)
        async for payload in self._wait():
            yield TriggerEvent(payload)


class PendingEventsTrigger(_ControlTableTrigger):
    """Wait until at least ``min_events`` rows of an event table are claimable.

    Checks every ``poll_interval``, and at once when a producer pushes (``EventTable.notify()``)
    or a batch is given back.
    """

    def __init__(
        self,
        *,
        table: str,
        key: str,
        min_events: int = 1,
        order_by: Optional[str] = None,
        schema: Optional[str] = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        not_before: Optional[float] = None,
        deferral: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval, refresh_interval=refresh_interval, deadline=deadline,
                         not_before=not_before, deferral=deferral)
        self.table = table
        self.key = key
        self.min_events = int(min_events)
        self.order_by = order_by
        self.schema = schema

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_controltable.triggers.controltable.PendingEventsTrigger",
            {
                "table": self.table,
                "key": self.key,
                "min_events": self.min_events,
                "order_by": self.order_by,
                "schema": self.schema,
                **self._conn_kwargs(),
            },
        )

    async def _interval(self, subscribed: bool) -> float:
        # Rows inserted by a producer that does not call ``notify()`` push nothing: always poll too.
        return self.poll_interval

    def _events(self) -> Any:
        return self._shared_table().events(self.table, key=self.key, order_by=self.order_by, table_schema=self.schema)

    def _wakeup_keys(self, table: Any) -> list[str]:
        return list(self._events().wakeup_keys())

    def _check(self) -> Optional[dict[str, Any]]:
        count = self._events().pending_count()
        if count < self.min_events:
            return None
        return {"status": "ready", "pending": count}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for payload in self._wait():
            yield TriggerEvent(payload)
