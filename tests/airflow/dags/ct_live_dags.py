"""DAGs run by the live-Airflow tests and the Airflow benchmark (one deployment, real scheduler and triggerer).

Every load records its interval (start, end, fencing token, try number, whether it waited deferred)
in a table beside the control tables, so the tests check exclusion from the workers' own records.
The conf of a run chooses the resource and the load's length.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from sqlalchemy import Boolean, Column, Float, Integer, MetaData, String, Table, insert, update

from airflow_controltable import ClaimBatchOperator, FailBatchOperator, ReleaseSlotOperator, SlotSensor
from airflow_controltable.hooks.controltable import ControlTableHook

NAMESPACE = os.environ.get("CT_LIVE_NAMESPACE", "live")
PARAMS = {
    "resource": Param("live_one", type="string"),
    "seconds": Param(1.0, type="number"),
}

intervals = Table(
    f"live_intervals_{NAMESPACE}",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pattern", String(20), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("token", Integer, nullable=True),
    Column("deferred", Boolean, nullable=False),
    Column("granted_by", String(10), nullable=True),  # what ended the wait: free, worker, trigger
    Column("granted", Float, nullable=True),
    Column("started", Float, nullable=False),
    Column("finished", Float, nullable=True),
    Column("closed", Boolean, nullable=False, default=False),
)

#: While a load works it stamps ``finished`` this often, so a load killed without unwinding (SIGKILL)
#: still has an end: its last stamp plus this period at most.
HEARTBEAT = 0.1


def _engine() -> Any:
    return ControlTableHook().get_control_table().engine


def record_work(pattern: str, token: Any, deferred: bool, seconds: float, granted: Any = None,
                granted_by: Any = None) -> dict[str, Any]:
    """The pretend load: record the start, work ``seconds`` stamping progress, record the end (also on a kill)."""
    context = get_current_context()
    engine = _engine()
    try:
        intervals.create(engine, checkfirst=True)
    except Exception:  # another load created it at the same moment
        pass
    with engine.begin() as conn:
        row_id = conn.execute(insert(intervals).values(
            pattern=pattern, run_id=context["run_id"], try_number=context["ti"].try_number,
            token=token, deferred=deferred, granted_by=granted_by,
            granted=granted.timestamp() if granted is not None else None,
            started=time.time(), finished=time.time(), closed=False,
        )).inserted_primary_key[0]
    stamp = update(intervals).where(intervals.c.id == row_id)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(HEARTBEAT, max(end - time.monotonic(), 0)))
            with engine.begin() as conn:
                conn.execute(stamp.values(finished=time.time()))
    finally:
        with engine.begin() as conn:
            conn.execute(stamp.values(finished=time.time(), closed=True))
    return {"token": token}


def slot_dag(dag_id: str, **options: Any) -> DAG:
    """The recommended pattern: ``@task.controltable_slot`` around the load, with ``options`` (e.g. ``worker_wait``)."""
    with DAG(dag_id, schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params=PARAMS,
             max_active_runs=64) as dag:

        @task.controltable_slot("{{ params.resource }}", poll_interval=1.0, **options)
        def load(lease: Any = None) -> dict[str, Any]:
            context = get_current_context()
            deferred = bool(getattr(context["task"], "slot_resumed", False))
            return record_work("deferrable", lease.token, deferred, float(context["params"]["seconds"]),
                               granted=lease.granted_at, granted_by=getattr(context["task"], "slot_granted_by", None))

        load()
    return dag


#: As users get it (a slot expected soon is waited for on the worker, ``worker_wait``'s default).
default_slot_dag = slot_dag("ct_live_slot")
#: Every wait deferred (``worker_wait=0``): the triggerer's path, for the tests of deferral and resume.
deferred_slot_dag = slot_dag("ct_live_slot_deferred", worker_wait=0)
#: A wait on the worker bounded only by a hang detector (``worker_wait=900``): the worker's path, its
#: decision the default's (the next two in line wait there), whatever the scheduler's pace.
worker_slot_dag = slot_dag("ct_live_slot_worker", worker_wait=900)


#: The writes of the SQL-statement loads: one row per statement that ran to its end (server clock).
sql_writes = Table(
    f"live_sql_writes_{NAMESPACE}",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(250), nullable=False),
    Column("token", Integer, nullable=True),
    Column("written", Float, nullable=False),
)


def sql_load(pattern: str, token: Any, seconds: float) -> dict[str, Any]:
    """A load that is one long statement (PostgreSQL: sleep, then write), its start recorded first."""
    from sqlalchemy import text

    context = get_current_context()
    engine = _engine()
    for table in (intervals, sql_writes):
        try:
            table.create(engine, checkfirst=True)
        except Exception:  # another load created it at the same moment
            pass
    with engine.begin() as conn:
        row_id = conn.execute(insert(intervals).values(
            pattern=pattern, run_id=context["run_id"], try_number=context["ti"].try_number, token=token,
            deferred=False, started=time.time(), finished=time.time(), closed=False,
        )).inserted_primary_key[0]
    try:
        with engine.begin() as conn:
            conn.execute(text(
                f"insert into {sql_writes.name} (run_id, token, written) "
                "select :run_id, :token, extract(epoch from clock_timestamp()) from (select pg_sleep(:s)) s"),
                {"run_id": context["run_id"], "token": token, "s": seconds})
    finally:
        with engine.begin() as conn:
            conn.execute(update(intervals).where(intervals.c.id == row_id).values(finished=time.time(), closed=True))
    return {"token": token}


with DAG("ct_live_sql", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params=PARAMS,
         max_active_runs=64) as sql_dag:

    @task.controltable_slot("{{ params.resource }}", poll_interval=1.0)
    def sql_in_slot(lease: Any = None) -> dict[str, Any]:
        return sql_load("sql", lease.token, float(get_current_context()["params"]["seconds"]))

    sql_in_slot()


with DAG("ct_live_sql_sensor", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params=PARAMS,
         max_active_runs=64) as sql_sensor_dag:
    sql_acquire = SlotSensor(task_id="acquire", resource="{{ params.resource }}", deferrable=True, poke_interval=1,
                             timeout=600, lease=600)

    @task
    def sql_work(lease: dict[str, Any]) -> dict[str, Any]:
        return sql_load("sql_sensor", lease["token"], float(get_current_context()["params"]["seconds"]))

    sql_release = ReleaseSlotOperator(task_id="release", resource="{{ params.resource }}")
    sql_work(sql_acquire.output) >> sql_release.as_teardown(setups=sql_acquire)


with DAG("ct_live_pool", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params=PARAMS,
         max_active_runs=64) as pool_dag:

    @task(pool="live_pool")
    def load_in_pool() -> dict[str, Any]:
        context = get_current_context()
        return record_work("pool", None, False, float(context["params"]["seconds"]))

    load_in_pool()


with DAG("ct_live_sensor", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, params=PARAMS,
         max_active_runs=64) as sensor_dag:
    acquire = SlotSensor(task_id="acquire", resource="{{ params.resource }}", deferrable=True, poke_interval=1,
                         timeout=600, lease=600)

    @task
    def work(lease: dict[str, Any]) -> dict[str, Any]:
        context = get_current_context()
        return record_work("sensor", lease["token"], False, float(context["params"]["seconds"]))

    # CT_LIVE_TEARDOWN_WAIT=0 turns the teardown's wait off: the test then sees the overlap it prevents.
    release = ReleaseSlotOperator(task_id="release", resource="{{ params.resource }}",
                                  wait_for_work=os.environ.get("CT_LIVE_TEARDOWN_WAIT", "1") == "1")
    work(acquire.output) >> release.as_teardown(setups=acquire)


with DAG("ct_live_poison", schedule=None, start_date=datetime(2024, 1, 1), catchup=False,
         params={"table": Param("live_events", type="string")}, max_active_runs=1) as poison_dag:
    claim = ClaimBatchOperator(task_id="claim", table="{{ params.table }}", key="id", size=5, max_attempts=2,
                               backoff=0, lease=120)

    @task
    def process(handles: list[dict[str, Any]]) -> None:
        raise RuntimeError(f"poison batch: {[h['keys'] for h in handles]}")

    fail = FailBatchOperator(task_id="fail", handle=claim.output, reason="poison", max_attempts=2, backoff=0,
                             trigger_rule="one_failed")
    process(claim.output) >> fail
