"""Defects found in review of the lease-loss interrupt, each pinned by the test that showed it.

Times here are hang detectors only (several times the goal), never assertions of speed.
"""

from __future__ import annotations

import pytest
from support.live import wait_until

from controltable import ControlTable, LeaseLost

#: Hang detector for the renewer's first look at ``alive()`` (goal: one orphan-check interval).
HANG = 15.0


def holders(ct: ControlTable, resource: str) -> list[str]:
    return [e.holder for st in ct.status([resource]) for e in st.holders]


def test_release_after_renewal_stopped_on_purpose_gives_the_slot_back(ct: ControlTable) -> None:
    """``alive()`` false stops renewal and records a loss, but the rows are still live: ``release()``
    must still give them back (and then report the stop), not leave the slot held until expiry."""
    ct.set_capacity("r", 1)
    lease = ct.acquire("r", holder="a", lease=60)
    lease.start_renewing(alive=lambda: False)
    wait_until(lambda: lease.lost is not None, HANG, "the renewer to stop (a hang)")
    assert lease.lost is not None and not lease.lost.gone
    assert holders(ct, "r") == ["a"]
    with pytest.raises(LeaseLost) as info:
        lease.release()
    assert info.value is lease.lost
    assert holders(ct, "r") == [], "the slot stays held until its lease expires"
