"""Background renewal stops when the work it covers has ended: orphaned process or owner's word.

A real parent process starts a child that holds a slot with background renewal; the parent is
SIGKILLed (as a Dagster run worker or an Airflow supervisor can be) while the child lives on.
With ``stop_when_orphaned=True`` the child's lease must run out within one lease of the kill,
on the database clock; with the default the child keeps renewing (the control case, so the test
can fail).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import pytest
from support.event_tables import wait_past
from support.live import wait_until

from controltable import ControlTable, LeaseLost

WORKER = Path(__file__).with_name("orphan_workers.py")


def _child_holder(ct: ControlTable, resource: str, holder: str) -> Optional[float]:
    """The child's lease expiry on the database clock, or None once it no longer holds."""
    for st in ct.status([resource]):
        for h in st.holders:
            if h.holder == holder and not h.expired and h.expires_at is not None:
                return h.expires_at.timestamp()
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("orphan", [True, False], ids=["stop-when-orphaned", "default-keeps-renewing"])
def test_orphaned_child_lets_its_slot_lease_expire(
    ct: ControlTable, tmp_path: Path, backend_url: str, namespace: str, orphan: bool
) -> None:
    lease = 4.0
    ct.set_capacity("gpu", 1)
    out = tmp_path / "child.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    parent = subprocess.Popen(
        [sys.executable, str(WORKER), "parent", backend_url, namespace, "gpu", "child", str(lease), str(out),
         "1" if orphan else "0"],
        env=env,
    )
    child_pid = 0
    try:
        def child_has_it() -> bool:
            assert parent.poll() is None, "the parent process died"
            return out.exists()

        wait_until(child_has_it, 60, "the child to get the slot", interval=0.05)
        info = json.loads(out.read_text())
        child_pid = int(info["pid"])
        assert info["parent"] == parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        killed_at = ct.now()  # from here on the child's getppid() has changed
        if orphan:
            last_expiry = _child_holder(ct, "gpu", "child")

            def came_back() -> Any:
                nonlocal last_expiry
                seen = _child_holder(ct, "gpu", "child")
                if seen is not None:
                    last_expiry = seen
                return ct.try_acquire("gpu", holder="next", lease=30)

            got = wait_until(came_back, lease + 60, "the orphan's slot to come back", interval=0.1)
            assert last_expiry is not None and last_expiry <= killed_at + lease + 1e-3, (
                f"the orphan renewed after its parent died: lease ran to {last_expiry - killed_at:.2f} s after the kill"
            )
            assert got.granted_at is not None
            assert _alive(child_pid), "the child must still be running: only its renewal stopped"
            got.release()
        else:
            # The default keeps renewing: past one lease after the kill the child still holds.
            wait_past(ct, killed_at + lease + 2.0)
            expiry = _child_holder(ct, "gpu", "child")
            assert expiry is not None and expiry > killed_at + lease, "the default renewer stopped"
            assert ct.try_acquire("gpu", holder="next", lease=30) is None
            ct.release("gpu", "next")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid and _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_renewal_stops_when_the_owner_says_the_work_ended(ct: ControlTable) -> None:
    wl = ct.worklist("owner-ended")
    wl.populate([{"n": 1}])
    # Renewal by cause, not by outliving a short lease: the expiry moves forward while the test does not
    # renew (loaded runs lost 3 s and 5 s leases renewed every 0.2-0.25 s when renewals came late: the
    # product keeping its word). A 30 s lease is never outlived before the owner ends the work.
    item = wl.allocate("slow", lease=30.0)
    assert item is not None
    ended = threading.Event()
    first_expiry = item.expires_at.timestamp()
    item.start_renewing(interval=0.2, alive=lambda: not ended.is_set())
    wait_until(lambda: item.expires_at.timestamp() > first_expiry, 120, "a background renewal (hang detector)",
               interval=0.05)
    assert wl.get(item.id).expires_at.timestamp() > first_expiry, "the renewal did not reach the database"
    assert wl.allocate("thief", lease=60) is None
    ended.set()
    # The renewer's verdict first, with nobody else writing: a thief polling meanwhile competed for
    # SQLite's write lock with the renewal in flight, which then came after the lease and found the
    # item taken (a loaded run: "no longer held" instead of the owner's word).
    renewer = item._renewer
    assert renewer is not None
    wait_until(lambda: renewer.stopped_because is not None or item.lost is not None, 60,
               "the renewer to stop after its owner said the work ended")
    assert renewer.stopped_because == "its owner said the work ended", (renewer.stopped_because, item.lost)
    assert isinstance(item.lost, LeaseLost)
    # Nothing renews it now: it comes back when its last 30 s lease lapses (120 s: hang detector).
    taken = wait_until(lambda: wl.allocate("thief", lease=60), 120,
                       "the item to come back after its owner ended the work (hang detector)")
    with pytest.raises(LeaseLost):
        item.complete()
    taken.complete()
