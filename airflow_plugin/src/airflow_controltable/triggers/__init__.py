"""Triggers of the controltable provider (run in the triggerer for deferrable sensors)."""

from airflow_controltable.triggers.controltable import PendingEventsTrigger, SlotTrigger

__all__ = ["PendingEventsTrigger", "SlotTrigger"]
