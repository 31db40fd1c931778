"""The grant decision (``controltable.grants``) as a pure function: no database needed."""

from __future__ import annotations

from controltable.grants import Queue, Waiter, decide, fits


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
