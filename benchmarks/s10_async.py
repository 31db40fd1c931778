"""Scenario "aio": the asyncio API beside the sync one, in one run.

* acquire+release, uncontended: ``await act.acquire(timeout=0)`` then ``await lease.release()``,
  sampled interleaved with the sync pair on the same database (the anchor), so both see the same noise.
* handoff: a holder releases, the waiter (already queued) gets the grant; release to grant, p50,
  async (both sides tasks of one loop) against sync (both sides threads of one process).
* 1,000 waiters in one event loop (PostgreSQL): all queued behind a holder, then served one after
  another (capacity 1); the time to serve them all, and the most connections checked out at once
  (the pool's bound: 15), against 1,000 sync handoffs at the sync p50.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from controltable import ControlTable
from controltable.aio import AsyncControlTable

from .common import Config, Report, Row, percentile


async def _until_waiting(act: AsyncControlTable, resource: str, n: int) -> None:
    for _ in range(100000):
        (st,) = await act.status(resource)
        if len(st.waiters) >= n:
            return
        await asyncio.sleep(0.005)
    raise RuntimeError("the waiters never queued")


def _sync_handoff(ct: ControlTable, resource: str) -> float:
    held = ct.acquire(resource, holder="holder", timeout=0)
    granted: list[float] = []

    def wait() -> None:
        lease = ct.acquire(resource, holder="waiter", timeout=60)
        granted.append(time.monotonic())
        lease.release()

    t = threading.Thread(target=wait)
    t.start()
    while not ct.status(resource)[0].waiters:
        time.sleep(0.002)
    started = time.monotonic()
    held.release()
    t.join(60)
    return granted[0] - started


async def _async_handoff(act: AsyncControlTable, resource: str) -> float:
    held = await act.acquire(resource, holder="holder", timeout=0)
    granted: list[float] = []

    async def wait() -> None:
        lease = await act.acquire(resource, holder="waiter", timeout=60)
        granted.append(time.monotonic())
        await lease.release()

    task = asyncio.create_task(wait())
    await _until_waiting(act, resource, 1)
    started = time.monotonic()
    await held.release()
    await task
    return granted[0] - started


async def _thousand(act: AsyncControlTable, ct: ControlTable, n: int) -> tuple[float, int]:
    await act.set_capacity("aio_fleet", 1)
    held = ct.acquire("aio_fleet", holder="sync-holder", timeout=0)
    pool: Any = act.sync.db.engine.pool
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, pool.checkedout())
            await asyncio.sleep(0.01)

    async def waiter(i: int) -> None:
        lease = await act.acquire("aio_fleet", holder=f"w{i}", timeout=600, waiter_ttl=300)
        await lease.release()

    sampler = asyncio.create_task(sample())
    tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
    await _until_waiting(act, "aio_fleet", n)
    started = time.monotonic()
    await asyncio.to_thread(held.release)
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    done.set()
    await sampler
    return elapsed, peak


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    samples, rounds = cfg.scale(300, 50), cfg.scale(30, 8)
    namespace = f"bench_aio_{uuid.uuid4().hex[:8]}"
    report.log(f"scenario aio [{backend}]: async vs sync acquire+release ({samples}), handoff ({rounds})")
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    ct.set_capacity("aio", 1)
    ct.set_capacity("aio_handoff", 1)

    async def main() -> dict[str, Any]:
        async with AsyncControlTable.from_control_table(ct) as act:
            sync_s: list[float] = []
            async_s: list[float] = []
            for i in range(samples + 20):
                t0 = time.perf_counter()
                ct.acquire("aio", holder="s", timeout=0).release()
                t1 = time.perf_counter()
                await (await act.acquire("aio", holder="a", timeout=0)).release()
                t2 = time.perf_counter()
                if i >= 20:
                    sync_s.append(t1 - t0)
                    async_s.append(t2 - t1)
            sync_h = [await asyncio.to_thread(_sync_handoff, ct, "aio_handoff") for _ in range(rounds)]
            async_h = [await _async_handoff(act, "aio_handoff") for _ in range(rounds)]
            fleet = await _thousand(act, ct, cfg.scale(1000, 200)) if backend == "postgres" else None
            return {"sync": sync_s, "async": async_s, "sync_h": sync_h, "async_h": async_h, "fleet": fleet}

    try:
        got = asyncio.run(main())
    finally:
        ct.close()
    s50, a50 = percentile(got["sync"], 50) * 1e3, percentile(got["async"], 50) * 1e3
    s99, a99 = percentile(got["sync"], 99) * 1e3, percentile(got["async"], 99) * 1e3
    report.add(Row("aio acquire+release", backend, "p50", a50, "ms", "sync p50", s50, "ms", a50 / s50))
    report.add(Row("aio acquire+release", backend, "p99", a99, "ms", "sync p99", s99, "ms", a99 / s99))
    hs50, ha50 = percentile(got["sync_h"], 50) * 1e3, percentile(got["async_h"], 50) * 1e3
    report.add(Row("aio handoff", backend, "p50", ha50, "ms", "sync handoff p50", hs50, "ms", ha50 / hs50,
                   note="release to the queued waiter's grant"))
    extra: dict[str, Any] = {"acquire_release_p50_ms": a50, "sync_acquire_release_p50_ms": s50,
                             "handoff_p50_ms": ha50, "sync_handoff_p50_ms": hs50}
    if got["fleet"] is not None:
        n = cfg.scale(1000, 200)
        elapsed, peak = got["fleet"]
        serial = n * hs50 / 1e3
        report.add(Row("aio 1,000 waiters", backend, f"{n} served (one loop)", elapsed, "s",
                       f"{n} sync handoffs", serial, "s", elapsed / serial,
                       note=f"peak {peak} pooled connections checked out (bound 15, plus 1 listener)"))
        extra.update(waiters=n, all_served_s=elapsed, peak_connections=peak)
    report.extra.setdefault("aio", {})[backend] = extra
