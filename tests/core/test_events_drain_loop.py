"""complete_and_claim: a drain loop with one commit per batch, still fenced and exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

import pytest

from controltable import ControlTable, LeaseLost


def test_drain_with_complete_and_claim_in_threads(backend_url: str, ct: ControlTable, namespace: str,
                                                 event_table: Callable[..., Any]) -> None:
    t = event_table(3000)
    done: Counter[Any] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            own = ControlTable(backend_url, namespace=namespace)
            ev = own.events(t.name, key="id")
            batch = ev.claim(50, owner=f"w{i}")
            while batch is not None:
                keys = batch.keys
                batch = batch.complete_and_claim()
                with lock:
                    done.update(keys)
            own.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors
    assert len(done) == 3000 and max(done.values()) == 1
    st = ct.events(t.name, key="id").stats()
    assert (st.done, st.pending, st.claimed) == (3000, 0, 0)


def test_complete_and_claim_claims_nothing_when_the_lease_was_lost(event_table: Callable[..., Any]) -> None:
    ev = event_table(6)
    slow = ev.claim(3, owner="slow", lease=0.5)
    assert slow is not None
    time.sleep(0.8)
    ev._next_expired_check = 0.0  # look for expired claims now
    thief = ev.claim(3, owner="thief")
    assert thief is not None and thief.keys == slow.keys
    with pytest.raises(LeaseLost):
        slow.complete_and_claim()
    st = ev.stats()
    assert (st.claimed, st.pending, st.done) == (3, 3, 0), "nothing completed and nothing claimed"
    assert thief.complete_and_claim() is not None
