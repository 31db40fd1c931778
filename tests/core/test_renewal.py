"""Background renewal of batches and work items: long work keeps its claim."""

from __future__ import annotations

from typing import Any, Callable

from support.live import wait_until

from controltable import ControlTable

#: Renewal proved by cause, not by outliving a short lease: the claim's expiry moves forward while
#: the test does not renew, so the background renewer did it, and another worker is refused. Loaded
#: runs lost 0.6 s, 3 s and (renewed every 0.25 s) 5 s leases when renewals came late beside two CPU
#: hogs: the product keeping its word, not a defect. A 30 s lease is never outlived here.
LEASE = 30.0
RENEW_EVERY = 0.25
#: A hang detector for the first renewal (asked for every RENEW_EVERY s).
RENEWAL_HANG = 120
#: Rounding of stored times against the database clock read apart (not machine speed).
CLOCK_SLACK = 0.01


def test_batch_renews_in_background(ct: ControlTable, event_table: Callable[..., Any]) -> None:
    ev = event_table(3)
    batch = ev.claim(3, owner="slow", lease=LEASE)
    assert batch is not None
    claimed_until = batch.expires_at.timestamp()
    batch.start_renewing(RENEW_EVERY)
    wait_until(lambda: batch.expires_at.timestamp() > claimed_until, RENEWAL_HANG,
               "a background renewal (hang detector)", interval=0.05)
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
    wait_until(lambda: item.expires_at.timestamp() > allocated_until, RENEWAL_HANG,
               "a background renewal (hang detector)", interval=0.05)
    # The database's own record moved too (not only the object's view of it).
    assert wl.get(item.id).expires_at.timestamp() > allocated_until
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
