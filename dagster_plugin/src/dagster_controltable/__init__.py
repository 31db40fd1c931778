"""dagster-controltable: controltable's resource slots, event batches and work lists for Dagster.

Coordination state lives in control tables in your own database, so limits are shared across
Dagster instances, Airflow deployments and shell jobs, and slots are leases that expire when a
run dies instead of leaking.
"""

from .checks import event_table_asset_check, judge_event_table
from .failures import as_failure
from .ops import build_batch_op, build_worklist_op
from .resource import ControlTableResource, batch_metadata
from .sensors import controltable_run_cleanup_sensor, pending_events_sensor
from .step import StepIdentity, current_step
from .version import __version__

try:  # the registry Dagster's own integration libraries report themselves to
    from dagster._core.libraries import DagsterLibraryRegistry

    DagsterLibraryRegistry.register("dagster-controltable", __version__, is_dagster_package=False)
except Exception:  # pragma: no cover - private API; registration is informational only
    pass

__all__ = [
    "ControlTableResource",
    "StepIdentity",
    "__version__",
    "as_failure",
    "batch_metadata",
    "build_batch_op",
    "build_worklist_op",
    "controltable_run_cleanup_sensor",
    "current_step",
    "event_table_asset_check",
    "judge_event_table",
    "pending_events_sensor",
]
