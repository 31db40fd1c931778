"""Op factories: drain an event table batch by batch, and work through an ordered work list.

Both ops look up the :class:`ControlTableResource` under ``resource_key`` and record what they
did (tables, fencing tokens, keys, counts) as output metadata, so a run's page in the Dagster UI
says which events or items it handled and under which token.

(No ``from __future__ import annotations`` here: Dagster reads the ``context`` annotation.)
"""

from typing import Any, Callable, Optional

from dagster import (
    Failure,
    In,
    MetadataValue,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    Output,
    RetryRequested,
    op,
)

from controltable import ControlTableError, LeaseLost
from controltable.waiting_text import jsonable

from . import defaults
from .resource import ControlTableResource, batch_metadata
from .step import current_step

try:  # type hints only
    from controltable.events import Batch
    from controltable.worklist import Item
except ImportError:  # pragma: no cover
    Batch = Item = Any  # type: ignore[misc,assignment]

BatchProcessor = Callable[[OpExecutionContext, Batch], Any]
ItemProcessor = Callable[[OpExecutionContext, Item], Any]
_MAX_KEYS = defaults.MAX_METADATA_KEYS


def build_batch_op(
    process: BatchProcessor,
    *,
    table: str,
    key: str,
    name: Optional[str] = None,
    size: int = defaults.BATCH_SIZE,
    order_by: Optional[str] = None,
    table_schema: Optional[str] = None,
    lease: Optional[float] = None,
    max_batches: Optional[int] = None,
    resource_key: str = defaults.RESOURCE_KEY,
    description: Optional[str] = None,
    tags: Optional[dict[str, Any]] = None,
    owner: Optional[str] = None,
    interrupt: Optional[bool] = None,
    **event_options: Any,
) -> OpDefinition:
    """An op that claims batches of ``table``, calls ``process(context, batch)`` and completes them.

    It loops until nothing is claimable (or ``max_batches`` batches are done). Completion is
    fenced on each batch's token: if the claim expired while ``process`` ran and another worker
    took rows over, the op fails naming them and nothing of that batch is completed. If
    ``process`` raises, the batch's rows go back for a retry after the table's back-off and the
    op fails. ``process`` may finish the batch itself (``batch.transaction()`` commits its own
    writes together with the completion); otherwise the op completes it.

    The op's output is a summary dict; its metadata holds the table, the batch count, the event
    count, the fencing tokens and the keys (first 100). The op has an optional ``start_after``
    input of type ``Nothing`` for ordering it after another op. ``table_schema`` is the event
    table's schema. ``owner`` (default: the step's holder
    id, ``dagster:<run id>:<step key>``) is recorded on the claimed rows.

    Each batch's lease is renewed in the background while ``process`` runs; if it is found lost
    or expired, ``process`` is interrupted (:class:`~controltable.LeaseLostInterrupt`) and the op
    fails naming the lease loss. ``interrupt=False`` (default: the resource's
    ``interrupt_on_lease_loss``) lets it run on.
    """
    op_name = name or f"process_{table}"

    @op(
        name=op_name,
        required_resource_keys={resource_key},
        ins={"start_after": In(Nothing)},
        out=Out(dict, description="Summary: table, batches, events, tokens, keys."),
        description=description or f"Claims batches of {table} and completes them after processing.",
        tags=tags,
    )
    def _batch_op(context: OpExecutionContext):  # type: ignore[no-untyped-def]
        resource: ControlTableResource = getattr(context.resources, resource_key)
        tokens: list[int] = []
        keys: list[Any] = []
        batches = 0
        while max_batches is None or batches < max_batches:
            with resource.claim_batch(table, key=key, size=size, order_by=order_by, table_schema=table_schema,
                                      owner=owner, lease=lease, interrupt=interrupt, **event_options) as batch:
                if batch is None:
                    break
                try:
                    process(context, batch)
                except (Failure, RetryRequested):
                    raise
                except LeaseLost as exc:  # interrupted (or fenced out): the claim is gone, not given back
                    raise resource.failure(exc, f"processing batch {batch.token} of {table!r}") from exc
                except Exception as exc:
                    raise Failure(
                        description=(f"processing batch {batch.token} of {table!r} ({len(batch)} events) failed: "
                                     f"{type(exc).__name__}: {exc}. Its events were given back for a retry after "
                                     "the table's back-off."),
                        metadata=batch_metadata(batch),
                        allow_retries=True,
                    ) from exc
                tokens.append(int(batch.token))
                keys.extend(jsonable(k) for k in batch.keys)
                batches += 1
            context.log.info(f"completed batch {batch.token} of {table!r}: {len(batch)} event(s)")
        summary = {"table": table, "batches": batches, "events": len(keys), "tokens": tokens,
                   "keys": keys[:_MAX_KEYS]}
        if batches == 0:
            context.log.info(f"no claimable events in {table!r}")
        return Output(
            summary,
            metadata={
                "controltable/table": MetadataValue.text(table),
                "controltable/batches": MetadataValue.int(batches),
                "controltable/events": MetadataValue.int(len(keys)),
                "controltable/tokens": MetadataValue.json(tokens),
                "controltable/keys": MetadataValue.json({"keys": keys[:_MAX_KEYS],
                                                         "truncated": len(keys) > _MAX_KEYS}),
            },
        )

    return _batch_op


def build_worklist_op(
    process: ItemProcessor,
    *,
    worklist: str,
    name: Optional[str] = None,
    lease: Optional[float] = None,
    poll_interval: Optional[float] = None,
    timeout: Optional[float] = None,
    resource_key: str = defaults.RESOURCE_KEY,
    description: Optional[str] = None,
    tags: Optional[dict[str, Any]] = None,
    owner: Optional[str] = None,
    interrupt: Optional[bool] = None,
) -> OpDefinition:
    """An op that allocates items of ``worklist`` in order until none are left.

    Items of one order all finish before the next order starts, also when several copies of the
    op (``.alias("worker_2")``) or other Dagster instances, Airflow tasks and shell jobs work on
    the same list. ``process(context, item)`` handles one item; the op completes it (fenced on
    the item's token). If ``process`` raises, the item is marked as error and the op fails: the
    list then stops at that order until the error is cleared, which is the work list's contract.
    ``timeout`` bounds how long the op waits while other workers hold the current order's items;
    ``poll_interval`` (default: the core's) is how often it looks while it waits without a wake-up.
    ``owner`` (default: the step's holder id, ``dagster:<run id>:<step key>``) is who the items
    are allocated to.

    Each item's lease is renewed in the background while ``process`` runs (``item.renewing()``);
    if it is found lost or expired, ``process`` is interrupted
    (:class:`~controltable.LeaseLostInterrupt`) and the op fails naming the lease loss, leaving
    the item to whoever holds it now. ``interrupt=False`` (default: the resource's
    ``interrupt_on_lease_loss``) lets it run on; the fenced completion then fails.
    """
    op_name = name or f"work_{worklist}"

    @op(
        name=op_name,
        required_resource_keys={resource_key},
        ins={"start_after": In(Nothing)},
        out=Out(dict, description="Summary: work list, items, orders, tokens."),
        description=description or f"Works through the ordered work list {worklist}.",
        tags=tags,
    )
    def _worklist_op(context: OpExecutionContext):  # type: ignore[no-untyped-def]
        resource: ControlTableResource = getattr(context.resources, resource_key)
        wl = resource.worklist(worklist)
        step = current_step()
        who = owner or step.holder
        interrupting = resource.interrupt_on_lease_loss if interrupt is None else bool(interrupt)
        # The core's own default interval unless one was given.
        waiting = {} if poll_interval is None else {"poll_interval": poll_interval}
        done: list[dict[str, Any]] = []
        try:
            for item in wl.items(who, lease=lease, timeout=timeout, **waiting):
                try:
                    with item.renewing(stop_when_orphaned=step.own_process, interrupt=interrupting):
                        process(context, item)
                except Exception as exc:
                    if item.lost is not None:  # found lost or expired: the item may be another worker's now
                        if isinstance(exc, LeaseLost):
                            raise resource.failure(
                                exc, f"working on item {item.id} (order {item.order}) of {worklist!r}") from exc
                        raise
                    if isinstance(exc, RetryRequested):
                        item.release()
                        raise
                    item.fail(f"{type(exc).__name__}: {exc}")
                    if isinstance(exc, Failure):
                        raise
                    raise Failure(
                        description=(f"work item {item.id} (order {item.order}) of {worklist!r} failed: "
                                     f"{type(exc).__name__}: {exc}. The list stops at order {item.order} until the "
                                     "error is cleared (WorkList.clear_errors() or `controltable worklist "
                                     "clear-errors`)."),
                        metadata={"controltable/item": MetadataValue.json(_item_json(item))},
                    ) from exc
                except BaseException:  # cancelled: hand the item back for another worker
                    item.release()
                    raise
                item.complete()
                done.append({"id": item.id, "order": item.order, "token": item.token})
                context.log.info(f"completed work item {item.id} (order {item.order}, token {item.token})")
        except ControlTableError as exc:
            raise resource.failure(exc, f"working through {worklist!r}") from exc
        orders = sorted({d["order"] for d in done})
        return Output(
            {"worklist": worklist, "items": len(done), "orders": orders, "done": done[:_MAX_KEYS]},
            metadata={
                "controltable/worklist": MetadataValue.text(worklist),
                "controltable/items": MetadataValue.int(len(done)),
                "controltable/orders": MetadataValue.json(orders),
                "controltable/tokens": MetadataValue.json([d["token"] for d in done][:_MAX_KEYS]),
            },
        )

    return _worklist_op


def _item_json(item: Item) -> dict[str, Any]:
    try:
        return dict(item.handle())
    except Exception:  # pragma: no cover - payload not JSON after all
        return {"id": item.id, "order": item.order, "token": item.token}
