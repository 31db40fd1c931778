"""Background renewal of batches and work items: long work keeps its claim."""

from __future__ import annotations

import time
from typing import Any, Callable

from controltable import ControlTable

#: Renewed every third of it (0.5 s), so one renewal may come up to 1 s late before the lease runs
#: out: a CI run on a loaded machine saw a 0.6 s lease run out between two renewals (the batch then
#: rightly counted as lost).
LEASE = 1.5
#: Well past the original lease: only renewal keeps the rows.
PAST_THE_LEASE = 2.5 * LEASE
#: Rounding of stored times against the database clock read apart (not machine speed).
CLOCK_SLACK = 0.01


def test_batch_renews_in_background(ct: ControlTable, event_table: Callable[..., Any]) -> None:
    ev = event_table(3)
    batch = ev.claim(3, owner="slow", lease=LEASE)
    assert batch is not None
    claimed_until = batch.expires_at.timestamp()
    batch.start_renewing()
    time.sleep(PAST_THE_LEASE)
    refused_at = ct.now()
    assert refused_at > claimed_until, "the sleep outlasted the claim's first lease"
    assert ev.claim(3, owner="thief") is None
    batch.check()
    assert batch.complete() == 3
    # The renewals reached the database: the claim ran past the moment the thief was refused, and
    # each renewal extends it by one lease from when it was made, no further.
    renewed_until = batch.expires_at.timestamp()
    assert refused_at <= renewed_until <= ct.now() + LEASE + CLOCK_SLACK, (refused_at, renewed_until)
    # Completing stopped the renewal: nothing touches the finished batch's claim any more.
    time.sleep(LEASE + 0.2)  # three renewal intervals (a third of the lease each) and more
    assert batch.expires_at.timestamp() == renewed_until and batch.lost is None


def test_work_item_renews_in_background(ct: ControlTable) -> None:
    wl = ct.worklist("renew")
    wl.populate([{"n": 1}])
    item = wl.allocate("slow", lease=LEASE)
    assert item is not None
    allocated_until = item.expires_at.timestamp()
    item.start_renewing()
    time.sleep(PAST_THE_LEASE)
    refused_at = ct.now()
    assert refused_at > allocated_until, "the sleep outlasted the item's first lease"
    assert wl.allocate("thief", lease=LEASE) is None
    item.complete()
    assert wl.status().finished
    renewed_until = item.expires_at.timestamp()
    assert refused_at <= renewed_until <= ct.now() + LEASE + CLOCK_SLACK, (refused_at, renewed_until)
    time.sleep(LEASE + 0.2)
    assert item.expires_at.timestamp() == renewed_until and item.lost is None
