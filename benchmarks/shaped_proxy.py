"""The shaping TCP proxy ``astraflow launch`` used to emulate a WAN link, kept as the measured
baseline of :mod:`astraflow.benchmarks.wan_links` (launch now uses :mod:`astraflow.topology.links`).

Its bandwidth cap is **per TCP connection**: a region whose node opens several Kafka
connections got several times its declared bandwidth (``wan_links.json`` measures it). The
model of one direction is a delay line behind a transmitter: a chunk of ``n`` bytes read at
``t`` starts transmitting when the connection's line is free, occupies it for ``n / rate``
and is delivered ``latency`` later; a reader stamps chunks and a sender delivers them at
their stamps, so latency does not cap throughput.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time


_CHUNK = 65536


class _Direction:
    """One direction of one connection: a reader that stamps chunks, a sender that delivers them."""

    def __init__(self, conn: "_Connection", src: socket.socket, dst: socket.socket, up: bool) -> None:
        self.conn, self.src, self.dst, self.up = conn, src, dst, up
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.cond = threading.Condition()
        self.link_free = 0.0  # when the emulated link finishes transmitting what it holds

    def start(self, name: str) -> None:
        threading.Thread(target=self._read, name=f"{name}-read", daemon=True).start()
        threading.Thread(target=self._send, name=f"{name}-send", daemon=True).start()

    def _read(self) -> None:
        proxy = self.conn.proxy
        try:
            while not self.conn.closed:
                with self.cond:
                    while self.queued >= proxy.buffer_bytes and not self.conn.closed:
                        self.cond.wait(0.5)
                data = self.src.recv(_CHUNK)
                now = time.monotonic()
                with self.cond:
                    if data:
                        start = max(now, self.link_free)
                        self.link_free = start + len(data) / proxy.rate_bytes_s
                        due = self.link_free + proxy.latency_s
                    else:
                        due = max(now, self.link_free) + proxy.latency_s  # the FIN travels the line too
                    self.queue.append((due, data))
                    self.queued += len(data)
                    self.cond.notify_all()
                if not data:
                    return
        except OSError:
            self.conn.close()

    def _send(self) -> None:
        proxy = self.conn.proxy
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.conn.closed:
                        self.cond.wait(0.5)
                    if self.conn.closed:
                        return
                    due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if self.conn.closed:
                    return
                if not data:  # the source closed its side: pass the FIN on
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    self.conn.half_closed()
                    return
                self.dst.sendall(data)
                proxy._count(self.up, len(data))
                with self.cond:
                    self.queue.popleft()
                    self.queued -= len(data)
                    self.cond.notify_all()
        except OSError:
            self.conn.close()


class _Connection:
    def __init__(self, proxy: "ShapedProxy", client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.closed = False
        self._lock = threading.Lock()
        self._ended = 0
        self.directions = (_Direction(self, client, upstream, up=True), _Direction(self, upstream, client, up=False))

    def start(self, name: str) -> None:
        self.directions[0].start(f"{name}-up")
        self.directions[1].start(f"{name}-down")

    def half_closed(self) -> None:
        with self._lock:
            self._ended += 1
            both = self._ended == 2
        if both:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.upstream):
            _close(s)
        for d in self.directions:
            with d.cond:
                d.cond.notify_all()
        self.proxy._forget(self)


class ShapedProxy:
    """A loopback TCP proxy to ``upstream_port`` that emulates a link: ``latency_ms`` one way and
    ``bandwidth_mbps`` per direction (see the module docstring for the model).

    ``bytes_up`` counts bytes forwarded to the upstream, ``bytes_down`` bytes forwarded back.
    :meth:`close` stops accepting and closes every connection.
    """

    def __init__(self, upstream_port: int, *, latency_ms: float, bandwidth_mbps: float,
                 upstream_host: str = "127.0.0.1", name: str = "wan") -> None:
        if bandwidth_mbps <= 0 or latency_ms < 0:
            raise ValueError(f"need bandwidth_mbps > 0 and latency_ms >= 0, got {bandwidth_mbps}, {latency_ms}")
        self.upstream = (upstream_host, upstream_port)
        self.latency_ms, self.bandwidth_mbps, self.name = latency_ms, bandwidth_mbps, name
        self.latency_s = latency_ms / 1000.0
        self.rate_bytes_s = bandwidth_mbps * 1e6 / 8
        # What one direction may hold: twice the bandwidth-delay product, at least 1 MiB.
        self.buffer_bytes = max(1 << 20, int(2 * self.rate_bytes_s * max(self.latency_s, 0.01)))
        self.bytes_up = self.bytes_down = self.connections = 0
        self._lock = threading.Lock()
        self._conns: set[_Connection] = set()
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"proxy-{name}", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def stats(self) -> dict:
        return {"latency_ms": self.latency_ms, "bandwidth_mbps": self.bandwidth_mbps, "proxy": self.address,
                "bytes_to_broker": self.bytes_up, "bytes_from_broker": self.bytes_down,
                "connections": self.connections}

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()

    def __enter__(self) -> "ShapedProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, upstream)
            with self._lock:
                if self._closed:
                    conn.closed = True
                else:
                    self._conns.add(conn)
                    self.connections += 1
            if conn.closed:
                _close(client)
                _close(upstream)
                return
            conn.start(f"proxy-{self.name}-{self.connections}")

    def _count(self, up: bool, n: int) -> None:
        with self._lock:
            if up:
                self.bytes_up += n
            else:
                self.bytes_down += n

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
