"""Soak run: slots, event batches and work lists side by side for N minutes, watching memory and connections.

Not a test and not a throughput benchmark: it answers "does a long-running worker leak?" Three
worker processes (one per feature, each with two threads sharing one ``ControlTable``, as a real
worker process would) run until the time is up, while this process prints one table row per
sample: operations done, errors, each worker's resident memory (RSS, from /proc) and the
server's connection count (PostgreSQL: this database's rows in ``pg_stat_activity``; MariaDB/MySQL:
``Threads_connected``, which counts the whole server). A leak shows as a column that keeps
growing; a steady state as flat columns after the first minute.

    .venv/bin/python benchmarks/soak.py --minutes 10 --url postgresql+psycopg://postgres@127.0.0.1:5432/ct_me

The control tables go into a namespace of their own and the event table is named after the run;
both are removed at the end (``--keep`` leaves them).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional

from sqlalchemy import BigInteger, Column, MetaData, String, Table, create_engine, delete, insert, text
from sqlalchemy.engine import make_url

from controltable import ControlTable, ControlTableError

FEATURES = ("slots", "batches", "worklist")


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (Linux /proc; 0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def event_table(name: str) -> Table:
    return Table(name, MetaData(), Column("id", BigInteger, primary_key=True, autoincrement=False),
                 Column("payload", String(100), nullable=False))


# -- workers (one process per feature) ---------------------------------------------------------------
def _worker(feature: str, url: str, namespace: str, table: str, stop_at: float, ops: Any, errors: Any) -> None:
    ct = ControlTable(url, namespace=namespace)
    rng = random.Random(f"{feature}-{os.getpid()}")

    def count(cell: Any) -> None:
        with cell.get_lock():
            cell.value += 1

    seen: set[str] = set()

    def guarded(fn: Any) -> Any:
        def loop() -> None:
            while time.time() < stop_at:
                try:
                    if fn() is not False:
                        count(ops)
                except Exception as exc:  # counted; any that is not a ControlTableError is a defect
                    count(errors)
                    name = type(exc).__name__
                    if name not in seen:
                        seen.add(name)
                        kind = "" if isinstance(exc, ControlTableError) else " (NOT a ControlTableError)"
                        print(f"soak {feature}: first {name}{kind}: {str(exc).splitlines()[0][:200]}",
                              file=sys.stderr, flush=True)
                    time.sleep(0.5)
        return loop

    def slot_round() -> None:
        with ct.slot("soak", mode=rng.choice(["shared", "shared", "exclusive"]), lease=5, timeout=60):
            time.sleep(rng.uniform(0.005, 0.05))

    ev = ct.events(table, key="id", lease=30)
    ev.table  # noqa: B018 - reflect once before the threads share it (a first reflection from two threads races)
    next_key = [int(time.time() * 1000) * 1000 + os.getpid() % 1000]
    key_lock = threading.Lock()

    def produce() -> bool:
        with key_lock:
            start = next_key[0]
            next_key[0] += 50
        with ct.engine.begin() as conn:
            conn.execute(insert(ev.table), [{"id": k, "payload": f"soak {k}"} for k in range(start, start + 50)])
            # Keep the table small: a soak measures the steady state, not a growing table.
            conn.execute(delete(ev.table).where(ev.table.c.id < start - 20_000))
        ev.notify()
        time.sleep(0.1)
        return False  # the events are counted when consumed

    def consume() -> bool:
        batch = ev.claim(25, wait=1.0)
        if batch is None:
            return False
        time.sleep(rng.uniform(0, 0.01))
        batch.complete()
        return True

    wl = ct.worklist("soak")

    def refill() -> bool:
        st = wl.status()
        if st.finished:
            wl.drop()
            wl.populate([{"n": i} for i in range(20)], order=100)
            wl.populate([{"n": i} for i in range(20)], order=200)
        time.sleep(0.5)
        return False

    def work() -> bool:
        item = wl.allocate(lease=30)
        if item is None:
            time.sleep(0.05)
            return False
        time.sleep(rng.uniform(0, 0.01))
        item.complete()
        return True

    plans: dict[str, list[Callable[[], Any]]] = {
        "slots": [slot_round, slot_round], "batches": [produce, consume], "worklist": [refill, work]}
    loops = plans[feature]
    threads = [threading.Thread(target=guarded(fn), daemon=True) for fn in loops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ct.close()


# -- the sampler --------------------------------------------------------------------------------------
def connection_count(engine: Any, database: Optional[str]) -> int:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return int(conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": database}))
        if engine.dialect.name == "mysql":
            row = conn.execute(text("SHOW GLOBAL STATUS LIKE 'Threads_connected'")).first()
            return int(row[1]) if row else -1
    return -1


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--url", required=True,
                   help="PostgreSQL or MariaDB/MySQL URL (SQLite works, without connection counts)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between samples (default 30)")
    p.add_argument("--keep", action="store_true", help="leave the namespace and event table behind")
    args = p.parse_args(argv)
    if not (0 < args.minutes <= 24 * 60) or args.every <= 0:
        p.error("--minutes must be in (0, 1440] and --every positive")

    url = make_url(args.url)
    safe = url.render_as_string(hide_password=True)
    namespace = f"soak_{uuid.uuid4().hex[:8]}"
    table = f"soak_ev_{uuid.uuid4().hex[:8]}"
    ct = ControlTable(args.url, namespace=namespace)
    ct.install()
    event_table(table).create(ct.engine)
    ct.events(table, key="id").prepare()
    ct.set_capacity("soak", 2)
    monitor = create_engine(args.url, pool_size=1, max_overflow=0)

    duration = args.minutes * 60.0
    started = time.time()
    stop_at = started + duration
    ctx = mp.get_context("spawn")
    ops = {f: ctx.Value("l", 0) for f in FEATURES}
    errors = {f: ctx.Value("l", 0) for f in FEATURES}
    procs = {f: ctx.Process(target=_worker, args=(f, args.url, namespace, table, stop_at, ops[f], errors[f]),
                            name=f"soak-{f}", daemon=True) for f in FEATURES}
    for proc in procs.values():
        proc.start()

    print(f"soak: {args.minutes:g} min against {safe}, namespace {namespace}, one process per feature "
          f"({', '.join(FEATURES)}), 2 threads each; a row every {args.every:g} s", flush=True)
    header = (f"{'elapsed':>8} {'progress':>8} | " + " ".join(f"{f + ' ops':>13}" for f in FEATURES)
              + f" {'errors':>7} | " + " ".join(f"{f[:5] + ' MiB':>10}" for f in FEATURES) + f" | {'conns':>5}")
    print(header)
    print("-" * len(header), flush=True)
    samples: list[tuple[float, list[int], list[float], int]] = []
    next_sample = started
    while True:
        now = time.time()
        if now >= next_sample or now >= stop_at:
            done = [ops[f].value for f in FEATURES]
            rss = [rss_mib(procs[f].pid or 0) for f in FEATURES]
            try:
                conns = connection_count(monitor, url.database)
            except Exception:
                conns = -1
            errs = sum(errors[f].value for f in FEATURES)
            elapsed = now - started
            samples.append((elapsed, done, rss, conns))
            print(f"{elapsed:7.0f}s {min(elapsed / duration, 1.0):8.0%} | " + " ".join(f"{d:13,}" for d in done)
                  + f" {errs:7,} | " + " ".join(f"{r:10.1f}" for r in rss) + f" | {conns:5}", flush=True)
            next_sample += args.every
            if now >= stop_at:
                break
        time.sleep(min(1.0, max(0.05, min(next_sample, stop_at) - time.time())))
    for proc in procs.values():
        proc.join(timeout=120)
        if proc.is_alive():
            proc.kill()

    # Summary: growth of RSS from the first full minute to the end.
    base = next((s for s in samples if s[0] >= 60), samples[min(1, len(samples) - 1)])
    last = samples[-1]
    print()
    print("summary: " + ", ".join(
        f"{f} {last[1][i]:,} ops, RSS {base[2][i]:.1f} -> {last[2][i]:.1f} MiB" for i, f in enumerate(FEATURES))
        + f"; connections {min(s[3] for s in samples)}..{max(s[3] for s in samples)}; "
        + f"errors {sum(errors[f].value for f in FEATURES)}", flush=True)

    if not args.keep:
        ct.worklist("soak").drop()
        ct.delete_resource("soak", force=True)
        event_table(table).drop(ct.engine)
    ct.close()
    monitor.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
