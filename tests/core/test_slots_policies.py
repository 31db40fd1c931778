"""Slot policies through the API: rate limits, priorities with aging, the grant history and its statistics."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Connection
from support.live import wait_until

from controltable import AcquireTimeout, ConfigurationError, ControlTable, GrantRecord, LeaseLost, Rate, ResourceStats
from controltable.checks import Grant, aging_violations, priority_violations, rate_violations
from controltable.clock import read_now
from controltable.slots import parse_duration, parse_rate


def test_set_capacity_keeps_sets_and_clears_policies(ct: ControlTable) -> None:
    ct.set_capacity("api", 5, rate=(100, 60), aging=30)
    (st,) = ct.status(["api"])
    assert st.rate == Rate(100, 60.0) and st.aging == 30.0
    ct.set_capacity("api", 6)  # policies left out are kept
    (st,) = ct.status(["api"])
    assert st.capacity == 6 and st.rate == Rate(100, 60.0) and st.aging == 30.0
    ct.set_capacity("api", 6, rate=Rate(10, 1.5))
    assert ct.status(["api"])[0].rate == Rate(10, 1.5) and ct.status(["api"])[0].aging == 30.0
    ct.set_capacity("api", 6, rate=None, aging=None)
    (st,) = ct.status(["api"])
    assert st.rate is None and st.aging is None


@pytest.mark.parametrize("rate", [(0, 60), (5, 0), (5, -1), (5, float("inf")), "100/60", (1, 2, 3)])
def test_bad_rates_are_refused(ct: ControlTable, rate: object) -> None:
    with pytest.raises(ConfigurationError):
        ct.set_capacity("api", 1, rate=rate)  # type: ignore[arg-type]


def test_bad_priorities_and_aging_are_refused(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    with pytest.raises(ConfigurationError):
        ct.try_acquire("r", holder="h", priority=2**31)
    with pytest.raises(ConfigurationError):
        ct.acquire("r", holder="h", priority="high", timeout=0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ct.set_capacity("r", 1, aging=0)


def test_parse_rate_and_duration() -> None:
    assert parse_rate("100/60s") == Rate(100, 60.0) and parse_rate("10/1m") == Rate(10, 60.0)
    assert parse_rate("5/2") == Rate(5, 2.0) and parse_duration("1h") == 3600.0
    for bad in ("100", "x/60s", "5/abc", "0/60s"):
        with pytest.raises(ConfigurationError):
            parse_rate(bad)


def test_higher_priority_is_granted_first_equal_ones_in_fifo_order(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    first = ct.acquire("r", holder="holder", timeout=0)
    for holder, priority in (("low-1", 0), ("high-1", 5), ("mid", 2), ("high-2", 5), ("low-2", 0)):
        assert ct.try_acquire("r", holder=holder, priority=priority) is None
    (st,) = ct.status(["r"])
    assert [w.holder for w in st.waiters] == ["high-1", "high-2", "mid", "low-1", "low-2"]
    assert st.waiters[2].ahead == ["holder", "high-1", "high-2"] and st.waiters[2].priority == 2
    assert ct.wait_info("r", "mid").ahead == ["holder", "high-1", "high-2"]  # type: ignore[union-attr]
    order = []
    current = first
    for _ in range(5):
        current.release()
        (st,) = ct.status(["r"])
        (holder,) = st.holders
        nxt = ct.try_acquire("r", holder=holder.holder, priority=holder.priority)
        assert nxt is not None
        order.append(nxt.holder)
        current = nxt
    current.release()
    assert order == ["high-1", "high-2", "mid", "low-1", "low-2"]
    records = ct.history("r")
    assert [r.holder for r in records][:5] == ["low-2", "low-1", "mid", "high-2", "high-1"]
    assert priority_violations([Grant.from_record(r) for r in records]) == []


def test_aging_raises_a_waiter_above_newer_higher_priorities(ct: ControlTable) -> None:
    ct.set_capacity("r", 1, aging=0.5)
    holder = ct.acquire("r", holder="holder", timeout=0)
    assert ct.try_acquire("r", holder="old-low") is None
    time.sleep(1.6)  # three aging steps and more: effective priority above 3
    assert ct.try_acquire("r", holder="new-high", priority=3) is None
    (st,) = ct.status(["r"])
    assert [w.holder for w in st.waiters] == ["old-low", "new-high"]
    # Both age at the same rate, so the older one stays ahead however late this status is read
    # (a bound such as "new-high below 3.5" held only if the status came within 0.25 s).
    old_low, new_high = (w.effective_priority for w in st.waiters)
    assert old_low > 3.0 and 3.0 <= new_high < old_low
    holder.release()
    got = ct.try_acquire("r", holder="old-low")
    assert got is not None
    got.release()
    holder = ct.try_acquire("r", holder="new-high", priority=3)  # granted on its behalf meanwhile
    assert holder is not None
    # Turning aging off reorders the queue by plain priority at once.
    assert ct.try_acquire("r", holder="a-low") is None
    time.sleep(1.2)
    assert ct.try_acquire("r", holder="b-high", priority=1) is None
    assert [w.holder for w in ct.status(["r"])[0].waiters] == ["a-low", "b-high"]
    ct.set_capacity("r", 1, aging=None)
    assert [w.holder for w in ct.status(["r"])[0].waiters] == ["b-high", "a-low"]
    holder.release()
    got = ct.try_acquire("r", holder="b-high", priority=1)
    assert got is not None
    got.release()
    ct.release("r", "a-low")


def test_rate_limit_holds_the_head_and_grants_when_the_window_opens(ct: ControlTable) -> None:
    # A window far longer than the test while the head is held back: what follows does not hang on how
    # fast a loaded machine made the three grants.
    ct.set_capacity("api", 5, rate=(3, 600.0))
    for i in range(3):
        ct.acquire("api", holder=f"h{i}", timeout=0).release()
    assert ct.try_acquire("api", holder="next") is None  # capacity free, budget spent
    # Nobody overtakes the head, whatever its priority...
    assert ct.try_acquire("api", holder="later") is None
    with pytest.raises(AcquireTimeout):
        ct.acquire("api", holder="impatient", timeout=0.2)
    # ...and a waiting acquire is granted when the window opens, without anybody else acting. The window
    # is shortened to end 3 s from now on the database clock, however long the steps above took (the
    # three statements before the status must run in that time: a loaded run took 1.7 s for eight).
    first = min(r.granted_at.timestamp() for r in ct.history("api"))
    window = ct.now() - first + 3.0
    ct.set_capacity("api", 5, rate=(3, window))
    before = ct.now()
    (st,) = ct.status(["api"])
    after = ct.now()
    opens = first + window  # when the first grant leaves the window
    assert st.rate_opens_in is not None and opens - after - 0.01 <= st.rate_opens_in <= opens - before + 0.01
    lease = ct.acquire("api", holder="next", timeout=30)  # 30 s (10x the wait): the hang detector
    granted = {r.holder: r.granted_at.timestamp() for r in ct.history("api")}
    assert granted["next"] >= opens - 0.01, "granted before the window opened (the database's record)"
    lease.release()
    (st,) = ct.status(["api"])
    assert st.rate_opens_in is None or st.rate_opens_in <= window
    ct.set_capacity("unrated", 1)
    assert ct.status(["unrated"])[0].rate_opens_in is None
    times = sorted(r.granted_at.timestamp() for r in ct.history("api"))
    assert len(times) in (4, 5) and times[3] - times[0] >= window - 0.01  # "later" may share the opening
    grants = [Grant.from_record(r) for r in ct.history("api")]
    assert rate_violations(grants, {"api": (3, window - 0.01)}) == []
    assert rate_violations(grants, {"api": (3, 60.0)}) != []  # the check can fail
    ct.release("api", "later")


def test_history_records_release_and_expiry(ct: ControlTable) -> None:
    ct.set_capacity("r", 2)
    kept = ct.acquire("r", holder="kept", timeout=0)
    released = ct.acquire("r", holder="released", slots=1, mode="shared", timeout=0, priority=3)
    released.release()
    dying = ct.acquire("r", holder="dying", lease=0.3, timeout=0)
    time.sleep(0.6)
    assert ct.reap() >= 1
    with pytest.raises(LeaseLost):
        dying.release()
    records = {r.holder: r for r in ct.history("r")}
    assert records["kept"].outcome == "held" and records["kept"].ended_at is None
    assert records["released"].outcome == "released" and records["released"].priority == 3
    assert records["dying"].outcome == "expired" and records["dying"].ended_at is not None
    # Every grant here was immediate: queued and granted at the same database time, so no wait.
    assert isinstance(records["kept"], GrantRecord) and records["kept"].wait_seconds == 0.0
    assert records["released"].wait_seconds == 0.0 and records["dying"].wait_seconds == 0.0
    assert records["kept"].token == kept.token
    assert ct.history("r", limit=1)[0].holder == "dying"  # newest first
    (stats,) = ct.stats(["r"], window=60)
    assert isinstance(stats, ResourceStats)
    assert stats.grants == 3 and stats.expired == 1 and stats.capacity == 2
    assert (stats.wait_p50, stats.wait_max) == (0.0, 0.0)
    assert stats.utilisation is not None and 0 < stats.utilisation <= 1
    assert stats.grants_per_hour == pytest.approx(3 * 60, rel=1e-6)
    series = ct.stats_series("r", window=60, buckets=6)
    assert len(series) == 6 and series[0].start < series[-1].start and sum(s.grants for s in series) == 3
    # Pruning keeps what is held; what ended goes once old enough.
    assert ct.prune_history(3600) == 0
    assert ct.prune_history(0) == 2
    assert [r.holder for r in ct.history("r")] == ["kept"]
    kept.release()
    assert ct.delete_resource("r")
    assert ct.history("r") == []


def test_every_attempt_keeps_its_history_row(ct: ControlTable) -> None:
    # A cleared run re-acquires with a new token while the first attempt's grant is held: the first
    # token's row ends (superseded) and the new token gets its own row; nothing is overwritten.
    ct.set_capacity("r", 1)
    first = ct.acquire("r", holder="task", attempt=1, timeout=0)
    second = ct.acquire("r", holder="task", attempt=2, timeout=0)
    assert second.token > first.token
    second.release()
    new, old = ct.history("r")
    assert (old.token, old.outcome) == (first.token, "superseded") and old.ended_at is not None
    assert (new.token, new.outcome) == (second.token, "released") and new.ended_at is not None
    assert old.ended_at <= new.granted_at and new.wait_seconds == 0.0, "the new attempt was granted at once"


def blocked_behind(probe: Connection, holder: Connection, namespace: str) -> bool:
    """Whether a session of this test's namespace waits on a lock the ``holder`` connection holds."""
    if probe.dialect.name == "mysql":
        # PyMySQL sends its parameters inlined, so the waiting statement's text names the namespace.
        found = probe.scalar(text("SELECT count(*) FROM information_schema.innodb_trx "
                                  "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern"),
                             {"pattern": f"%{namespace}%"})
    else:
        pid = holder.scalar(text("SELECT pg_backend_pid()"))
        found = probe.scalar(text("SELECT count(*) FROM pg_stat_activity "
                                  "WHERE wait_event_type = 'Lock' AND :pid = ANY(pg_blocking_pids(pid))"), {"pid": pid})
    probe.rollback()  # a fresh snapshot of the server's tables at each look
    return bool(found)


def test_policy_checks_detect_violations() -> None:
    # A low-priority grant while a higher one waited.
    g = [Grant("r", "low", 0, 0.0, 5.0), Grant("r", "high", 5, 1.0, 6.0)]
    assert priority_violations(g) != []
    # With aging 0.1 s/step, at t=5 the low one is at 0 + 50 and the high one at 5 + 40: fine.
    assert priority_violations(g, {"r": 0.1}) == []
    assert aging_violations(g, {"r": 0.1}, max_priority=5, slack=5.0) == []
    assert aging_violations(g, {"r": 0.1}, max_priority=5, slack=0.0) != []


@pytest.mark.backends("postgres", "mysql")
def test_a_request_that_waited_for_the_resource_lock_is_stamped_after_the_lock(ct: ControlTable,
                                                                                backend_url: str) -> None:
    """The database time of a slot transaction is read once its locks are held.

    Every backend's clock is taken when a statement starts, so a time read with the row lock
    would come from before the lock wait: a request that waited behind a grant would be stamped
    as enqueued before that grant, ahead of requests that were queued while it waited (its queue
    key too early) and, in the history, as passed over by the grant it waited for.
    """
    ct.set_capacity("r", 1)
    assert ct.try_acquire("r", holder="first") is not None
    r = ct.tables.resource
    engine = create_engine(backend_url)
    try:
        with engine.connect() as conn, engine.connect() as probe:
            tx = conn.begin()
            conn.execute(select(r.c.name).where(r.c.namespace == ct.namespace, r.c.name == "r").with_for_update())
            waiter = threading.Thread(target=lambda: ct.try_acquire("r", holder="second"))
            waiter.start()
            # Released only once the server shows the waiter blocked on the row lock held here (else
            # it could start its statement after the release, and the test would prove nothing).
            wait_until(lambda: blocked_behind(probe, conn, ct.namespace), 60,
                       "the waiter's transaction to block on the resource row's lock")
            assert waiter.is_alive()
            released = read_now(conn)
            tx.commit()
        waiter.join(timeout=30)
    finally:
        engine.dispose()
    info = ct.wait_info("r", "second")
    assert info is not None and info.waiting_since is not None
    assert info.waiting_since.timestamp() >= released - 0.05, (
        f"enqueued {released - info.waiting_since.timestamp():.3f} s before the lock it waited for was released")
