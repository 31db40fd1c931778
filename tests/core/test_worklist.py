"""Ordered work lists, behaviour in one process (order, errors, administration)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Iterator

import pytest
from sqlalchemy import select
from support.event_tables import wait_past

from controltable import ConfigurationError, LeaseLost
from controltable.worklist import WorkListBlocked


@pytest.fixture
def wl(ct: Any) -> Iterator[Any]:
    w = ct.worklist(f"wl_{uuid.uuid4().hex[:8]}")
    yield w
    w.drop()


def _by_id(wl: Any) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in wl.items_list(limit=1000)}


def _wait_until_expired(ct: Any, item: Any) -> None:
    wait_past(ct, item.expires_at.timestamp())


def test_populate_status_and_items_list(wl: Any) -> None:
    assert wl.populate([{"table": "a"}, {"table": "b"}], order=100) == 2
    assert wl.populate(["x", ["y", 1], None, 3.5], order=200, priority=2) == 4
    seen: list[int] = []
    assert wl.populate(({"n": i} for i in range(3)), order=300, progress=seen.append) == 3
    assert sum(seen) == 3
    st = wl.status()
    assert [(o.order, o.new, o.active, o.done, o.error) for o in st.orders] == [
        (100, 2, 0, 0, 0), (200, 4, 0, 0, 0), (300, 3, 0, 0, 0)]
    assert st.current_order == 100 and not st.finished and not st.blocked_by_errors
    assert st.total("new") == 9
    items = wl.items_list()
    assert [i["payload"] for i in items[:6]] == [{"table": "a"}, {"table": "b"}, "x", ["y", 1], None, 3.5]
    assert all(i["state"] == "new" and i["attempts"] == 0 for i in items)
    assert [i["exec_order"] for i in items] == [100, 100, 200, 200, 200, 200, 300, 300, 300]
    assert len(wl.items_list(limit=2)) == 2
    assert wl.items_list(state="done") == []
    assert wl.populate([]) == 0


def test_orders_run_one_after_another_with_priority_inside(wl: Any) -> None:
    wl.populate(["late-high"], order=200, priority=99)
    wl.populate(["low-1", "low-2"], order=100)
    wl.populate(["high"], order=100, priority=5)
    first = wl.allocate(owner="w1")
    assert first is not None and first.payload == "high" and first.order == 100 and first.priority == 5
    second = wl.allocate(owner="w2")
    third = wl.allocate(owner="w3")
    assert (second.payload, third.payload) == ("low-1", "low-2")  # same priority: id order
    # Order 100 is still running: nothing of order 200 may start, whatever its priority.
    assert wl.allocate(owner="w4") is None
    st = wl.status()
    assert st.current_order == 100 and not st.blocked_by_errors
    assert st.orders[0].active == 3
    for item in (first, second):
        item.complete()
    assert wl.allocate(owner="w4") is None  # one item of order 100 is still active
    third.complete()
    nxt = wl.allocate(owner="w4")
    assert nxt is not None and nxt.payload == "late-high" and nxt.order == 200
    assert nxt.token > third.token > second.token > first.token  # tokens strictly increase
    nxt.complete()
    assert wl.allocate() is None
    st = wl.status()
    assert st.finished and st.current_order is None
    rows = wl.items_list()
    assert all(r["state"] == "done" and r["finished_at"] is not None and r["started_at"] is not None for r in rows)
    assert {r["payload"]: r["owner"] for r in rows}["high"] == "w1"


def test_failed_item_blocks_later_orders_until_cleared(wl: Any) -> None:
    wl.populate(["a", "b"], order=100)
    wl.populate(["c"], order=200)
    a = wl.allocate(owner="w")
    b = wl.allocate(owner="w")
    a.fail("disk full")
    st = wl.status()
    assert st.current_order == 100 and not st.blocked_by_errors  # b is still being worked on
    b.complete()
    st = wl.status()
    assert st.current_order == 100 and st.blocked_by_errors
    assert (st.orders[0].error, st.orders[0].done, st.orders[1].new) == (1, 1, 1)
    assert wl.allocate(owner="w") is None  # order 200 stays blocked
    row = _by_id(wl)[a.id]
    assert row["state"] == "error" and row["last_error"] == "disk full" and row["finished_at"] is not None
    with pytest.raises(WorkListBlocked, match="clear_errors"):
        list(wl.items(owner="w", poll_interval=0.01, timeout=5))
    with pytest.raises(LeaseLost):
        a.complete()  # a failed item is no longer held

    assert wl.clear_error(b.id) == 0  # not in error
    assert wl.clear_error(a.id) == 1
    row = _by_id(wl)[a.id]
    assert row["state"] == "new" and row["last_error"] is None and row["owner"] is None
    again = wl.allocate(owner="w")
    assert again is not None and again.id == a.id and again.attempts == 2
    again.complete()
    c = wl.allocate(owner="w")
    assert c is not None and c.payload == "c"
    c.complete()
    assert wl.status().finished


def test_clear_errors_and_reset_all(wl: Any) -> None:
    wl.populate(["a", "b", "c"], order=100)
    items = [wl.allocate(owner="w") for _ in range(3)]
    items[0].fail("x")
    items[1].fail("y")
    items[2].complete()
    assert wl.status().blocked_by_errors
    assert wl.clear_errors() == 2
    st = wl.status()
    assert (st.orders[0].new, st.orders[0].error, st.orders[0].done) == (2, 0, 1)
    assert not st.blocked_by_errors
    assert wl.reset() == 3
    rows = wl.items_list()
    assert all(r["state"] == "new" and r["attempts"] == 0 and r["owner"] is None and r["started_at"] is None
               and r["finished_at"] is None and r["last_error"] is None for r in rows)
    done = [item.id for item in wl.items(owner="w", poll_interval=0.01, timeout=10) if item.complete() is None]
    assert sorted(done) == sorted(r["id"] for r in rows)
    assert wl.status().finished


def test_free_gives_the_item_back(wl: Any) -> None:
    wl.populate(["only"], order=100)
    item = wl.allocate(owner="w1")
    assert wl.allocate(owner="w2") is None
    item.release()
    row = _by_id(wl)[item.id]
    assert (row["state"], row["owner"], row["token"], row["started_at"]) == ("new", None, None, None)
    again = wl.allocate(owner="w2")
    assert again is not None and again.id == item.id and again.owner == "w2"
    with pytest.raises(LeaseLost):
        item.complete()
    item.release()  # freeing an item no longer held is a no-op
    assert _by_id(wl)[item.id]["owner"] == "w2"
    again.complete()


def test_crashed_workers_item_returns_after_its_lease(ct: Any, wl: Any) -> None:
    wl.populate(["job"], order=100)
    wl.populate(["next"], order=200)
    crashed = wl.allocate(owner="crashed", lease=1)
    assert crashed is not None and crashed.attempts == 1
    assert wl.allocate(owner="other") is None  # still leased
    _wait_until_expired(ct, crashed)
    st = wl.status()
    assert st.orders[0].expired == 1 and not st.blocked_by_errors
    taken = wl.allocate(owner="other")
    assert taken is not None and taken.id == crashed.id
    assert taken.token > crashed.token and taken.attempts == 2
    with pytest.raises(LeaseLost):
        crashed.complete()
    with pytest.raises(LeaseLost):
        crashed.renew(30)
    with pytest.raises(LeaseLost):
        crashed.fail("late")
    row = _by_id(wl)[crashed.id]
    assert row["state"] == "active" and row["owner"] == "other" and row["token"] == taken.token
    assert wl.allocate(owner="third") is None  # order 200 waits for the taken-over item
    taken.complete()
    assert wl.allocate(owner="third").payload == "next"


def test_renew_and_get(ct: Any, wl: Any) -> None:
    wl.populate([{"k": 1}], order=100)
    # The renewal must reach it before it lapses: 20 s is a hang detector (5 s lapsed between two
    # statements on a loaded MariaDB); the test then waits it out.
    item = wl.allocate(owner="w", lease=20)
    first_expiry = item.expires_at.timestamp()
    item.renew(60)
    wait_past(ct, first_expiry)  # the first lease is over by the database clock
    assert wl.allocate(owner="thief") is None  # the renewal kept it
    same = wl.get(item.id, token=item.token)
    assert (same.id, same.token, same.payload, same.owner) == (item.id, item.token, {"k": 1}, "w")
    with pytest.raises(LeaseLost):
        wl.get(item.id, token=item.token + 1)
    with pytest.raises(ConfigurationError):
        wl.get(10 ** 9)
    same.complete()
    with pytest.raises(LeaseLost):
        wl.get(item.id)


def test_items_iterator_stops_when_finished(wl: Any) -> None:
    wl.populate([1, 2], order=1)
    wl.populate([3], order=2)
    got = []
    for item in wl.items(owner="w", poll_interval=0.01, timeout=10):
        got.append(item.payload)
        item.complete()
    assert got == [1, 2, 3]
    assert list(wl.items(owner="w", poll_interval=0.01, timeout=1)) == []


def test_drop_removes_the_list(ct: Any, namespace: str) -> None:
    name = f"wl_{uuid.uuid4().hex[:8]}"
    wl = ct.worklist(name)
    other = ct.worklist(name + "_other")
    wl.populate(["a", "b"], order=1)
    other.populate(["z"], order=1)
    wl.allocate(owner="w")
    assert wl.drop() == 2
    assert wl.items_list() == [] and wl.status().orders == [] and wl.status().finished
    assert wl.allocate() is None
    assert [r["payload"] for r in other.items_list()] == ["z"]  # another list is untouched
    assert other.drop() == 1
    assert wl.drop() == 0


def test_namespaces_are_separate(ct: Any, backend_url: str) -> None:
    from controltable import ControlTable

    name = f"wl_{uuid.uuid4().hex[:8]}"
    mine = ct.worklist(name)
    with ControlTable(backend_url, namespace=f"t_{uuid.uuid4().hex[:12]}") as other_ct:
        theirs = other_ct.worklist(name)
        mine.populate(["mine"], order=1)
        theirs.populate(["theirs"], order=1)
        assert mine.allocate(owner="w").payload == "mine"
        assert theirs.allocate(owner="w").payload == "theirs"
        assert theirs.drop() == 1
    assert mine.drop() == 1


def test_bad_input(ct: Any, wl: Any) -> None:
    with pytest.raises(ConfigurationError):
        ct.worklist("")
    with pytest.raises(ConfigurationError):
        wl.populate([1], order=1.5)
    with pytest.raises(ConfigurationError):
        wl.populate([1], order=True)
    with pytest.raises(ConfigurationError, match="JSON"):
        wl.populate([{"ok": 1}, {"bad": object()}])
    assert wl.items_list() == []
    wl.populate([1])
    with pytest.raises(ConfigurationError):
        wl.allocate(owner="")
    with pytest.raises(ConfigurationError):
        wl.allocate(owner="w", lease=0)
    assert wl.status().orders[0].new == 1


def test_started_at_is_not_before_the_lower_orders_finished_at(ct: Any, wl: Any, backend: str) -> None:
    """The recorded start of an item is taken after the allocation saw the lower order finish.

    An allocation that has to wait for the work list's lock (another allocator holds it) while the
    last item of the lower order completes must still record a ``started_at`` after that item's
    ``finished_at``. (On SQLite a writer holds the whole database, so the completion cannot slip
    in while an allocation waits; there the sequence simply runs in order.)
    """
    wl.populate(["a"], order=100)
    wl.populate(["b"], order=200)
    a = wl.allocate(owner="w1")
    assert a is not None
    got: dict[str, Any] = {}

    def allocate() -> None:
        try:
            got["item"] = wl.allocate(owner="w2")
        except BaseException as exc:  # pragma: no cover - reported below
            got["error"] = exc

    if backend == "sqlite":
        a.complete()
        allocate()
    else:
        w = ct.tables.worklist
        blocker = ct.engine.connect()
        tx = blocker.begin()
        try:  # another allocator holds the work list's lock...
            blocker.execute(select(w.c.last_token).where(w.c.namespace == ct.namespace, w.c.name == wl.name)
                            .with_for_update())
            thread = threading.Thread(target=allocate)
            thread.start()
            time.sleep(0.5)  # ...so this allocation waits for it,
            a.complete()  # while the last item of order 100 completes (no lock needed)
            time.sleep(0.2)
        finally:
            tx.commit()
            blocker.close()
        thread.join(60)
        assert not thread.is_alive()
    assert "error" not in got, got.get("error")
    b = got["item"]
    assert b is not None and b.payload == "b"
    rows = _by_id(wl)
    started, finished = rows[b.id]["started_at"], rows[a.id]["finished_at"]
    assert started >= finished, (
        f"item b (order 200) is recorded as started {finished - started:.3f} s before item a (order 100) "
        "finished: allocate() took started_at from the clock read before it waited for the work list's lock"
    )
    b.complete()


def test_allocation_reads_the_next_item_in_index_order_without_a_sort(ct: Any, wl: Any, backend: str) -> None:
    """An allocation takes the first item of its order by (priority high first, id): the
    statement is served in index order by the (namespace, worklist, state, exec_order, priority
    DESC, id) index, so it never sorts every new item of the order. Checked in the plans the
    three live backends choose (PostgreSQL told to prefer indexes: a small table is scanned)."""
    wl.populate([{"n": i} for i in range(300)], order=1, priority=0)
    wl.populate([{"n": i} for i in range(300)], order=1, priority=5)
    first = wl.allocate(owner="w")
    assert first is not None and first.priority == 5 and first.payload == {"n": 0}
    stmt = wl.sql.next_item(1, ct.now())
    with ct.engine.begin() as conn:
        sql_text = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        if backend == "sqlite":
            plan = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql_text)]
            sorts = [p for p in plan if "TEMP B-TREE" in p]
        elif backend == "mysql":
            conn.exec_driver_sql(f"ANALYZE TABLE {ct.tables.item.name}")
            plan = [str(dict(r._mapping)) for r in conn.exec_driver_sql("EXPLAIN " + sql_text)]
            sorts = [p for p in plan if "filesort" in p]
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            plan = [str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + sql_text)]
            sorts = [p for p in plan if "Sort" in p]
    assert not sorts, plan
    assert any("work_item_next_ix" in p for p in plan), plan


def test_an_expired_item_of_higher_priority_comes_before_new_ones(ct: Any, wl: Any) -> None:
    """The two branches of the next-item read (new items, expired allocations) are merged in
    allocation order: priority first, then id."""
    wl.populate([{"n": "low"}], order=1, priority=0)
    wl.populate([{"n": "high"}], order=1, priority=9)
    high = wl.allocate(owner="a", lease=1)
    assert high is not None and high.payload == {"n": "high"}
    _wait_until_expired(ct, high)
    again = wl.allocate(owner="b")
    assert again is not None and again.payload == {"n": "high"} and again.token != high.token
    low = wl.allocate(owner="c")
    assert low is not None and low.payload == {"n": "low"}
