"""``ReleaseSlotOperator``: give back what a :class:`SlotSensor` acquired for the DAG run.

Use it as a teardown (``release.as_teardown(setups=acquire)``): Airflow then runs it when the work
in between fails too, so a failed load never keeps the warehouse slot until the lease runs out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from airflow.sdk import Context

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID
from airflow_controltable.operators.base import ControlTableBaseOperator
from airflow_controltable.utils import airflow_errors, dag_run_holder


class ReleaseSlotOperator(ControlTableBaseOperator):
    """Release (or withdraw from the queue) whatever ``holder`` has on ``resource``; returns rows removed.

    Releasing a slot that is no longer held (already released, or its lease ran out) is not an
    error: it logs a warning, so re-running the teardown is harmless. A resource that does not exist
    is an error (most likely a typo that would otherwise leave the real slot held).

    :param resource: the resource name (templated).
    :param holder: the holder (templated). Default: the DAG run, the sensor's default too.
    """

    template_fields: Sequence[str] = ("resource", "holder")
    ui_color = "#f8ece8"

    def __init__(
        self,
        *,
        resource: str,
        holder: Optional[str] = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema, **kwargs)
        self.resource = resource
        self.holder = holder

    def execute(self, context: Context) -> int:
        holder = self.holder or dag_run_holder(context)
        with airflow_errors():
            # An unknown resource raises (most likely a typo that would leave the real slot held).
            removed = self._table().release(self.resource, holder)
        if removed:
            self.log.info("released %r held by %r (%d row(s))", self.resource, holder, removed)
        else:
            self.log.warning(
                "nothing to release: %r holds no slot of %r (already released, never granted, or its lease expired)",
                holder, self.resource,
            )
        return removed
