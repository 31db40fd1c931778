"""``SlotTrigger``: wait in the triggerer for a slot in FIFO order and pick the grant up; what a grant puts in XCom."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Optional

from airflow.triggers.base import TriggerEvent

from airflow_controltable.defaults import (
    DEFAULT_MODE,
    DEFAULT_REFRESH_INTERVAL,
    DEFAULT_TRIGGER_POLL_INTERVAL,
    WORKER_WAIT_HISTORY,
    WORKER_WAIT_HISTORY_WINDOW,
)
from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID
from airflow_controltable.triggers.base import _ControlTableTrigger
from airflow_controltable.utils import check_wait_args
from airflow_controltable.worker_wait import typical_hold, worker_wait_budget

log = logging.getLogger("airflow_controltable.triggers")  # one logger for the triggers' wait


def lease_payload(lease: Any) -> dict[str, Any]:
    """What a granted slot puts in XCom: enough for any later task to find or check it."""
    return {
        "resource": lease.resource,
        "holder": lease.holder,
        "token": lease.token,
        "tokens": dict(lease.tokens),
        "slots": lease.slots,
        "mode": lease.mode,
        "attempt": getattr(lease, "attempt", None),
        "lease_seconds": lease.lease_seconds,
        "expires_at": lease.expires_at.isoformat(),
    }


class SlotTrigger(_ControlTableTrigger):
    """Wait in FIFO order for a slot and acquire it; yields one event with the lease.

    The grant is picked up here (``try_acquire``) with ``lease`` seconds, so it does not lapse
    while the task is being resumed on a worker; the worker re-acquires idempotently with the same
    holder and attempt and renews from then on. ``waiter_ttl`` must be comfortably longer than the
    interval between checks: the queue place expires if the trigger stops checking (triggerer down)
    for longer than that. ``pickup`` must cover the polling interval when there is no push.

    ``resume_near`` (seconds, 0: off): once the request is the head of its queue and the resource's
    slots are typically held briefly enough that the grant is expected within this many seconds
    (:func:`~airflow_controltable.worker_wait.worker_wait_budget`), the trigger fires a ``"near"``
    event instead of waiting for the grant: the task resumes on a worker while the holders finish
    and waits for the grant there (``worker_wait``), so the resume no longer follows the grant.
    """

    def __init__(
        self,
        *,
        resource: str,
        holder: str,
        slots: int = 1,
        slot_mode: str = DEFAULT_MODE,
        lease: float,
        waiter_ttl: float,
        attempt: Optional[int] = None,
        pickup: Optional[float] = None,
        conn_id: str = DEFAULT_CONN_ID,
        namespace: Optional[str] = None,
        control_schema: Optional[str] = None,
        poll_interval: float = DEFAULT_TRIGGER_POLL_INTERVAL,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        deadline: Optional[float] = None,
        withdraw_on_timeout: bool = True,
        not_before: Optional[float] = None,
        priority: int = 0,
        deferral: Optional[dict[str, Any]] = None,
        resume_near: float = 0.0,
    ) -> None:
        super().__init__(conn_id=conn_id, namespace=namespace, control_schema=control_schema,
                         poll_interval=poll_interval, refresh_interval=refresh_interval, deadline=deadline,
                         not_before=not_before, deferral=deferral)
        self.priority = int(priority)
        self.resume_near = float(resume_near)
        self.resource = resource
        self.holder = holder
        self.slots = slots
        self.slot_mode = slot_mode
        self.lease = float(lease)
        self.waiter_ttl = float(waiter_ttl)
        self.attempt = attempt
        self.pickup = pickup
        self.withdraw_on_timeout = withdraw_on_timeout
        # A check at most every quarter of the waiter's time to live keeps its queue entry alive.
        self.refresh_interval = min(self.refresh_interval, max(self.waiter_ttl / 4.0, self.poll_interval))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{__name__}.SlotTrigger",
            {
                "resource": self.resource,
                "holder": self.holder,
                "slots": self.slots,
                "slot_mode": self.slot_mode,
                "lease": self.lease,
                "waiter_ttl": self.waiter_ttl,
                "attempt": self.attempt,
                "pickup": self.pickup,
                "withdraw_on_timeout": self.withdraw_on_timeout,
                "priority": self.priority,
                "resume_near": self.resume_near,
                **self._conn_kwargs(),
            },
        )

    def _wakeup_keys(self, table: Any) -> list[str]:
        return list(table.wakeup_keys(self.resource, self.holder))

    async def _check(self) -> Optional[dict[str, Any]]:
        options: dict[str, Any] = {"attempt": self.attempt, "priority": self.priority}
        if self.pickup is not None:
            options["pickup"] = self.pickup
        act = await self._shared_async()
        lease = await act.try_acquire(
            self.resource, holder=self.holder, slots=self.slots, mode=self.slot_mode,
            lease=self.lease, waiter_ttl=self.waiter_ttl, **options,
        )
        if lease is None:
            return await self._near() if self.resume_near > 0 else None
        return {"status": "granted", **lease_payload(lease)}

    async def _near(self) -> Optional[dict[str, Any]]:
        """The ``"near"`` event when this request heads its queue and the grant is expected soon, else None.

        Checked after each look that found no grant (a push comes when the request becomes the head).
        """
        act = await self._shared_async()
        info = await act.wait_info(self.resource, self.holder)
        if info is None or info.state != "waiting" or info.position != 1:
            return None
        (status,) = await act.status([self.resource])
        table = self._shared_table()  # the grant history is read through the sync API (rare: the head only)
        records = await asyncio.to_thread(table.history, self.resource, since=WORKER_WAIT_HISTORY_WINDOW,
                                          limit=WORKER_WAIT_HISTORY)
        hold = typical_hold(records)
        if hold is None or worker_wait_budget(position=1, capacity=status.capacity, slots=self.slots,
                                              exclusive=self.slot_mode == "exclusive",
                                              worker_wait=self.resume_near, hold=hold) <= 0:
            return None  # nothing known of the holds, or they are long: wait for the grant here
        log.info("controltable: %r is next in line for %r (typical hold %.1f s): resuming the task to wait on its "
                 "worker", self.holder, self.resource, hold)
        return {"status": "near", "resource": self.resource, "holder": self.holder, "position": 1}

    async def _on_timeout(self) -> None:
        if self.withdraw_on_timeout:
            try:
                await (await self._shared_async()).release(self.resource, self.holder)
            except Exception as exc:  # the entry expires after waiter_ttl anyway
                log.warning("controltable: could not withdraw %r from %r: %s", self.holder, self.resource, exc)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        check_wait_args(self.slot_mode, self.resource)
        async for payload in self._wait():
            yield TriggerEvent(payload)
