"""Round trips per uncontended grant (issue 26): statements per acquire and per release, and the
acquire+release p50 against two durable 1-row commits sampled in the same loop.

Run from a checkout (``python -m benchmarks.round_trips URL [samples]``); the "before" figure of a
change comes from the same script run with ``PYTHONPATH`` pointing at an older checkout's
``core/src`` (a ``git worktree``), alternated with the current code. Statements are counted by a
``before_cursor_execute`` listener on the engine (COMMIT is not a cursor statement: it is counted
apart, one per transaction): the usual count per call, and the most (a release that also pruned
the grant history sends more).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from sqlalchemy import event

import controltable
from controltable import ControlTable

from .common import percentile, raw_connection, settle_control_tables


def run(url: str, samples: int = 300) -> dict[str, Any]:
    backend = url.split(":", 1)[0].split("+", 1)[0]
    ct = ControlTable(url, namespace="bench_rt")
    ct.install()
    ct.set_capacity("rt", 1)
    settle_control_tables(ct)
    sent: list[str] = []
    event.listen(ct.db.engine, "before_cursor_execute",
                 lambda conn, cur, stmt, params, ctx, many: sent.append(stmt))
    wconn = raw_connection(url)
    wcur = wconn.cursor()
    wcur.execute("DROP TABLE IF EXISTS bench_rt_floor")
    wcur.execute("CREATE TABLE bench_rt_floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    wcur.execute("INSERT INTO bench_rt_floor VALUES (1, 0)")
    if backend == "sqlite":
        wconn.commit()

    def two_commits() -> None:  # the floor: two durable 1-row commits (autocommit)
        for _ in range(2):
            wcur.execute("UPDATE bench_rt_floor SET v = v + 1 WHERE id = 1")
            if backend == "sqlite":
                wconn.commit()

    ours, floor = [], []
    acquires: list[int] = []
    releases: list[int] = []
    for i in range(50 + samples):
        t0 = time.perf_counter()
        two_commits()
        t1 = time.perf_counter()
        sent.clear()
        lease = ct.acquire("rt", timeout=0)
        n_acq = len(sent)
        lease.release()
        t2 = time.perf_counter()
        n_rel = len(sent) - n_acq
        if i >= 50:
            floor.append(t1 - t0)
            ours.append(t2 - t1)
            acquires.append(n_acq)
            releases.append(n_rel)
    wcur.execute("DROP TABLE bench_rt_floor")
    if backend == "sqlite":
        wconn.commit()
    wconn.close()
    ct.close()
    p50, f50 = percentile(ours, 50) * 1e3, percentile(floor, 50) * 1e3
    return {"code": controltable.__file__, "backend": backend, "p50_ms": round(p50, 3),
            "two_commits_p50_ms": round(f50, 3), "ratio": round(p50 / f50, 2),
            # The usual count; the most is higher when a release also pruned the grant history
            # (every few minutes per resource, see HistoryPruner.maybe_prune).
            "statements_per_acquire": statistics.mode(acquires), "statements_per_release": statistics.mode(releases),
            "most_per_acquire": max(acquires), "most_per_release": max(releases)}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300)))
