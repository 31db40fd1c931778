"""Background renewal of batches and work items: long work keeps its claim."""

from __future__ import annotations

import time
from typing import Any, Callable

from controltable import ControlTable


def test_batch_renews_in_background(event_table: Callable[..., Any]) -> None:
    ev = event_table(3)
    batch = ev.claim(3, owner="slow", lease=0.6)
    assert batch is not None
    batch.start_renewing()
    time.sleep(1.6)  # well past the original lease: only renewal keeps the rows
    assert ev.claim(3, owner="thief") is None
    batch.check()
    assert batch.complete() == 3
    assert batch._renewer is None


def test_work_item_renews_in_background(ct: ControlTable) -> None:
    wl = ct.worklist("renew")
    wl.populate([{"n": 1}])
    item = wl.allocate("slow", lease=0.6)
    assert item is not None
    item.start_renewing()
    time.sleep(1.6)
    assert wl.allocate("thief", lease=0.6) is None
    item.complete()
    assert wl.status().finished
