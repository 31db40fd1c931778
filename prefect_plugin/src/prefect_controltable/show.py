"""Showing a wait in the Prefect UI beside the logs: the flow run's state message and the status-page link.

Both are best effort: a run whose API is unreachable still waits for and holds its slot, and the
log lines (written by :mod:`.slots`) remain the record. Task runs get no state message: Prefect 3
records task-run states through events emitted by the task engine itself, and a state set from
the outside would race it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional
from uuid import UUID

log = logging.getLogger("prefect_controltable")

#: The artifact key of the status-page link (one per run; Prefect keys are lowercase and dashes).
ARTIFACT_KEY = "controltable-status"
#: The longest state message written (Prefect shows it on the run's page and in lists).
MESSAGE_LIMIT = 400
_LINKED: set[UUID] = set()


def set_flow_run_message(flow_run_id: Optional[UUID], message: str) -> bool:
    """Show ``message`` as the flow run's Running state message; whether it was accepted."""
    if flow_run_id is None:
        return False
    try:
        from prefect.client.orchestration import get_client
        from prefect.states import Running

        with get_client(sync_client=True) as client:
            current = client.read_flow_run(flow_run_id).state
            if current is None or not current.is_running():
                return False  # cancelling, crashed or paused: never overwrite what Prefect decided
            client.set_flow_run_state(flow_run_id, Running(message=message[:MESSAGE_LIMIT]), force=True)
        return True
    except Exception as exc:  # the wait goes on; the log lines say the same
        log.debug("controltable: could not set the flow run's state message: %s", exc)
        return False


async def aset_flow_run_message(flow_run_id: Optional[UUID], message: str) -> bool:
    """:func:`set_flow_run_message` with Prefect's async client (async flows: the loop is not blocked)."""
    if flow_run_id is None:
        return False
    try:
        from prefect.client.orchestration import get_client
        from prefect.states import Running

        async with get_client() as client:
            current = (await client.read_flow_run(flow_run_id)).state
            if current is None or not current.is_running():
                return False  # cancelling, crashed or paused: never overwrite what Prefect decided
            await client.set_flow_run_state(flow_run_id, Running(message=message[:MESSAGE_LIMIT]), force=True)
        return True
    except Exception as exc:  # the wait goes on; the log lines say the same
        log.debug("controltable: could not set the flow run's state message: %s", exc)
        return False


def link_status_page(status_url: Optional[str], run_key: Optional[UUID], resources: list[str], logger: Any) -> None:
    """Once per run: a link artifact to the status page (and a log line with the URL)."""
    if not status_url or run_key is None or run_key in _LINKED:
        return
    _LINKED.add(run_key)
    link = status_url.rstrip("/") + "/"
    logger.info(f"controltable: status page of {', '.join(map(repr, resources))}: {link}")
    try:
        from prefect.artifacts import create_link_artifact

        create_link_artifact(link=link, link_text="controltable status page", key=ARTIFACT_KEY,
                             description=f"Holders and queues of {', '.join(resources)}", _sync=True)  # type: ignore[call-arg]
    except Exception as exc:
        log.debug("controltable: could not create the status-page artifact: %s", exc)
