"""Every default and limit of controltable, in one module: the core, the CLI and both plugins import them.

Change a default here and every surface (Python API, CLI, Airflow provider, Dagster resource) moves
with it; nothing else in the code base retypes these numbers.
"""

from __future__ import annotations

#: Where the control tables live when no URL is given (the embedded default).
DEFAULT_URL = "sqlite:///controltable.db"

# -- names -------------------------------------------------------------------------------------
#: The longest resource, holder, work-list or event-table name (characters).
NAME_LENGTH = 200
#: The longest namespace (characters).
NAMESPACE_LENGTH = 100

# -- slots -------------------------------------------------------------------------------------
#: The mode of a slot request when none is given: a counting semaphore (``set_capacity(r, 3)``
#: means three holders), as Airflow pools, Dagster pools and Prefect limits mean a limit.
DEFAULT_MODE = "shared"
#: A slot holder's lease (seconds); ``slot()`` renews it in the background every third of it.
DEFAULT_LEASE = 300.0
#: How long a waiter's queue entry survives without a refresh; waiters refresh after half of it,
#: so 20 idle waiters cost well under one transaction per second.
DEFAULT_WAITER_TTL = 60.0
#: How long a grant made on a waiter's behalf (by whoever freed the capacity) waits to be picked
#: up before it lapses and passes to the next in line: a dead waiter delays its queue by this much.
DEFAULT_PICKUP = 8.0

# -- event batches and work items ----------------------------------------------------------------
#: A claimed batch's lease (seconds).
DEFAULT_BATCH_LEASE = 900.0
#: A work item's lease (seconds).
DEFAULT_ITEM_LEASE = 600.0
