"""Event batch operators: claim a batch, hand it through XCom, complete or fail it (fenced).

The claim is a soft lock: no database lock is held while the batch is processed; the rows carry a
token and a lease. Completion is fenced on that token, so a task whose lease ran out (and whose
rows another worker re-claimed) fails clearly instead of marking someone else's rows done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from airflow.sdk import Context

from airflow_controltable.exceptions import ControlTableConfigError
from airflow_controltable.operators.base import ControlTableBaseOperator
from airflow_controltable.utils import airflow_errors, load_handles, task_instance_holder


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ControlTableConfigError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


class _EventOperator(ControlTableBaseOperator):
    """Connection plumbing and retry policy shared by the batch operators.

    :param max_attempts: claims of a row before a failure (or an expired claim) moves it to the
        error state instead of back to the queue (default: the core's).
    :param backoff: seconds before a failed row can be claimed again, doubled per attempt.
    :param max_backoff: the longest back-off (seconds).
    """

    def __init__(
        self,
        *,
        max_attempts: Optional[int] = None,
        backoff: Optional[float] = None,
        max_backoff: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff

    def _policy(self) -> dict[str, Any]:
        """The retry options given (the core validates and bounds them)."""
        options = {"max_attempts": self.max_attempts, "backoff": self.backoff, "max_backoff": self.max_backoff}
        return {k: v for k, v in options.items() if v is not None}

    def _events(self, table: str, key: str, order_by: Optional[str], table_schema: Optional[str]) -> Any:
        return self._table().events(table, key=key, order_by=order_by, table_schema=table_schema, **self._policy())

    def _batch(self, handle: dict[str, Any]) -> Any:
        """Rebuild a claimed batch from its handle (which carries the table, key and ``table_schema``)."""
        if "table" not in handle or "key" not in handle:
            raise ControlTableConfigError(
                f"batch handle {handle!r} has no table/key; pass the handles ClaimBatchOperator returned"
            )
        return self._events(handle["table"], handle["key"], handle.get("order_by"),
                            handle.get("table_schema")).batch(handle)


class ClaimBatchOperator(_EventOperator):
    """Claim up to ``max_batches`` batches of ``size`` rows; return their handles as a list.

    Each handle is JSON (table, key, keys, token, owner, expires_at, optionally rows), so the list
    feeds dynamic task mapping directly: ``process.expand(handle=claim.output)``. An empty list
    (nothing claimable) makes the mapped tasks skip.

    :param table: the user's event table (templated); ``prepare=True`` adds the claim columns
        and index if missing (needs DDL rights), otherwise run ``controltable events prepare``.
    :param key: its unique key column.
    :param lease: seconds the rows stay claimed; must cover processing and completion. When it
        runs out the rows become claimable again and completing the old batch fails.
    :param include_rows: also put the claimed rows in the handles (keep batches small then).
    :param table_schema: the event table's schema (templated).
    :param batch_owner: who claims (default: the task instance); not ``owner``, which every Airflow
        operator already has for the task's owner.
    """

    template_fields: Sequence[str] = ("table", "table_schema", "batch_owner")
    ui_color = "#eaf0f8"

    def __init__(
        self,
        *,
        table: str,
        key: str,
        size: int = 100,
        max_batches: int = 1,
        order_by: Optional[str] = None,
        table_schema: Optional[str] = None,
        batch_owner: Optional[str] = None,
        lease: Optional[float] = None,
        include_rows: bool = False,
        prepare: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.key = key
        self.size = size
        self.max_batches = max_batches
        self.order_by = order_by
        self.table_schema = table_schema
        self.batch_owner = batch_owner
        self.lease = lease
        self.include_rows = include_rows
        self.prepare = prepare

    def execute(self, context: Context) -> list[dict[str, Any]]:
        size = _check_positive("size", self.size)
        max_batches = _check_positive("max_batches", self.max_batches)
        owner = self.batch_owner or task_instance_holder(context)
        handles: list[dict[str, Any]] = []
        with airflow_errors():
            events = self._events(self.table, self.key, self.order_by, self.table_schema)
            if self.prepare:
                for statement in events.prepare():
                    self.log.info("prepared %r: %s", self.table, statement)
            for _ in range(max_batches):
                batch = events.claim(size, owner=owner, lease=self.lease)
                if batch is None:
                    break
                handle = dict(batch.handle(), key=self.key, order_by=self.order_by)
                if self.include_rows:
                    handle["rows"] = batch.rows
                handles.append(handle)
                self.log.info("claimed %d row(s) of %r, token %d", len(batch), self.table, batch.token)
        if not handles:
            self.log.info("nothing claimable in %r", self.table)
        return handles


class CompleteBatchOperator(_EventOperator):
    """Mark claimed batches done, fenced on their tokens.

    :param handle: one handle or a list of them (templated; usually an XComArg, or mapped with
        ``CompleteBatchOperator.partial(...).expand(handle=...)``).
    :raises ControlTableLeaseLost: if the lease ran out and rows were re-claimed; nothing of that
        batch is marked done. It is retryable like every lost lease (the task's ``retries`` apply),
        but a retry of this task meets the same stale token and fails the same way: the rows belong
        to the newer claim, which processes and completes them (at-least-once). To redo the work
        under a new claim, retry the claiming task's run from the claim on.
    """

    template_fields: Sequence[str] = ("handle",)

    def __init__(self, *, handle: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle = handle

    def execute(self, context: Context) -> int:
        done = 0
        for handle in load_handles(self.handle, "batch"):
            with airflow_errors():
                n = self._batch(handle).complete()
            self.log.info("completed %d row(s) of %r (token %s)", n, handle["table"], handle.get("token"))
            done += n
        return done


class FailBatchOperator(_EventOperator):
    """Give claimed batches back for a retry after a back-off, or to the error state after ``max_attempts``.

    Typically ``trigger_rule="one_failed"`` after the processing task, so rows return to the queue
    now instead of when the lease runs out. Use the same ``max_attempts`` / ``backoff`` /
    ``max_backoff`` as the claiming operator: a poison batch then ends in ``error`` after
    ``max_attempts`` claims instead of cycling forever.
    """

    template_fields: Sequence[str] = ("handle", "reason")

    def __init__(self, *, handle: Any, reason: str = "failed in Airflow", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle = handle
        self.reason = reason

    def execute(self, context: Context) -> int:
        failed = 0
        for handle in load_handles(self.handle, "batch"):
            with airflow_errors():
                n = self._batch(handle).fail(self.reason)
            self.log.info("failed %d row(s) of %r (token %s): %s", n, handle["table"], handle.get("token"), self.reason)
            failed += n
        return failed
