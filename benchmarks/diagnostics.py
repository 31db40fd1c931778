"""Where the time goes: round trips and statement time per controltable operation.

Counted on the client through SQLAlchemy events on the engine controltable uses: statements
(``before/after_cursor_execute``), commits, and pool check-outs (each check-out runs the
``pool_pre_ping`` probe, one more round trip, when the engine has it). The anchor of each
operation is the ``SELECT 1`` round trip on a raw connection, measured in the same loop.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Any, Callable

from sqlalchemy import event

from controltable import ControlTable

from .common import (
    Config,
    Report,
    Row,
    create_event_table,
    fill_events,
    median,
    percentile,
    raw_connection,
    select_one,
    timed,
)


class Trace:
    """Counts and times statements on one engine while ``active``."""

    def __init__(self, engine: Any) -> None:
        self.active = False
        self.statements: dict[str, list[float]] = defaultdict(list)
        self.commits = 0
        self.checkouts = 0
        self._start = 0.0
        self.pre_ping = bool(getattr(engine.pool, "_pre_ping", False))
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "commit", self._commit)
        event.listen(engine.pool, "checkout", self._checkout)

    def reset(self) -> None:
        self.statements = defaultdict(list)
        self.commits = self.checkouts = 0

    @staticmethod
    def label(sql: str) -> str:
        words = re.sub(r"\s+", " ", sql).strip()
        words = re.sub(r"\(__\[POSTCOMPILE_[^)]*\]\)|\(%\(\w+\)s(, %\(\w+\)s)*\)", "(...)", words)
        return words[:70]

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self._start = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.active:
            self.statements[self.label(statement)].append(time.perf_counter() - self._start)

    def _commit(self, conn: Any) -> None:
        if self.active:
            self.commits += 1

    def _checkout(self, *args: Any) -> None:
        if self.active:
            self.checkouts += 1


def profile(trace: Trace, fn: Callable[[], Any], n: int, rtt: Callable[[], float]) -> dict[str, Any]:
    """Run ``fn`` ``n`` times under the trace, a ``SELECT 1`` anchor before each run."""
    trace.reset()
    totals, trips = [], []
    for _ in range(n):
        trips.append(rtt())
        trace.active = True
        totals.append(timed(fn))
        trace.active = False
    stmts = {k: {"per_op": len(v) / n, "ms_per_op": sum(v) / n * 1e3} for k, v in trace.statements.items()}
    return {
        "ms_per_op": median(totals) * 1e3,
        "select1_ms": median(trips) * 1e3,
        "statements_per_op": sum(len(v) for v in trace.statements.values()) / n,
        "statement_ms_per_op": sum(sum(v) for v in trace.statements.values()) / n * 1e3,
        "commits_per_op": trace.commits / n,
        "pool_checkouts_per_op": trace.checkouts / n,
        "pre_ping": trace.pre_ping,
        "statements": dict(sorted(stmts.items(), key=lambda kv: -kv[1]["ms_per_op"])),
    }


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    n = cfg.scale(200, 50)
    report.log(f"diagnostics [{backend}]: statements and round trips per operation ({n} each)")
    ct = ControlTable(url, namespace="bench_diag")
    ct.install()
    ct.set_capacity("diag", 1)
    create_event_table(url, "bench_diag")
    fill_events(url, "bench_diag", 1000 * n + 100 * n)
    events = ct.events("bench_diag", key="event_id")
    events.table  # noqa: B018 - reflect outside the measurement
    trace = Trace(ct.engine)
    conn = raw_connection(url)

    def rtt() -> float:
        return timed(lambda: select_one(conn))

    leases: list[Any] = []
    batches: list[Any] = []
    ops: dict[str, Any] = {}

    def acquire_release() -> None:
        ct.acquire("diag", timeout=0).release()

    def acquire() -> None:
        leases.append(ct.acquire("diag", timeout=0))

    def release() -> None:
        leases.pop().release()

    # acquire and release separately, alternating, so each is measured with the slot free / held
    acq, rel = [], []
    for _ in range(n):
        acq.append(profile(trace, acquire, 1, rtt))
        rel.append(profile(trace, release, 1, rtt))
    ops["acquire (uncontended)"] = _merge(acq)
    ops["release"] = _merge(rel)
    ops["acquire+release"] = profile(trace, acquire_release, n, rtt)
    for size in (100, 1000):
        cl, co = [], []

        def claim(size: int = size) -> None:
            batches.append(events.claim(size=size, owner="diag"))

        def complete() -> None:
            batches.pop().complete()

        for _ in range(n if size == 100 else max(n // 4, 10)):
            cl.append(profile(trace, claim, 1, rtt))
            co.append(profile(trace, complete, 1, rtt))
        ops[f"claim({size})"] = _merge(cl)
        ops[f"complete({size})"] = _merge(co)
    floor = write_floor(url, backend, n)
    conn.close()
    ct.close()
    report.extra.setdefault("diagnostics", {})[backend] = {"operations": ops, "write_floor": floor}
    r50 = floor["select1_p50_ms"]
    report.add(Row("0 floor", backend, "1-row UPDATE + COMMIT p50", floor["durable_write_p50_ms"], "ms",
                   "SELECT 1 p50", r50, "ms", floor["durable_write_p50_ms"] / r50,
                   note="any operation that writes and commits pays this at least once"))
    if "async_write_p50_ms" in floor:
        report.add(Row("0 floor", backend, "same, synchronous_commit=off", floor["async_write_p50_ms"], "ms",
                       "SELECT 1 p50", r50, "ms", floor["async_write_p50_ms"] / r50,
                       note="the difference is the WAL flush (fsync) at commit"))
    for name, op in ops.items():
        top = next(iter(op["statements"].items()), ("-", {"ms_per_op": 0.0}))
        report.log(f"  {name:<22} {op['ms_per_op']:7.2f} ms = {op['ms_per_op'] / op['select1_ms']:5.1f} x SELECT 1; "
                   f"{op['statements_per_op']:.1f} stmts + {op['commits_per_op']:.0f} commit + "
                   f"{op['pool_checkouts_per_op']:.0f} checkout(s); top: {top[0][:45]} {top[1]['ms_per_op']:.2f} ms")


def write_floor(url: str, backend: str, n: int) -> dict[str, float]:
    """The cheapest durable write on this server: a 1-row UPDATE committed (autocommit), vs SELECT 1.

    Sampled in rotation with ``SELECT 1`` and, on PostgreSQL, with the same UPDATE on a second
    connection running ``synchronous_commit = off`` (the difference is the commit's WAL flush).
    """
    conns = [raw_connection(url) for _ in range(2)]
    cur, cur2 = conns[0].cursor(), conns[1].cursor()
    cur.execute("DROP TABLE IF EXISTS bench_floor")
    cur.execute("CREATE TABLE bench_floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    cur.execute("INSERT INTO bench_floor VALUES (1, 0), (2, 0)")
    if backend == "postgres":
        cur2.execute("SET synchronous_commit = off")
    out: dict[str, list[float]] = {"select1": [], "durable_write": [], "async_write": []}
    for _ in range(n):
        out["select1"].append(timed(lambda: select_one(conns[0])))
        out["durable_write"].append(timed(lambda: cur.execute("UPDATE bench_floor SET v = v + 1 WHERE id = 1")))
        if backend == "postgres":
            out["async_write"].append(timed(lambda: cur2.execute("UPDATE bench_floor SET v = v + 1 WHERE id = 2")))
    cur.execute("DROP TABLE bench_floor")
    for c in conns:
        c.close()
    return {f"{k}_p50_ms": percentile(v, 50) * 1e3 for k, v in out.items() if v}


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Median times and mean counts over single-operation profiles."""
    n = len(parts)
    stmts: dict[str, dict[str, float]] = defaultdict(lambda: {"per_op": 0.0, "ms_per_op": 0.0})
    for p in parts:
        for k, v in p["statements"].items():
            stmts[k]["per_op"] += v["per_op"] / n
            stmts[k]["ms_per_op"] += v["ms_per_op"] / n
    return {
        "ms_per_op": median([p["ms_per_op"] for p in parts]),
        "select1_ms": median([p["select1_ms"] for p in parts]),
        "statements_per_op": sum(p["statements_per_op"] for p in parts) / n,
        "statement_ms_per_op": sum(p["statement_ms_per_op"] for p in parts) / n,
        "commits_per_op": sum(p["commits_per_op"] for p in parts) / n,
        "pool_checkouts_per_op": sum(p["pool_checkouts_per_op"] for p in parts) / n,
        "pre_ping": parts[0]["pre_ping"],
        "statements": dict(sorted(stmts.items(), key=lambda kv: -kv[1]["ms_per_op"])),
    }
