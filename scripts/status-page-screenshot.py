#!/usr/bin/env python3
"""Take the README's screenshot of the status page (docs/img/status-page.png) from a real control table.

Builds a throwaway SQLite control table with real activity through the public API (holders, a queue,
grants that waited, an event table with done and failed rows, a work list part-way through), serves
the page with uvicorn and photographs it in Debian's chromium. Charts appear when the installed
controltable records the grant history. Usage:

    .venv/bin/python scripts/status-page-screenshot.py [docs/img/status-page.png]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, insert

from controltable import ControlTable
from controltable.web import StatusSource, create_app, parse_event_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.browser import CHROMIUM, ServerThread  # noqa: E402


def populate(ct: ControlTable) -> None:
    ct.set_capacity("warehouse", 3)
    ct.set_capacity("orders_table", 1)
    ct.set_capacity("partner_api", 5)
    policies = hasattr(ct, "stats_series")  # a controltable with slot policies: show a rate limit and priorities
    if policies:
        ct.set_capacity("partner_api", 5, rate=(100, 60))  # type: ignore[call-arg]
        ct.set_capacity("warehouse", 3, aging=60)  # type: ignore[call-arg]
    prio = {"priority": 5} if policies else {}
    # History: grants that had to wait, over a few rounds.
    for i in range(4):
        first = ct.acquire("orders_table", holder=f"rebuild/{i}")
        assert ct.try_acquire("orders_table", holder=f"report/{i}") is None
        time.sleep(0.4)
        first.release()
        ct.acquire("orders_table", holder=f"report/{i}", timeout=10).release()
    for name in ("dag:nightly_load/run-0412/load_sales", "dag:nightly_load/run-0412/load_stock",
                 "dagster:9f1c2e/load_customers"):
        ct.acquire("warehouse", holder=name, lease=600)
    assert ct.try_acquire("warehouse", holder="cron:hourly_refresh", waiter_ttl=600) is None
    assert ct.try_acquire("warehouse", holder="dag:backfill/run-0409/rebuild", mode="exclusive",
                          waiter_ttl=600, **prio) is None
    ct.acquire("orders_table", holder="dag:orders_rebuild/run-77", mode="exclusive", lease=900)
    assert ct.try_acquire("orders_table", holder="dagster:5be01a/orders_report", waiter_ttl=600) is None
    for i in range(2):
        ct.acquire("partner_api", holder=f"sync-worker-{i}", lease=300)

    table = Table("rainfall_events", MetaData(), Column("event_id", Integer, primary_key=True, autoincrement=False),
                  Column("created_at", Float(53), nullable=False), Column("station", String(20)))
    table.create(ct.engine)
    now = ct.now()
    with ct.engine.begin() as conn:
        conn.execute(insert(table), [{"event_id": i, "created_at": now - 1800 + i, "station": f"st{i % 7}"}
                                     for i in range(1, 1201)])
    ev = ct.events("rainfall_events", key="event_id", max_attempts=1)
    ev.prepare()
    for _ in range(6):
        batch = ev.claim(100, owner="loader")
        assert batch is not None
        batch.complete()
        time.sleep(0.2)
    batch = ev.claim(3, owner="loader")
    assert batch is not None
    batch.fail("station st3: value out of range (-999.0)", keys=batch.keys[:2])
    batch.complete(keys=batch.keys[2:])
    ev.claim(50, owner="loader-2", lease=600)

    wl = ct.worklist("nightly_partitions")
    wl.populate([{"partition": p} for p in range(6)], order=100)
    wl.populate([{"partition": p} for p in range(4)], order=200)
    wl.populate([{"rollup": 1}], order=300)
    for _ in range(5):
        item = wl.allocate("worker-a")
        assert item is not None
        item.complete()
    wl.allocate("worker-b", lease=900)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/status-page.png").resolve()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the page shows the URL: a short relative one
        ct = ControlTable("sqlite:///controltable.db", namespace="production")
        ct.install()
        populate(ct)
        source = StatusSource(ct, events=[parse_event_spec("rainfall_events:event_id::created_at")],
                              worklists=["nightly_partitions"])
        with ServerThread(create_app(source, poll_interval=0.5)) as server, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.base + "/")
            page.locator('section.worklist[data-worklist="nightly_partitions"]').wait_for(timeout=10_000)
            time.sleep(1.5)  # two refreshes: the per-minute rates appear
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
        ct.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
