"""Triggers that wait in the triggerer, holding no worker slot.

A trigger only *checks and acquires*. Both are idempotent: ``try_acquire`` with the same holder
keeps the same FIFO place and returns the same lease, so a trigger that runs twice (triggerer
failover) or an event delivered twice grants the slot once. The core API is synchronous, so every
database call runs in a worker thread (``asyncio.to_thread``) and never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Optional

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from controltable import DatabaseUnavailableError

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
        "lease_seconds": lease.lease_seconds,
        "expires_at": lease.expires_at.isoformat(),
    }


class _ControlTableTrigger(UsesControlTable, BaseTrigger):
    """Shared plumbing: the connection arguments and a thread-run database call."""

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = 5.0,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.poll_interval = float(poll_interval)

    def _conn_kwargs(self) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "namespace": self.namespace,
            "control_schema": self.control_schema,
            "poll_interval": self.poll_interval,
        }

    async def _poll(self) -> AsyncIterator[Any]:
        """Yield the result of ``self._check()`` until it is not None; errors become error events."""
        while True:
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
                yield result
                return
            await asyncio.sleep(self.poll_interval)

    def _check(self) -> Optional[dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError


class SlotTrigger(_ControlTableTrigger):
    """Wait in FIFO order for a slot and acquire it; yields one event with the lease.

    ``waiter_ttl`` must be comfortably longer than ``poll_interval``: the queue place expires if
    the trigger stops polling (triggerer down) for longer than that.
    """

    def __init__(
        self,
        *,
        resource: str,
        holder: str,
        slots: int = 1,
        slot_mode: str = "exclusive",
        lease: float,
        waiter_ttl: float,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = 5.0,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval)
        self.resource = resource
        self.holder = holder
        self.slots = slots
        self.slot_mode = slot_mode
        self.lease = float(lease)
        self.waiter_ttl = float(waiter_ttl)

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
                **self._conn_kwargs(),
            },
        )

    def _check(self) -> Optional[dict[str, Any]]:
        lease = self._table().try_acquire(
            self.resource, holder=self.holder, slots=self.slots, mode=self.slot_mode,
            lease=self.lease, waiter_ttl=self.waiter_ttl,
        )
        if lease is None:
            return None
        return {"status": "granted", **lease_payload(lease)}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for payload in self._poll():
            yield TriggerEvent(payload)


class PendingEventsTrigger(_ControlTableTrigger):
    """Wait until at least ``min_events`` rows of an event table are claimable."""

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
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval)
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

    def _check(self) -> Optional[dict[str, Any]]:
        events = self._table().events(self.table, key=self.key, order_by=self.order_by, schema=self.schema)
        count = events.pending_count()
        if count < self.min_events:
            return None
        return {"status": "ready", "pending": count}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for payload in self._poll():
            yield TriggerEvent(payload)
