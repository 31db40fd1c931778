"""Scenario 3: uncontended slot acquire+release latency, p50 and p99.

One process, one resource of capacity 1, ``acquire(timeout=0)`` then ``release()``. The anchor is
the database's own lock pair on one raw driver connection in autocommit mode, interleaved sample
by sample with the controltable samples so both see the same noise:
``pg_advisory_lock``/``pg_advisory_unlock`` on PostgreSQL, ``GET_LOCK``/``RELEASE_LOCK`` on
MariaDB, ``BEGIN IMMEDIATE``/``COMMIT`` on SQLite.
"""

from __future__ import annotations

from typing import Any, Callable

from controltable import ControlTable

from .common import Config, Report, Row, percentile, raw_connection, settle_control_tables, timed

GOAL = 4.0


def lock_pair(backend: str, conn: Any) -> Callable[[], None]:
    cur = conn.cursor()

    def pg() -> None:
        cur.execute("SELECT pg_advisory_lock(4242)")
        cur.fetchall()
        cur.execute("SELECT pg_advisory_unlock(4242)")
        cur.fetchall()

    def mysql() -> None:
        cur.execute("SELECT GET_LOCK('controltable_bench', 10)")
        cur.fetchall()
        cur.execute("SELECT RELEASE_LOCK('controltable_bench')")
        cur.fetchall()

    def sqlite() -> None:
        cur.execute("BEGIN IMMEDIATE")
        cur.execute("COMMIT")

    return {"postgres": pg, "mysql": mysql}.get(backend, sqlite)


def run(cfg: Config, report: Report, url: str, backend: str) -> None:
    samples, warmup = cfg.scale(1000, 200), 50
    report.log(f"scenario 3 [{backend}]: uncontended acquire+release, {samples} samples")
    ct = ControlTable(url, namespace="bench_s3")
    ct.install()
    ct.set_capacity("s3", 1)
    settle_control_tables(ct)
    conn = raw_connection(url)
    anchor_fn = lock_pair(backend, conn)
    # Context, not the anchor: the cheapest durable write (1-row UPDATE, autocommit) sampled in the
    # same loop, since acquire and release each commit a write and the lock pair writes nothing.
    wconn = raw_connection(url)
    wcur = wconn.cursor()
    wcur.execute("DROP TABLE IF EXISTS bench_s3_floor")
    wcur.execute("CREATE TABLE bench_s3_floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    wcur.execute("INSERT INTO bench_s3_floor VALUES (1, 0)")

    def write() -> None:
        wcur.execute("UPDATE bench_s3_floor SET v = v + 1 WHERE id = 1")

    def slot() -> None:
        ct.acquire("s3", timeout=0).release()

    ours: list[float] = []
    anchor: list[float] = []
    writes: list[float] = []
    for i in range(warmup + samples):
        a = timed(anchor_fn)
        s = timed(slot)
        w = timed(write)
        if i >= warmup:
            anchor.append(a)
            ours.append(s)
            writes.append(w)
    wcur.execute("DROP TABLE bench_s3_floor")
    wconn.close()
    conn.close()
    ct.close()
    p50, p99 = percentile(ours, 50) * 1e3, percentile(ours, 99) * 1e3
    a50, a99 = percentile(anchor, 50) * 1e3, percentile(anchor, 99) * 1e3
    w50 = percentile(writes, 50) * 1e3
    report.extra.setdefault("s3", {})[backend] = {"p50_ms": p50, "p99_ms": p99, "anchor_p50_ms": a50,
                                                  "anchor_p99_ms": a99, "samples": samples,
                                                  "durable_write_p50_ms": w50}
    is_pg = backend == "postgres"
    report.add(Row("3 slot acquire+release", backend, "p50", p50, "ms", "lock pair p50", a50, "ms", p50 / a50,
                   goal="<= 4" if is_pg else None, met=(p50 / a50 <= GOAL) if is_pg else None,
                   note=f"1-row durable write in the same loop: p50 {w50:.3g} ms ({p50 / w50:.3g} of them)"))
    report.add(Row("3 slot acquire+release", backend, "p99", p99, "ms", "lock pair p99", a99, "ms", p99 / a99))
