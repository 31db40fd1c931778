"""Issue 33, hole 2: releasing a grant that was released already is a no-op; a lost one still says how.

An idempotent ``try_acquire`` (a sensor asking again, a retried task) hands out the same grant as
several :class:`Lease` objects. Releasing the second used to raise ``LeaseLost`` "had already
expired and been reaped", which was not what happened. The grant history says how each grant
ended: a second release of a released grant returns quietly, and one that was reaped or taken
over by a newer attempt still raises ``LeaseLost`` naming that.
"""

from __future__ import annotations

import pytest
from support.live import wait_until

from controltable import ControlTable, LeaseLost

EXPIRY_HANG = 30.0


def _holders(ct: ControlTable, name: str = "r") -> list[str]:
    (st,) = ct.status([name])
    return [h.holder for h in st.holders]


def test_releasing_a_grant_handed_out_twice_releases_it_once_and_then_does_nothing(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    first = ct.try_acquire("r", holder="sensor")
    again = ct.try_acquire("r", holder="sensor")
    assert first is not None and again is not None and again.token == first.token, "the same grant twice"
    first.release()
    assert _holders(ct) == []
    again.release()  # before: LeaseLost "had already expired and been reaped"
    with ct.try_acquire("r", holder="sensor") as third:  # a context manager's exit releases once more
        assert third.token > first.token
        fourth = ct.try_acquire("r", holder="sensor")
        assert fourth is not None and fourth.token == third.token
    fourth.release()
    assert _holders(ct) == []


def test_releasing_a_multi_resource_grant_twice_is_a_no_op(ct: ControlTable) -> None:
    ct.set_capacity("a", 1)
    ct.set_capacity("b", 1)
    first = ct.try_acquire({"a": 1, "b": 1}, holder="job")
    again = ct.try_acquire({"a": 1, "b": 1}, holder="job")
    assert first is not None and again is not None and again.tokens == first.tokens
    again.release()
    first.release()
    assert _holders(ct, "a") == [] and _holders(ct, "b") == []


def test_a_grant_that_was_reaped_still_reports_lease_lost(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    lease = ct.try_acquire("r", holder="slow", lease=1)
    assert lease is not None
    wait_until(lambda: all(h.expired for st in ct.status(["r"]) for h in st.holders), EXPIRY_HANG,
               "the lease to expire (a hang)")
    assert ct.reap() == 1
    with pytest.raises(LeaseLost, match="expired and been reaped"):
        lease.release()


def test_a_grant_taken_over_by_a_newer_attempt_reports_lease_lost_saying_so(ct: ControlTable) -> None:
    ct.set_capacity("r", 1)
    old = ct.try_acquire("r", holder="task", attempt=1)
    new = ct.try_acquire("r", holder="task", attempt=2)
    assert old is not None and new is not None and new.token > old.token
    new.release()
    with pytest.raises(LeaseLost, match="taken over by a newer attempt"):
        old.release()


@pytest.mark.parametrize("parts", ["r", {"a": 1, "b": 1}], ids=["one", "two"])
def test_an_older_attempts_release_leaves_the_newer_attempts_grant_held(ct: ControlTable, parts: object) -> None:
    """A newer attempt takes the grant over in place (same request key, new tokens): the older
    Lease's release must not free it (before: the rows went, the next waiter was granted while
    attempt 2 still worked, and attempt 2's renew said "expired and was reaped")."""
    names = ["r"] if parts == "r" else ["a", "b"]
    for name in names:
        ct.set_capacity(name, 1)
    old = ct.try_acquire(parts, holder="task", attempt=1)  # type: ignore[arg-type]
    new = ct.try_acquire(parts, holder="task", attempt=2)  # type: ignore[arg-type]
    assert old is not None and new is not None and new.tokens != old.tokens
    with pytest.raises(LeaseLost, match="taken over by a newer attempt"):
        old.release()
    for name in names:
        assert _holders(ct, name) == ["task"], f"attempt 2 still holds {name!r}"
    assert ct.try_acquire(parts, holder="other") is None, "nobody else is granted while attempt 2 holds"  # type: ignore[arg-type]
    new.renew()
    new.release()
    got = ct.try_acquire(parts, holder="other")  # type: ignore[arg-type]
    assert got is not None and all(got.tokens[n] > new.tokens[n] for n in names)
    got.release()


@pytest.mark.parametrize("parts", ["r", {"a": 1, "b": 1}], ids=["one", "two"])
def test_an_older_attempts_renew_and_look_leave_the_newer_attempts_grant_alone(ct: ControlTable, parts: object) -> None:
    """A newer attempt takes the grant over in place (same request key, new tokens): the older
    Lease's renew must neither extend nor remove the newer attempt's rows, and must raise LeaseLost
    saying it was taken over; its is_held()/check() must not call the newer grant its own (before:
    renew matched by request key alone, extended attempt 2's rows and returned, is_held() said True)."""
    names = ["r"] if parts == "r" else ["a", "b"]
    for name in names:
        ct.set_capacity(name, 1)
    old = ct.try_acquire(parts, holder="task", attempt=1, lease=60)  # type: ignore[arg-type]
    new = ct.try_acquire(parts, holder="task", attempt=2, lease=60)  # type: ignore[arg-type]
    assert old is not None and new is not None and new.tokens != old.tokens
    assert not old.is_held(), "the older attempt's lease is not held: its rows are attempt 2's now"
    with pytest.raises(LeaseLost, match="no longer held"):
        old.check()
    assert new.is_held()
    before = new.expires_at
    with pytest.raises(LeaseLost, match="taken over by a newer attempt"):
        old.renew(3600)  # an hour: an extension of attempt 2's rows would show in its expiry
    for st in ct.status(names):
        assert [(h.holder, h.token, h.expires_at) for h in st.holders] == [("task", new.tokens[st.name], before)], (
            f"attempt 2 still holds {st.name!r} alone, its expiry unchanged")
    assert new.is_held()
    assert new.renew(120).expires_at > before, "the newer attempt renews its own rows"
    assert new.is_held()
    new.release()
    assert ct.try_acquire(parts, holder="other") is not None  # type: ignore[arg-type]
