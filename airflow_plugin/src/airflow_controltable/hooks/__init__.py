"""Hooks of the controltable provider."""

from airflow_controltable.hooks.controltable import DEFAULT_CONN_ID, ControlTableHook

__all__ = ["DEFAULT_CONN_ID", "ControlTableHook"]
