"""Larger socket reads for kafka-python's transports.

kafka-python 3.0 reads a connection 4 KiB at a time: ``_sock_recv`` loops over
``sock.recv(4096)`` until the socket would block and joins the pieces. A fetch of weight
chunks (1 MiB records, up to 64 MiB a response) is then hundreds of Python-level
iterations per MiB, and on this project's 2-core machine that loop, not the broker, bounded
how fast a consumer reads: plain ``KafkaConsumer`` reading 400 MiB of 1 MiB records from a
local broker, 4 interleaved runs each, 238–267 MB/s and 1.38–1.49 CPU s stock against
265–592 MB/s and 0.55–1.38 CPU s with 256 KiB reads (1 MiB reads were no better;
``kafka-consumer-perf-test`` reads ~400–600 MB/s there). The spread is how much data has
arrived when the reader wakes up: a reader that keeps up finds little per wake-up either way.

:func:`install` replaces ``_sock_recv`` of the TCP and SSL transports with the same loop
over ``recv`` of up to :data:`RECV_BYTES`: the same bytes in the same order, the same end
conditions (the socket would block, the peer closed it, an error), a few reads per fetch
instead of hundreds; a transport whose socket another thread has already closed reports a
connection error without the stock loop's logged traceback. It is installed when :mod:`astraflow.topics` is
imported, only on the kafka-python versions it was written against (:data:`SUPPORTED`), so a
kafka-python upgrade falls back to the stock reads (with a warning) instead of patching code
it has not seen. ``ASTRAFLOW_KAFKA_STOCK_RECV=1`` keeps the stock reads.
"""

from __future__ import annotations

import logging
import os
import ssl

__all__ = ["RECV_BYTES", "SUPPORTED", "install", "installed", "uninstall"]

log = logging.getLogger(__name__)

RECV_BYTES = 256 * 1024  #: bytes asked of each read (a larger read is only as large as what has arrived)
SUPPORTED = ("3.0.12",)  #: kafka-python versions whose ``_sock_recv`` this replaces

_stock: dict[type, object] = {}


def _reader(would_block: tuple[type[BaseException], ...]):
    """A ``_sock_recv`` that reads up to :data:`RECV_BYTES` at a time until ``would_block``."""
    from kafka import errors

    def _sock_recv(self):
        if self._sock is None:  # closed by another thread between its poll and this read: no traceback
            return b"", errors.KafkaConnectionError("socket closed")
        recvd: list[bytes] = []
        err = None
        while True:
            try:
                data = self._sock.recv(RECV_BYTES)
            except would_block:
                break
            except BaseException as e:  # noqa: BLE001 - as the stock loop: the connection is reported failed
                log.exception("%s: Error receiving network data closing socket", self)
                err = errors.KafkaConnectionError(e)
                break
            if not data:  # the peer closed the connection
                log.error("%s: socket disconnected", self)
                err = errors.KafkaConnectionError("socket disconnected")
                break
            recvd.append(data)
        return (recvd[0] if len(recvd) == 1 else b"".join(recvd)), err

    _sock_recv.__qualname__ = "astraflow_sock_recv"
    return _sock_recv


def install() -> bool:
    """Replace the transports' reads (idempotent); False when kept stock (see the module docstring)."""
    if _stock:
        return True
    if os.environ.get("ASTRAFLOW_KAFKA_STOCK_RECV") == "1":
        return False
    import kafka
    from kafka.net import transport

    if kafka.__version__ not in SUPPORTED:
        log.warning("kafka-python %s: keeping its 4 KiB socket reads (astraflow's larger reads were written "
                    "for %s); large fetches will use more CPU", kafka.__version__, ", ".join(SUPPORTED))
        return False
    classes = {transport.KafkaTCPTransport: (BlockingIOError, InterruptedError),
               transport.KafkaSSLTransport: (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                                             ssl.SSLWantWriteError)}
    for cls, would_block in classes.items():
        _stock[cls] = cls.__dict__["_sock_recv"]
        cls._sock_recv = _reader(would_block)
    return True


def installed() -> bool:
    """Whether the larger reads are in place."""
    return bool(_stock)


def uninstall() -> None:
    """Put the stock reads back (benchmarks compare both; tests)."""
    for cls, stock in _stock.items():
        cls._sock_recv = stock
    _stock.clear()
