"""``event_table_asset_check``: an asset check that an event table is being drained.

Why an asset check: an asset fed by an event table (``build_batch_op`` or a claiming asset) can
materialize successfully every time while its backlog grows, or while events pile up in the error
state after their last attempt. The check reads the table's counts through the core
(:meth:`EventTable.stats`) and fails when the oldest pending event is older than
``max_pending_age`` or more than ``max_error_rows`` events are in error, so the asset's page in the
Dagster UI shows a stuck or failing feed where people already look.

(No ``from __future__ import annotations`` here: Dagster reads the ``context`` annotation.)
"""

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional, Union

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetsDefinition,
    MetadataValue,
    SourceAsset,
    asset_check,
)

from controltable import ConfigurationError, ControlTableError
from controltable.waiting_text import jsonable

from . import defaults
from .resource import ControlTableResource
from .text import duration

AssetRef = Union[str, AssetKey, AssetsDefinition, SourceAsset]


@dataclass
class EventTableVerdict:
    """The outcome of comparing an event table's counts with the thresholds (see :func:`judge_event_table`)."""

    passed: bool
    #: One sentence per threshold exceeded (empty when passed).
    problems: list[str] = field(default_factory=list)
    #: One sentence saying how the table stands, for the check's description.
    summary: str = ""


def judge_event_table(stats: Any, *, max_pending_age: Optional[float], max_error_rows: Optional[int],
                      key: str = "key") -> EventTableVerdict:
    """Compare ``stats`` (an ``EventStats``) with the thresholds: a pure decision, tested without a database.

    ``max_pending_age``: seconds the oldest pending event (first in claim order) may wait.
    Backing-off events count as pending: they wait too. An oldest pending event whose time
    column is empty fails the age check, because its age cannot be known. ``max_error_rows``:
    how many events may sit in the error state (0: none).
    """
    problems = []
    age = stats.oldest_pending_age
    if max_pending_age is not None and stats.pending:
        if age is None:
            problems.append(f"the oldest pending event ({key}={stats.oldest_pending_key!r}) has no event time, so "
                            f"its age cannot be compared with max_pending_age={max_pending_age:g} s")
        elif age > max_pending_age:
            problems.append(f"the oldest pending event ({key}={stats.oldest_pending_key!r}) is {duration(age)} old, "
                            f"more than max_pending_age={max_pending_age:g} s: the table is not drained fast "
                            "enough (is the job that claims it running?)")
    if max_error_rows is not None and stats.error > max_error_rows:
        problems.append(f"{stats.error} event(s) in error after their last attempt, more than "
                        f"max_error_rows={max_error_rows}: fix the cause, then retry them with `controltable events "
                        "retry-errors` or EventTable.retry_errors()")
    summary = (f"{stats.pending} pending, {stats.claimed} claimed ({stats.expired} with expired claims), "
               f"{stats.done} done, {stats.error} in error")
    if stats.pending and stats.oldest_pending_key is not None:
        summary += f"; oldest pending {key}={stats.oldest_pending_key!r}" + (
            f", {duration(age)} old" if age is not None else "")
    return EventTableVerdict(passed=not problems, problems=problems, summary=summary)


def event_table_asset_check(
    *,
    asset: AssetRef,
    table: str,
    key: str,
    max_pending_age: Union[float, timedelta, None] = None,
    max_error_rows: Optional[int] = None,
    time_column: Optional[str] = None,
    order_by: Optional[str] = None,
    table_schema: Optional[str] = None,
    name: Optional[str] = None,
    resource_key: str = defaults.RESOURCE_KEY,
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR,
    blocking: bool = False,
    description: Optional[str] = None,
) -> AssetChecksDefinition:
    """An asset check on ``asset`` that passes while event table ``table`` keeps up.

    It fails (with ``severity``) when the oldest pending event is older than ``max_pending_age``
    (seconds or a ``timedelta``; needs ``time_column``, the column holding each event's time) or
    when more than ``max_error_rows`` events are in the error state. At least one threshold must
    be given. Ages are measured on the database clock. The result's metadata holds the counts per
    state, the oldest pending key and age, and the thresholds, so the check history charts the
    backlog. ``blocking=True`` stops downstream assets of the same run while the check fails.

    Example::

        orders_drained = event_table_asset_check(
            asset=orders, table="order_events", key="id", time_column="created_at",
            max_pending_age=timedelta(minutes=15), max_error_rows=0)
        defs = Definitions(assets=[orders], asset_checks=[orders_drained],
                           resources={"controltable": ControlTableResource(url=...)})
    """
    age_limit = max_pending_age.total_seconds() if isinstance(max_pending_age, timedelta) else max_pending_age
    if age_limit is None and max_error_rows is None:
        raise ConfigurationError("event_table_asset_check needs max_pending_age and/or max_error_rows: with neither "
                                 "it could never fail")
    if age_limit is not None and (not isinstance(age_limit, (int, float)) or not age_limit > 0):
        raise ConfigurationError(f"max_pending_age must be a positive number of seconds or a timedelta, got "
                                 f"{max_pending_age!r}")
    if max_error_rows is not None and (isinstance(max_error_rows, bool) or not isinstance(max_error_rows, int)
                                       or max_error_rows < 0):
        raise ConfigurationError(f"max_error_rows must be a whole number >= 0, got {max_error_rows!r}")
    if age_limit is not None and time_column is None:
        raise ConfigurationError(
            f"max_pending_age needs time_column=: the column of {table!r} that holds each event's time (the age "
            "of the oldest pending event is measured from it)")
    limit = float(age_limit) if age_limit is not None else None
    thresholds = {"max_pending_age_seconds": limit, "max_error_rows": max_error_rows}
    check_name = name or f"{table}_drained"
    told = []
    if limit is not None:
        told.append(f"no pending event older than {duration(limit)}")
    if max_error_rows is not None:
        told.append(f"at most {max_error_rows} event(s) in error")

    @asset_check(
        asset=asset,
        name=check_name,
        required_resource_keys={resource_key},
        blocking=blocking,
        description=description or f"Event table {table}: {' and '.join(told)}.",
    )
    def _check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        resource: ControlTableResource = getattr(context.resources, resource_key)
        events = resource.events(table, key=key, order_by=order_by, table_schema=table_schema,
                                 time_column=time_column)
        try:
            stats = events.stats()
        except ControlTableError as exc:
            raise resource.failure(exc, f"reading the counts of event table {table!r}") from exc
        verdict = judge_event_table(stats, max_pending_age=limit, max_error_rows=max_error_rows, key=key)
        metadata: dict[str, Any] = {
            "controltable/table": MetadataValue.text(stats.table),
            "controltable/pending": MetadataValue.int(stats.pending),
            "controltable/claimed": MetadataValue.int(stats.claimed),
            "controltable/expired": MetadataValue.int(stats.expired),
            "controltable/done": MetadataValue.int(stats.done),
            "controltable/error": MetadataValue.int(stats.error),
            "controltable/thresholds": MetadataValue.json(thresholds),
        }
        if stats.oldest_pending_key is not None:
            metadata["controltable/oldest_pending_key"] = MetadataValue.text(str(jsonable(stats.oldest_pending_key)))
        if stats.oldest_pending_age is not None:
            metadata["controltable/oldest_pending_age_seconds"] = MetadataValue.float(
                round(float(stats.oldest_pending_age), 3))
        text = verdict.summary if verdict.passed else f"{'; '.join(verdict.problems)} ({verdict.summary})"
        metadata["controltable/verdict"] = MetadataValue.text(text)
        (context.log.info if verdict.passed else context.log.warning)(f"controltable: {table!r}: {text}")
        return AssetCheckResult(passed=verdict.passed, severity=severity, metadata=metadata,
                                description=text)

    return _check
