"""Who is asking: the executing step's identity (run id, step key, retry number) and the holder ids built from it."""

import logging
from typing import Any, Optional

from dagster import DagsterInvariantViolationError, OpExecutionContext

from controltable.defaults import MAX_PRIORITY, MIN_PRIORITY
from controltable.holders import holder_id

log = logging.getLogger("dagster_controltable")


class StepIdentity:
    """Who is asking, as far as Dagster tells: run id, step key, retry number and a logger."""

    def __init__(self, run_id: Optional[str], step_key: Optional[str], retry_number: int, logger: Any,
                 context: Any = None, *, own_process: bool = False) -> None:
        self.run_id = run_id
        self.step_key = step_key
        self.retry_number = retry_number
        self.log = logger
        self.context = context
        #: The step runs in a process of its own that the run's orchestrator started (multiprocess
        #: executor, step launchers): the process lives only for this try of the step, and its
        #: parent is the run worker. False in the run worker itself (in-process executor).
        self.own_process = own_process

    def tag_priority(self) -> int:
        """The ``dagster/priority`` tags as Dagster's own pools weigh them: the run's plus the step's.

        Unset or not a whole number counts as 0 (as in Dagster); clamped to the core's range.
        """
        if self.context is None:
            return 0
        total = 0
        sources: list[Any] = []
        try:
            sources.append(self.context.run.tags)
        except Exception:  # pragma: no cover - no run (direct invocation)
            pass
        try:
            sources.append(self.context.get_step_execution_context().step.tags or {})
        except Exception:  # pragma: no cover - framework-author API
            pass
        for tags in sources:
            try:
                total += int(tags.get("dagster/priority", 0))
            except (TypeError, ValueError):
                continue
        return max(MIN_PRIORITY, min(MAX_PRIORITY, total))

    @property
    def attempt(self) -> Optional[int]:
        """The step's attempt (retry number + 1), passed to the core so a retry gets a higher fencing token.

        ``None`` outside a step: the core then treats every request of a holder as the same attempt.
        """
        return self.retry_number + 1 if self.run_id is not None else None

    @property
    def run_prefix(self) -> Optional[str]:
        """``dagster:<run id>:``: the start of every holder id of this run's steps."""
        return run_holder_prefix(self.run_id) if self.run_id is not None else None

    @property
    def holder(self) -> Optional[str]:
        """``dagster:<run id>:<step key>``: stable across retries of the step, unique across steps.

        Stability across retries is what lets a step that raised ``RetryRequested`` keep its
        place in the FIFO queue; uniqueness keeps two steps from sharing one lease.
        Built by the core's :func:`~controltable.holders.holder_id`: a step key too long for a
        holder id is shortened with a hash of the whole id rather than cut, so two long step keys
        never share one lease, and the run prefix is kept for :meth:`ControlTableResource.release_run`.
        """
        if self.run_id is None:
            return None
        return holder_id("dagster", self.run_id, self.step_key or "run")


def run_holder_prefix(run_id: str) -> str:
    """The prefix every holder id of run ``run_id`` starts with (what withdrawing a whole run matches)."""
    return holder_id("dagster", run_id, "")


def current_step() -> StepIdentity:
    """The executing op/asset's identity, read from the context Dagster sets for the step.

    ``OpExecutionContext.get()`` works from any code the step calls (resource methods included)
    but only in the step's own thread; elsewhere (sensors, scripts) the identity is empty.
    """
    try:
        ctx = OpExecutionContext.get()
    except DagsterInvariantViolationError:
        ctx = None
    if ctx is None:
        return StepIdentity(None, None, 0, log)
    try:
        step_context = ctx.get_step_execution_context()
        step_key: Optional[str] = step_context.step.key
        # An orchestrator in another process handles this step's retries ("deferred"): the step
        # runs in a process of its own (the multiprocess executor's child, a step launcher's pod).
        own_process = bool(step_context.retry_mode.deferred)
    except Exception:  # pragma: no cover - framework-author API; fall back to the op name
        step_key, own_process = ctx.op.name, False
    return StepIdentity(ctx.run_id, step_key, int(ctx.retry_number), ctx.log, ctx, own_process=own_process)


def add_output_metadata(step: StepIdentity, metadata: dict[str, Any]) -> None:
    """Add to the step's output metadata when Dagster allows it (one output); the log line has it anyway."""
    if step.context is None:
        return
    try:
        step.context.add_output_metadata(metadata)
    except Exception as exc:  # several outputs, no output, or outside an op: metadata is optional
        log.debug("controltable: no output metadata for the slot: %s", exc)
