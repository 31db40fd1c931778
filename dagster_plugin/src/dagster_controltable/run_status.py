"""Which Dagster run states mean a run will never pick up a grant, so its requests can be withdrawn.

A leaf shared by the in-process watcher (:mod:`dagster_controltable.run_watch`) and the detached one
(:mod:`dagster_controltable.retry_watch`), which starts the other way round: ``run_watch`` starts
``retry_watch``, so neither can own the set without a circle.
"""

from dagster import DagsterRunStatus

#: A run in one of these states will never pick up a grant: its requests can be withdrawn.
RUN_ENDED_BADLY = frozenset({DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE})
