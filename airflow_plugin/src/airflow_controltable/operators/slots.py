"""``ReleaseSlotOperator``: give back what a :class:`SlotSensor` acquired for the DAG run.

Use it as a teardown (``release.as_teardown(setups=acquire)``): Airflow then runs it when the work
in between fails too, so a failed load never keeps the warehouse slot until the lease runs out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from airflow.sdk import BaseOperator, Context

from airflow_controltable.exceptions import ControlTableConfigError
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, ControlTableHook
from airflow_controltable.utils import airflow_errors, dag_run_holder


class ReleaseSlotOperator(BaseOperator):
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
        super().__init__(**kwargs)
        self.resource = resource
        self.holder = holder
        self.conn_id = conn_id
        self.namespace = namespace
        self.control_schema = control_schema

    def execute(self, context: Context) -> int:
        holder = self.holder or dag_run_holder(context)
        hook = ControlTableHook(self.conn_id, namespace=self.namespace, schema=self.control_schema)
        with airflow_errors():
            table = hook.get_control_table()
            if not table.status([self.resource]):
                raise ControlTableConfigError(
                    f"resource {self.resource!r} does not exist in namespace {table.namespace!r}; check the name "
                    "(it must match the SlotSensor's) and the connection/namespace"
                )
            removed = table.release(self.resource, holder)
        if removed:
            self.log.info("released %r held by %r (%d row(s))", self.resource, holder, removed)
        else:
            self.log.warning(
                "nothing to release: %r holds no slot of %r (already released, never granted, or its lease expired)",
                holder, self.resource,
            )
        return removed
