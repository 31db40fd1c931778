"""Task factories: drain an event table batch by batch, and work through an ordered work list.

Like ``prefect-sqlalchemy``'s tasks and Dagster's op factories: ``build_batch_task(handle, ...)``
returns a Prefect task that claims batches, calls ``handle(batch)`` and completes them (fenced on
each batch's token); ``build_worklist_task(handle, ...)`` allocates work items in order. Both
return a summary (tokens, counts, keys) as the task's result, and both hold what they claimed for
the run (owner ``prefect:<flow run id>:<task run id>``), giving it back when the run is cancelled.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from prefect import Task, task

from controltable import LeaseLost
from controltable.events import Batch
from controltable.waiting_text import jsonable
from controltable.worklist import Item

from .block import ControlTableBlock, resolve_block
from .run import current_run

#: Keys shown in a task's summary at most.
MAX_KEYS = 100
BlockRef = Union[ControlTableBlock, str]


def build_batch_task(
    handle: Callable[[Batch], Any],
    *,
    block: BlockRef,
    table: str,
    key: str,
    size: int = 100,
    order_by: Optional[str] = None,
    table_schema: Optional[str] = None,
    lease: Optional[float] = None,
    max_batches: Optional[int] = None,
    name: Optional[str] = None,
    interrupt: Optional[bool] = None,
    **task_options: Any,
) -> Task[[], dict[str, Any]]:
    """A task that claims batches of ``table`` until none is claimable (or ``max_batches``), calling ``handle``.

    ``handle(batch)`` may finish the batch itself (``batch.transaction()`` commits its own writes
    with the completion); otherwise the task completes it. If ``handle`` raises, the batch's rows
    go back for a retry after the table's back-off and the task fails (Prefect's retries apply).
    A cancelled or crashed run gives the rows back untouched. Each batch's lease is renewed while
    ``handle`` runs; a lease found lost interrupts it (``LeaseLostInterrupt``) and fails the task
    without touching rows another worker may hold now. ``task_options`` go to ``@task``
    (``retries``, ``tags``...).
    """

    def process_batches() -> dict[str, Any]:
        ct_block = resolve_block(block)
        run = current_run()
        events = ct_block.control_table().events(table, key=key, order_by=order_by, table_schema=table_schema)
        interrupting = ct_block.interrupt_on_lease_loss if interrupt is None else bool(interrupt)
        tokens: list[int] = []
        keys: list[Any] = []
        while max_batches is None or len(tokens) < max_batches:
            batch = events.claim(size, owner=run.holder, lease=lease)
            if batch is None:
                break
            run.logger.info(f"controltable: claimed {len(batch)} event(s) of {table!r} under token {batch.token}")
            try:
                with batch.renewing(stop_when_orphaned=run.supervised, interrupt=interrupting):
                    handle(batch)
            except Exception as exc:
                if batch.lost is None and not batch.finished and not isinstance(exc, LeaseLost):
                    batch.fail(f"{type(exc).__name__}: {exc}")
                raise
            except BaseException:  # cancelled (TerminationSignal) or interrupted: give the rows back untouched
                if not batch.finished:
                    batch.release()
                raise
            if not batch.finished:
                batch.complete()
            tokens.append(int(batch.token))
            keys.extend(jsonable(k) for k in batch.keys)
            run.logger.info(f"controltable: completed batch {batch.token} of {table!r}: {len(batch)} event(s)")
        if not tokens:
            run.logger.info(f"controltable: no claimable events in {table!r}")
        return {"table": table, "batches": len(tokens), "events": len(keys), "tokens": tokens,
                "keys": keys[:MAX_KEYS]}

    return task(process_batches, name=name or f"process_{table}", **task_options)


def build_worklist_task(
    handle: Callable[[Item], Any],
    *,
    block: BlockRef,
    worklist: str,
    lease: Optional[float] = None,
    timeout: Optional[float] = None,
    poll_interval: Optional[float] = None,
    name: Optional[str] = None,
    interrupt: Optional[bool] = None,
    **task_options: Any,
) -> Task[[], dict[str, Any]]:
    """A task that allocates items of ``worklist`` in order until none are left, calling ``handle(item)``.

    Items of one order all finish before the next order starts, also across several such tasks,
    Airflow tasks, Dagster ops and shell jobs on the same list. If ``handle`` raises, the item is
    marked as error and the task fails; the list then stops at that order until the error is
    cleared (the work list's contract). A cancelled run hands its item back for another worker.
    ``timeout`` bounds the wait while others hold the current order's items.
    """

    def work_items() -> dict[str, Any]:
        ct_block = resolve_block(block)
        run = current_run()
        wl = ct_block.control_table().worklist(worklist)
        interrupting = ct_block.interrupt_on_lease_loss if interrupt is None else bool(interrupt)
        waiting = {} if poll_interval is None else {"poll_interval": poll_interval}
        done: list[dict[str, Any]] = []
        for item in wl.items(run.holder, lease=lease, timeout=timeout, **waiting):
            try:
                with item.renewing(stop_when_orphaned=run.supervised, interrupt=interrupting):
                    handle(item)
            except Exception as exc:
                if item.lost is None and not isinstance(exc, LeaseLost):
                    item.fail(f"{type(exc).__name__}: {exc}")
                raise
            except BaseException:  # cancelled: hand the item back for another worker
                item.release()
                raise
            item.complete()  # safe when ``handle`` completed it: done under this token counts as completed
            done.append({"id": jsonable(item.id), "order": jsonable(item.order), "token": int(item.token)})
            run.logger.info(f"controltable: completed item {item.id} (order {item.order}) of {worklist!r}")
        return {"worklist": worklist, "items": len(done), "done": done[:MAX_KEYS]}

    return task(work_items, name=name or f"work_{worklist}", **task_options)
