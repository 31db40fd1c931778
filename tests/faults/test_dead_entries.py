"""Dead queue entries after a restart: a waiter that gives up takes its entry with it.

A throwaway PostgreSQL / MariaDB server holds a capacity-1 resource and its holder. Three waiters
queue behind it with a long waiter TTL (60 s, so their entries would outlive the test by
themselves); the server is then stopped brutally and kept down until every waiter's ``acquire``
has failed: the head with ``DatabaseUnavailableError`` at its next look, the two behind it with
their timeout falling inside the outage (their withdrawal cannot reach the server either). Once
the server is back, their withdrawals go through on reconnect; a live waiter queues, the holder
releases, and the live waiter is granted with no grant ever made to a dead entry (the grant
history is the witness: a grant to a dead entry is what would delay the handoff by its pickup).
How soon it is granted is printed (the promise: within 2 s), not asserted.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Optional

import pytest
from support.live import wait_until

from controltable import ControlTable, ControlTableError

from .servers import ThrowawayServer

pytestmark = [pytest.mark.faults]

TTL = 60.0
#: How long the live waiter may wait after the release (the issue's promise): printed, and 5x it
#: plus 20 s is the hang detector.
HANDOFF = 2.0


class Waiter(threading.Thread):
    """One ``acquire`` in its own ControlTable (its own engine, pool and listener), as a process would."""

    def __init__(self, url: str, namespace: str, holder: str, timeout: float) -> None:
        super().__init__(daemon=True, name=f"waiter-{holder}")
        self.ct = ControlTable(url, namespace=namespace)
        self.holder = holder
        self.timeout = timeout
        self.error: Optional[BaseException] = None
        self.granted_at: Optional[float] = None

    def run(self) -> None:
        try:
            lease = self.ct.acquire("r", holder=self.holder, timeout=self.timeout, waiter_ttl=TTL)
            self.granted_at = time.monotonic()
            lease.release()
        except ControlTableError as exc:
            self.error = exc


def _queued(ct: ControlTable, holder: str) -> bool:
    return ct.wait_info("r", holder) is not None


def _wait_until(what: str, predicate: Any, seconds: float) -> float:
    """``wait_until``, returning how long it took (for the report)."""
    start = time.monotonic()
    wait_until(predicate, seconds, what, interval=0.05)
    return time.monotonic() - start


def test_dead_entries_are_withdrawn_and_the_next_live_waiter_is_granted(server: ThrowawayServer) -> None:
    namespace = f"dead_{uuid.uuid4().hex[:8]}"
    url = server.url()
    ct = ControlTable(url, namespace=namespace)
    ct.install()
    ct.set_capacity("r", 1)
    holder = ct.acquire("r", holder="holder", lease=300)
    # The head fails at its next look (timeout far away); the two behind it time out in the outage.
    dead = [Waiter(url, namespace, "dead0", 120), Waiter(url, namespace, "dead1", 4),
            Waiter(url, namespace, "dead2", 4)]
    live: Optional[Waiter] = None
    try:
        for w in dead:
            w.start()
            _wait_until(f"{w.holder} queued", lambda w=w: _queued(ct, w.holder), 20)
        _, brutal = server.restart_modes
        server.stop(brutal)
        # Down until every waiter gave up (the head at its next look, the others at their timeout).
        _wait_until("every dead waiter's acquire failed", lambda: all(not w.is_alive() for w in dead), 90)
        for w in dead:
            assert w.error is not None and w.granted_at is None, (w.holder, w.error)
        server.start()
        back = time.monotonic()
        # Withdrawn on reconnect by their request keys, long before their 60 s TTL.
        took = _wait_until("the dead entries withdrawn", lambda: not any(_queued(ct, w.holder) for w in dead), 15)
        live = Waiter(url, namespace, "live", 60)
        live.start()
        _wait_until("the live waiter queued", lambda: _queued(ct, "live"), 20)
        released = time.monotonic()
        holder.release()
        live.join(timeout=5 * HANDOFF + 20)
        assert live.error is None and live.granted_at is not None, f"hang: the live waiter not granted: {live.error}"
        handoff = live.granted_at - released
        print(f"dead entries {server.kind}: withdrawn {took:.2f} s after the server was back "
              f"({time.monotonic() - back:.1f} s ago); live waiter granted {handoff:.2f} s after the release; "
              f"errors {[type(w.error).__name__ for w in dead]}")
        # By cause, not by the handoff's time: the release went to the live waiter, no grant to a
        # dead entry (whose pickup window would have delayed it); the handoff is printed above.
        to_dead = [r for r in ct.history("r") if r.holder.startswith("dead")]
        assert not to_dead, f"grants went to dead entries: {to_dead}"
    finally:
        for w in dead + ([live] if live is not None else []):
            w.ct.close()
        ct.close()
