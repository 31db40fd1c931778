"""Slot API for adapters: shared default, attempts, wait information, scope withdrawal, wake-up listeners."""

from __future__ import annotations

import threading
import time

import pytest
from support.live import wait_until

from controltable import AcquireTimeout, ConfigurationError, ControlTable, LeaseLost
from controltable.defaults import DEFAULT_MODE


def test_shared_slot_is_the_default(ct: ControlTable) -> None:
    assert DEFAULT_MODE == "shared"
    ct.set_capacity("warehouse", 3)
    leases = [ct.acquire("warehouse", holder=f"h{i}", timeout=0) for i in range(3)]
    assert all(lease.mode == "shared" for lease in leases)
    assert ct.try_acquire("warehouse", holder="fourth") is None  # full: three holders
    with pytest.raises(AcquireTimeout):
        ct.acquire("warehouse", holder="fifth", timeout=0)
    (st,) = ct.status(["warehouse"])
    assert st.used == 3 and [w.holder for w in st.waiters] == ["fourth"]
    for lease in leases:
        lease.release()
    fourth = ct.try_acquire("warehouse", holder="fourth")
    assert fourth is not None
    with ct.slot("warehouse", holder="in-block") as lease:
        assert lease.mode == "shared"
    fourth.release()


def test_same_attempt_is_the_same_grant(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    first = ct.acquire("w", holder="task", attempt=1, timeout=0)
    again = ct.acquire("w", holder="task", attempt=1, timeout=0)
    unspecified = ct.acquire("w", holder="task", timeout=0)
    assert first.token == again.token == unspecified.token
    assert first.attempt == again.attempt == unspecified.attempt == 1
    first.release()


def test_higher_attempt_gets_a_new_token_in_place(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    first = ct.acquire("w", holder="task", attempt=1, timeout=0)
    assert ct.try_acquire("w", holder="behind") is None
    retry = ct.acquire("w", holder="task", attempt=2, timeout=0)  # not queued behind itself or "behind"
    assert retry.token > first.token and retry.attempt == 2
    assert retry.request_key == first.request_key and retry.ticket == first.ticket
    assert retry.is_held()
    with pytest.raises(LeaseLost, match="superseded by attempt 2"):
        ct.acquire("w", holder="task", attempt=1, timeout=0)
    with pytest.raises(LeaseLost, match="superseded by attempt 2"):
        ct.try_acquire("w", holder="task", attempt=1)
    (st,) = ct.status(["w"])
    assert [(h.holder, h.token) for h in st.holders] == [("task", retry.token)]
    retry.release()
    behind = ct.try_acquire("w", holder="behind")
    assert behind is not None and behind.token > retry.token
    behind.release()


def test_higher_attempt_of_a_waiter_keeps_its_place(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    holder = ct.acquire("w", holder="holder", timeout=0)
    assert ct.try_acquire("w", holder="first", attempt=1) is None
    assert ct.try_acquire("w", holder="second") is None
    assert ct.try_acquire("w", holder="first", attempt=2) is None
    info = ct.wait_info("w", "first")
    assert info is not None and info.position == 1
    with pytest.raises(LeaseLost):
        ct.try_acquire("w", holder="first", attempt=1)
    holder.release()
    got = ct.try_acquire("w", holder="first", attempt=2)
    assert got is not None and got.attempt == 2
    assert ct.try_acquire("w", holder="second") is None
    got.release()


def test_attempt_is_checked(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    for bad in (-1, "2", 1.5, True, 2**40):
        with pytest.raises(ConfigurationError, match="attempt"):
            ct.acquire("w", holder="h", attempt=bad, timeout=0)  # type: ignore[arg-type]


def test_wait_info(ct: ControlTable) -> None:
    ct.set_capacity("w", 2)
    a = ct.acquire("w", holder="a", timeout=0)
    x = ct.acquire("w", holder="x", mode="shared", slots=1, timeout=0)
    assert ct.try_acquire("w", holder="big", slots=2) is None
    assert ct.try_acquire("w", holder="small") is None
    assert ct.wait_info("w", "nobody") is None
    held = ct.wait_info("w", "a")
    assert held is not None and held.state == "granted" and held.position == 0 and held.token == a.token
    big = ct.wait_info("w", "big")
    assert big is not None and big.state == "waiting" and big.position == 1 and big.token is None
    assert sorted(big.ahead) == ["a", "x"]
    small = ct.wait_info("w", "small")
    assert small is not None and small.position == 2
    assert sorted(small.ahead[:2]) == ["a", "x"] and small.ahead[2:] == ["big"]
    assert small.waiting_since is not None and big.waiting_since is not None
    assert small.waiting_since >= big.waiting_since
    a.release()
    x.release()


def test_release_holders_by_prefix(ct: ControlTable) -> None:
    ct.set_capacity("w", 2)
    ct.set_capacity("v", 1)
    ct.acquire("w", holder="run_1/a", timeout=0)
    ct.acquire("v", holder="run_1/b", timeout=0)
    ct.acquire("w", holder="run_10/a", timeout=0)  # "run_1" would match this without the "/"
    assert ct.try_acquire("w", holder="run_1/waiting") is None
    assert ct.try_acquire("w", holder="runX1/c") is None  # "_" is a literal, not a wildcard
    assert ct.release_holders("run_1/") == 3
    assert ct.release_holders("run_1/") == 0
    assert ct.release_holders("%") == 0  # literal too
    (v, w) = ct.status(["v", "w"])
    assert v.holders == [] and [h.holder for h in w.holders] == ["run_10/a", "runX1/c"] or (
        [h.holder for h in w.holders] == ["run_10/a"] and [x.holder for x in w.waiters] == ["runX1/c"]
    )
    # The withdrawn capacity goes to whoever can run.
    assert ct.try_acquire("w", holder="runX1/c") is not None
    with pytest.raises(ConfigurationError):
        ct.release_holders("")


def test_release_holders_matches_the_prefix_literally_and_by_case(ct: ControlTable) -> None:
    """Every character of a prefix is itself: SQL Server's ``[1]`` (a class) and SQLite's LIKE,
    which ignores ASCII case, would release holders the prefix does not name."""
    ct.set_capacity("w", 20)
    holders = ["job[1]a", "job1a", "ETL x", "etl y", "a*b", "a?b", "axb", "a%b", "a_b", "a/b", "a[b"]
    for holder in holders:
        assert ct.try_acquire("w", holder=holder) is not None
    for prefix, released in [("job[1]", "job[1]a"), ("ETL", "ETL x"), ("a*", "a*b"), ("a?", "a?b"),
                             ("a%", "a%b"), ("a_", "a_b"), ("a/", "a/b"), ("a[", "a[b")]:
        assert ct.release_holders(prefix) == 1, prefix
        holders.remove(released)
        assert sorted(h.holder for h in ct.status(["w"])[0].holders) == sorted(holders), prefix


@pytest.mark.parametrize("dialect", ["mssql", "oracle", "postgresql", "mysql", "sqlite"])
def test_release_holders_prefix_is_escaped_for_each_dialect(dialect: str) -> None:
    """Compiled, for the servers not run here: ``[`` is escaped on SQL Server only (Oracle refuses
    an escape before anything but ``%``, ``_`` and the escape character, ORA-01424)."""
    from sqlalchemy import select

    from controltable.dialects import offline_dialect
    from controltable.schema import build_schema
    from controltable.slots.statements import SlotStatements

    t = build_schema()
    compiled = select(t.request.c.id).where(SlotStatements(t, "ns").prefix_match("job[1]_%/")).compile(
        dialect=offline_dialect(dialect, (16,) if dialect == "mssql" else (19,)))
    (pattern,) = [v for v in compiled.params.values() if v != "ns"]
    if dialect == "sqlite":  # GLOB: exact case; *, ? and [ as one-character classes
        assert pattern == "job[[]1]_%/*" and " GLOB " in str(compiled)
    else:
        assert pattern.startswith("job/[1]" if dialect == "mssql" else "job[1]/_/%//")
        assert " LIKE " in str(compiled) and "ESCAPE '/'" in str(compiled)


def test_wakeup_keys(ct: ControlTable) -> None:
    keys = ct.wakeup_keys({"b": 1, "a": 2}, holder="h")
    assert keys and all(isinstance(k, str) for k in keys)
    assert ct.wakeup_keys("a") != ct.wakeup_keys("b")
    assert ct.wakeup_keys("a", holder="h1") != ct.wakeup_keys("a", holder="h2")
    events = ct.events("some_table", key="id")
    assert events.wakeup_keys() == [events.wakeup_key]


@pytest.mark.backends("sqlite", "mysql")
def test_no_push_without_postgres(ct: ControlTable) -> None:
    assert ct.push_active is False
    start = time.monotonic()
    assert ct.wait_for_wakeup(ct.wakeup_keys("a"), 0.2) is False
    assert time.monotonic() - start >= 0.15
    remove = ct.add_wakeup_listener(ct.wakeup_keys("a"), lambda: None)
    remove()


@pytest.mark.backends("postgres")
def test_wakeup_listener_called_on_grant(ct: ControlTable, backend_url: str) -> None:
    other = ControlTable(backend_url, namespace=ct.namespace)
    try:
        ct.set_capacity("w", 1)
        holder = other.acquire("w", holder="holder", timeout=0)
        assert ct.try_acquire("w", holder="waiter", pickup=60) is None
        woken = threading.Event()
        calls: list[int] = []

        def callback() -> None:
            calls.append(1)
            woken.set()

        remove = ct.add_wakeup_listener(ct.wakeup_keys("w", holder="waiter"), callback)
        wait_until(lambda: ct.push_active, 30, "the listener to be up (push active)", interval=0.05)
        holder.release()
        assert woken.wait(10), "no wake-up arrived for the waiter"
        got = ct.try_acquire("w", holder="waiter", pickup=60)
        assert got is not None
        remove()
        before = len(calls)
        got.release()
        time.sleep(0.5)
        assert len(calls) == before  # removed: no more calls

        # wait_for_wakeup: woken when another process's release grants a waiter, long before its timeout.
        keys = ct.wakeup_keys("w")
        lease = other.acquire("w", holder="again", timeout=0)
        assert ct.try_acquire("w", holder="third") is None
        threading.Timer(0.3, lease.release).start()
        start = time.monotonic()
        assert ct.wait_for_wakeup(keys, 20) is True
        assert time.monotonic() - start < 15
    finally:
        other.close()


def test_release_of_an_expired_unreaped_lease_is_lost(ct: ControlTable) -> None:
    ct.set_capacity("w", 1)
    lease = ct.acquire("w", holder="h", timeout=0, lease=0.3)
    time.sleep(0.6)  # expired, and nobody touched the queue since: not reaped
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(LeaseLost, match="had expired"):
        lease.release()
    (st,) = ct.status(["w"])
    assert st.holders == []  # the expired row is gone all the same
    ct.acquire("w", holder="next", timeout=0).release()


def _commit_twice(ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every transaction run, commit, and run again: a retry after a lost COMMIT reply."""
    original = ct.db.run
    calls: list[int] = []

    def run(fn, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        original(fn, **kw)
        return original(fn, **kw)

    monkeypatch.setattr(ct.db, "run", run)
    return calls


def test_release_retried_after_lost_commit_reply_succeeds(ct: ControlTable, monkeypatch: pytest.MonkeyPatch) -> None:
    ct.set_capacity("w", 1)
    lease = ct.acquire("w", holder="h", timeout=0)
    calls = _commit_twice(ct, monkeypatch)
    lease.release()  # the retry finds nothing to delete, and must not report LeaseLost
    assert calls
    monkeypatch.undo()
    (st,) = ct.status(["w"])
    assert st.holders == [] and st.waiters == []


def test_acquire_retried_after_lost_commit_reply_enqueues_once(
    ct: ControlTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    ct.set_capacity("w", 1)
    _commit_twice(ct, monkeypatch)
    first = ct.acquire("w", holder="granted", timeout=0)
    assert ct.try_acquire("w", holder="waiter") is None
    monkeypatch.undo()
    (st,) = ct.status(["w"])
    assert [(h.holder, h.token) for h in st.holders] == [("granted", first.token)]
    assert st.last_token == first.token  # no second grant was made
    assert [w.holder for w in st.waiters] == ["waiter"]
    first.release()
    got = ct.try_acquire("w", holder="waiter")
    assert got is not None and got.token == first.token + 1
    got.release()


def test_racing_first_set_capacity_of_one_name_all_succeed(ct: ControlTable) -> None:
    """Threads creating the same resource at once: the losers of the insert race update instead."""
    import threading

    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def create(n: int) -> None:
        try:
            barrier.wait()
            ct.set_capacity("raced", n)
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(1, 9)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    (status,) = ct.status(["raced"])
    assert 1 <= status.capacity <= 8
