"""``PendingEventsTrigger``: wait in the triggerer until an event table has enough claimable rows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Optional

from airflow.triggers.base import TriggerEvent

from airflow_controltable.defaults import DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL, DEFAULT_REFRESH_INTERVAL
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID
from airflow_controltable.triggers.base import _ControlTableTrigger


class PendingEventsTrigger(_ControlTableTrigger):
    """Wait until at least ``min_events`` rows of an event table are claimable.

    Checks every ``poll_interval``, and at once when a producer pushes (``EventTable.notify()``)
    or a batch is given back. ``table_schema`` is the event table's schema.
    """

    def __init__(
        self,
        *,
        table: str,
        key: str,
        min_events: int = 1,
        order_by: Optional[str] = None,
        table_schema: Optional[str] = None,
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
        #: The event table's schema.
        self.table_schema = table_schema

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{__name__}.PendingEventsTrigger",
            {
                "table": self.table,
                "key": self.key,
                "min_events": self.min_events,
                "order_by": self.order_by,
                "table_schema": self.table_schema,
                **self._conn_kwargs(),
            },
        )

    async def _interval(self, subscribed: bool) -> float:
        # Rows inserted by a producer that does not call ``notify()`` push nothing: always poll too.
        return self.poll_interval

    def _events(self) -> Any:
        return self._shared_table().events(self.table, key=self.key, order_by=self.order_by,
                                           table_schema=self.table_schema)

    def _wakeup_keys(self, table: Any) -> list[str]:
        return list(self._events().wakeup_keys())

    async def _check(self) -> Optional[dict[str, Any]]:
        act = await self._shared_async()
        count = await act.events(self.table, key=self.key, order_by=self.order_by,
                                 table_schema=self.table_schema).pending_count()
        if count < self.min_events:
            return None
        return {"status": "ready", "pending": count}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for payload in self._wait():
            yield TriggerEvent(payload)
