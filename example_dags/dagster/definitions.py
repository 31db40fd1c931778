"""Dagster example for controltable: a shared warehouse slot, an event table drained in batches,
a sensor that requests the draining job, and an ordered work list.

Run it against the embedded SQLite control table (no server needed)::

    export DAGSTER_HOME=$(mktemp -d) && touch $DAGSTER_HOME/dagster.yaml
    export CONTROLTABLE_URL=sqlite:///$DAGSTER_HOME/controltable.db   # optional, this is the default
    dagster definitions validate -f example_dags/dagster/definitions.py
    dagster job execute -f example_dags/dagster/definitions.py -j drain_demo_events
    dagster job execute -f example_dags/dagster/definitions.py -j warehouse_reports

Point ``CONTROLTABLE_URL`` at PostgreSQL or MariaDB to share the limits with other Dagster
instances, Airflow deployments and shell jobs (``controltable run --resource warehouse -- ./load.sh``).

(No ``from __future__ import annotations``: Dagster reads the ``context`` annotations.)
"""

import os
import time
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    Config,
    Definitions,
    EnvVar,
    MaterializeResult,
    MetadataValue,
    OpExecutionContext,
    asset,
    define_asset_job,
    job,
    op,
)
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, inspect, select

from dagster_controltable import (
    ControlTableResource,
    build_batch_op,
    build_worklist_op,
    controltable_run_cleanup_sensor,
    event_table_asset_check,
    pending_events_sensor,
)

EVENT_TABLE = "demo_events"
WORKLIST = "demo_steps"


def _default_url() -> str:
    """The embedded SQLite control table: in $DAGSTER_HOME, else next to this file."""
    home = os.environ.get("DAGSTER_HOME")
    folder = Path(home) if home else Path(__file__).resolve().parent
    return f"sqlite:///{folder / 'controltable-example.db'}"


# EnvVar keeps a real URL (with its password) out of the definitions and the UI; it is read when
# a run starts. Without the variable the example uses the embedded SQLite file.
controltable = ControlTableResource(
    url=EnvVar("CONTROLTABLE_URL") if os.environ.get("CONTROLTABLE_URL") else _default_url(),
    namespace=os.environ.get("CONTROLTABLE_NAMESPACE", "dagster_example"),
)

_events = Table(
    EVENT_TABLE,
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("kind", String(20), nullable=False),
    Column("amount", Integer, nullable=False),
)


def setup_demo(ct: ControlTableResource, events: int = 20) -> int:
    """Create what the demo needs, once: control tables, the warehouse slot, the event table.

    Idempotent, so every job may start with it; a real deployment does this once with the
    ``controltable`` CLI (``controltable init``, ``controltable capacity set warehouse 1``).
    """
    ct.install()
    if not any(st.name == "warehouse" for st in ct.status(["warehouse"])):
        ct.set_capacity("warehouse", 1)
    engine = ct.control_table.engine
    if not inspect(engine).has_table(EVENT_TABLE):
        _events.create(engine, checkfirst=True)
        with engine.begin() as conn:
            conn.execute(insert(_events), [{"kind": "order" if i % 3 else "refund", "amount": i * 10}
                                           for i in range(1, events + 1)])
    ct.events(EVENT_TABLE, key="id", prepare=True)
    return events


# -- assets sharing a capacity-1 warehouse slot -----------------------------------------------
@asset(group_name="controltable_demo")
def demo_events(controltable: ControlTableResource) -> MaterializeResult:
    """The demo event table (created with 20 events on first run) and the controltable set-up."""
    setup_demo(controltable)
    with controltable.control_table.engine.connect() as conn:
        total = conn.scalar(select(func.count()).select_from(_events))
    return MaterializeResult(metadata={"rows": MetadataValue.int(int(total or 0))})


def _warehouse_query(context: AssetExecutionContext, controltable: ControlTableResource, name: str) -> dict:
    # The slot is shared with every Dagster instance, Airflow task and shell job using this
    # control table: at most one of them queries the warehouse at a time.
    with controltable.slot("warehouse") as lease:
        context.log.info(f"{name}: warehouse slot held with fencing token {lease.token}")
        time.sleep(0.5)  # the expensive query
        return {"fencing_token": MetadataValue.int(lease.token), "holder": MetadataValue.text(lease.holder)}


@asset(group_name="controltable_demo", deps=[demo_events])
def orders_report(context: AssetExecutionContext, controltable: ControlTableResource) -> MaterializeResult:
    """Needs the warehouse: waits for its slot (blocking, with lease renewal)."""
    return MaterializeResult(metadata=_warehouse_query(context, controltable, "orders_report"))


@asset(group_name="controltable_demo", deps=[demo_events])
def customers_report(context: AssetExecutionContext, controltable: ControlTableResource) -> MaterializeResult:
    """Needs the warehouse too; with the multiprocess executor it queues behind orders_report."""
    return MaterializeResult(metadata=_warehouse_query(context, controltable, "customers_report"))


# The demo event table keeps up: no event in the error state (a check on the asset's page; add
# time_column= and max_pending_age= for a table that records each event's time).
demo_events_drained = event_table_asset_check(asset=demo_events, table=EVENT_TABLE, key="id", max_error_rows=0)

warehouse_reports = define_asset_job("warehouse_reports", selection=AssetSelection.groups("controltable_demo"))


# -- a job draining the event table in fenced batches --------------------------------------------
@op
def prepare_demo_events(controltable: ControlTableResource) -> None:
    """Create the control tables and the demo event table if missing (idempotent)."""
    setup_demo(controltable)


def handle_batch(context: OpExecutionContext, batch) -> None:  # type: ignore[no-untyped-def]
    """The per-batch work: here, totals per kind. Raise to give the batch back for a retry."""
    totals: dict[str, int] = {}
    for row in batch.rows:
        totals[row["kind"]] = totals.get(row["kind"], 0) + int(row["amount"])
    context.log.info(f"batch {batch.token}: {len(batch)} events, totals {totals}")


process_demo_events = build_batch_op(handle_batch, table=EVENT_TABLE, key="id", size=8, name="process_demo_events")


@job(description="Claims the demo events in batches of 8 until none are left, completing each (fenced).")
def drain_demo_events() -> None:
    process_demo_events(start_after=prepare_demo_events())


demo_events_sensor = pending_events_sensor(
    drain_demo_events, table=EVENT_TABLE, key="id", min_events=1, minimum_interval_seconds=30,
)


# -- emitting more events (to see the sensor fire) --------------------------------------------------
class EmitConfig(Config):
    count: int = 10


@op
def emit_demo_events(config: EmitConfig, controltable: ControlTableResource) -> int:
    """Append ``count`` events; the sensor then requests drain_demo_events."""
    setup_demo(controltable)
    with controltable.control_table.engine.begin() as conn:
        conn.execute(insert(_events), [{"kind": "order", "amount": 1} for _ in range(config.count)])
    return config.count


@job
def emit_events() -> None:
    emit_demo_events()


# -- an ordered work list: every order-100 step finishes before order 200 starts --------------------
@op
def fill_worklist(controltable: ControlTableResource) -> None:
    """Fill the work list once: two extract steps, then a load step that must come after both."""
    controltable.install()
    wl = controltable.worklist(WORKLIST)
    if not wl.status().orders:  # empty: fill it (a second run finds the finished list and skips)
        wl.populate([{"step": "extract", "part": 1}, {"step": "extract", "part": 2}], order=100)
        wl.populate([{"step": "load"}], order=200)


def handle_item(context: OpExecutionContext, item) -> None:  # type: ignore[no-untyped-def]
    context.log.info(f"order {item.order}: {item.payload}")


work_demo_steps = build_worklist_op(handle_item, worklist=WORKLIST, name="work_demo_steps", timeout=60)


@job(description="Two workers allocate the ordered work items until none are left.")
def work_through_steps() -> None:
    filled = fill_worklist()
    work_demo_steps(start_after=filled)
    work_demo_steps.alias("work_demo_steps_2")(start_after=filled)


defs = Definitions(
    assets=[demo_events, orders_report, customers_report],
    asset_checks=[demo_events_drained],
    jobs=[warehouse_reports, drain_demo_events, emit_events, work_through_steps],
    # The cleanup sensor withdraws the slots and queue places of cancelled and failed runs.
    sensors=[demo_events_sensor, controltable_run_cleanup_sensor()],
    resources={"controltable": controltable},
)
