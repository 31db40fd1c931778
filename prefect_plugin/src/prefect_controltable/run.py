"""Who is asking: the current Prefect flow or task run, the holder id built from it, its attempt and logger.

The holder id is ``prefect:<flow run id>`` in a flow and ``prefect:<flow run id>:<task run id>``
in a task, so ``ControlTable.release_holders("prefect:<flow run id>")`` frees everything a flow
run and its tasks hold, and ``controltable status`` names the run a waiter queues behind. The
attempt is the run's ``run_count``: a retry of the same task run keeps its holder and gets a new,
higher fencing token, so a write fenced on the old token is refused.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Optional
from uuid import UUID

from controltable.holders import holder_id

log = logging.getLogger("prefect_controltable")

#: The environment variable a Prefect worker or runner sets in the flow-run process it starts.
FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"


@dataclass(frozen=True)
class RunIdentity:
    """The run a slot, batch or work item is held for."""

    #: ``prefect:<flow run id>[:<task run id>]``, or a process-local id outside any run.
    holder: str
    #: The run's ``run_count`` (1 on the first try), or None outside a run.
    attempt: Optional[int]
    flow_run_id: Optional[UUID]
    task_run_id: Optional[UUID]
    #: The run's logger (its lines go to the run's logs in the UI), or the module's outside a run.
    logger: Any
    #: Started by a Prefect worker or runner: if that parent dies the process is an orphan whose
    #: outcome nobody records, so its leases must lapse (renewal stops when orphaned).
    supervised: bool

    @property
    def kind(self) -> str:
        return "task run" if self.task_run_id is not None else "flow run" if self.flow_run_id is not None else "process"

    @property
    def scope(self) -> Optional[str]:
        """``prefect:<flow run id>``: the prefix of every holder id of this flow run and its tasks."""
        return holder_id("prefect", self.flow_run_id) if self.flow_run_id is not None else None


def current_run() -> RunIdentity:
    """The identity of the flow or task run this code runs in (a process-local one outside any run)."""
    from prefect.context import FlowRunContext, TaskRunContext, get_run_context
    from prefect.logging import get_run_logger

    supervised = bool(os.environ.get(FLOW_RUN_ENV))
    try:
        ctx = get_run_context()
    except Exception:  # outside any run (a script calling the function directly, a test)
        ident = holder_id("prefect", "local", socket.gethostname(), os.getpid(), threading.get_ident())
        return RunIdentity(ident, None, None, None, log, supervised)
    logger = get_run_logger(ctx)
    if isinstance(ctx, TaskRunContext):
        tr = ctx.task_run
        who = holder_id("prefect", tr.flow_run_id, tr.id) if tr.flow_run_id else holder_id("prefect", tr.id)
        return RunIdentity(who, max(1, int(tr.run_count or 1)), tr.flow_run_id, tr.id, logger, supervised)
    assert isinstance(ctx, FlowRunContext) and ctx.flow_run is not None
    fr = ctx.flow_run
    return RunIdentity(holder_id("prefect", fr.id), max(1, int(fr.run_count or 1)), fr.id, None, logger, supervised)
