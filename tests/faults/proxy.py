"""A TCP proxy between the workers and a throwaway server that cuts connections, also mid-COMMIT.

Every client connection gets its own upstream connection and two pump threads. The client-to-
server pump looks for the ``COMMIT`` both drivers send (psycopg's ``conn.commit()`` and PyMySQL's
``COM_QUERY``), and every ``cut_commit_every``-th one is cut, alternating two ways:

* ``before``: the COMMIT is dropped and both sides closed - the server rolls the transaction back;
* ``after``: the COMMIT is forwarded, then both sides closed before the reply can come back - the
  server commits, the client never hears of it (the ambiguous case idempotency must handle).

``cut_all()`` drops every open connection at once (as a network blip or a proxy restart would).

A silent network (``silence(mode)``, ``restore()``), for the timeout bounds:

* ``blackhole``: the proxy keeps every connection open, reads (so the kernel ACKs) and discards
  whatever arrives, in both directions, and accepts new connections that it never answers - a
  hung pooler or a half-open proxy;
* ``drop``: nothing is read or forwarded any more and new connections are not accepted (they sit
  in the listen backlog): the path is gone, nothing is answered, nothing is closed.

``silence_after_bytes`` (per connection, server to client) black-holes each new connection by
itself once that many bytes of answers went through (a statement in the middle of a transaction).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from .servers import free_port


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    commits: int = 0
    cuts: dict[str, int] = field(default_factory=lambda: {"before": 0, "after": 0, "all": 0})


class _Link:
    def __init__(self, proxy: FaultProxy, client: socket.socket, server: Optional[socket.socket]) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.closed = False
        self.lock = threading.Lock()
        self.answered = 0
        self.silent = False

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.proxy._forget(self)

    def pump(self, src: socket.socket, dst: Optional[socket.socket], inspect: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if dst is None or not self.proxy._pass(self, data, inspect):
                    continue  # black hole: read (ACKed by the kernel) and thrown away
                if inspect and b"COMMIT" in data:
                    cut = self.proxy._commit_seen()
                    if cut == "before":
                        break
                    dst.sendall(data)
                    if cut == "after":
                        break
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self.close()


class FaultProxy:
    """Listens on 127.0.0.1:``port`` and forwards to 127.0.0.1:``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.stats = ProxyStats()
        #: Cut every n-th COMMIT (0: never).
        self.cut_commit_every = 0
        self._next_cut = "after"
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(256)
        self._closed = False
        #: "forward", "blackhole" or "drop" (see the module's docstring).
        self.mode = "forward"
        self._flowing = threading.Event()
        self._flowing.set()
        #: Black-hole each connection after this many bytes from the server (0: never).
        self.silence_after_bytes = 0
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def silence(self, mode: str = "blackhole") -> None:
        """Make the network silent: ``blackhole`` (ACKs, never answers) or ``drop`` (the path is gone)."""
        assert mode in ("blackhole", "drop")
        self.mode = mode
        if mode == "drop":
            self._flowing.clear()

    def restore(self) -> None:
        self.mode = "forward"
        self._flowing.set()

    def _pass(self, link: _Link, data: bytes, from_client: bool) -> bool:
        """Whether ``data`` goes on; a dropped path holds it (and the pump) until ``restore()``."""
        if self.mode == "drop":
            while not self._flowing.wait(0.2):
                if self._closed or link.closed:
                    return False
        if self.mode == "blackhole" or link.silent:
            return False
        if not from_client and self.silence_after_bytes:
            link.answered += len(data)
            if link.answered > self.silence_after_bytes:
                link.silent = True
                return False
        return True

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            while self.mode == "drop" and not self._closed:
                time.sleep(0.1)  # accepted by the kernel, never by us: a SYN-ACK and then nothing
            if self.mode == "blackhole":
                link = _Link(self, client, None)
                with self._lock:
                    self._links.add(link)
                    self.stats.connections += 1
                threading.Thread(target=link.pump, args=(client, None, True), daemon=True).start()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                server.settimeout(None)
            except OSError:
                # The server is down (restarting): the client sees its connection closed at once.
                with self._lock:
                    self.stats.refused += 1
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, server)
            with self._lock:
                self._links.add(link)
                self.stats.connections += 1
            threading.Thread(target=link.pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=link.pump, args=(server, client, False), daemon=True).start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _commit_seen(self) -> Optional[str]:
        with self._lock:
            self.stats.commits += 1
            if not self.cut_commit_every or self.stats.commits % self.cut_commit_every:
                return None
            cut = self._next_cut
            self._next_cut = "before" if cut == "after" else "after"
            self.stats.cuts[cut] += 1
            return cut

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    def cut_all(self) -> int:
        with self._lock:
            links = list(self._links)
            self.stats.cuts["all"] += len(links)
        for link in links:
            link.close()
        return len(links)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut_all()
