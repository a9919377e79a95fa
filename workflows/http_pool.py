"""Connections to environment servers: keep-alive, bounded, retried where it is safe, counted.

One :class:`ServerPool` per environment server (its URL) in a process, shared by every
session of every episode the process runs (:func:`pool_for`). It keeps connections alive
between calls (HTTP/1.1), lets at most ``max_in_flight`` requests be outstanding at once (so
the process never opens more connections than that, nor queues more than that on the
server's listen backlog), retries with backoff the calls that failed before the server could
have acted on them (see :class:`Retry`), and counts requests, retries and failures per server
(:func:`server_counts`, what a RaaS node reports as ``raas.env_*`` metrics).

What every transport to an environment server shares (the bound, the backoff, the counts)
is :class:`ServerGate`; :class:`ServerPool` adds HTTP connections to it, and the OpenEnv client
(:mod:`.openenv_env`) its WebSocket sessions. ``pool_for(url, n, kind)`` makes the one per URL.

It speaks HTTP and JSON bytes only: it knows nothing of the protocol's calls beyond which of
them are safe to repeat (its callers say so), nor of episodes, engines or Kafka.
"""

from __future__ import annotations

import enum
import http.client
import random
import select
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["Retry", "ServerGate", "ServerPool", "pool_for", "server_counts", "backoff", "ATTEMPTS"]

#: tries of one call (the first and its retries); the backoff doubles from 50 ms up to 2 s
ATTEMPTS = 6
_BACKOFF_S, _BACKOFF_MAX_S = 0.05, 2.0

#: a broken connection, before the server's answer began
_BROKEN = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine)


class Retry(enum.Enum):
    """When a failed call may be sent again.

    ``UNSENT``: only if the request never left this process: the connection was refused or
    could not be made (or a kept-alive connection was found closed by the server before it
    was used). ``SENT``: also when the connection was reset or closed after the request was
    sent but before the first byte of an answer; the caller has made repeating it harmless.
    """

    UNSENT = "unsent"
    SENT = "sent"


def backoff(k: int) -> float:
    """Seconds to wait before retry ``k + 1``: doubling from 50 ms, at most 2 s, jittered."""
    return min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** k) * random.uniform(0.5, 1.0)


class ServerGate:
    """One environment server as this process sees it: at most ``max_in_flight`` requests
    outstanding (:meth:`slot`), and the counts of requests, retries and failures."""

    def __init__(self, url: str, max_in_flight: int) -> None:
        self.url = url.rstrip("/")
        self.max_in_flight = int(max_in_flight)
        self._slots = threading.BoundedSemaphore(self.max_in_flight)
        self._lock = threading.Lock()
        self.requests = self.retries = self.failures = 0

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.requests, "retries": self.retries, "failures": self.failures}

    @contextmanager
    def slot(self, timeout_s: float) -> Iterator[None]:
        """Hold one of the server's ``max_in_flight`` slots (waiting up to ``timeout_s`` for it)."""
        if not self._slots.acquire(timeout=timeout_s):
            self.count(failures=1)
            raise TimeoutError(f"{self.url}: {self.max_in_flight} requests in flight for {timeout_s:g} s "
                               "(env_params.max_in_flight)")
        try:
            yield
        finally:
            self._slots.release()

    def count(self, requests: int = 0, retries: int = 0, failures: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.retries += retries
            self.failures += failures


class ServerPool(ServerGate):
    """Keep-alive connections to one environment server, at most ``max_in_flight`` in use."""

    def __init__(self, url: str, max_in_flight: int) -> None:
        super().__init__(url, max_in_flight)
        parts = urllib.parse.urlsplit(url)
        self._conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port, self._base = parts.hostname or "", parts.port, parts.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        #: False once the server closed a connection after an answer (an HTTP/1.0 server):
        #: new connections are then not proven before a call that is not safe to repeat
        self.keep_alive = True

    def request(self, method: str, path: str, body: Callable[[int], bytes] | bytes | None, timeout_s: float,
                retry: Retry, limit: int) -> tuple[int, bytes]:
        """Send one call; ``(status, the answer's first limit + 1 bytes)``. ``body(k)`` gives try
        ``k``'s body (a retried ``/start`` changes its attempt). Raises the transport's error
        (``OSError``, ``http.client.HTTPException``) when every try failed, or at once when a
        retry would not be safe."""
        with self.slot(timeout_s):
            return self._tries(method, path, body, timeout_s, retry, limit)

    def _tries(self, method, path, body, timeout_s, retry, limit) -> tuple[int, bytes]:
        for k in range(ATTEMPTS):
            self.count(requests=1)
            sent = False
            conn = None
            try:
                conn = self._connection(timeout_s, prove=retry is Retry.UNSENT)
                sent = True
                data = body(k) if callable(body) else body
                conn.request(method, self._base + path, body=data,
                             headers={"Content-Type": "application/json"} if data is not None else {})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                if conn is not None:
                    conn.close()
                # refused or not connected: nothing was sent. Reset or closed before any
                # answer: safe only where the caller says a repeat is harmless. A timeout is
                # never retried (the server may still be acting; the call's bound is spent).
                again = not sent or (retry is Retry.SENT and isinstance(e, _BROKEN))
                if not again or k == ATTEMPTS - 1:
                    self.count(failures=1)
                    raise
                self.count(retries=1)
                time.sleep(backoff(k))
                continue
            try:
                raw = resp.read(limit + 1)
            except (OSError, http.client.HTTPException):
                conn.close()  # an answer began: the server acted; the caller's failure
                self.count(failures=1)
                raise
            if len(raw) > limit or not resp.isclosed():  # an answer past the limit: the rest is never read
                conn.close()
            else:
                self._give_back(conn, resp)
            return resp.status, raw
        raise AssertionError("unreachable")

    def _connection(self, timeout_s: float, prove: bool) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, else a new one (connected here, so a
        refusal is an error of nothing sent). With ``prove``, a new connection first carries a
        call that is safe to repeat (``POST /cancel`` of no session), so that a call that is not
        never goes out on a connection the server might not have accepted (a full listen
        backlog resets it after the request was sent)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if conn.sock is not None and not _closed_by_peer(conn.sock):
                conn.sock.settimeout(timeout_s)
                return conn
            conn.close()
        conn = self._conn_cls(self._host, self._port, timeout=timeout_s)
        conn.connect()
        if prove and self.keep_alive:
            try:
                conn.request("POST", self._base + "/cancel", body=b'{"session": ""}',
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
            except _BROKEN:
                conn.close()
                raise ConnectionRefusedError("the connection was reset before its first answer") from None
            if resp.will_close:
                self.keep_alive = False
                conn.close()
                conn = self._conn_cls(self._host, self._port, timeout=timeout_s)
                conn.connect()
        return conn

    def _give_back(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close:
            self.keep_alive = False
            conn.close()
            return
        with self._lock:
            self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _closed_by_peer(sock) -> bool:
    """An idle keep-alive connection is readable only when the server closed it (or sent what
    no request asked for): either way it is not used again."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


_POOLS: dict[str, ServerGate] = {}
_POOLS_LOCK = threading.Lock()
Gate = TypeVar("Gate", bound=ServerGate)


def pool_for(url: str, max_in_flight: int, kind: type[Gate] = ServerPool) -> Gate:  # type: ignore[assignment]
    """The process's ``kind`` (a :class:`ServerPool` unless another transport asks) for the
    server at ``url`` (made on first use; one job names one bound per server, so the first
    caller's ``max_in_flight`` is the pool's)."""
    key = url.rstrip("/")
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = kind(key, max_in_flight)
        if not isinstance(pool, kind):
            raise ValueError(f"{key} is reached as a {type(pool).__name__} already in this process, not as a "
                             f"{kind.__name__}: one server, one protocol")
        return pool


def server_counts() -> dict[str, dict[str, int]]:
    """Per server URL: requests (tries sent), retries and failures (calls given up) so far."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    return {p.url: p.counts() for p in pools}
