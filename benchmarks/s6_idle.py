"""Scenario 6: idle cost. Queries per second that 20 idle waiters and 20 idle claimers issue, with
polling and with push wake-ups, counted by PostgreSQL itself.

The counter is ``xact_commit + xact_rollback`` of the benchmark's own database in
``pg_stat_database`` (``pg_stat_statements`` is used instead when the server has it loaded),
read at the start and end of a window after a warm-up, minus our own reads. Waiters queue on one
resource of capacity 1 held by this process; claimers wait in ``events.claim(wait=...)`` on an
empty table (back-off capped at 2 s when polling; with push it may grow to 10 s, since producers
announce new rows with ``events.notify()``). Each group runs in its own 20 spawned processes, one
group at a time.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from controltable import ControlTable

from .common import Config, Report, Row, create_event_table, raw_connection
from .workers import SPAWN, idle_claimer, idle_waiter

NAMESPACE = "bench_s6"
RESOURCE = "idle"
TABLE = "bench_s6_events"


class ServerCounter:
    """Statements (pg_stat_statements) or transactions (pg_stat_database) of our database so far."""

    def __init__(self, url: str) -> None:
        self.conn = raw_connection(url)
        self.kind = "transactions"
        try:
            self.conn.execute("SELECT calls FROM pg_stat_statements LIMIT 1")
            self.kind = "statements"
        except Exception:
            pass

    def read(self) -> int:
        if self.kind == "statements":
            sql = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                   "WHERE d.datname = current_database()")
        else:
            sql = ("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                   "WHERE datname = current_database()")
        return int(self.conn.execute(sql).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


def _measure(
    url: str, target: Callable[..., None], args: tuple[Any, ...], n: int, warmup: float, window: float,
    modes: list[bool],
) -> dict[bool, float]:
    phases = [SPAWN.Queue() for _ in range(n)]
    reports: Any = SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, phases[i], reports), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    counter = ServerCounter(url)
    rates: dict[bool, float] = {}
    try:
        for push in modes:
            for q in phases:
                q.put((push, warmup + window + 1.0))
            for _ in range(n):
                assert reports.get(timeout=120) == "started"
            time.sleep(warmup)
            c0, t0 = counter.read(), time.monotonic()
            time.sleep(window)
            c1, t1 = counter.read(), time.monotonic()
            rates[push] = (c1 - c0) / (t1 - t0)
            for _ in range(n):
                assert reports.get(timeout=120) == "finished"
            time.sleep(1.0)
    finally:
        for q in phases:
            q.put(None)
        for p in procs:
            p.join(timeout=20)
        counter.close()
    return rates


def run(cfg: Config, report: Report, url: str) -> None:
    n = 20
    warmup, window = cfg.scale_f(5.0, 3.0), cfg.scale_f(15.0, 6.0)
    counter = ServerCounter(url)
    kind = counter.kind
    counter.close()
    # The anchor: the same counter with nobody working, over the same window.
    c = ServerCounter(url)
    a0, t0 = c.read(), time.monotonic()
    time.sleep(window / 2)
    a1, t1 = c.read(), time.monotonic()
    c.close()
    baseline = (a1 - a0) / (t1 - t0)

    report.log(f"scenario 6 [postgres]: {n} idle waiters, polling then push "
               f"({warmup:g} s warm-up, {window:g} s window)")
    holder = ControlTable(url, namespace=NAMESPACE)
    holder.install()
    holder.set_capacity(RESOURCE, 1)
    lease = holder.acquire(RESOURCE, holder="idle-holder", timeout=0, lease=3600)
    waiters = _measure(url, idle_waiter, (url, NAMESPACE, RESOURCE), n, warmup, window, [False, True])
    lease.release()
    holder.close()

    report.log(f"scenario 6 [postgres]: {n} idle claimers on an empty table, polling then push")
    create_event_table(url, TABLE)
    claimers = _measure(url, idle_claimer, (url, TABLE), n, warmup, window, [False, True])

    unit = f"{'stmts' if kind == 'statements' else 'xacts'}/s"
    report.extra["s6"] = {"counter": kind, "processes": n, "warmup_s": warmup, "window_s": window,
                          "baseline_per_s": baseline, "waiters": {"polling": waiters[False], "push": waiters[True]},
                          "claimers": {"polling": claimers[False], "push": claimers[True]}}
    for group, rates in (("waiters", waiters), ("claimers", claimers)):
        report.add(Row("6 idle cost", "postgres", f"{n} idle {group}, push", rates[True], unit,
                       f"{n} idle {group}, polling", rates[False], unit, rates[True] / rates[False],
                       note=f"server counter: {kind}; idle-database baseline {baseline:.2f}/s"))
