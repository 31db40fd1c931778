"""Push wake-ups for waiters: PostgreSQL LISTEN/NOTIFY where available, polling everywhere else.

A change that may let a waiter proceed (a release, a grant with others queued behind, a batch
returned, a work item finished, a populate) sends ``pg_notify`` *inside its own transaction*, so
the notification is delivered exactly when the change is visible. One listener thread per
``ControlTable`` holds a dedicated connection and wakes the local waiters of that key.

Polling stays as the fallback: a waiter never sleeps longer than its poll interval, so a lost
notification (listener reconnecting, a notification sent before the waiter started listening)
only costs latency, never correctness. A per-key counter closes the window between a waiter's
poll and its wait: if a notification for the key arrived since the poll began, it does not sleep.

A connection pooler in transaction mode (PgBouncer, RDS Proxy, Supavisor) accepts ``LISTEN`` and
then hands the server connection to someone else, so nothing ever arrives: the listener would
believe itself connected while waiters sleep for pushes that never come. So the listener proves at
start that a notification it sends (through the work URL, as every real push is sent) comes back.
When it does not, push is reported inactive (``push_status()``, the status page, ``/metrics``), one
warning names ``listen_url`` (a direct URL to the server that only the listener uses), and waiters
poll at the pace of the no-push path.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, make_url

from . import dialects, threads
from .connect import connect_args
from .defaults import PUSH_PROBE_TIMEOUT
from .dialects import traits
from .errors import ConfigurationError, safe_url

log = logging.getLogger("controltable")

#: The key prefix of the listener's self-probes (no engine key starts with a control character).
PROBE_KEY = "\x1eprobe:"


@dataclass(frozen=True)
class PushStatus:
    """Whether push wake-ups reach this process, and why not when they do not.

    ``state`` is ``"active"`` (the listener's self-probe came back), ``"starting"`` (not proven
    yet), ``"inactive"`` (the probe did not come back: a pooler in transaction mode, or a lost
    connection; waiters poll) or ``"unavailable"`` (not PostgreSQL with psycopg: waiters poll).
    """

    active: bool
    state: str
    #: In words: what was seen and what to do about it.
    detail: str
    #: The listener's connection target, password masked (``listen_url`` or the work URL).
    listen_url: Optional[str] = None
    #: The self-probe's round trip (send through the work URL, receive on the listener), ms.
    round_trip_ms: Optional[float] = None


class Wakeups:
    """Notify and wait on keys such as ``"slot:<resource>"`` within one namespace."""

    def __init__(self, db: Any, namespace: str, channel: str, listen_url: Optional[str] = None,
                 probe_timeout: float = PUSH_PROBE_TIMEOUT) -> None:
        self.db = db
        self.namespace = namespace
        self.channel = channel
        engine = db.engine
        self.enabled = traits(engine.dialect.name).listen_notify and engine.dialect.driver == "psycopg"
        #: A direct URL to the server for the listener only (the work goes through ``db``'s URL).
        self.listen_url = _check_listen_url(listen_url) if listen_url else None
        self.probe_timeout = probe_timeout
        #: Replaces :meth:`wait`'s blocking sleep when set and it answers (None: "not here", e.g.
        #: a thread outside the event loop): :mod:`controltable.aio` awaits the event loop there,
        #: so the engines' own wait loops run unchanged in its greenlets.
        self.waiter: Optional[Callable[[list[str], float, Optional[tuple[int, ...]]], Optional[bool]]] = None
        self._probe_failed = False
        self._warned = False
        #: The server's port when the work URL leads to another (a pooler in the way): no LISTEN there.
        self._in_the_way: Optional[int] = None
        self._round_trip: Optional[float] = None
        #: Set when the listener's first start-up ended either way (probe passed, failed, or no connection).
        self._settled = threading.Event()
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
        """Whether pushes are being received now (so polls may be spaced out).

        False when the start-up self-probe did not come back: the listener is then stopped for
        good, since a pooler that swallowed one notification swallows all of them.
        """
        if not self.enabled or self._probe_failed:
            return False
        self._ensure_listener()
        return self._listening.is_set()

    @property
    def lost(self) -> bool:
        """Whether the self-probe found that pushes cannot arrive (a pooler swallows them): waiters
        then poll at the head of a queue more often than where push is merely unavailable."""
        return self._probe_failed

    def status(self) -> PushStatus:
        """Whether pushes reach this process (starting the listener if needed), with the reason."""
        target = self._target_text()
        where = safe_url(self.listen_url) if self.listen_url else self.db.safe_url
        if not self.enabled:
            return PushStatus(False, "unavailable", "push wake-ups need PostgreSQL with psycopg; waiters poll")
        active = self.active
        if self._probe_failed:
            return PushStatus(False, "inactive", _probe_failed_text(self.listen_url is not None, target,
                                                                    self.probe_timeout, self._in_the_way), where)
        if active:
            return PushStatus(True, "active", f"the listener's self-probe came back through {target}", where,
                              None if self._round_trip is None else self._round_trip * 1000.0)
        if not self._settled.is_set():
            return PushStatus(False, "starting", "the listener is connecting; waiters poll meanwhile", where)
        return PushStatus(False, "inactive", f"the listener cannot reach {target}; waiters poll until it is back",
                          where)

    def probe(self, timeout: Optional[float] = None) -> Optional[float]:
        """Send a notification through the work URL and wait for the listener to receive it.

        Returns the round trip in seconds, or ``None`` when it did not arrive within ``timeout``
        (or push is inactive). For ``doctor``: a live proof, not the start-up one.
        """
        if not self.active:
            return None
        key = f"{PROBE_KEY}{uuid.uuid4().hex}"
        arrived = threading.Event()
        remove = self.add_listener([key], arrived.set)
        try:
            start = time.monotonic()
            self._send_probe_now(key)
            if arrived.wait(self.probe_timeout if timeout is None else timeout):
                return time.monotonic() - start
            return None
        finally:
            remove()

    def _send_probe_now(self, key: str) -> None:
        """Notify ``key`` through the work URL, committed."""
        if dialects.on_asyncio(self.db.engine.dialect):
            # This thread has no event loop for the async pool: the same URL, a plain connection.
            sender = self._plain_connect(self.db.engine.url)
            try:
                sender.autocommit = True
                sender.execute("SELECT pg_notify(%s, %s)", (self.channel, f"{self.namespace}\x1f{key}"))
            finally:
                sender.close()
        else:
            self.db.run(lambda conn: conn.execute(select(func.pg_notify(self.channel, f"{self.namespace}\x1f{key}"))))

    def _target_text(self) -> str:
        if self.listen_url:
            return f"listen_url {safe_url(self.listen_url)}"
        return f"the work URL {self.db.safe_url}"

    def wait(self, keys: list[str], seconds: float, since: Optional[tuple[int, ...]] = None) -> bool:
        """Sleep up to ``seconds`` or until a wake-up for one of ``keys``; True if woken."""
        if self.waiter is not None:
            woken = self.waiter(keys, seconds, since)
            if woken is not None:
                return woken
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
        if self._probe_failed or (self._thread is not None and self._thread.is_alive()):
            return
        with self._cond:
            if self._probe_failed or (self._thread is not None and self._thread.is_alive()):
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._listen_forever, name="controltable-listen", daemon=True)
            threads.start(self._thread)
        # The first wait may fall back to polling if the server is slow; the self-probe is bounded.
        self._settled.wait(self.probe_timeout + 0.5)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _connect(self) -> Any:
        dialect = self.db.engine.dialect
        url = make_url(self.listen_url) if self.listen_url else self.db.engine.url
        raw = self._plain_connect(url)
        raw.autocommit = True
        if not self.listen_url:
            server_port = raw.execute("SELECT inet_server_port()").fetchone()[0]
            if behind_proxy(url, None if server_port is None else int(server_port)):
                raw.close()
                raise _PoolerInTheWay(int(server_port))
        quoted = dialect.identifier_preparer.quote_identifier(self.channel)
        raw.execute(f"LISTEN {quoted}")  # the channel is a validated identifier, quoted by the dialect
        return raw

    def _plain_connect(self, url: Any) -> Any:
        """A psycopg connection of this thread's own to ``url``, outside the pool."""
        dialect = self.db.engine.dialect
        if dialects.on_asyncio(dialect):  # this thread has no event loop: plain psycopg
            plain = url.set(drivername="postgresql+psycopg").get_dialect()
            dialect = plain(dbapi=plain.import_dbapi())
        cargs, cparams = dialect.create_connect_args(url)
        # The pool's connect timeout and keepalives (a silent network ends this connection too);
        # no statement timeout: LISTEN waits by design. What the URL's query sets wins.
        cparams.update(connect_args(url, connect_timeout=self.db.connect_timeout, statement_timeout=None))
        return dialect.connect(*cargs, **cparams)

    def _listen_forever(self) -> None:
        backoff = 0.5
        connects = 0
        while not self._stop.is_set():
            raw = None
            try:
                try:
                    raw = self._connect()
                except _PoolerInTheWay as pooler:
                    # Never LISTEN through a pooler: in transaction mode the subscribed server
                    # connection goes back to the pool, and notifications arriving on it while it
                    # is not linked to a client break the pooler's logins (PgBouncer 1.18: "got
                    # packet 'A' from server when not linked"). listen_url is the way to push.
                    self._in_the_way = pooler.server_port
                    self._give_up()
                    return
                if not self._self_probe(raw):
                    try:  # leave no subscription behind on a server connection a pooler may hand on
                        raw.execute("UNLISTEN *")
                    except Exception:  # the connection is being dropped anyway
                        pass
                    if connects == 0:  # never proven: a pooler swallows pushes; stop for good
                        self._give_up()
                        return
                    # Proven before, so this server delivers: a slow restart, not a pooler. Reconnect.
                    raise RuntimeError(f"the self-probe did not come back within {self.probe_timeout:g} s")
                self._listening.set()
                self._settled.set()
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
                self._settled.set()
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

    def _self_probe(self, raw: Any) -> bool:
        """Prove that a notification sent through the work URL reaches ``raw`` within the probe timeout."""
        key = f"{PROBE_KEY}{uuid.uuid4().hex}"
        payload = f"{self.namespace}\x1f{key}"
        prefix = f"{self.namespace}\x1f"
        start = time.monotonic()
        self._send_probe_now(key)
        # The wait starts once the notification is committed: opening a pooled connection for the
        # send can take a while on a loaded machine, and says nothing about delivery.
        deadline = time.monotonic() + self.probe_timeout
        while (left := deadline - time.monotonic()) > 0:
            for note in raw.notifies(timeout=left, stop_after=1):
                if note.payload == payload:
                    self._round_trip = time.monotonic() - start
                    return True
                if note.payload.startswith(prefix) and not note.payload.startswith(prefix + PROBE_KEY):
                    self._deliver(note.payload[len(prefix):])
        return False

    def _give_up(self) -> None:
        """Push is lost for this process: one warning, then waiters poll (see :attr:`lost`)."""
        if not self._warned:  # before the state changes: whoever sees "inactive" can find the warning
            self._warned = True
            log.warning("controltable: %s", _probe_failed_text(self.listen_url is not None, self._target_text(),
                                                             self.probe_timeout, self._in_the_way))
        self._probe_failed = True
        self._settled.set()


class _PoolerInTheWay(Exception):
    """The work URL does not lead straight to the server (its port differs from the server's)."""

    def __init__(self, server_port: int) -> None:
        super().__init__(server_port)
        self.server_port = server_port


def url_ports(url: Any) -> set[int]:
    """The TCP ports a PostgreSQL URL connects to: its port, and the ``host=h:p`` entries of a
    multi-host URL (libpq's default 5432 where none is given); empty for a Unix socket."""
    ports: set[int] = set()
    hosts = url.query.get("host")
    for entry in [hosts] if isinstance(hosts, str) else list(hosts or ()):
        entry = str(entry)
        if not entry or entry.startswith("/"):
            continue  # a socket directory
        host, sep, port = entry.rpartition(":")
        ports.add(int(port) if sep and host and port.isdigit() else int(url.port or 5432))
    if url.host:
        ports.add(int(url.port or 5432))
    return ports


def behind_proxy(url: Any, server_port: Optional[int]) -> bool:
    """Whether something stands between the URL and the server: the server says it listens on a TCP port
    the URL does not name (a pooler such as PgBouncer on its own port, or a port-mapping proxy).

    A direct TCP connection reports the URL's own port; a direct Unix-socket connection reports none.
    A proxy that keeps the server's port is not seen here: the self-probe is the check for it. (A
    proxy that maps ports but keeps sessions, where LISTEN would work, loses push until listen_url
    is set to the same URL: the safe side, since LISTEN through a transaction pooler breaks it.)
    """
    if server_port is None:
        return False
    ports = url_ports(url)
    return server_port not in ports if ports else True


def _probe_failed_text(with_listen_url: bool, target: str, timeout: float, in_the_way: Optional[int] = None) -> str:
    """The one warning (and the status text) when the listener's self-probe did not come back."""
    if in_the_way is not None:
        return (f"push wake-ups are inactive: {target} does not lead straight to the server (the server listens on "
                f"port {in_the_way}), so a connection pooler or proxy is in the way, and LISTEN through a pooler "
                "in transaction mode receives nothing and can break the pooler. Set listen_url "
                "(ControlTable(url, listen_url=...), CONTROLTABLE_LISTEN_URL, --listen-url) to a direct URL of the "
                "server for the listener; waiters poll meanwhile.")
    if with_listen_url:
        return (f"push wake-ups are inactive: a notification sent through the work URL did not reach the listener "
                f"on {target} within {timeout:g} s; listen_url must be a direct connection to the same "
                "PostgreSQL server (not through a pooler in transaction mode). Waiters poll meanwhile.")
    return (f"push wake-ups are inactive: a notification sent to itself did not come back through {target} "
            f"within {timeout:g} s, as happens behind a connection pooler in transaction mode (PgBouncer, "
            "RDS Proxy, Supavisor). Set listen_url (ControlTable(url, listen_url=...), CONTROLTABLE_LISTEN_URL, "
            "--listen-url) to a direct URL of the server for the listener; waiters poll meanwhile.")


def _check_listen_url(listen_url: str) -> str:
    """``listen_url`` must be a PostgreSQL URL (the listener speaks LISTEN/NOTIFY)."""
    try:
        parsed = make_url(listen_url)
    except Exception:
        raise ConfigurationError(
            f"listen_url {safe_url(str(listen_url))!r} is not a database URL; use a direct URL of the PostgreSQL "
            "server, e.g. postgresql+psycopg://user@db-host:5432/db") from None
    if not traits(parsed.get_backend_name()).listen_notify:
        raise ConfigurationError(
            f"listen_url {safe_url(listen_url)!r} is not a PostgreSQL URL; push wake-ups (LISTEN/NOTIFY) exist on "
            "PostgreSQL only: leave listen_url unset on other databases")
    return listen_url
