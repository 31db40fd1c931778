"""Push wake-ups for waiters: PostgreSQL LISTEN/NOTIFY where available, polling everywhere else.

A change that may let a waiter proceed (a release, a grant with others queued behind, a batch
returned, a work item finished, a populate) sends ``pg_notify`` *inside its own transaction*, so
the notification is delivered exactly when the change is visible. One listener thread per
``ControlTable`` holds a dedicated connection and wakes the local waiters of that key.

Polling stays as the fallback: a waiter never sleeps longer than its poll interval, so a lost
notification (listener reconnecting, a notification sent before the waiter started listening)
only costs latency, never correctness. A per-key counter closes the window between a waiter's
poll and its wait: if a notification for the key arrived since the poll began, it does not sleep.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

log = logging.getLogger("controltable")


class Wakeups:
    """Notify and wait on keys such as ``"slot:<resource>"`` within one namespace."""

    def __init__(self, db: Any, namespace: str, channel: str) -> None:
        self.db = db
        self.namespace = namespace
        self.channel = channel
        engine = db.engine
        self.enabled = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
        self._cond = threading.Condition()
        self._seq: dict[str, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._listening = threading.Event()
        self._stop = threading.Event()
        #: Notifications received (for tests and benchmarks).
        self.received = 0
        self._listeners: dict[str, list[Callable[[], None]]] = {}
        #: Bumped when the listener (re)connects: pushes sent while it was away are lost, so every
        #: local waiter looks once.
        self._generation = 0

    # -- sending -------------------------------------------------------------------------------
    def notify(self, conn: Connection, keys: Iterable[str]) -> None:
        """Queue a wake-up for ``keys``; PostgreSQL delivers it when ``conn``'s transaction commits."""
        if not self.enabled:
            return
        unique = list(dict.fromkeys(keys))
        if unique:  # one round trip for all of them
            conn.execute(select(*(func.pg_notify(self.channel, f"{self.namespace}\x1f{key}") for key in unique)))

    # -- waiting -------------------------------------------------------------------------------
    def mark(self, keys: Iterable[str]) -> tuple[int, ...]:
        """The keys' counters now: take before polling, pass to :meth:`wait`."""
        with self._cond:
            return (self._generation, *(self._seq.get(k, 0) for k in keys))

    @property
    def active(self) -> bool:
        """Whether pushes are being received now (so polls may be spaced out)."""
        if not self.enabled:
            return False
        self._ensure_listener()
        return self._listening.is_set()

    def wait(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        """Sleep up to ``seconds`` or until a wake-up for one of ``keys``; True if woken."""
        if not self.active:
            time.sleep(seconds)
            return False
        deadline = time.monotonic() + seconds
        start = since if since is not None else self.mark(keys)
        with self._cond:
            while True:
                if (self._generation, *(self._seq.get(k, 0) for k in keys)) != start:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)

    def add_listener(self, keys: list[str], callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` from the listener thread on a push for any of ``keys``; returns a remover."""
        with self._cond:
            for key in keys:
                self._listeners.setdefault(key, []).append(callback)
        if self.enabled:
            self._ensure_listener()

        def remove() -> None:
            with self._cond:
                for key in keys:
                    found = self._listeners.get(key, [])
                    if callback in found:
                        found.remove(callback)
                    if not found:
                        self._listeners.pop(key, None)

        return remove

    def _deliver(self, key: str) -> None:
        with self._cond:
            self.received += 1
            self._seq[key] = self._seq.get(key, 0) + 1
            self._cond.notify_all()
            callbacks = list(self._listeners.get(key, ()))
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a faulty callback must not kill the listener of everyone else
                log.exception("controltable: wake-up callback for %r failed", key)

    # -- the listener thread -----------------------------------------------------------------------
    def _ensure_listener(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._listen_forever, name="controltable-listen", daemon=True)
            self._thread.start()
        self._listening.wait(2.0)  # the first wait may fall back to polling if the server is slow

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _connect(self) -> Any:
        dialect = self.db.engine.dialect
        cargs, cparams = dialect.create_connect_args(self.db.engine.url)
        raw = dialect.connect(*cargs, **cparams)
        raw.autocommit = True
        quoted = dialect.identifier_preparer.quote_identifier(self.channel)
        raw.execute(f"LISTEN {quoted}")  # the channel is a validated identifier, quoted by the dialect
        return raw

    def _listen_forever(self) -> None:
        backoff = 0.5
        connects = 0
        while not self._stop.is_set():
            raw = None
            try:
                raw = self._connect()
                self._listening.set()
                connects += 1
                missed = connects > 1  # a reconnect: pushes sent meanwhile were lost
                with self._cond:
                    if missed:
                        self._generation += 1
                        self._cond.notify_all()
                    everyone = [cb for cbs in self._listeners.values() for cb in cbs] if missed else []
                for callback in dict.fromkeys(everyone):
                    try:
                        callback()
                    except Exception:
                        log.exception("controltable: wake-up callback failed")
                backoff = 0.5
                prefix = f"{self.namespace}\x1f"
                while not self._stop.is_set():
                    for note in raw.notifies(timeout=1.0):
                        if not note.payload.startswith(prefix):
                            continue
                        self._deliver(note.payload[len(prefix):])
            except Exception as exc:  # the connection dropped: poll until it is back
                self._listening.clear()
                log.warning("controltable: wake-up listener lost its connection (%s); polling meanwhile", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                self._listening.clear()
                if raw is not None:
                    try:
                        raw.close()
                    except Exception:  # pragma: no cover
                        pass
