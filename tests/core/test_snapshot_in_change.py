"""The snapshot read by the statement that changes a queue (issue 26): equal to the one a separate
read after the change returns, held by a property test on random queues, and the same grants live."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from controltable import ControlTable
from controltable.slots.grants import after_removal, merge_entered
from controltable.slots.statements import GRANTED, WAITING

# The SQLAlchemy 1.4 run (a venv of its own) has no hypothesis; the main run has it.
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _row(i: int, resource: str, state: str, queue_key: float) -> Any:
    return SimpleNamespace(id=i, resource=resource, state=state, queue_key=queue_key, ticket=i)


def _read(table: list[Any], heads: dict[str, int]) -> list[Any]:
    """What snapshot() returns: every holder, and per queue the first n waiters by (queue_key, ticket)."""
    out = [r for r in table if r.state == GRANTED]
    for name in sorted(heads):
        waiting = sorted((r for r in table if r.resource == name and r.state == WAITING),
                         key=lambda r: (r.queue_key, r.ticket))
        out.extend(waiting[:heads[name]])
    return out


def _ids(rows: list[Any]) -> list[int]:
    return sorted(r.id for r in rows)


queues = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([GRANTED, WAITING]),
                            st.sampled_from([0.0, -1.0, -5.0, 17.5])), max_size=25)


@settings(max_examples=300, deadline=None)
@given(queues, st.sampled_from(["a", "b"]), st.sampled_from([0.0, -1.0, -5.0, 17.5, -100.0]),
       st.integers(min_value=1, max_value=5), st.integers(min_value=1, max_value=5))
def test_merging_the_entered_row_gives_what_a_later_read_returns(
    rows: list[tuple[str, str, float]], resource: str, queue_key: float, head_a: int, head_b: int
) -> None:
    table = [_row(i, r, s, q) for i, (r, s, q) in enumerate(rows)]
    heads = {"a": head_a, "b": head_b}
    new = _row(len(table), resource, WAITING, queue_key)  # the highest ticket, any queue position
    assert _ids(merge_entered(_read(table, heads), [new], heads)) == _ids(_read([*table, new], heads))


@settings(max_examples=300, deadline=None)
@given(queues, st.data())
def test_dropping_removed_holders_gives_what_a_later_read_returns(rows: list[tuple[str, str, float]],
                                                                  data: st.DataObject) -> None:
    table = [_row(i, r, s, q) for i, (r, s, q) in enumerate(rows)]
    heads = {"a": 3, "b": 2}
    removed = [r for r in table if data.draw(st.booleans())]
    merged = after_removal(_read(table, heads), removed)
    if any(r.state == WAITING for r in removed):
        assert merged is None  # a queue's head was read one short: read again
    else:
        assert merged is not None
        assert _ids(merged) == _ids(_read([r for r in table if r not in removed], heads))


def test_an_uncontended_acquire_and_release_run_four_and_two_statements_on_postgresql(backend_url: str) -> None:
    """The folded statements on the live backends: the grant, the pickup by a waiter and the
    release's pass all behave as before (the contract suites run the same path at scale)."""
    from sqlalchemy import event

    ct = ControlTable(backend_url, namespace=f"t_{uuid.uuid4().hex[:12]}")
    try:
        ct.install()
        ct.set_capacity("r", 1)
        sent: list[str] = []
        event.listen(ct.db.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        lease = ct.acquire("r", timeout=0)
        acquired = len(sent)
        lease.release()
        released = len(sent) - acquired
        if ct.db.dialect_name == "postgresql":  # lock + own rows + insert/snapshot + grant; lock + remove/snapshot
            assert (acquired, released) == (4, 2), sent
        first = ct.acquire("r", timeout=0)
        assert ct.try_acquire("r", holder="second") is None  # queued behind it
        first.release()  # the pass starts from the snapshot read by the removal: grants "second"
        second = ct.try_acquire("r", holder="second")
        assert second is not None and second.tokens["r"] > first.tokens["r"] > lease.tokens["r"]
        second.release()
        (status,) = ct.status("r")
        assert (status.used, status.holders, status.waiters) == (0, [], [])
        assert status.last_token == second.tokens["r"]
    finally:
        ct.close()
