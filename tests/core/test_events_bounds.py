"""The first call on an ``EventTable`` is bounded by the call's wait, waiting for another thread's
reflection of the same object included (issue 33, item 4; the silent-network form is in
``tests/faults/test_silent_network.py``)."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest

from controltable import DatabaseUnavailableError

#: A hang detector, far above the 0.2 s wait plus its 0.5 s statement grace.
HANG = 30.0


def test_waiting_for_another_threads_reflection_is_bounded_by_the_wait(
        ct: Any, event_table: Callable[..., Any]) -> None:
    """A thread reflecting the table on a silent network holds the object's reflection lock for up to
    one statement timeout; a ``claim(wait=0.2)`` in another thread gave up only when it was released."""
    prepared = event_table(3)
    events = ct.events(prepared.name, key="id")  # a new object: nothing reflected yet
    outcome: list[BaseException] = []
    assert events._reflect_lock.acquire()  # stands in for a reflection that does not come back
    try:
        def claim() -> None:
            try:
                events.claim(5, owner="w", wait=0.2)
            except BaseException as exc:  # recorded for the assertion below
                outcome.append(exc)

        worker = threading.Thread(target=claim, daemon=True)
        worker.start()
        worker.join(HANG)
        assert not worker.is_alive(), "hang: claim(wait=0.2) waited on another thread's reflection"
    finally:
        events._reflect_lock.release()
    assert len(outcome) == 1 and isinstance(outcome[0], DatabaseUnavailableError), outcome
    assert "another thread of this process" in str(outcome[0])
    batch = events.claim(5, owner="w", wait=0.2)  # the lock released: the claim reflects and claims
    assert batch is not None and batch.keys == [1, 2, 3]


@pytest.mark.parametrize("wait", [None, 0.0])
def test_a_first_claim_reflects_within_its_wait(ct: Any, event_table: Callable[..., Any], wait: Any) -> None:
    """A healthy database answers a reflection well within the grace even of ``wait=0``."""
    prepared = event_table(2)
    batch = ct.events(prepared.name, key="id").claim(5, owner="w", wait=wait)
    assert batch is not None and batch.keys == [1, 2]
