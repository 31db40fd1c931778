"""Database-free tests of the status page's pure pieces: rates, queue positions, blockers, histogram buckets."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

import pytest

from controltable import Entry, Rate
from controltable.web.data import entry_view, order_by_activity, per_minute, rate_view, worklist_blocker
from controltable.worklist.values import OrderStatus, WorkListStatus


def test_per_minute_needs_two_samples_and_restarts_after_a_fall() -> None:
    assert per_minute([], 100.0) is None
    assert per_minute([(100.0, 5)], 100.0) is None
    assert per_minute([(100.0, 5), (100.5, 9)], 100.5) is None  # under a second apart
    assert per_minute([(0.0, 0), (30.0, 10), (60.0, 20)], 60.0) == pytest.approx(20.0)
    # Rows deleted (count fell): measured from the fall on, never negative.
    assert per_minute([(0.0, 100), (30.0, 10), (60.0, 40)], 60.0) == pytest.approx(60.0)
    # Samples older than the horizon are ignored.
    assert per_minute([(0.0, 0), (1000.0, 10), (1060.0, 20)], 1060.0, horizon=300.0) == pytest.approx(10.0)


def _entry(holder: str, position: int, since: Optional[float] = None, **policy: object) -> Entry:
    ts = datetime.fromtimestamp(since, timezone.utc) if since is not None else None
    return Entry(holder=holder, slots=1, mode="shared", state="waiting", since=ts, expires_at=None, token=None,
                 position=position, **policy)  # type: ignore[arg-type]


def test_entries_show_ages_on_the_given_clock_and_the_cores_policy_fields() -> None:
    holder = entry_view(_entry("h1", 0, 10.0), 15.0)
    assert holder["age"] == pytest.approx(5.0) and holder["priority"] == 0 and holder["ahead"] == []
    waiter = entry_view(_entry("w2", 2), 15.0)
    assert waiter["age"] is None and waiter["expires_in"] is None
    # What a waiter waits behind comes from the core (priorities can reorder the queue).
    told = entry_view(_entry("w3", 1, ahead=["x"], priority=5, effective_priority=7.0), 0.0)
    assert told["ahead"] == ["x"] and (told["priority"], told["effective_priority"]) == (5, 7.0)


def test_rate_view() -> None:
    assert rate_view(None) is None
    assert rate_view(Rate(10, 60.0))["text"] == "10 per 1 min"
    assert rate_view(Rate(3, 86400.0))["text"] == "3 per day"
    assert rate_view(Rate(3, 90.0))["text"] == "3 per 90 s"


def _WL(orders: list[OrderStatus], current_order: Optional[int] = None,  # noqa: N802 - reads like the class
        blocked_by_errors: bool = False) -> WorkListStatus:
    return WorkListStatus("wl", orders, current_order, blocked_by_errors)


def test_worklist_blocker_says_what_holds_the_next_order() -> None:
    assert worklist_blocker(_WL([OrderStatus(1, done=3)]), [], []) is None
    st = _WL([OrderStatus(1, new=1, active=2, expired=1, done=4), OrderStatus(5, new=9)], current_order=1)
    text = worklist_blocker(st, [{"owner": "w-2"}, {"owner": "w-1"}], [])
    assert text == ("order 5 waits for order 1: 1 new, 1 active (held by w-1, w-2), "
                    "1 active with an expired lease (to be reclaimed)")
    failed = _WL([OrderStatus(2, error=2, done=1), OrderStatus(3, new=1)], current_order=2, blocked_by_errors=True)
    text = worklist_blocker(failed, [], [{"id": 11}, {"id": 12}])
    assert text is not None and text.startswith("order 3 is blocked by 2 failed item(s) of order 2 (#11, #12)")
    last = _WL([OrderStatus(7, active=1)], current_order=7)
    assert worklist_blocker(last, [], []) == "the end of the list waits for order 7: 1 active"


def test_histogram_buckets_are_cumulative() -> None:
    from controltable.web.metrics import histogram_buckets

    assert histogram_buckets([0.05, 0.7, 2.0, 5000.0], (0.1, 1.0, 10.0)) == [
        ("0.1", 1.0), ("1.0", 2.0), ("10.0", 3.0), ("+Inf", 4.0)]


def test_active_resources_come_first_and_idle_ones_are_marked() -> None:
    def res(name: str, holders: int = 0, waiters: int = 0) -> dict[str, object]:
        return {"name": name, "holders": [{}] * holders, "waiters": [{}] * waiters}

    given = [res("a_idle"), res("b_held", holders=1), res("c_recent"), res("d_idle"), res("e_queue", waiters=2)]
    ordered = order_by_activity(given, {"c_recent": 4, "d_idle": 0})
    assert [(r["name"], r["active"]) for r in ordered] == [
        ("b_held", True), ("c_recent", True), ("e_queue", True), ("a_idle", False), ("d_idle", False)]
    assert all(r["active"] is False for r in order_by_activity([res("x")], {}))
