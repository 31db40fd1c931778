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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Callable, Optional

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.utils import DEFAULT_REFRESH_INTERVAL, check_wait_args
from controltable import DatabaseUnavailableError
from controltable.defaults import DEFAULT_MODE

log = logging.getLogger(__name__)


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
        poll_interval: float = 5.0,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        not_before: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.poll_interval = float(poll_interval)
        self.refresh_interval = max(float(refresh_interval), self.poll_interval)
        #: Wall-clock (epoch seconds) after which the trigger gives up with a "timeout" event.
        self.deadline = deadline
        #: Wall-clock (epoch seconds) before which no event is fired (see ``DEFAULT_RESUME_SETTLE``).
        self.not_before = not_before
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

    async def _wait(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the first non-None result of ``self._check()``; errors become error events."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
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
                    yield {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
                    return
                if result is not None:
                    if self.not_before is not None and self.not_before > time.time():
                        await asyncio.sleep(self.not_before - time.time())
                    yield result
                    return
                interval = await self._interval(remove is not None)
                if self.deadline is not None:
                    left = self.deadline - time.time()
                    if left <= 0:
                        await asyncio.to_thread(self._on_timeout)
                        yield {"status": "timeout", "message": "gave up waiting: the task's wait timeout passed"}
                        return
                    interval = min(interval, left)
                try:
                    await asyncio.wait_for(woken.wait(), interval)
                    self.pushed += 1
                except asyncio.TimeoutError:
                    pass
        finally:
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
        poll_interval: float = 5.0,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        withdraw_on_timeout: bool = True,
        not_before: Optional[float] = None,
        priority: int = 0,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval, refresh_interval=refresh_interval, deadline=deadline,
                         not_before=not_before)
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
        poll_interval: float = 5.0,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        not_before: Optional[float] = None,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval, refresh_interval=refresh_interval, deadline=deadline,
                         not_before=not_before)
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
        return self._shared_table().events(self.table, key=self.key, order_by=self.order_by, schema=self.schema)

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
