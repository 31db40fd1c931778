"""``PendingEventsSensor``: wait until an event table has at least N claimable rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Optional

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from airflow_controltable.defaults import DEFAULT_EVENTS_POKE_INTERVAL, DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL
from airflow_controltable.exceptions import ControlTableConfigError
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, UsesControlTable
from airflow_controltable.resume_race import deferral_facts
from airflow_controltable.triggers.events import PendingEventsTrigger
from airflow_controltable.utils import airflow_errors, trigger_failure


class PendingEventsSensor(UsesControlTable, BaseSensorOperator):
    """Succeed (pushing the pending count) once ``min_events`` rows of ``table`` are claimable.

    Works in ``poke``, ``reschedule`` and deferrable form. It only counts; claiming is
    :class:`~airflow_controltable.operators.events.ClaimBatchOperator`'s job, so several DAGs may
    watch one table without stealing from each other.
    """

    template_fields: Sequence[str] = ("table", "table_schema")
    ui_color = "#eaf0f8"

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
        deferrable: bool = False,
        poke_interval: float = DEFAULT_EVENTS_POKE_INTERVAL,
        poll_interval: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        #: How often the deferrable form's trigger checks (default: ``poke_interval``, at most 30 s).
        self.poll_interval = poll_interval
        self.table = table
        self.key = key
        self.min_events = min_events
        self.order_by = order_by
        #: The event table's schema.
        self.table_schema = table_schema
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema
        self.deferrable = deferrable

    def _count(self) -> int:
        if isinstance(self.min_events, bool) or not isinstance(self.min_events, int) or self.min_events < 1:
            raise ControlTableConfigError(f"min_events must be a whole number >= 1, got {self.min_events!r}")
        with airflow_errors():
            events = self._table().events(
                self.table, key=self.key, order_by=self.order_by, table_schema=self.table_schema
            )
            return events.pending_count()

    def poke(self, context: Context) -> PokeReturnValue:
        count = self._count()
        self.log.info("%d claimable event(s) in %r (waiting for %d)", count, self.table, self.min_events)
        return PokeReturnValue(is_done=count >= self.min_events, xcom_value=count)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        count = self._count()
        if count >= self.min_events:
            return count
        timeout = timedelta(seconds=float(self.timeout)) if self.timeout is not None else None
        self.defer(
            trigger=PendingEventsTrigger(
                table=self.table, key=self.key, min_events=self.min_events, order_by=self.order_by,
                table_schema=self.table_schema, conn_id=self.conn_id, namespace=self.namespace,
                control_schema=self.control_schema, poll_interval=self._poll_interval(),
                deferral=deferral_facts(),
            ),
            method_name="execute_complete",
            timeout=timeout,
        )

    def _poll_interval(self) -> float:
        if self.poll_interval is not None:
            return float(self.poll_interval)
        return min(float(self.poke_interval), DEFAULT_EVENTS_TRIGGER_POLL_INTERVAL)

    def execute_complete(self, context: Context, event: Optional[dict[str, Any]] = None) -> int:
        if not event or event.get("status") != "ready":
            raise trigger_failure(event, f"waiting for events in {self.table!r}")
        return int(event["pending"])
