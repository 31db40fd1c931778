"""Work lists across a lost COMMIT reply: the retry finds what the first attempt did.

The fault is injected where it really happens: the COMMIT reaches the server and succeeds, then
the connection drops before the reply arrives, so the client sees a disconnect error and runs
the transaction again. Without idempotency, allocate hands out a second item (the first stays
orphaned for its lease) and complete/fail report LeaseLost for work that was recorded.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from controltable import ControlTable, LeaseLost


def _disconnect_error(dialect: str) -> BaseException:
    """The driver's own error for a connection lost while waiting for a reply."""
    if dialect == "postgresql":
        import psycopg

        return psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    if dialect == "mysql":
        import pymysql

        return pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    return sqlite3.OperationalError("disk I/O error")


@pytest.fixture
def lose_commit_replies(ct: ControlTable) -> Iterator[Callable[[int], list[int]]]:
    """``arm(n)``: the next ``n`` COMMITs succeed on the server, then raise a disconnect error."""
    dialect = ct.engine.dialect
    real_commit = dialect.do_commit
    state = {"armed": 0, "lost": 0}

    def do_commit(dbapi_connection: Any) -> None:
        real_commit(dbapi_connection)
        if state["armed"] > 0:
            state["armed"] -= 1
            state["lost"] += 1
            raise OperationalError("COMMIT", None, _disconnect_error(dialect.name), connection_invalidated=True)

    def arm(n: int) -> list[int]:
        state["armed"] = n
        return [state["lost"]]

    dialect.do_commit = do_commit  # type: ignore[method-assign]
    try:
        yield arm
    finally:
        dialect.do_commit = real_commit  # type: ignore[method-assign]
    assert state["armed"] == 0, "an armed fault was never triggered: the test proved nothing"


def _states(ct: ControlTable, name: str) -> dict[int, tuple[str, Any]]:
    t = ct.tables.item
    rows = ct.db.run(lambda c: c.execute(
        select(t.c.id, t.c.state, t.c.token).where(t.c.namespace == ct.namespace, t.c.worklist == name)).all())
    return {int(r.id): (str(r.state), r.token) for r in rows}


def test_allocate_retried_after_lost_commit_reply_returns_the_same_item(
    ct: ControlTable, lose_commit_replies: Callable[[int], list[int]]
) -> None:
    wl = ct.worklist("lost-alloc")
    wl.populate([{"n": i} for i in range(3)])
    lose_commit_replies(1)
    item = wl.allocate("w1", lease=60)
    assert item is not None
    states = _states(ct, "lost-alloc")
    active = [i for i, (s, _) in states.items() if s == "active"]
    assert active == [item.id], f"one item allocated once, got {states}"
    assert states[item.id][1] == item.token == 1  # the token counter moved once
    assert item.attempts == 1
    item.complete()
    nxt = wl.allocate("w1", lease=60)
    assert nxt is not None and nxt.token == 2


@pytest.mark.parametrize("finish", ["complete", "fail", "release"])
def test_finish_retried_after_lost_commit_reply_succeeds(
    ct: ControlTable, lose_commit_replies: Callable[[int], list[int]], finish: str
) -> None:
    wl = ct.worklist(f"lost-{finish}")
    wl.populate([{"n": 1}])
    item = wl.allocate("w1", lease=60)
    assert item is not None
    lose_commit_replies(1)
    if finish == "fail":
        item.fail("boom")
    else:
        getattr(item, finish)()
    expected = {"complete": "done", "fail": "error", "release": "new"}[finish]
    assert _states(ct, f"lost-{finish}")[item.id][0] == expected


def test_finish_under_a_lost_lease_still_raises(ct: ControlTable) -> None:
    """Recognising "already done by this token" must not excuse a token that was superseded."""
    wl = ct.worklist("superseded")
    wl.populate([{"n": 1}])
    first = wl.allocate("slow", lease=0.05)
    assert first is not None
    import time

    time.sleep(0.3)
    second = wl.allocate("fast", lease=60)
    assert second is not None and second.id == first.id
    second.complete()
    with pytest.raises(LeaseLost):
        first.complete()
    with pytest.raises(LeaseLost):
        first.fail("late")


def test_first_uses_of_a_new_list_from_many_threads_do_not_collide(ct: ControlTable) -> None:
    """The list's row is created on first use; racing creators must not fail on its primary key."""
    import threading

    wl = ct.worklist("born-racing")
    barrier = threading.Barrier(6)
    failures: list[BaseException] = []

    def fill() -> None:
        barrier.wait()
        try:
            wl.populate([{"n": i} for i in range(5)])
        except BaseException as exc:  # collected for the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=fill) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert wl.status().total("new") == 30
