"""Scenario 9: the grant history does not slow grants down as it grows, nor while it is pruned.

``python -m benchmarks.s9_history --url URL [--rows 1000000] [--samples 300]`` prints figures:

* uncontended acquire+release p50/p95 of a rate-limited resource (the rate check reads the
  history window on every grant; the limit is set high so it never binds) with 10,000 history
  rows, then with ``--rows`` (1,000,000) rows, both older than the retention;
* the same while ``prune_history()`` deletes those rows in batches in another thread, and how
  long the pruning took.

Ratios are against the 10,000-row figure of the same run. The history rows are written straight
into the history table (bulk inserts), as months of grants would have left them.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from controltable import ControlTable
from controltable.defaults import HISTORY_RETENTION

from .common import percentile, timed

SMALL = 10_000


def fill(ct: ControlTable, resource: str, upto: int, have: int, now: float) -> None:
    """Add ended grants, all older than the retention, until ``upto`` rows exist."""
    h = ct.tables.history
    chunk = 5_000
    with ct.engine.begin() as conn:
        for start in range(have, upto, chunk):
            rows = []
            for token in range(start + 1, min(start + chunk, upto) + 1):
                t = now - HISTORY_RETENTION - 86400.0 + token * 0.01
                rows.append(dict(namespace=ct.namespace, resource=resource, token=token, holder=f"old-{token}",
                                 mode="shared", slots=1, priority=0, enqueued_at=t - 0.5, granted_at=t,
                                 ended_at=t + 1.0, outcome="released"))
            conn.execute(h.insert(), rows)


def alternate(ct: ControlTable, resources: list[str], samples: int) -> dict[str, list[float]]:
    """acquire+release of each resource in turn, so both see the same machine load (same-run anchor)."""
    out: dict[str, list[float]] = {r: [] for r in resources}
    for i in range(samples + 20):
        for r in resources:

            def once(name: str = r) -> None:
                ct.acquire(name, timeout=0).release()

            s = timed(once)
            if i >= 20:
                out[r].append(s)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.s9_history", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--samples", type=int, default=300)
    a = p.parse_args(argv)
    ns = f"bench_s9_{int(time.time())}"
    ct = ControlTable(a.url, namespace=ns)
    ct.install()
    small, big = "api_small", "api_big"
    r = ct.tables.resource
    for name in (small, big):
        ct.set_capacity(name, 1, rate=(1_000_000, 60.0))
        # Tokens of the live grants start above the old rows' (the fencing counter is the resource's).
        with ct.engine.begin() as conn:
            conn.execute(r.update().where(r.c.namespace == ns, r.c.name == name).values(last_token=a.rows + 1))
    now = ct.now()
    started = time.monotonic()
    fill(ct, small, SMALL, 0, now)
    fill(ct, big, a.rows, 0, now)
    print(f"filled {SMALL:,} + {a.rows:,} rows in {time.monotonic() - started:.1f} s", flush=True)
    if ct.engine.dialect.name == "postgresql":
        with ct.engine.connect() as conn:  # what autovacuum would do shortly: not measured meanwhile
            conn.exec_driver_sql(f"ANALYZE {ct.tables.history.name}")
            conn.commit()
    before = alternate(ct, [small, big], a.samples)

    pruned: list[Any] = []

    def prune() -> None:
        t0 = time.monotonic()
        pruned.append(ct.prune_history())
        pruned.append(time.monotonic() - t0)

    pruner = threading.Thread(target=prune)
    pruner.start()
    during: list[float] = []
    while pruner.is_alive() and len(during) < 100_000:
        during.append(timed(lambda: ct.acquire(big, timeout=0).release()))
    pruner.join()
    after = alternate(ct, [small, big], a.samples)
    left = len(ct.history(big, since=HISTORY_RETENTION * 4, limit=10_000_000))
    for name in (small, big):
        ct.delete_resource(name, force=True)
    ct.close()

    def ms(values: list[float], q: float) -> float:
        return percentile(values, q) * 1e3

    print(f"\nscenario 9 [{ct.engine.dialect.name}]: acquire+release of a rate-limited resource, uncontended; "
          "anchor: a resource with 10,000 history rows, sampled alternately")
    print(f"{'resource':<44} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>10} {'p95 ratio':>10}")
    rows = [(f"{SMALL:,} rows (anchor)", before[small], before[small]),
            (f"{a.rows:,} rows", before[big], before[small]),
            (f"{a.rows:,} rows, pruning meanwhile (vs anchor)", during, before[small]),
            (f"after pruning: {SMALL:,}-row resource", after[small], before[small]),
            ("after pruning: the pruned resource", after[big], after[small])]
    for label, values, anchor in rows:
        if not values:
            continue
        print(f"{label:<44} {ms(values, 50):8.2f} {ms(values, 95):8.2f} {ms(values, 50) / ms(anchor, 50):10.2f} "
              f"{ms(values, 95) / ms(anchor, 95):10.2f}")
    print(f"pruned {pruned[0]:,} rows in {pruned[1]:.1f} s ({len(during)} grants meanwhile); {left} rows of the "
          "pruned resource left (this run's own grants)")


if __name__ == "__main__":
    main()
