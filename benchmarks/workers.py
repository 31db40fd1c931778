"""Code that runs in worker processes (started with ``spawn``), and the pool that drives them.

Each function here is a process entry point: it imports what it needs, reports through a queue
or pipe, and never shares a connection with the parent.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import secrets
import time
from datetime import timedelta
from typing import Any, Optional

from controltable import AcquireTimeout, ControlTable

SPAWN = mp.get_context("spawn")


# -- drain workers (scenarios 1, 2 and 7) ------------------------------------------------------------
def _drain(ct: ControlTable, table: str, batch: int, owner: str, duration: Optional[float]) -> tuple[int, int]:
    """Claim and complete batches until the table is empty or ``duration`` seconds passed.

    The loop users write: ``complete_and_claim`` completes a batch and claims the next one in one
    transaction (one commit per batch).
    """
    events = ct.events(table, key="event_id")
    start = time.monotonic()
    rows = batches = 0
    claimed = events.claim(size=batch, owner=owner)
    while claimed is not None:
        rows += len(claimed)
        batches += 1
        if duration is not None and time.monotonic() - start >= duration:
            claimed.complete()
            break
        claimed = claimed.complete_and_claim(batch)
    return rows, batches


def _skip_locked_loop(url: str, table: str, batch: int) -> tuple[int, int]:
    """The minimal hand-written PostgreSQL loop the goals compare with: claim, then mark done.

    One psycopg connection, two short transactions per batch, no fencing beyond the token.
    """
    import psycopg

    from .common import asyncpg_dsn

    rows = batches = 0
    with psycopg.connect(asyncpg_dsn(url), autocommit=True) as conn:
        while True:
            token = secrets.randbits(62)
            with conn.transaction():
                got = conn.execute(
                    f"UPDATE {table} SET ct_state = 1, ct_token = %s, ct_owner = 'loop', "
                    f"ct_expires_at = extract(epoch from now()) + 900, ct_attempts = ct_attempts + 1 "
                    f"WHERE event_id IN (SELECT event_id FROM {table} WHERE ct_state = 0 "
                    f"ORDER BY event_id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING event_id, payload",
                    (token, batch),
                ).fetchall()
            if not got:
                break
            with conn.transaction():
                conn.execute(
                    f"UPDATE {table} SET ct_state = 2, ct_done_at = extract(epoch from clock_timestamp()), "
                    f"ct_expires_at = NULL WHERE event_id = ANY(%s) AND ct_token = %s AND ct_state = 1",
                    ([r[0] for r in got], token),
                )
            rows += len(got)
            batches += 1
    return rows, batches


def pool_worker(index: int, commands: Any, results: Any, go: Any) -> None:
    """A long-lived worker: set up for a command, report ready, wait for ``go``, run, report."""
    cts: dict[str, ControlTable] = {}
    while True:
        cmd = commands.get()
        kind = cmd[0]
        if kind == "stop":
            break
        _, url, table, batch, duration = cmd
        try:
            if kind == "drain":
                ct = cts.get(url)
                if ct is None:
                    ct = cts[url] = ControlTable(url)
                ct.events(table, key="event_id").table  # noqa: B018 - reflect before the clock starts
                ct.db.ping()
            results.put(("ready", index))
            go.wait()
            t0 = time.time()
            if kind == "drain":
                rows, batches = _drain(cts[url], table, batch, f"w{index}-{os.getpid()}", duration)
            else:
                rows, batches = _skip_locked_loop(url, table, batch)
            results.put(("done", index, rows, batches, t0, time.time(), None))
        except Exception as exc:  # report and keep serving
            results.put(("done", index, 0, 0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    for ct in cts.values():
        ct.close()


class WorkerPool:
    """``size`` spawned drain workers reused across runs, so process start-up stays out of the timings."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.go = SPAWN.Event()
        self.results: Any = SPAWN.Queue()
        self.commands: list[Any] = [SPAWN.Queue() for _ in range(size)]
        self.procs = [
            SPAWN.Process(target=pool_worker, args=(i, self.commands[i], self.results, self.go), daemon=True)
            for i in range(size)
        ]
        for p in self.procs:
            p.start()

    def run(
        self, kind: str, url: str, table: str, batch: int, workers: int, duration: Optional[float] = None
    ) -> dict[str, Any]:
        """Run ``kind`` ("drain" or "skiplocked") on ``workers`` of the pool at once; rows/s over the run."""
        assert workers <= self.size
        self.go.clear()
        for i in range(workers):
            self.commands[i].put((kind, url, table, batch, duration))
        for _ in range(workers):
            msg = self.results.get(timeout=300)
            assert msg[0] == "ready", msg
        start = time.time()
        self.go.set()
        done = [self.results.get(timeout=900) for _ in range(workers)]
        self.go.clear()
        errors = [d[6] for d in done if d[6]]
        if errors:
            raise RuntimeError("; ".join(errors))
        rows = sum(d[2] for d in done)
        end = max(d[5] for d in done)
        elapsed = max(end - start, 1e-9)
        return {"rows": rows, "batches": sum(d[3] for d in done), "seconds": elapsed, "rate": rows / elapsed}

    def close(self) -> None:
        for q in self.commands:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=20)
            if p.is_alive():
                p.terminate()


# -- pgqueuer (scenario 2) ---------------------------------------------------------------------------
def pgqueuer_drain(dsn: str, jobs: int, batch: int, results: Any) -> None:
    """Install pgqueuer afresh, enqueue ``jobs`` no-op jobs, then time one worker draining them."""
    try:
        results.put(asyncio.run(_pgqueuer_drain(dsn, jobs, batch)))
    except Exception as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


async def _pgqueuer_drain(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    setup = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(setup))
    if await queries.schema_is_installed():
        await queries.uninstall()
    await queries.install()
    for i in range(0, jobs, 1000):
        k = min(1000, jobs - i)
        await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    await setup.execute("VACUUM ANALYZE pgqueuer")
    await setup.close()

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    processed = 0

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        nonlocal processed
        processed += 1

    start = time.perf_counter()
    await qm.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
    elapsed = time.perf_counter() - start
    check = await asyncpg.connect(dsn)
    left = int(await check.fetchval("SELECT count(*) FROM pgqueuer"))
    await check.close()
    return {"rows": processed, "seconds": elapsed, "rate": processed / elapsed, "left_in_queue": left}


# -- slot waiters (scenarios 4 and 6) ----------------------------------------------------------------
def handoff_waiter(url: str, namespace: str, resource: str, push: bool, conn: Any) -> None:
    """On each "go", wait for ``resource`` (queued behind the parent) and report when granted."""
    ct = ControlTable(url, namespace=namespace)
    ct.wakeups.enabled = push
    ct.db.ping()
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg == "stop":
            break
        before = ct.wakeups.received
        lease = ct.acquire(resource, holder=f"waiter-{msg}", timeout=60, lease=60)
        granted = time.time()
        woken = ct.wakeups.received > before
        lease.release()
        conn.send((granted, woken, ct.wakeups.active))
    ct.close()


def idle_waiter(url: str, namespace: str, resource: str, phases: Any, reports: Any) -> None:
    """Wait (and time out) on a resource held by someone else, once per phase: (push, seconds)."""
    while True:
        phase = phases.get()
        if phase is None:
            break
        push, seconds = phase
        ct = ControlTable(url, namespace=namespace)
        ct.wakeups.enabled = push
        reports.put("started")
        try:
            ct.acquire(resource, timeout=seconds, lease=60)
        except AcquireTimeout:
            pass
        ct.close()
        reports.put("finished")


def idle_claimer(url: str, table: str, phases: Any, reports: Any) -> None:
    """An idle claimer: ``events.claim(wait=...)`` on an empty table.

    Polling: push disabled, back-off capped at 2 s (new events are seen within 2 s). Push: the
    back-off may grow to 10 s, because producers announce new rows with ``events.notify()`` (and
    rows given back by release or fail notify too), which wakes the claim at once.
    """
    while True:
        phase = phases.get()
        if phase is None:
            break
        push, seconds = phase
        ct = ControlTable(url)
        ct.wakeups.enabled = push
        events = ct.events(table, key="event_id")
        reports.put("started")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            batch = events.claim(size=100, owner=f"idle-{os.getpid()}", wait=left,
                                 max_poll_interval=10.0 if push else 2.0)
            if batch is not None:
                batch.complete()
        ct.close()
        reports.put("finished")
