"""Triggers of the controltable provider (run in the triggerer for deferrable sensors)."""

from airflow_controltable.triggers.events import PendingEventsTrigger
from airflow_controltable.triggers.slot import SlotTrigger

__all__ = ["PendingEventsTrigger", "SlotTrigger"]
