"""The status page in headless Chromium against live control tables (SQLite, PostgreSQL, MariaDB).

A real uvicorn server, a real browser (Debian's chromium through Playwright): the page shows the
holders and waiters of the control table, redraws without a reload when a slot is released from
outside the page, and draws its charts from real grant history. Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.browser import ServerThread, screenshot

from controltable import ControlTable
from controltable.web import StatusSource, create_app

POLL = 0.3


def _serve(ct: ControlTable, **kw: Any) -> ServerThread:
    return ServerThread(create_app(StatusSource(ct, worklists=kw.pop("worklists", ())), poll_interval=POLL, **kw))


def test_page_shows_holders_and_waiters_and_updates_on_release(chromium: Any, ct: ControlTable, backend: str) -> None:
    ct.set_capacity("warehouse", 1)
    ct.acquire("warehouse", holder="nightly-load", lease=120)
    assert ct.try_acquire("warehouse", holder="report-refresh", waiter_ttl=120) is None
    assert ct.try_acquire("warehouse", holder="backfill-2026", mode="exclusive", waiter_ttl=120) is None
    with _serve(ct) as server:
        page = chromium.new_page(viewport={"width": 1200, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(server.base + "/")
        card = page.locator('section.resource[data-resource="warehouse"]')
        card.locator('tr.holder[data-holder="nightly-load"]').wait_for(timeout=10_000)
        assert card.locator(".used").inner_text() == "1 / 1 used"
        waiters = card.locator("tr.waiter")
        assert waiters.count() == 2
        assert waiters.nth(0).get_attribute("data-holder") == "report-refresh"
        assert "nightly-load" in waiters.nth(1).inner_text() and "report-refresh" in waiters.nth(1).inner_text()
        # One vocabulary: the page names the modes as the docs, the CLI and the JSON do.
        assert "shared" in waiters.nth(0).inner_text() and "exclusive" in waiters.nth(1).inner_text()
        assert "counting" not in card.inner_text()
        if backend == "sqlite":
            screenshot(page, "status-page-queue.png")

        # Released from outside the page: the next in line is granted and the page follows, no reload.
        page.evaluate("window.__marker = 'same page'")
        ct.release("warehouse", "nightly-load")
        card.locator('tr.holder[data-holder="report-refresh"]').wait_for(timeout=10_000)
        page.wait_for_function(
            "() => !document.querySelector('tr.holder[data-holder=\"nightly-load\"]')", timeout=10_000)
        assert page.evaluate("window.__marker") == "same page"
        assert card.locator("tr.waiter").count() == 1
        assert errors == []
        page.close()


@pytest.mark.backends("sqlite")
def test_page_shows_event_tables_worklists_and_no_chart_note_without_history(chromium: Any, ct: ControlTable) -> None:
    wl = ct.worklist("nightly")
    wl.populate([{"n": i} for i in range(3)], order=100)
    wl.populate([{"n": 9}], order=200)
    item = wl.allocate("loader-1")
    assert item is not None
    item.complete()
    ct.set_capacity("api", 2)
    with _serve(ct, worklists=["nightly"]) as server:
        page = chromium.new_page()
        page.goto(server.base + "/")
        card = page.locator('section.worklist[data-worklist="nightly"]')
        card.wait_for(timeout=10_000)
        assert "1 / 4 done" in card.inner_text()
        assert "order 200 waits for order 100: 2 new" in card.locator(".blocker").inner_text()
        note = page.locator("#chart-note")
        time.sleep(3 * POLL)  # refreshes without the chart series keep the note as it was
        assert note.is_hidden()  # the core has the grant history: charts, no note
        page.close()


def test_charts_draw_from_real_history(chromium: Any, ct: ControlTable, backend: str) -> None:
    ct.set_capacity("warehouse", 1)
    # Real history: grants that waited (a holder keeps the slot ~0.3 s while another waits).
    for i in range(3):
        first = ct.acquire("warehouse", holder=f"h{i}a")
        assert ct.try_acquire("warehouse", holder=f"h{i}b") is None
        time.sleep(0.3)
        first.release()
        second = ct.acquire("warehouse", holder=f"h{i}b", timeout=10)
        second.release()
    ct.acquire("warehouse", holder="nightly-load", lease=120)
    assert ct.try_acquire("warehouse", holder="report-refresh", waiter_ttl=120) is None
    with _serve(ct) as server:
        page = chromium.new_page(viewport={"width": 1280, "height": 720})
        page.goto(server.base + "/")
        charts = page.locator('.charts[data-resource="warehouse"]')
        charts.wait_for(timeout=10_000)
        assert charts.locator('svg.wait[data-window="hour"] path.p50').count() == 1
        assert charts.locator('svg.wait[data-window="hour"] path.p95').count() == 1
        heights = charts.locator('svg.util[data-window="hour"] rect.util').evaluate_all(
            "rs => rs.map(r => parseFloat(r.getAttribute('height')))")
        assert len(heights) == 12 and max(heights) > 0
        if backend == "sqlite":
            screenshot(page, "status-page.png")
        page.close()


@pytest.mark.backends("sqlite")
def test_page_says_when_a_spent_rate_window_opens_again(chromium: Any, ct: ControlTable) -> None:
    """A resource whose rate window is spent shows when the next grant may come, beside its queue."""
    ct.set_capacity("api", 2, rate=(1, 60))
    ct.acquire("api", holder="first-call").release()
    assert ct.try_acquire("api", holder="second-call", waiter_ttl=120) is None  # capacity free, rate spent
    with _serve(ct) as server:
        page = chromium.new_page()
        page.goto(server.base + "/")
        card = page.locator('section.resource[data-resource="api"]')
        card.locator('tr.waiter[data-holder="second-call"]').wait_for(timeout=10_000)
        text = card.locator(".blocker").inner_text()
        assert text.startswith("rate limit reached: next grant in"), text
        page.close()


@pytest.mark.backends("sqlite")
def test_many_resources_the_busy_one_first_idle_ones_folded(chromium: Any, ct: ControlTable) -> None:
    """23 resources, one in use: one card (the busy one) and one line naming the 22 idle ones; no
    "rate limit" where none is set, and the one that has a rate limit says it."""
    names = [f"res_{i:02d}" for i in range(23)]
    for name in names:
        ct.set_capacity(name, 2, rate=(5, 60) if name == "res_17" else None)
    ct.acquire("res_09", holder="the-busy-one", lease=120)
    with _serve(ct) as server:
        page = chromium.new_page(viewport={"width": 1200, "height": 800})
        page.goto(server.base + "/")
        page.locator('section.resource[data-resource="res_09"] tr.holder').wait_for(timeout=10_000)
        cards = page.locator("section.resource")
        assert cards.count() == 1 and cards.nth(0).get_attribute("data-resource") == "res_09"
        assert "rate limit" not in cards.nth(0).inner_text()
        idle = page.locator("p.idle")
        assert idle.get_attribute("data-idle") == "22"
        folded = idle.locator(".idle-resource").evaluate_all("xs => xs.map(x => x.dataset.resource)")
        assert folded == [n for n in names if n != "res_09"]
        assert "rate limit 5 per" in (idle.locator('[data-resource="res_17"]').get_attribute("title") or "")
        screenshot(page, "status-page-many-resources.png")
        page.close()
