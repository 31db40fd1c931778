"""Operators of the controltable provider."""

from airflow_controltable.operators.events import ClaimBatchOperator, CompleteBatchOperator, FailBatchOperator
from airflow_controltable.operators.slots import HoldSlotMixin, ReleaseSlotOperator, SlotPythonOperator
from airflow_controltable.operators.worklist import (
    AllocateWorkItemOperator,
    CompleteWorkItemOperator,
    FailWorkItemOperator,
)

__all__ = [
    "AllocateWorkItemOperator",
    "ClaimBatchOperator",
    "CompleteBatchOperator",
    "CompleteWorkItemOperator",
    "FailBatchOperator",
    "FailWorkItemOperator",
    "HoldSlotMixin",
    "ReleaseSlotOperator",
    "SlotPythonOperator",
]
