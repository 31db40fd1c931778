"""Database-free tests of the status page's pure pieces: rates, queue positions, blockers, histogram buckets."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Optional

import pytest

from controltable.web.data import behind, entry_view, grant_wait, per_minute, rate_view, worklist_blocker


def test_per_minute_needs_two_samples_and_restarts_after_a_fall() -> None:
    assert per_minute([], 100.0) is None
    assert per_minute([(100.0, 5)], 100.0) is None
    assert per_minute([(100.0, 5), (100.5, 9)], 100.5) is None  # under a second apart
    assert per_minute([(0.0, 0), (30.0, 10), (60.0, 20)], 60.0) == pytest.approx(20.0)
    # Rows deleted (count fell): measured from the fall on, never negative.
    assert per_minute([(0.0, 100), (30.0, 10), (60.0, 40)], 60.0) == pytest.approx(60.0)
    # Samples older than the horizon are ignored.
    assert per_minute([(0.0, 0), (1000.0, 10), (1060.0, 20)], 1060.0, horizon=300.0) == pytest.approx(10.0)


def _entry(holder: str, position: int, since: Optional[float] = None) -> SimpleNamespace:
    ts = datetime.fromtimestamp(since, timezone.utc) if since is not None else None
    return SimpleNamespace(holder=holder, mode="shared", slots=1, state="waiting", token=None, position=position,
                           since=ts, expires_at=None)


def test_entries_without_policy_fields_show_none_and_fifo_behind() -> None:
    holders = [entry_view(_entry("h1", 0, 10.0), 15.0)]
    waiters = [entry_view(_entry("w1", 1, 11.0), 15.0), entry_view(_entry("w2", 2), 15.0)]
    assert holders[0]["age"] == pytest.approx(5.0) and holders[0]["priority"] is None
    assert waiters[1]["age"] is None and waiters[1]["expires_in"] is None
    behind(waiters, holders)
    assert waiters[0]["ahead"] == ["h1"] and waiters[1]["ahead"] == ["h1", "w1"]
    # A core that says what a waiter is behind (priorities can reorder the queue) is believed.
    told = entry_view(SimpleNamespace(**vars(_entry("w3", 1)), ahead=["x"], priority=5, effective_priority=7), 0.0)
    behind([told], holders)
    assert told["ahead"] == ["x"] and (told["priority"], told["effective_priority"]) == (5, 7)


def test_rate_view() -> None:
    assert rate_view(None) is None
    assert rate_view(SimpleNamespace(count=10, per=60.0))["text"] == "10 per 1 min"
    assert rate_view(SimpleNamespace(count=3, per=86400.0))["text"] == "3 per day"
    assert rate_view(SimpleNamespace(count=3, per=90.0))["text"] == "3 per 90 s"


@dataclass
class _Order:
    order: int
    new: int = 0
    active: int = 0
    done: int = 0
    error: int = 0
    expired: int = 0


@dataclass
class _WL:
    orders: list[_Order] = field(default_factory=list)
    current_order: Optional[int] = None
    blocked_by_errors: bool = False


def test_worklist_blocker_says_what_holds_the_next_order() -> None:
    assert worklist_blocker(_WL([_Order(1, done=3)]), [], []) is None
    st = _WL([_Order(1, new=1, active=2, expired=1, done=4), _Order(5, new=9)], current_order=1)
    text = worklist_blocker(st, [{"owner": "w-2"}, {"owner": "w-1"}], [])
    assert text == ("order 5 waits for order 1: 1 new, 1 active (held by w-1, w-2), "
                    "1 active with an expired lease (to be reclaimed)")
    failed = _WL([_Order(2, error=2, done=1), _Order(3, new=1)], current_order=2, blocked_by_errors=True)
    text = worklist_blocker(failed, [], [{"id": 11}, {"id": 12}])
    assert text is not None and text.startswith("order 3 is blocked by 2 failed item(s) of order 2 (#11, #12)")
    last = _WL([_Order(7, active=1)], current_order=7)
    assert worklist_blocker(last, [], []) == "the end of the list waits for order 7: 1 active"


def test_grant_wait_from_whichever_fields_the_history_has() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert grant_wait(SimpleNamespace(wait=2.5)) == 2.5
    assert grant_wait(SimpleNamespace(waited=timedelta(seconds=4))) == 4.0
    assert grant_wait(SimpleNamespace(requested_at=t0, granted_at=t0 + timedelta(seconds=3))) == 3.0
    assert grant_wait(SimpleNamespace(requested_at=None, granted_at=t0)) is None


def test_histogram_buckets_are_cumulative() -> None:
    from controltable.web.metrics import histogram_buckets

    assert histogram_buckets([0.05, 0.7, 2.0, 5000.0], (0.1, 1.0, 10.0)) == [
        ("0.1", 1.0), ("1.0", 2.0), ("10.0", 3.0), ("+Inf", 4.0)]
