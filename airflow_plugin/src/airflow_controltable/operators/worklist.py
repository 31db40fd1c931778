"""Ordered work list operators: allocate items of the current order, complete or fail them (fenced).

A work list runs every item of one ``order`` before any item of the next. Allocation hands out
only items of the lowest unfinished order, so a DAG maps workers over what
:class:`AllocateWorkItemOperator` returned, completes them, and allocates again for the next order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from airflow.sdk import Context

from airflow_controltable.exceptions import ControlTableConfigError
from airflow_controltable.operators.base import ControlTableBaseOperator
from airflow_controltable.utils import airflow_errors, load_handles, task_instance_holder


class _WorkListOperator(ControlTableBaseOperator):
    """Shared by the work list operators."""

    def _item(self, handle: dict[str, Any]) -> Any:
        try:
            name, item_id, token = str(handle["worklist"]), int(handle["id"]), int(handle["token"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlTableConfigError(
                f"not a work item handle (needs worklist, id, token): {handle!r}; pass what "
                "AllocateWorkItemOperator returned"
            ) from exc
        return self._table().worklist(name).get(item_id, token)


class AllocateWorkItemOperator(_WorkListOperator):
    """Allocate up to ``max_items`` items of the work list's current order; return their handles.

    Each handle is JSON (worklist, id, token, owner, order, payload), ready for
    ``work.expand(item=allocate.output)``. An empty list means the list is finished or the current
    order's remaining items are all taken; a list blocked only by errored items fails the task
    (clear the errors to go on).

    :param worklist: the work list name (templated).
    :param lease: seconds each item stays allocated; it must cover the work and the completion.
    """

    template_fields: Sequence[str] = ("worklist", "item_owner")
    ui_color = "#f3eaf8"

    def __init__(
        self,
        *,
        worklist: str,
        max_items: int = 1,
        item_owner: Optional[str] = None,
        lease: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worklist = worklist
        self.max_items = max_items
        self.item_owner = item_owner
        self.lease = lease

    def execute(self, context: Context) -> list[dict[str, Any]]:
        if isinstance(self.max_items, bool) or not isinstance(self.max_items, int) or self.max_items < 1:
            raise ControlTableConfigError(f"max_items must be a whole number >= 1, got {self.max_items!r}")
        owner = self.item_owner or task_instance_holder(context)
        handles: list[dict[str, Any]] = []
        with airflow_errors():
            worklist = self._table().worklist(self.worklist)
            for _ in range(self.max_items):
                item = worklist.allocate(owner=owner, lease=self.lease)
                if item is None:
                    break
                handles.append(item.handle())
            if not handles:
                status = worklist.status()
                if status.blocked_by_errors:
                    raise ControlTableConfigError(
                        f"work list {self.worklist!r} is blocked at order {status.current_order} by errored items; "
                        "fix them and clear the errors (`controltable worklist clear-errors`) to go on"
                    )
                if status.finished:
                    self.log.info("work list %r is finished (or empty)", self.worklist)
                else:
                    self.log.info(
                        "work list %r: every remaining item of order %s is taken", self.worklist, status.current_order
                    )
        for h in handles:
            self.log.info("allocated item %s (order %s, token %s)", h["id"], h["order"], h["token"])
        return handles


class CompleteWorkItemOperator(_WorkListOperator):
    """Mark allocated items done, fenced on their tokens (a lost lease fails the task clearly)."""

    template_fields: Sequence[str] = ("handle",)

    def __init__(self, *, handle: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle = handle

    def execute(self, context: Context) -> int:
        handles = load_handles(self.handle, "work item")
        for handle in handles:
            with airflow_errors():
                self._item(handle).complete()
            self.log.info("completed item %s of %r", handle["id"], handle["worklist"])
        return len(handles)


class FailWorkItemOperator(_WorkListOperator):
    """Mark allocated items as errored: they block later orders until their errors are cleared."""

    template_fields: Sequence[str] = ("handle", "reason")

    def __init__(self, *, handle: Any, reason: str = "failed in Airflow", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle = handle
        self.reason = reason

    def execute(self, context: Context) -> int:
        handles = load_handles(self.handle, "work item")
        for handle in handles:
            with airflow_errors():
                self._item(handle).fail(self.reason)
            self.log.info("marked item %s of %r as error: %s", handle["id"], handle["worklist"], self.reason)
        return len(handles)
