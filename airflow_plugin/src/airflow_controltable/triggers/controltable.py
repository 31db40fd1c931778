"""The triggers' stored class path: re-exports ``SlotTrigger``, ``PendingEventsTrigger`` and their helpers.

Airflow stores a deferred trigger by the class path its ``serialize()`` returns, and this module's
is the one every release has returned (``airflow_controltable.triggers.controltable.SlotTrigger``),
so triggers stored by any version load. The code lives in :mod:`~airflow_controltable.triggers.base`
(the wait loop), :mod:`~airflow_controltable.triggers.slot`, :mod:`~airflow_controltable.triggers.events`
and :mod:`airflow_controltable.resume_race` (the scheduler-race workaround).
"""

from __future__ import annotations

from airflow_controltable.resume_race import (
    EXIT_WATCH_INTERVAL,
    SchedulerBeats,
    exit_time,
    fire_not_before,
    health_url,
    in_deferring_process,
    process_alive,
    read_scheduler_heartbeat,
    scheduler_beats,
    scheduler_caught_up,
)
from airflow_controltable.triggers.base import _ControlTableTrigger
from airflow_controltable.triggers.events import PendingEventsTrigger
from airflow_controltable.triggers.slot import SlotTrigger, lease_payload

__all__ = [
    "EXIT_WATCH_INTERVAL",
    "PendingEventsTrigger",
    "SchedulerBeats",
    "SlotTrigger",
    "_ControlTableTrigger",
    "exit_time",
    "fire_not_before",
    "health_url",
    "in_deferring_process",
    "lease_payload",
    "process_alive",
    "read_scheduler_heartbeat",
    "scheduler_beats",
    "scheduler_caught_up",
]
