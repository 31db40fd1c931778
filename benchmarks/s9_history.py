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


def latencies(ct: ControlTable, resource: str, samples: int) -> list[float]:
    out = []
    for i in range(samples + 20):
        s = timed(lambda: ct.acquire(resource, timeout=0).release())
        if i >= 20:
            out.append(s)
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
    resource = "api"
    ct.set_capacity(resource, 1, rate=(1_000_000, 60.0))
    now = ct.now()
    # Tokens of the live grants start above the old rows' (the fencing counter is the resource's).
    r = ct.tables.resource
    with ct.engine.begin() as conn:
        conn.execute(r.update().where(r.c.namespace == ns, r.c.name == resource).values(last_token=a.rows + 1))

    started = time.monotonic()
    fill(ct, resource, SMALL, 0, now)
    print(f"filled {SMALL} rows in {time.monotonic() - started:.1f} s", flush=True)
    small = latencies(ct, resource, a.samples)
    started = time.monotonic()
    fill(ct, resource, a.rows, SMALL, now)
    print(f"filled {a.rows} rows in {time.monotonic() - started:.1f} s", flush=True)
    big = latencies(ct, resource, a.samples)

    pruned: list[Any] = []

    def prune() -> None:
        t0 = time.monotonic()
        pruned.append(ct.prune_history())
        pruned.append(time.monotonic() - t0)

    pruner = threading.Thread(target=prune)
    pruner.start()
    during: list[float] = []
    while pruner.is_alive() and len(during) < 100_000:
        during.append(timed(lambda: ct.acquire(resource, timeout=0).release()))
    pruner.join()
    after = latencies(ct, resource, a.samples)
    left = len(ct.history(resource, since=HISTORY_RETENTION * 4, limit=10_000_000))
    ct.delete_resource(resource, force=True)
    ct.close()

    def ms(values: list[float], q: float) -> float:
        return percentile(values, q) * 1e3

    base50, base95 = ms(small, 50), ms(small, 95)
    print(f"\nscenario 9 [{a.url.split(':')[0]}]: acquire+release of a rate-limited resource, uncontended")
    print(f"{'history':<34} {'p50 ms':>8} {'p95 ms':>8} {'p50 ratio':>10} {'p95 ratio':>10}")
    for label, values in ((f"{SMALL:,} rows", small), (f"{a.rows:,} rows", big),
                          (f"{a.rows:,} rows, pruning meanwhile", during), ("after pruning", after)):
        if not values:
            continue
        print(f"{label:<34} {ms(values, 50):8.2f} {ms(values, 95):8.2f} {ms(values, 50) / base50:10.2f} "
              f"{ms(values, 95) / base95:10.2f}")
    print(f"pruned {pruned[0]:,} rows in {pruned[1]:.1f} s ({len(during)} grants meanwhile); {left} rows left "
          "(the live grants of this run)")


if __name__ == "__main__":
    main()
