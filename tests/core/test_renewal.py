"""Background renewal of batches and work items: long work keeps its claim."""

from __future__ import annotations

from typing import Any, Callable

from support.event_tables import wait_past

from controltable import ControlTable

#: The lease is a hang detector for the renewer: renewed every RENEW_EVERY s, a renewal may come
#: nearly 5 s late before the lease runs out (a CI run on a loaded machine saw a 0.6 s lease run out
#: between two renewals, and a 3 s one renewed every second failed once beside two CPU hogs).
LEASE = 5.0
RENEW_EVERY = 0.25
#: Rounding of stored times against the database clock read apart (not machine speed).
CLOCK_SLACK = 0.01


def test_batch_renews_in_background(ct: ControlTable, event_table: Callable[..., Any]) -> None:
    ev = event_table(3)
    batch = ev.claim(3, owner="slow", lease=LEASE)
    assert batch is not None
    claimed_until = batch.expires_at.timestamp()
    batch.start_renewing(RENEW_EVERY)
    wait_past(ct, claimed_until)  # by the database clock: only renewal keeps the rows now
    refused_at = ct.now()
    assert ev.claim(3, owner="thief") is None
    batch.check()
    renewer = batch._renewer
    assert renewer is not None
    assert batch.complete() == 3
    # The renewals reached the database: the claim ran past the moment the thief was refused, and
    # each renewal extends it by one lease from when it was made, no further.
    renewed_until = batch.expires_at.timestamp()
    assert refused_at <= renewed_until <= ct.now() + LEASE + CLOCK_SLACK, (refused_at, renewed_until)
    # Completing stopped the renewal (its thread has ended: nothing can touch the finished claim).
    assert batch._renewer is None and not renewer.is_alive()
    assert batch.expires_at.timestamp() == renewed_until and batch.lost is None


def test_work_item_renews_in_background(ct: ControlTable) -> None:
    wl = ct.worklist("renew")
    wl.populate([{"n": 1}])
    item = wl.allocate("slow", lease=LEASE)
    assert item is not None
    allocated_until = item.expires_at.timestamp()
    item.start_renewing(RENEW_EVERY)
    wait_past(ct, allocated_until)
    refused_at = ct.now()
    assert wl.allocate("thief", lease=LEASE) is None
    renewer = item._renewer
    assert renewer is not None
    item.complete()
    assert wl.status().finished
    renewed_until = item.expires_at.timestamp()
    assert refused_at <= renewed_until <= ct.now() + LEASE + CLOCK_SLACK, (refused_at, renewed_until)
    assert item._renewer is None and not renewer.is_alive()
    assert item.expires_at.timestamp() == renewed_until and item.lost is None
