"""prefect-controltable: controltable's resource slots, event batches and work lists for Prefect.

Coordination state lives in control tables in your own database, so limits are shared across
Prefect servers, Airflow deployments, Dagster instances and shell jobs, and slots are leases that
expire when a flow run dies instead of leaking. ``prefect block register -m prefect_controltable``
registers :class:`ControlTableBlock`.
"""

from .block import ControlTableBlock
from .run import RunIdentity, current_run
from .slots import SlotScope, slot
from .tasks import build_batch_task, build_worklist_task
from .version import __version__

__all__ = [
    "ControlTableBlock",
    "RunIdentity",
    "SlotScope",
    "__version__",
    "build_batch_task",
    "build_worklist_task",
    "current_run",
    "slot",
]
