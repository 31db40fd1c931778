"""Event batch claiming, behaviour in one process: fencing, fail/back-off, release, where, order, bad input."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, UniqueConstraint, func, insert, select, text, update
from support import event_tables

from controltable import ConfigurationError, LeaseLost, NotInstalledError

PENDING, CLAIMED, DONE, ERROR = 0, 1, 2, 3


@pytest.fixture
def events_table(ct: Any, tables: Callable[..., Table]) -> Callable[..., Table]:
    """An event table with ``n`` rows (id, kind, seq, payload), not yet prepared."""

    def make(n: int) -> Table:
        t = tables(
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("kind", String(10), nullable=False),
            Column("seq", Integer, nullable=False),
            Column("payload", String(100), nullable=False),
        )
        with ct.engine.begin() as conn:
            # seq runs backwards, so order_by="seq" claims in the reverse of key order.
            conn.execute(insert(t), [{"id": i, "kind": "a" if i % 2 else "b", "seq": 1000 - i,
                                      "payload": f"event {i}"} for i in range(1, n + 1)])
        return t

    return make


_rows = event_tables.rows
_wait_past = event_tables.wait_past


# -- leases and fencing ------------------------------------------------------------------------------
def test_lease_lost_rolls_back_the_callers_writes(ct: Any, events_table: Callable[..., Table],
                                                  tables: Callable[..., Table]) -> None:
    t = events_table(10)
    queue = tables(
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("event_id", Integer, nullable=False),
        Column("writer", String(20), nullable=False),
        prefix="q",
    )
    ev = ct.events(t.name, key="id")
    ev.prepare()
    # The first claim still runs at the next claim, however loaded the machine (a 5 s lease lapsed
    # between two claims on a loaded MariaDB); then it is cut to 1 s and runs out.
    first = ev.claim(4, owner="first", lease=3600)
    assert first is not None and first.keys == [1, 2, 3, 4]
    assert ev.claim(4, owner="early", lease=3600).keys == [5, 6, 7, 8]  # the held rows are not claimable
    first.renew(1)
    _wait_past(ct, first.expires_at.timestamp())
    second = ev.claim(4, owner="second", where=ev.c.id <= 4)
    assert second is not None and second.keys == first.keys and second.token != first.token

    with pytest.raises(LeaseLost) as info, first.transaction() as conn:
        conn.execute(insert(queue), [{"event_id": k, "writer": "first"} for k in first.keys])
    assert sorted(info.value.keys) == [1, 2, 3, 4]
    assert "1" in str(info.value)
    with ct.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(queue)) == 0
    rows = _rows(ct, t.name)
    assert all(rows[k]["ct_state"] == CLAIMED and rows[k]["ct_owner"] == "second" for k in first.keys)

    with pytest.raises(LeaseLost):  # complete and fail are fenced the same way
        first.complete()
    with pytest.raises(LeaseLost):
        first.fail("late")
    with pytest.raises(LeaseLost):
        first.renew(10)
    assert first.release() == 0  # lost rows are ignored by release

    with second.transaction() as conn:
        conn.execute(insert(queue), [{"event_id": k, "writer": "second"} for k in second.keys])
    assert second.finished
    with ct.engine.connect() as conn:
        written = conn.execute(select(queue.c.event_id, queue.c.writer).order_by(queue.c.event_id)).all()
    assert [tuple(r) for r in written] == [(k, "second") for k in [1, 2, 3, 4]]
    st = ev.stats()
    assert (st.done, st.claimed, st.pending) == (4, 4, 2)


def test_partial_lease_loss_names_only_the_lost_rows(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(6)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    first = ev.claim(4, owner="first", lease=1)
    assert first is not None
    _wait_past(ct, first.expires_at.timestamp())
    # The thief is another worker (its own EventTable): this object, having found no expired claim at
    # the first claim, skips that look for EXPIRED_CHECK_INTERVAL (1 s, measured from after the look),
    # which a loaded machine's slow first claim stretched past the 1 s lease: the thief took the
    # pending rows 5 and 6 instead (SQLAlchemy 1.4 lane, loaded run 11).
    thief = ct.events(t.name, key="id").claim(2, owner="thief")  # takes over 1 and 2 only
    assert thief is not None and thief.keys == [1, 2]
    with pytest.raises(LeaseLost) as info:
        first.complete()
    assert sorted(info.value.keys) == [1, 2]
    # nothing was completed: the whole completion rolled back
    assert ev.stats().done == 0
    assert first.complete(keys=[3, 4]) == 2  # the rows still held can be completed
    assert thief.complete() == 2
    assert ev.stats().done == 4


def test_renew_extends_the_lease(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(3)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    # The first lease must still run when the renewal reaches the database: 20 s is a hang detector for
    # the one round trip between the claim and the renewal (1 s lapsed on a loaded CI machine, and 5 s
    # between two claims on a loaded MariaDB); the test then waits it out.
    batch = ev.claim(3, owner="w", lease=20)
    assert batch is not None
    before = batch.expires_at
    batch.renew(120)
    assert (batch.expires_at - before).total_seconds() > 99  # 120 s from the renewal, not 20 from the claim
    event_tables.wait_past(ct, before.timestamp())  # the first lease is over by the database clock
    assert ev.claim(3, owner="other") is None  # still held thanks to the renewal
    assert batch.complete() == 3


def test_renewing_an_expired_claim_names_its_rows_and_why(ct: Any, events_table: Callable[..., Table]) -> None:
    """A renewal that reaches the database after the claim ran out is refused even though nobody
    took the rows yet (any worker may from then on); the error names those rows and the cause, not
    an empty list of rows "no longer held" (as a CI run on a loaded machine printed)."""
    t = events_table(3)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(2, owner="w", lease=0.5)
    assert batch is not None
    event_tables.wait_past(ct, batch.expires_at.timestamp())  # the claim is over by the database clock
    with pytest.raises(LeaseLost, match="already expired when the renewal reached the database") as info:
        batch.renew(60)
    assert sorted(info.value.keys) == [1, 2]
    assert batch.complete() == 2  # still under its token: the fenced completion goes through


def test_handle_rebuilds_the_batch(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(5)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(3, owner="w")
    assert batch is not None
    again = ct.events(t.name, key="id").batch(batch.handle())
    assert again.keys == batch.keys and again.token == batch.token
    assert [r["payload"] for r in again.rows] == ["event 1", "event 2", "event 3"]
    assert again.complete() == 3
    with pytest.raises(LeaseLost):  # a forged token holds nothing
        ev.batch({**ev.claim(2, owner="w").handle(), "token": 12345}).complete()


# -- finishing: fail, back-off, max_attempts, release, partial completion --------------------------------
def test_fail_backs_off_then_errors_after_max_attempts(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(4)
    ev = ct.events(t.name, key="id", backoff=10, max_backoff=15, max_attempts=3)
    ev.prepare()
    batch = ev.claim(3, owner="w")
    assert batch is not None and batch.keys == [1, 2, 3]
    assert batch.fail("boom 1") == 3
    now = ct.now()
    rows = _rows(ct, t.name)
    for k in (1, 2, 3):
        r = rows[k]
        assert r["ct_state"] == PENDING and r["ct_owner"] is None and r["ct_token"] is None
        assert r["ct_attempts"] == 1 and r["ct_error"] == "boom 1"
        assert now + 8 < r["ct_available_at"] <= now + 10.5  # backoff * 2**0
    st = ev.stats()
    assert (st.pending, st.claimed, st.error) == (4, 0, 0)
    assert ev.pending_count() == 1  # only row 4 is due
    again = ev.claim(10, owner="w")
    assert again is not None and again.keys == [4]  # the failed rows are not claimable yet
    again.release()

    def make_due() -> None:
        with ct.engine.begin() as conn:
            conn.execute(update(ev.table).values(ct_available_at=None).where(ev.c.id <= 3))

    make_due()
    second = ev.claim(3, owner="w")
    assert second is not None and second.keys == [1, 2, 3]
    assert second.attempts == {1: 2, 2: 2, 3: 2}
    second.fail("boom 2")
    now = ct.now()
    rows = _rows(ct, t.name)
    assert all(now + 13 < rows[k]["ct_available_at"] <= now + 15.5 for k in (1, 2, 3))  # min(10 * 2, 15)

    make_due()
    third = ev.claim(3, owner="w")
    assert third is not None and third.attempts == {1: 3, 2: 3, 3: 3}
    third.fail("boom 3: the last straw")
    rows = _rows(ct, t.name)
    for k in (1, 2, 3):
        r = rows[k]
        assert r["ct_state"] == ERROR and r["ct_error"] == "boom 3: the last straw"
        assert r["ct_available_at"] is None and r["ct_token"] is None
    st = ev.stats()
    assert (st.error, st.pending) == (3, 1)
    assert ev.claim(10, owner="w").keys == [4]

    assert ev.retry_errors(where=ev.c.id == 2) == 1
    assert ev.retry_errors() == 2
    rows = _rows(ct, t.name)
    assert all(rows[k]["ct_state"] == PENDING and rows[k]["ct_attempts"] == 0 and rows[k]["ct_error"] is None
               for k in (1, 2, 3))
    back = ev.claim(10, owner="w")
    assert back is not None and back.keys == [1, 2, 3]
    assert back.complete() == 3
    assert ev.stats().done == 3


def test_fail_part_of_a_batch(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(4)
    ev = ct.events(t.name, key="id", backoff=0, max_attempts=1)
    ev.prepare()
    batch = ev.claim(4, owner="w")
    assert batch is not None
    assert batch.fail("bad row", keys=[2]) == 1
    assert not batch.finished
    assert batch.complete(keys=[1, 3, 4]) == 3
    # Every row of the batch is settled now: a wrapper that completes unfinished batches on exit
    # (the Dagster resource's claim_batch does) must not complete them again.
    assert batch.finished
    rows = _rows(ct, t.name)
    assert [rows[k]["ct_state"] for k in (1, 2, 3, 4)] == [DONE, ERROR, DONE, DONE]
    assert rows[2]["ct_error"] == "bad row"


def test_zero_backoff_retries_at_once(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(1)
    ev = ct.events(t.name, key="id", backoff=0, max_attempts=2)
    ev.prepare()
    ev.claim(1, owner="w").fail("once")
    b = ev.claim(1, owner="w")
    assert b is not None and b.attempts == {1: 2}
    b.fail("twice")
    assert ev.claim(1, owner="w") is None
    assert ev.stats().error == 1


def test_release_gives_rows_back_untouched(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(5)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(3, owner="w")
    assert batch is not None and batch.keys == [1, 2, 3]
    assert batch.release() == 3
    assert batch.finished
    rows = _rows(ct, t.name)
    for k in (1, 2, 3):
        r = rows[k]
        assert (r["ct_state"], r["ct_owner"], r["ct_token"], r["ct_attempts"], r["ct_error"]) == (
            PENDING, None, None, 0, None)
        assert r["ct_expires_at"] is None and r["ct_available_at"] is None
    again = ev.claim(3, owner="other")
    assert again is not None and again.keys == [1, 2, 3]  # claimable at once, first in order again
    assert again.attempts == {1: 1, 2: 1, 3: 1}
    assert again.complete() == 3


def test_complete_part_of_a_batch(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(5)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(5, owner="w")
    assert batch is not None
    assert batch.complete(keys=[2, 4]) == 2
    assert not batch.finished
    st = ev.stats()
    assert (st.done, st.claimed, st.pending) == (2, 3, 0)
    rows = _rows(ct, t.name)
    assert {k for k, r in rows.items() if r["ct_state"] == DONE} == {2, 4}
    assert all(rows[k]["ct_done_at"] is not None for k in (2, 4))
    assert batch.complete(keys=[1, 3, 5]) == 3
    assert ev.stats().done == 5
    assert batch.finished, "all five rows were completed (in two parts), yet the batch is not finished"


def test_completing_a_row_twice_is_a_retry_and_only_lost_rows_are_named(
    ct: Any, events_table: Callable[..., Table]
) -> None:
    t = events_table(3)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(3, owner="w", lease=0.5)
    assert batch is not None
    batch.complete(keys=[2])
    # 2 is done under this batch's token already: a retry after a lost COMMIT reply, not a loss.
    assert batch.complete(keys=[1, 2]) == 2
    event_tables.wait_past(ct, batch.expires_at.timestamp())  # row 3's lease is over by the database clock
    other = ct.events(t.name, key="id").claim(3, owner="x")  # row 3's lease ran out: taken over
    assert other is not None and other.keys == [3]
    with pytest.raises(LeaseLost) as info:
        batch.complete(keys=[1, 3])
    assert info.value.keys == [3], "row 1 is done under the batch and must not be reported as lost"
    assert ev.stats().done == 2


def test_where_narrows_what_is_claimable(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(10)
    only_a = ct.events(t.name, key="id", where=lambda tab: tab.c.kind == "a")
    only_a.prepare()
    batch = only_a.claim(100, owner="w")
    assert batch is not None and batch.keys == [1, 3, 5, 7, 9]
    assert only_a.claim(100, owner="w") is None
    assert only_a.pending_count() == 0
    everything = ct.events(t.name, key="id")
    assert everything.pending_count() == 5
    assert everything.pending_count(where=everything.c.id > 6) == 2
    big_b = everything.claim(100, owner="w", where=everything.c.id > 6)  # a per-claim filter
    assert big_b is not None and big_b.keys == [8, 10]
    both = ct.events(t.name, key="id", where=lambda tab: tab.c.kind == "b")
    rest = both.claim(100, owner="w", where=lambda tab: tab.c.id < 5)  # constructor and claim filters combine
    assert rest is not None and rest.keys == [2, 4]
    assert everything.claim(100, owner="w").keys == [6]


def test_claims_follow_order_by(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(7)  # seq = 1000 - id
    ev = ct.events(t.name, key="id", order_by="seq")
    ev.prepare()
    first = ev.claim(3, owner="w")
    second = ev.claim(3, owner="w")
    assert first is not None and second is not None
    assert first.keys == [7, 6, 5] and second.keys == [4, 3, 2]
    assert [r["seq"] for r in first.rows] == [993, 994, 995]
    assert ev.stats().oldest_pending_key == 1
    by_key = ct.events(t.name, key="id")
    first.release()
    assert by_key.claim(2, owner="w").keys == [1, 5]


def test_stats_and_reap(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(6)
    ev = ct.events(t.name, key="id")
    assert ev.prepare()  # it ran DDL
    assert ev.prepare() == []  # idempotent
    # Held until the stats are read, however loaded the machine: with a 5 s lease a loaded MariaDB run
    # let it lapse before the next claim, which then took row 1 back (an expired claim is claimable).
    b = ev.claim(2, owner="w", lease=3600)
    assert b is not None and b.keys == [1, 2]
    third = ev.claim(1, owner="w")
    assert third is not None and third.keys == [3]
    third.complete()
    st = ev.stats()
    assert (st.pending, st.claimed, st.done, st.error, st.total) == (3, 2, 1, 0, 6)
    assert st.oldest_pending_key == 4
    b.renew(1)  # now let its claims run out, to be reaped
    _wait_past(ct, b.expires_at.timestamp())
    assert ev.stats().expired == 2
    assert ev.reap() == 2
    st = ev.stats()
    assert (st.pending, st.claimed, st.expired) == (5, 0, 0)
    assert ev.reset() == 6
    assert ev.stats().pending == 6


# -- bad input -----------------------------------------------------------------------------------------
def test_unknown_table(ct: Any) -> None:
    ev = ct.events(f"nope_{uuid.uuid4().hex[:8]}", key="id")
    with pytest.raises(ConfigurationError, match="does not exist"):
        ev.claim(10)
    with pytest.raises(ConfigurationError):
        ev.prepare()
    with pytest.raises(ConfigurationError):
        ev.stats()


def test_unknown_key_or_order_by_column(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(2)
    with pytest.raises(ConfigurationError, match="nokey"):
        ct.events(t.name, key="nokey").prepare()
    with pytest.raises(ConfigurationError, match="noorder"):
        ct.events(t.name, key="id", order_by="noorder").prepare()
    ct.events(t.name, key="id").prepare()
    with pytest.raises(ConfigurationError, match="nokey"):
        ct.events(t.name, key="nokey").claim(1)
    with pytest.raises(ConfigurationError, match="noorder"):
        ct.events(t.name, key="id", order_by="noorder").claim(1)
    with pytest.raises(ConfigurationError):
        ct.events(t.name, key="id; drop table x")


def test_key_must_be_unique(ct: Any, tables: Callable[..., Table]) -> None:
    t = tables(
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("code", String(20), nullable=False),
        Column("ucode", String(20), nullable=False),
        UniqueConstraint("ucode"),
    )
    with pytest.raises(ConfigurationError, match="not unique"):
        ct.events(t.name, key="code").prepare()
    with pytest.raises(ConfigurationError, match="not unique"):
        ct.events(t.name, key="code").claim(1)
    ct.events(t.name, key="ucode").prepare()  # a unique constraint is enough
    with ct.engine.begin() as conn:
        conn.execute(insert(t), [{"id": 1, "code": "x", "ucode": "u1"}])
    assert ct.events(t.name, key="ucode").claim(5).keys == ["u1"]


def test_size_must_be_positive(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(2)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    for size in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError):
            ev.claim(size)
    with pytest.raises(ConfigurationError):
        ev.claim(1, lease=0)
    assert ev.stats().claimed == 0


def test_table_without_claim_columns(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(2)
    ev = ct.events(t.name, key="id")
    with pytest.raises(NotInstalledError, match="prepare") as info:
        ev.claim(1)
    assert "ct_state" in str(info.value)
    with pytest.raises(NotInstalledError, match="prepare"):
        ev.stats()
    ev.prepare()
    assert ev.claim(5).keys == [1, 2]


def test_worklist_populate_rejects_non_json_payloads(ct: Any) -> None:
    wl = ct.worklist(f"wl_{uuid.uuid4().hex[:8]}")
    try:
        for bad in ([{"a": 1}, object()], [{"a": 1}, {"when": {1, 2}}], [1.0, float("nan")], [b"bytes"]):
            with pytest.raises(ConfigurationError, match="JSON"):
                wl.populate(bad)
        assert wl.items_list() == []
        assert wl.status().orders == []
        with pytest.raises(ConfigurationError):
            wl.populate([1], order="100")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            wl.populate([1], priority=1.5)  # type: ignore[arg-type]
        assert wl.items_list() == []
    finally:
        wl.drop()


# -- lost COMMIT replies: the retry must not hand out a second batch ---------------------------------
@contextmanager
def commit_reply_lost(ct: Any, times: int = 1) -> Iterator[list[int]]:
    """The next ``times`` commits happen on the server, but the client sees the connection drop
    (as when the reply to COMMIT is lost): the driver's commit runs, then a disconnect error."""
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError

    left = [times]

    def on_commit(conn: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            conn.connection.dbapi_connection.commit()
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"),
                                   connection_invalidated=True)

    event.listen(ct.db.engine, "commit", on_commit)
    try:
        yield left
    finally:
        event.remove(ct.db.engine, "commit", on_commit)


def test_claim_retried_after_a_lost_commit_reply_returns_the_same_batch(
    ct: Any, events_table: Callable[..., Table]
) -> None:
    t = events_table(10)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    with commit_reply_lost(ct) as left:
        batch = ev.claim(3, owner="w")
    assert left == [0], "the fault was not injected"
    assert batch is not None and batch.keys == [1, 2, 3]
    stats = ev.stats()
    assert stats.claimed == 3 and stats.pending == 7, "the retry claimed a second batch"
    assert batch.complete() == 3


def test_complete_and_claim_and_complete_survive_a_lost_commit_reply(
    ct: Any, events_table: Callable[..., Table]
) -> None:
    t = events_table(10)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    first = ev.claim(3, owner="w", lease=60)
    assert first is not None
    with commit_reply_lost(ct) as left:
        second = first.complete_and_claim()
    assert left == [0]
    assert second is not None and second.keys == [4, 5, 6]
    stats = ev.stats()
    assert (stats.done, stats.claimed, stats.pending) == (3, 3, 4)
    with commit_reply_lost(ct) as left:
        assert second.complete() == 3  # the retry finds the rows done under its token: not LeaseLost
    assert left == [0]
    assert ev.stats().done == 6


# -- batch handles keep their history ---------------------------------------------------------------
def _rebuilt(ev: Any, batch: Any) -> Any:
    import json

    return ev.batch(json.loads(json.dumps(batch.handle())))


def test_a_handle_carries_attempts_claim_time_and_lease(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(4)
    ev = ct.events(t.name, key="id", backoff=0)
    ev.prepare()
    batch = ev.claim(2, owner="w", lease=60)
    assert batch is not None
    batch.fail("again")
    batch = ev.claim(2, owner="w", lease=60)
    assert batch is not None and batch.attempts == {1: 2, 2: 2}
    again = _rebuilt(ev, batch)
    assert again.attempts == {1: 2, 2: 2}
    assert again.lease_seconds == 60
    assert abs(again.claimed_at - batch.claimed_at) < 1e-3
    assert abs(again._expires_at - batch._expires_at) < 1e-3
    assert 19 < again._renew_interval() < 21, "renewal every third of the batch's own lease"


def test_a_batch_failed_through_its_handle_reaches_the_error_state(
    ct: Any, events_table: Callable[..., Table]
) -> None:
    t = events_table(3)
    ev = ct.events(t.name, key="id", max_attempts=3, backoff=0)
    ev.prepare()
    for attempt in range(1, 4):
        batch = ev.claim(3, owner="w", lease=60)
        assert batch is not None, f"attempt {attempt}: the rows should be claimable again"
        # Each failure goes through a handle, as Airflow's FailBatchOperator does in another task.
        assert _rebuilt(ct.events(t.name, key="id", max_attempts=3, backoff=0), batch).fail("poison") == 3
    stats = ev.stats()
    assert stats.error == 3 and stats.pending == 0, "max_attempts failures must end in the error state"
    assert ev.claim(3, owner="w") is None
    rows = _rows(ct, t.name)
    assert all(r["ct_error"] == "poison" and r["ct_attempts"] == 3 for r in rows.values())


def test_backoff_grows_with_the_stored_attempts(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(1)
    ev = ct.events(t.name, key="id", max_attempts=5, backoff=100, max_backoff=250)
    ev.prepare()
    waits = []
    prepared = Table(t.name, MetaData(), autoload_with=ct.engine)
    for _ in range(3):
        with ct.engine.begin() as conn:  # make the row due again without waiting for its back-off
            conn.execute(update(prepared).values(ct_available_at=None))
        batch = ev.claim(1, owner="w")
        assert batch is not None
        now = ct.now()
        _rebuilt(ev, batch).fail("slow")
        waits.append(float(_rows(ct, t.name)[1]["ct_available_at"]) - now)
    assert [round(w, -1) for w in waits] == [100, 200, 250], waits


def test_renew_without_an_argument_keeps_the_batch_lease(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(2)
    ev = ct.events(t.name, key="id", lease=900)
    ev.prepare()
    batch = ev.claim(2, owner="w", lease=60)
    assert batch is not None
    for b in (batch, _rebuilt(ev, batch)):
        b.renew()
        left = b._expires_at - ct.now()
        assert 50 < left <= 60.5, f"renew() moved a 60 s batch to {left:.0f} s"


def test_complete_and_claim_hands_on_the_lease_of_a_rebuilt_batch(
    ct: Any, events_table: Callable[..., Table]
) -> None:
    t = events_table(4)
    ev = ct.events(t.name, key="id", lease=900)
    ev.prepare()
    batch = ev.claim(2, owner="w", lease=60)
    assert batch is not None
    following = _rebuilt(ev, batch).complete_and_claim()
    assert following is not None and following.keys == [3, 4]
    assert following.lease_seconds == 60
    assert 50 < following._expires_at - ct.now() <= 60.5


def test_fail_messages_fit_the_error_column(ct: Any, events_table: Callable[..., Table]) -> None:
    t = events_table(1)
    ev = ct.events(t.name, key="id")
    ev.prepare()
    batch = ev.claim(1, owner="w")
    assert batch is not None
    batch.fail("é" * 5000)  # 2 bytes each: cut to whole characters within the column's size
    stored = _rows(ct, t.name)[1]["ct_error"]
    # Cut with a marker saying how much (validation.fail_reason, the rule Item.fail() shares).
    head, marker = stored.split("... [cut: ")
    assert set(head) == {"é"} and len(stored) <= 2000 and len(stored.encode()) <= 4000
    assert marker == f"{5000 - len(head)} more characters]"


# -- prepare(): one DDL per transaction, online where offered, statistics, busy tables ----------------
def test_prepare_runs_each_statement_then_refreshes_statistics(
    ct: Any, events_table: Callable[..., Table], backend: str
) -> None:
    t = events_table(50)
    ev = ct.events(t.name, key="id")
    done = ev.prepare()
    assert sum(s.startswith("ALTER TABLE") for s in done) == 8
    analyze = {"sqlite": f"ANALYZE {t.name}", "postgres": f"ANALYZE {t.name}", "mysql": f"ANALYZE TABLE {t.name}"}
    assert done[-1] == analyze[backend]
    if backend == "postgres":
        assert any(s.startswith("CREATE INDEX CONCURRENTLY") for s in done), "PostgreSQL builds indexes online"
        with ct.engine.connect() as conn:
            analyzed = conn.execute(text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = :n"),
                                    {"n": t.name}).scalar()
        assert analyzed is not None, "prepare() must leave the table analyzed"
    assert ev.prepare() == [], "prepare() is idempotent and analyzes only after a change"
    batch = ev.claim(10, owner="w")
    assert batch is not None and len(batch) == 10


def test_prepare_on_a_busy_table_fails_clearly_with_the_ddl(
    ct: Any, events_table: Callable[..., Table], backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite waits for its single writer (busy_timeout); no per-statement DDL lock timeout")
    t = events_table(5)
    ev = ct.events(t.name, key="id")
    from sqlalchemy import create_engine

    from controltable import TableBusyError

    other = create_engine(ct.engine.url)
    try:
        with other.connect() as conn:
            trans = conn.begin()
            conn.execute(select(func.count()).select_from(t))  # holds a lock the ALTER must wait for
            with pytest.raises(TableBusyError) as info:
                ev.prepare(lock_timeout=1)
            trans.rollback()
        message = str(info.value)
        assert "Retry later" in message and "ALTER TABLE" in message and t.name in message
    finally:
        other.dispose()
    assert ev.prepare(), "after the other session finished, prepare() goes through"
    assert ev.claim(5, owner="w") is not None


def test_prepare_rebuilds_an_index_an_interrupted_concurrent_build_left_invalid(
    ct: Any, events_table: Callable[..., Table], backend: str
) -> None:
    """PostgreSQL: a ``CREATE INDEX CONCURRENTLY`` stopped by its lock timeout leaves the index behind,
    invalid (claims never use it). The next ``prepare()`` must drop it and build it again rather than
    take it for done. Taken here on purpose, for each of the two claim indexes: a loaded run once took
    this path by accident (a build waiting out other sessions' transactions), and the ``DROP INDEX``
    it sends belongs in the suite's golden SQL (``core/sql/postgresql.suite.sql``) by design, not by
    the chance of a lock timeout."""
    if backend != "postgres":
        pytest.skip("only PostgreSQL builds indexes concurrently, and only such a build leaves one invalid")
    from sqlalchemy import create_engine, false

    from controltable import TableBusyError

    t = events_table(5)
    ev = ct.events(t.name, key="id")
    ev.prepare()

    def claim_indexes() -> dict[str, bool]:
        """This table's controltable indexes and whether each is valid (pg_index.indisvalid)."""
        with ct.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_class r ON r.oid = i.indrelid WHERE r.relname = :table AND c.relname LIKE 'ct\\_%'"
            ), {"table": t.name}).all()
        return {str(name): bool(valid) for name, valid in rows}

    names = sorted(claim_indexes())
    assert [n.split("_")[1] for n in names] == ["claimed", "pending"], names
    other = create_engine(ct.engine.url)
    try:
        for name in names:
            with ct.engine.begin() as conn:
                conn.execute(text("DROP INDEX " + conn.dialect.identifier_preparer.quote(name)))
            with other.connect() as conn:
                writer = conn.begin()
                # A writer's lock on the table: the build's catalogue entry is made, then it waits for
                # the writer, and its 1 s lock timeout stops it there.
                conn.execute(update(t).where(false()).values(id=t.c.id))
                with pytest.raises(TableBusyError) as info:
                    ev.prepare(lock_timeout=1)
                writer.rollback()
            assert "CREATE INDEX CONCURRENTLY" in str(info.value) and name in str(info.value)
            assert claim_indexes().get(name) is False, f"the interrupted build left no invalid {name}"
            done = ev.prepare()
            assert any(s.startswith(f"CREATE INDEX CONCURRENTLY {name} ") for s in done), done
            assert claim_indexes() == {n: True for n in names}, "the invalid index was not built again"
    finally:
        other.dispose()
    batch = ev.claim(5, owner="w")
    assert batch is not None and len(batch) == 5


def test_capped_backends_page_admin_updates_by_key(
    ct: Any, events_table: Callable[..., Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQL Server path (row cap per statement), run here with a cap of 3 rows."""
    from dataclasses import replace

    t = events_table(10)
    ev = ct.events(t.name, key="id", max_attempts=1)
    ev.prepare()
    batch = ev.claim(10, owner="w")
    assert batch is not None
    # The event table's statements are bound to the backend's traits: these say "3 rows at most".
    monkeypatch.setattr(ev.sql, "traits", replace(ev.sql.traits, rows_per_statement=3))
    monkeypatch.setattr(ev.sql, "key_chunk", 3)
    assert batch.fail("boom") == 10
    assert ev.stats().error == 10
    assert ev.retry_errors() == 10 and ev.stats().pending == 10
    again = ev.claim(4, owner="w")  # chunks of 3 rows per claim statement
    assert again is not None and again.keys == [1, 2, 3, 4]
    assert again.complete() == 4 and ev.stats().done == 4
    assert ev.reset() == 10
    stats = ev.stats()
    assert stats.pending == 10 and stats.done == 0


def test_threads_sharing_one_event_table_reflect_it_once(ct: Any, events_table: Callable[..., Table]) -> None:
    """Many threads making the first claim through one EventTable object at once all succeed."""
    import threading

    t = events_table(200)
    ct.events(t.name, key="id").prepare()
    events = ct.events(t.name, key="id")  # a fresh object: nothing reflected yet
    barrier = threading.Barrier(16)
    got: list[Any] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            batch = events.claim(size=5, owner=f"w{i}", lease=60)
            if batch is not None:
                got.append(batch)
                batch.complete()
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert errors == []
    keys = [k for b in got for k in b.keys]
    assert len(got) == 16 and len(keys) == len(set(keys)) == 80
