"""The grant pass's input and a waiter's own rule (``controltable.slots.grants``), as pure functions: no database."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from controltable.slots.grants import (
    BEHIND_GRACE,
    REAP_GRACE,
    Queue,
    assemble,
    behind_grace,
    decide,
    rate_rescue,
    read_again,
    waiter_runs_pass,
    waiting_multi,
    waiting_read,
)


def row(resource: str, key: str, ticket: int, state: str = "waiting", slots: int = 1, mode: str = "shared",
        priority: int = 0, enqueued_at: float = 0.0) -> Any:
    return SimpleNamespace(resource=resource, request_key=key, ticket=ticket, state=state, slots=slots, mode=mode,
                           priority=priority, enqueued_at=enqueued_at)


# -- assemble: the locked rows as the decision's queues -------------------------------------------
def test_holders_count_towards_usage_and_waiters_form_the_head_in_queue_order() -> None:
    rows = [row("r", "h1", 1, "granted", slots=2), row("r", "w2", 3), row("r", "w1", 2),
            row("r", "vip", 4, priority=5)]
    got = assemble({"r": Queue("r", 4)}, rows, {}, {"r": 6})
    q = got.queues["r"]
    assert (q.used, q.exclusive_held) == (2, False)
    assert [w.key for w in q.head] == ["vip", "w1", "w2"], "priority first, then ticket order"
    assert got.first_before == {"r": "vip"} and sorted(got.rows_by_key) == ["vip", "w1", "w2"]
    assert q.complete, "fewer waiters read than the head size: the whole queue"
    assert decide(got.queues).grant == ["vip", "w1"]


def test_an_exclusive_holder_marks_the_queue_and_a_full_read_is_not_complete() -> None:
    rows = [row("r", "x", 1, "granted", mode="exclusive"), row("r", "a", 2), row("r", "b", 3)]
    got = assemble({"r": Queue("r", 1)}, rows, {}, {"r": 2})
    assert got.queues["r"].exclusive_held and not got.queues["r"].complete


def test_aging_orders_the_head_by_the_effective_priority() -> None:
    rows = [row("r", "old", 1, enqueued_at=0.0), row("r", "new", 2, priority=1, enqueued_at=100.0)]
    got = assemble({"r": Queue("r", 1, aging=10.0)}, rows, {}, {"r": 3})
    assert [w.key for w in got.queues["r"].head] == ["old", "new"], "100 s of waiting outrank one step"


def test_a_multi_resource_request_spans_its_queues_and_a_partly_removed_one_is_left_out() -> None:
    rows = [row("a", "m2-x", 1), row("b", "m2-x", 1), row("a", "m2-gone", 2), row("b", "solo", 2),
            row("b", "h", 0, "granted")]
    assert waiting_multi(rows) == ["m2-gone", "m2-x"], "holders and single requests need no span read"
    spans = {"m2-x": {"a", "b"}, "m2-gone": {"a"}}
    got = assemble({"a": Queue("a", 2), "b": Queue("b", 2)}, rows, spans, {"a": 4, "b": 4})
    assert [w.key for w in got.queues["a"].head] == ["m2-x"]
    assert got.queues["a"].head[0].resources == frozenset({"a", "b"})
    assert "m2-gone" not in got.rows_by_key and len(got.rows_by_key["m2-x"]) == 2
    assert got.first_before == {"a": "m2-x", "b": "m2-x"}


def test_empty_queues_have_no_head() -> None:
    got = assemble({"r": Queue("r", 1)}, [], {}, {"r": 3})
    assert got.queues["r"].head == [] and got.first_before == {} and got.rows_by_key == {}


# -- a waiter's own rule: run a grant pass itself ---------------------------------------------------
def test_behind_grace_grows_per_position_up_to_the_reap_grace() -> None:
    assert behind_grace(1) == 0.0
    assert behind_grace(2) == BEHIND_GRACE and behind_grace(3) == 2 * BEHIND_GRACE
    assert behind_grace(1000) == REAP_GRACE


@pytest.mark.parametrize(("head", "fits_all", "expiry", "position", "rescue", "runs"), [
    (True, True, None, 1, False, True),      # the head fits: nobody else would grant it
    (True, False, None, 1, False, False),    # the head does not fit: it waits for a release
    (True, False, 5.0, 1, False, False),     # ... and the first holder's lease is still live
    (True, False, -0.01, 1, False, True),    # the head reaps a holder that ran out, at once
    (False, True, None, 2, False, False),    # behind the head: fitting is the head's business
    (False, False, -0.2, 2, False, False),   # second: within its grace (0.25 s) the head may still do it
    (False, False, -0.3, 2, False, True),    # ... past it, the head may be dead: it runs the pass
    (False, False, -0.4, 3, False, False),   # third: a grace of 0.5 s
    (False, False, -0.6, 3, False, True),
    (False, False, -1.9, 50, False, False),  # far back: never more than REAP_GRACE
    (False, False, -2.1, 50, False, True),
    (False, False, None, 2, True, True),     # the rate window opened long ago and the head did not run it
])
def test_waiter_runs_pass(head: bool, fits_all: bool, expiry: float | None, position: int, rescue: bool,
                          runs: bool) -> None:
    assert waiter_runs_pass(head=head, fits_all=fits_all, holder_expiry_in=expiry, position=position,
                            rescue=rescue) is runs


def test_rate_rescue_waits_the_reap_grace_past_the_window_opening() -> None:
    assert not rate_rescue(None, 60.0, 1000.0), "no grant left the window: nothing opened"
    assert not rate_rescue(930.0, 60.0, 991.0), "opened a second ago: the head's turn"
    assert not rate_rescue(930.0, 60.0, 990.0 + REAP_GRACE), "exactly the grace: not yet"
    assert rate_rescue(930.0, 60.0, 990.0 + REAP_GRACE + 0.1)


# -- a page of expired entries does not end the pass (issue 33) -----------------------------------
def _with_id(rows: list[Any]) -> list[Any]:
    for i, r in enumerate(rows):
        r.id = i
    return rows


def test_a_page_whose_waiters_were_all_reaped_is_not_the_whole_queue() -> None:
    """The pass read 3 waiters (the head size), all expired and reaped: the live ones are unread."""
    read = _with_id([row("r", f"dead{i}", i + 1) for i in range(3)])
    counted = waiting_read(read)
    assert counted == {"r": 3}
    got = assemble({"r": Queue("r", 1)}, [], {}, {"r": 3}, read=counted)
    assert not got.queues["r"].complete, "a full page read, nothing live in it: more wait behind"
    d = decide(got.queues)
    assert d.grant == [] and d.more == {"r"}
    assert read_again(d, granted=0, reaped=3), "a round that reaped a page reads the next one"


def test_without_the_read_count_a_reaped_page_looked_like_the_end_of_the_queue() -> None:
    """What the pass did before issue 33: the live rows alone (none) said the queue was complete."""
    got = assemble({"r": Queue("r", 1)}, [], {}, {"r": 3})
    assert got.queues["r"].complete and decide(got.queues).more == set()


def test_waiting_read_counts_each_waiting_row_once_and_never_a_holder() -> None:
    rows = _with_id([row("r", "h", 1, "granted"), row("r", "a", 2), row("s", "b", 3)])
    assert waiting_read([*rows, rows[1]]) == {"r": 1, "s": 1}


def test_a_round_that_changed_nothing_is_the_last() -> None:
    """A page of partly removed multi-resource requests (skipped, not reaped) is read again the
    same: the pass stops rather than loop."""
    partial = _with_id([row("r", f"m2-{i}", i) for i in range(3)])  # their rows on "s" were removed
    got = assemble({"r": Queue("r", 1)}, partial, {f"m2-{i}": {"r"} for i in range(3)}, {"r": 3},
                   read=waiting_read(partial))
    d = decide(got.queues)
    assert d.more == {"r"}
    assert not read_again(d, granted=0, reaped=0)
    assert read_again(d, granted=1, reaped=0)


def test_the_first_live_waiter_after_the_reaped_page_is_granted_in_fifo_order() -> None:
    """The next page: live waiters in ticket order after the reaped ones; the first that fits goes."""
    live = _with_id([row("r", "h", 1, "granted"), row("r", "A", 10), row("r", "B", 11)])
    got = assemble({"r": Queue("r", 2)}, live, {}, {"r": 4}, read=waiting_read(live))
    d = decide(got.queues)
    assert d.grant == ["A"] and d.heads == {"r": "B"} and d.more == set()
