"""Scenario 8: slots for fleets - many waiters, handoffs, idle cost and a dead waiter at the head.

Figures (PostgreSQL; the scale figure also on MariaDB and SQLite, which poll):

* scale: 3 processes x 100 threads (quick: 3 x 20), each thread acquires once a resource of
  capacity 4 and holds it 0.1 s. Wall time over the ideal ``N x hold / capacity``; and, on
  PostgreSQL, committed transactions per grant from ``pg_stat_database`` of our own database.
* uncontended acquire+release p50 over two durable one-row commits p50, sampled in the same loop
  (the floor: acquire and release each commit once).
* handoff p50 with push: a holder in this process releases, a waiter in another ``ControlTable``
  (its own listener) is woken and picks the grant up; in ``SELECT 1`` round trips of the same run.
* idle: 20 waiters queued behind a holder that keeps the slot, with push: transactions per second
  of our database over a window longer than the waiters' refresh interval.
* a waiter SIGKILLed at the head of the queue: how long the next waiter waits after the release.

Everything runs in a database of its own (``controltable_bench_slots``), so other users of the
server neither disturb the tables nor the transaction counters.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from controltable import ControlTable

from .common import (
    Config,
    Report,
    Row,
    backend_of,
    percentile,
    raw_connection,
    select_one,
    settle_control_tables,
    timed,
)
from .workers import SPAWN

#: The scenario's own database (CONTROLTABLE_BENCH_SLOTS_DATABASE overrides, e.g. to run beside
#: another checkout whose control tables have another schema version).
DATABASE = os.environ.get("CONTROLTABLE_BENCH_SLOTS_DATABASE", "controltable_bench_slots")
CAPACITY, HOLD = 4, 0.1


def own_database(url: str) -> str:
    """Create (once) and return this scenario's own database on the server of ``url``."""
    backend = backend_of(url)
    if backend == "sqlite":
        return url
    parsed = make_url(url)
    engine = create_engine(parsed, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        if backend == "postgres":
            if not conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": DATABASE}):
                conn.execute(text(f"CREATE DATABASE {DATABASE}"))
        else:
            conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {DATABASE}"))
    engine.dispose()
    return parsed.set(database=DATABASE).render_as_string(hide_password=False)


def transactions(url: str) -> int:
    conn = raw_connection(url)
    try:
        cur = conn.cursor()
        cur.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return int(cur.fetchone()[0])
    finally:
        conn.close()


# -- worker processes ------------------------------------------------------------------------------
def fleet_process(url: str, namespace: str, threads: int, hold: float, start_at: float, out: Any,
                  priorities: bool = False) -> None:
    ct = ControlTable(url, namespace=namespace)
    done: list[float] = []
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            time.sleep(max(start_at - time.time(), 0))
            priority = i % 4 if priorities else 0  # four levels, mixed across the queue
            with ct.slot("fleet", holder=f"{os.getpid()}-{i}", lease=60, timeout=600, priority=priority):
                time.sleep(hold)
            done.append(time.time())
        except Exception as exc:  # reported to the parent
            errors.append(repr(exc))

    pool = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    ct.close()
    out.put((max(done) if done else 0.0, len(done), errors[:3]))


def idle_process(url: str, namespace: str, waiters: int, ready: Any, stop: Any) -> None:
    ct = ControlTable(url, namespace=namespace)

    def one(i: int) -> None:
        try:
            ct.acquire("idle", holder=f"idle-{os.getpid()}-{i}", timeout=3600).release()
        except Exception:
            pass

    pool = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(waiters)]
    for t in pool:
        t.start()
    ready.put(1)
    stop.get()
    os._exit(0)  # the waiters stay queued; the parent deletes the resource


def doomed_waiter(url: str, namespace: str, ready: Any) -> None:
    ct = ControlTable(url, namespace=namespace)
    threading.Thread(target=lambda: ct.acquire("head", holder="doomed", timeout=3600), daemon=True).start()
    deadline = time.time() + 30
    while time.time() < deadline:
        info = ct.wait_info("head", "doomed")
        if info is not None:
            break
        time.sleep(0.05)
    ready.put(os.getpid())
    time.sleep(3600)


# -- the figures -----------------------------------------------------------------------------------
#: The policy variants of the scale figure: none, priorities (four levels, aging 5 s per step),
#: and a rate limit half the capacity's throughput (so that it binds: ideal = N / rate).
POLICIES = ("none", "priorities", "rate")
RATE = (20, 1.0)
AGING = 5.0


def scale(cfg: Config, report: Report, url: str, backend: str, policy: str = "none", processes: int = 3,
          where: str = "") -> float:
    """The fleet figure; returns wall time over its ideal (for the ratio of policy variants)."""
    per = cfg.scale(100, 20)
    n = processes * per
    ns = f"bench_s8_{policy}_{int(time.time())}"
    ct = ControlTable(url, namespace=ns)
    ct.install()
    settle_control_tables(ct)
    if policy == "rate":
        ct.set_capacity("fleet", CAPACITY, rate=RATE)
    elif policy == "priorities":
        ct.set_capacity("fleet", CAPACITY, aging=AGING)
    else:
        ct.set_capacity("fleet", CAPACITY)
    report.log(f"scenario 8 [{backend}]: {n} waiters ({processes} processes x {per} threads), capacity {CAPACITY}, "
               f"{HOLD} s holds, policy {policy}")
    out: Any = SPAWN.Queue()
    start_at = time.time() + 8.0 + processes * 0.5  # all threads of all processes start queueing at once
    procs = [SPAWN.Process(target=fleet_process, args=(url, ns, per, HOLD, start_at, out, policy == "priorities"))
             for _ in range(processes)]
    for p in procs:
        p.start()
    time.sleep(max(start_at - time.time() - 1.0, 0))
    before = transactions(url) if backend == "postgres" else 0
    results = [out.get(timeout=900) for _ in procs]
    after = transactions(url) if backend == "postgres" else 0
    for p in procs:
        p.join(30)
    errors = [e for r in results for e in r[2]]
    grants = sum(r[1] for r in results)
    wall = max(r[0] for r in results) - start_at
    ideal = n * HOLD / CAPACITY
    anchor = "ideal N x hold / capacity"
    if policy == "rate":
        ideal = max(ideal, (n - RATE[0]) * RATE[1] / RATE[0])
        anchor = f"ideal at rate {RATE[0]}/{RATE[1]:g}s"
    ct.delete_resource("fleet", force=True)
    ct.close()
    note = f"{grants}/{n} grants" + (f"; errors: {errors}" if errors else "")
    label = f"8 fleet {n} waiters" + ("" if policy == "none" else f", {policy}") + where
    report.add(Row(label, backend, "wall time", wall, "s", anchor, ideal,
                   "s", wall / ideal, goal="<= 1.5", met=wall / ideal <= 1.5 and grants == n, note=note))
    if backend == "postgres":
        per_grant = (after - before) / max(grants, 1)
        report.add(Row(label, backend, "transactions per grant", per_grant, "tx", "one grant",
                       1, "grant", per_grant, goal="<= 6", met=per_grant <= 6,
                       note="pg_stat_database xact_commit + xact_rollback of the scenario's own database"))
    return wall / ideal


def fleet_of_thousands(cfg: Config, report: Report) -> None:
    """3,000 waiters in 30 processes (quick: 600 in 30) against 300 in 3, both on one throwaway
    PostgreSQL (the shared server's 100 connections do not fit 30 processes' pools): wall time over
    the ideal, and whether the committed transactions per grant stay flat as the fleet grows."""
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from faults.servers import ThrowawayPostgres, postgres_bin  # the fault suite's helper

    if postgres_bin() is None:
        report.errors.append("scenario fleet: no PostgreSQL binaries (initdb, pg_ctl) for a throwaway server")
        return
    server = ThrowawayPostgres()
    with open(server.data / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write("max_connections = 700\nshared_buffers = 128MB\n")  # the last setting wins
    server.start()
    try:
        url = server.url()
        small = scale(cfg, report, url, "postgres", processes=3, where=" (throwaway server)")
        large = scale(cfg, report, url, "postgres", processes=30, where=" (throwaway server)")
        per_grant = {r.scenario: r.value for r in report.rows if r.figure == "transactions per grant"
                     and r.scenario.endswith("(throwaway server)")}
        n_small, n_large = 3 * cfg.scale(100, 20), 30 * cfg.scale(100, 20)
        a = per_grant.get(f"8 fleet {n_small} waiters (throwaway server)")
        b = per_grant.get(f"8 fleet {n_large} waiters (throwaway server)")
        if a and b:
            report.add(Row(f"8 fleet {n_large} vs {n_small} waiters", "postgres", "transactions per grant", b, "tx",
                           f"{n_small} waiters, same server", a, "tx", b / a, goal="<= 1.2 (flat)", met=b / a <= 1.2,
                           note=f"wall/ideal {large:.2f} at {n_large}, {small:.2f} at {n_small}"))
    finally:
        server.close()


def policies(cfg: Config, report: Report, url: str, backend: str) -> None:
    """The fleet figure with each policy, against the same scenario without them in the same run."""
    base = scale(cfg, report, url, backend, "none")
    for policy in POLICIES[1:]:
        ratio = scale(cfg, report, url, backend, policy)
        report.add(Row(f"8 fleet, {policy} vs none", backend, "wall/ideal", ratio, "x", "wall/ideal without policies",
                       base, "x", ratio / base, goal="<= 1.3", met=ratio / base <= 1.3,
                       note="same run, same machine; the rate variant's ideal is the rate's"))


def uncontended(cfg: Config, report: Report, url: str, backend: str) -> None:
    samples, warmup = cfg.scale(500, 100), 30
    ct = ControlTable(url, namespace="bench_s8_u")
    ct.install()
    ct.set_capacity("u", 1)
    settle_control_tables(ct)
    conn = raw_connection(url)
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS bench_s8_floor")
    cur.execute("CREATE TABLE bench_s8_floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    cur.execute("INSERT INTO bench_s8_floor VALUES (1, 0)")

    def two_commits() -> None:
        cur.execute("UPDATE bench_s8_floor SET v = v + 1 WHERE id = 1")
        cur.execute("UPDATE bench_s8_floor SET v = v + 1 WHERE id = 1")

    ours, floor = [], []
    for i in range(warmup + samples):
        s = timed(lambda: ct.acquire("u", timeout=0).release())
        f = timed(two_commits)
        if i >= warmup:
            ours.append(s)
            floor.append(f)
    cur.execute("DROP TABLE bench_s8_floor")
    conn.close()
    ct.close()
    p50, f50 = percentile(ours, 50) * 1e3, percentile(floor, 50) * 1e3
    report.add(Row("8 uncontended acquire+release", backend, "p50", p50, "ms", "two durable 1-row commits p50",
                   f50, "ms", p50 / f50, goal="<= 2", met=p50 / f50 <= 2))


def handoff(cfg: Config, report: Report, url: str, backend: str) -> None:
    rounds = cfg.scale(60, 15)
    holder_ct = ControlTable(url, namespace="bench_s8_h")
    holder_ct.install()
    holder_ct.set_capacity("h", 1)
    waiter_ct = ControlTable(url, namespace="bench_s8_h")
    conn = raw_connection(url)
    latencies, rtts = [], []
    for i in range(rounds):
        lease = holder_ct.acquire("h", holder=f"holder-{i}", timeout=0)
        got: list[float] = []
        t = threading.Thread(target=lambda i=i, got=got: got.append(
            (waiter_ct.acquire("h", holder=f"waiter-{i}", timeout=60), time.perf_counter())[1]))
        t.start()
        deadline = time.monotonic() + 10
        while waiter_ct.wait_info("h", f"waiter-{i}") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the waiter is asleep, waiting for its push
        start = time.perf_counter()
        lease.release()
        t.join(60)
        if got:
            latencies.append(got[0] - start)
        holder_ct.release("h", f"waiter-{i}")
        rtts.append(timed(lambda: select_one(conn)))
    conn.close()
    push = waiter_ct.push_active
    holder_ct.close()
    waiter_ct.close()
    h50, r50 = percentile(latencies, 50) * 1e3, percentile(rtts, 50) * 1e3
    report.add(Row("8 handoff with push", backend, "p50", h50, "ms", "SELECT 1 round trip p50", r50, "ms",
                   h50 / r50, goal="<= 20", met=h50 / r50 <= 20,
                   note=f"release() call to the waiter's acquire() returning; push active: {push}"))


def idle(cfg: Config, report: Report, url: str, backend: str) -> None:
    window = cfg.scale_f(70.0, 35.0)
    ct = ControlTable(url, namespace="bench_s8_i")
    ct.install()
    ct.set_capacity("idle", 1)
    holder = ct.acquire("idle", holder="keeper", timeout=0, lease=600)
    ready: Any = SPAWN.Queue()
    stop: Any = SPAWN.Queue()
    proc = SPAWN.Process(target=idle_process, args=(url, "bench_s8_i", 20, ready, stop))
    proc.start()
    ready.get(timeout=120)
    deadline = time.monotonic() + 60
    while len(ct.status(["idle"])[0].waiters) < 20 and time.monotonic() < deadline:
        time.sleep(0.5)
    # Settled, and past PostgreSQL's deferred flush of backend statistics (up to 10 s when idle),
    # so that the set-up's own transactions are not counted inside the window.
    time.sleep(12.0)
    before = transactions(url)
    time.sleep(window)
    after = transactions(url)
    rate = (after - before - 1) / window  # minus our own read of the counter
    stop.put(1)
    proc.join(30)
    holder.release()
    ct.delete_resource("idle", force=True)
    ct.close()
    report.add(Row("8 idle 20 waiters, push", backend, "transactions/s", rate, "tx/s", "one per second", 1.0,
                   "tx/s", rate, goal="<= 1", met=rate <= 1,
                   note=f"window {window:.0f} s, longer than the waiters' refresh interval (waiter_ttl / 2)"))


def dead_head(cfg: Config, report: Report, url: str, backend: str) -> None:
    ct = ControlTable(url, namespace="bench_s8_d")
    ct.install()
    ct.set_capacity("head", 1)
    holder = ct.acquire("head", holder="holder", timeout=0)
    ready: Any = SPAWN.Queue()
    proc = SPAWN.Process(target=doomed_waiter, args=(url, "bench_s8_d", ready))
    proc.start()
    pid = ready.get(timeout=120)
    os.kill(pid, signal.SIGKILL)
    proc.join(10)
    got: list[float] = []
    t = threading.Thread(target=lambda: got.append(
        (ct.acquire("head", holder="next", timeout=120), time.monotonic())[1]))
    t.start()
    deadline = time.monotonic() + 10
    while ct.wait_info("head", "next") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    holder.release()
    t.join(150)
    delay = got[0] - start if got else float("inf")
    ct.release("head", "next")
    ct.close()
    report.add(Row("8 SIGKILLed waiter at the head", backend, "next grant after release", delay, "s",
                   "goal", 10.0, "s", delay / 10.0, goal="<= 10 s", met=delay <= 10.0,
                   note="the dead waiter is granted on its behalf; the grant lapses after the pickup deadline"))


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    url = own_database(url)
    policies(cfg, report, url, backend)
    if backend == "postgres":
        uncontended(cfg, report, url, backend)
        handoff(cfg, report, url, backend)
        dead_head(cfg, report, url, backend)
        idle(cfg, report, url, backend)
