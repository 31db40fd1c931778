"""The triggers' shared plumbing: connection arguments, the shared table, and the push-or-poll wait loop.

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
lost notification. Checks run on the core's asyncio API (:class:`controltable.aio.AsyncControlTable`,
one per shared table and event loop, over the async driver): no thread is used per check, and no
trigger ever blocks a thread while it waits.

Every event waits first until firing cannot make Airflow's scheduler fail the resumed task (the
workaround in :mod:`airflow_controltable.resume_race`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Callable, Optional

from airflow.triggers.base import BaseTrigger

from airflow_controltable.defaults import DEFAULT_REFRESH_INTERVAL, DEFAULT_TRIGGER_POLL_INTERVAL
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.resume_race import SettleBeforeFiring, in_deferring_process
from controltable import DatabaseUnavailableError
from controltable.aio import AsyncControlTable, loop_shared
from controltable.errors import is_retryable

log = logging.getLogger("airflow_controltable.triggers")  # one logger for the triggers' wait


class _ControlTableTrigger(SettleBeforeFiring, UsesControlTable, BaseTrigger):
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
        # ``not_before`` and the deferring process's facts: when an event may fire (resume_race).
        self._init_settle(deferral, not_before)
        self._ct: Any = None
        self._act: Optional[AsyncControlTable] = None
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

    async def _shared_async(self) -> AsyncControlTable:
        """The asyncio API over the shared table's database and settings, shared by this loop's triggers."""
        if self._act is None:
            table = await asyncio.to_thread(self._shared_table)
            # One twin per table and loop, shared by the loop's triggers, closed when the loop ends.
            self._act = loop_shared(table, lambda: AsyncControlTable.from_control_table(table))  # no I/O
        return self._act

    def _wakeup_keys(self, table: Any) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _check(self) -> Optional[dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _on_timeout(self) -> None:
        """Called when the deadline passes: withdraw whatever the wait left behind."""

    async def _subscribe(self, loop: asyncio.AbstractEventLoop, woken: asyncio.Event) -> Optional[Callable[[], None]]:
        """Register for pushes; None when the table offers none (polling only)."""

        def on_push() -> None:  # called from the listener thread
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop closed (triggerer shutting down)
                pass

        try:
            table = (await self._shared_async()).sync
            keys = self._wakeup_keys(table)
            return await asyncio.to_thread(table.add_wakeup_listener, keys, on_push)
        except Exception as exc:  # no push: polling still works
            log.info("controltable: no push wake-ups for this trigger (%s); polling every %.1f s", exc,
                     self.poll_interval)
            return None

    async def _push_active(self) -> bool:
        try:
            table = (await self._shared_async()).sync
            return bool(await asyncio.to_thread(lambda: table.push_active))
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
                    result = await self._check()
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
                        await self._on_timeout()
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
