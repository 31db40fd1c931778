"""The grant decision (``controltable.slots.grants``) as a pure function: no database needed."""

from __future__ import annotations

from controltable.slots.grants import (
    Queue,
    Waiter,
    decide,
    effective_priority,
    fits,
    next_opening,
    opens_in,
    order,
    queue_key,
    rate_budget,
)


def w(key: str, ticket: int, slots: int = 1, mode: str = "shared", resources: tuple[str, ...] = ("r",)) -> Waiter:
    return Waiter(key, ticket, slots, mode, frozenset(resources))


def test_fits() -> None:
    q = Queue("r", 3, used=2)
    assert fits(q, 1, "shared") and not fits(q, 2, "shared") and not fits(q, 1, "exclusive")
    assert fits(Queue("r", 3), 1, "exclusive")
    assert not fits(Queue("r", 3, used=1, exclusive_held=True), 1, "shared")


def test_grants_in_fifo_order_up_to_the_capacity() -> None:
    q = Queue("r", 3, used=1, head=[w("a", 1), w("b", 2), w("c", 3)])
    d = decide({"r": q})
    assert d.grant == ["a", "b"] and d.heads == {"r": "c"} and q.used == 3 and not d.need


def test_a_waiting_exclusive_request_blocks_later_shared_ones() -> None:
    q = Queue("r", 5, used=1, head=[w("x", 1, mode="exclusive"), w("s", 2)])
    d = decide({"r": q})
    assert d.grant == [] and d.heads == {"r": "x"}
    q = Queue("r", 5, used=0, head=[w("x", 1, mode="exclusive"), w("s", 2)])
    d = decide({"r": q})
    assert d.grant == ["x"] and d.heads == {"r": "s"}  # the shared one waits for the exclusive holder


def test_a_big_request_blocks_smaller_ones_behind_it() -> None:
    q = Queue("r", 3, used=2, head=[w("big", 1, slots=2), w("small", 2, slots=1)])
    assert decide({"r": q}).grant == []  # no overtaking: the big one would starve


def test_multi_resource_request_is_all_or_nothing() -> None:
    both = ("a", "b")
    qa = Queue("a", 1, head=[w("m", 5, resources=both)])
    qb = Queue("b", 1, used=1, head=[w("m", 7, resources=both)])
    d = decide({"a": qa, "b": qb})
    assert d.grant == [] and qa.used == 0  # b is full: a is not taken either
    qb = Queue("b", 1, head=[w("m", 7, resources=both)])
    qa = Queue("a", 1, head=[w("m", 5, resources=both)])
    d = decide({"a": qa, "b": qb})
    assert d.grant == ["m"] and qa.used == 1 and qb.used == 1


def test_multi_resource_request_waits_until_first_in_every_queue() -> None:
    both = ("a", "b")
    qa = Queue("a", 2, head=[w("m", 1, resources=both)])
    qb = Queue("b", 3, used=1, head=[w("x", 1, slots=1), w("m", 2, resources=both)])
    d = decide({"a": qa, "b": qb})
    # x is granted in b first (it fits), then m is first everywhere and fits: granted too.
    assert d.grant == ["x", "m"]
    qa = Queue("a", 2, head=[w("m", 1, resources=both)])
    qb = Queue("b", 2, used=1, head=[w("y", 1, slots=2), w("m", 2, resources=both)])
    d = decide({"a": qa, "b": qb})
    assert d.grant == [] and d.heads == {"a": "m", "b": "y"}  # y blocks b, so m waits in a as well


def test_multi_resource_request_asks_for_missing_locks() -> None:
    q = Queue("b", 1, head=[w("m", 1, resources=("a", "b")), w("s", 2, resources=("b",))])
    d = decide({"b": q})
    assert d.grant == [] and d.need == {"a"}


def test_more_waiters_unread_asks_for_another_round() -> None:
    q = Queue("r", 5, head=[w("a", 1), w("b", 2)], complete=False)
    d = decide({"r": q})
    assert d.grant == ["a", "b"] and d.more == {"r"}
    q = Queue("r", 5, head=[w("a", 1), w("b", 2)], complete=True)
    assert decide({"r": q}).more == set()


def test_weights_and_exclusive_mixed_queue_drains_in_order() -> None:
    head = [w("a", 1, slots=2), w("b", 2, mode="exclusive"), w("c", 3), w("d", 4)]
    q = Queue("r", 3, head=list(head))
    d = decide({"r": q})
    assert d.grant == ["a"] and d.heads == {"r": "b"}
    q = Queue("r", 3, head=head[1:])
    assert decide({"r": q}).grant == ["b"]
    q = Queue("r", 3, head=head[2:])
    assert decide({"r": q}).grant == ["c", "d"]


# -- policies: priority, aging, rate ---------------------------------------------------------------


def p(key: str, ticket: int, priority: int = 0, enqueued: float = 0.0, slots: int = 1,
      mode: str = "shared") -> Waiter:
    return Waiter(key, ticket, slots, mode, frozenset({"r"}), priority, enqueued)


def test_higher_priority_first_and_fifo_among_equals() -> None:
    q = Queue("r", 2, head=[p("a", 1), p("b", 2, priority=5), p("c", 3), p("d", 4, priority=5)])
    d = decide({"r": q})
    assert d.grant == ["b", "d"] and d.heads == {"r": "a"}


def test_the_reader_writer_rule_holds_within_priority_order() -> None:
    # A waiting exclusive request blocks later requests that do not outrank it...
    q = Queue("r", 5, used=1, head=[p("x", 1, mode="exclusive"), p("s", 2)])
    assert decide({"r": q}).grant == []
    # ...but one that outranks it goes first.
    q = Queue("r", 5, used=1, head=[p("x", 1, mode="exclusive"), p("s", 2, priority=1)])
    assert decide({"r": q}).grant == ["s"]


def test_a_multi_slot_request_is_not_overtaken_by_smaller_ones_of_its_priority() -> None:
    q = Queue("r", 3, used=1, head=[p("big", 1, slots=3), p("small", 2), p("small2", 3)])
    assert decide({"r": q}).grant == []


def test_aging_lets_an_old_low_priority_waiter_outrank_new_high_ones() -> None:
    old = p("old", 1, priority=0, enqueued=0.0)
    new = p("new", 2, priority=3, enqueued=100.0)
    # Aging 10 s per step: at t=100 the old one is at 0 + 10 = 10, the new one at 3.
    assert effective_priority(0, 0.0, 100.0, 10.0) == 10.0 and effective_priority(3, 100.0, 100.0, 10.0) == 3.0
    assert [w.key for w in order([new, old], 10.0)] == ["old", "new"]
    assert decide({"r": Queue("r", 1, head=[new, old], aging=10.0)}).grant == ["old"]
    # Without aging, priority wins.
    assert decide({"r": Queue("r", 1, head=[old, new])}).grant == ["new"]
    # The static key orders exactly like the effective priority at any time.
    for t in (100.0, 129.0, 131.0, 1000.0):
        by_eff = sorted([old, new], key=lambda w: (-effective_priority(w.priority, w.enqueued_at, t, 10.0), w.ticket))
        assert [w.key for w in by_eff] == [w.key for w in order([old, new], 10.0)]
    assert queue_key(3, 100.0, None) == -3.0 and queue_key(3, 100.0, 10.0) == 70.0


def test_a_spent_rate_budget_stops_the_queue() -> None:
    q = Queue("r", 5, head=[p("a", 1), p("b", 2), p("c", 3)], budget=2)
    d = decide({"r": q})
    assert d.grant == ["a", "b"] and d.heads == {"r": "c"} and q.budget == 0
    assert decide({"r": Queue("r", 5, head=[p("a", 1)], budget=0)}).grant == []
    assert not fits(Queue("r", 5, budget=0), 1, "shared")


def test_rate_budget_and_next_opening() -> None:
    times = [10.0, 20.0, 30.0]
    assert rate_budget(3, 60.0, times, 65.0) == 0
    assert rate_budget(3, 60.0, times, 70.0) == 1  # the grant at 10 left the window (10 > 70 - 60 is false)
    assert next_opening(3, 60.0, times, 65.0) == 70.0
    assert next_opening(3, 60.0, times, 75.0) == 75.0  # open now
    # More grants in the window than the rate allows (the rate was lowered): the budget grows
    # when enough of them have left.
    assert next_opening(2, 60.0, times, 35.0) == 80.0
    assert next_opening(3, 60.0, [], 5.0) == 5.0
    # In seconds from now, as waiters and the status show it; None while a grant is allowed.
    assert opens_in(3, 60.0, times, 65.0) == 5.0
    assert opens_in(2, 60.0, times, 35.0) == 45.0
    assert opens_in(3, 60.0, times, 75.0) is None and opens_in(3, 60.0, [], 5.0) is None
