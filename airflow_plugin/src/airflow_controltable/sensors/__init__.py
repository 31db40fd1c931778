"""Sensors of the controltable provider."""

from airflow_controltable.sensors.events import PendingEventsSensor
from airflow_controltable.sensors.slots import SlotSensor

__all__ = ["PendingEventsSensor", "SlotSensor"]
