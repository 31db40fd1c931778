"""The flows the live tests deploy to a process work pool: hold a slot (sync or async) and record it, do fenced
work, drain events.

Run by a real Prefect worker (``prefect worker start --type process``), each flow run in its own
process. Configured through the worker's environment: LIVE_BLOCK (the saved ControlTableBlock),
LIVE_RECORDS (a folder where every hold writes what it saw, so the test checks runs from their own
records), LIVE_WORK_TABLE and LIVE_EVENT_TABLE (tables in the control-table database).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run
from prefect_controltable import ControlTableBlock, build_batch_task, slot
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, func, insert

BLOCK = os.environ.get("LIVE_BLOCK", "live")
RECORDS = Path(os.environ.get("LIVE_RECORDS", "."))
EVENTS = os.environ.get("LIVE_EVENT_TABLE", "live_events")


def _log_to_records() -> None:
    """The core's log lines of this flow-run process in a file of the records (its output pipe dies with a worker)."""
    handler = logging.FileHandler(RECORDS / f"controltable_{os.getpid()}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
    for name in ("controltable", "prefect_controltable", "prefect"):
        logging.getLogger(name).addHandler(handler)
    previous = threading.excepthook

    def died(args: threading.ExceptHookArgs) -> None:  # a thread's death, in the file too
        logging.getLogger("controltable").error("thread %s died", args.thread, exc_info=(
            args.exc_type, args.exc_value, args.exc_traceback))  # type: ignore[arg-type]
        previous(args)

    threading.excepthook = died
    # Every thread's stack on SIGUSR2: what a test reads when this process does not do what it should.
    faulthandler.register(signal.SIGUSR2, file=open(RECORDS / f"stacks_{os.getpid()}.txt", "w"),  # noqa: SIM115
                          all_threads=True)


def _write(name: str, record: dict) -> None:
    tmp = RECORDS / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(RECORDS / name)


@flow
def hold(resource: str, seconds: float = 1.0, lease: float = 30.0, work_table: str = "") -> None:
    """Hold one slot of ``resource`` for ``hold`` seconds; for ``seconds`` seconds."""
    run_id = str(flow_run.id)
    _log_to_records()
    with slot(resource, block=BLOCK, lease=lease) as held:
        start = time.time()
        info = {"run_id": run_id, "holder": held.holder, "resource": resource, "token": held.token,
                "ticket": held.ticket, "mode": held.mode, "slots": held.slots, "pid": os.getpid(),
                "ppid": os.getppid(), "start": start, "armed": held._arming is not None}
        _write(f"holding_{run_id}.json", info)
        if work_table:
            engine = ControlTableBlock.load(BLOCK).control_table().engine
            table = Table(work_table, MetaData(), Column("run_id", String(64)), Column("n", Integer),
                          Column("at", DateTime(timezone=True)))
            n = 0
            while time.time() - start < seconds:
                with engine.begin() as conn:  # the database's clock: compared with the lease's expiry
                    conn.execute(insert(table).values(run_id=run_id, n=n, at=func.now()))
                n += 1
                time.sleep(0.1)
        else:
            time.sleep(seconds)
        end = time.time()
    _write(f"held_{run_id}.json", {**info, "end": end})


@flow
async def hold_async(resource: str, seconds: float = 1.0, lease: float = 30.0) -> None:
    """:func:`hold` as an async flow: ``async with slot(...)`` on the core's asyncio API."""
    import asyncio

    run_id = str(flow_run.id)
    _log_to_records()
    async with slot(resource, block=BLOCK, lease=lease) as held:
        start = time.time()
        info = {"run_id": run_id, "holder": held.holder, "resource": resource, "token": held.token,
                "ticket": held.ticket, "mode": held.mode, "slots": held.slots, "pid": os.getpid(),
                "ppid": os.getppid(), "start": start, "async": True}
        _write(f"holding_{run_id}.json", info)
        await asyncio.sleep(seconds)
        end = time.time()
    _write(f"held_{run_id}.json", {**info, "end": end})


def _log_batch(batch) -> None:  # type: ignore[no-untyped-def]
    """Log every key with the batch token, in the transaction that completes the batch."""
    log = Table(f"{EVENTS}_log", MetaData(), autoload_with=batch.events.engine)
    with batch.transaction() as conn:
        conn.execute(insert(log), [{"event_id": int(k), "token": int(batch.token), "run_id": str(flow_run.id)}
                                   for k in batch.keys])


process_events = build_batch_task(_log_batch, block=BLOCK, table=EVENTS, key="id", size=5)


@flow
def drain() -> dict:
    return process_events()
