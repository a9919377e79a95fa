"""kafka-python's connections read with larger socket reads (``topics/socket_reads.py``).

The replacement must hand the protocol the very bytes the stock 4 KiB loop would, stop
where it stops (the socket would block, the peer closed it), report a closed socket as a
connection error, and install only over the kafka-python it was written for.
"""

from __future__ import annotations

import os
import socket

import kafka
import pytest
from kafka import errors
from kafka.net import transport

from astraflow.topics import socket_reads


class _Conn:
    """What ``_sock_recv`` uses of a transport: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock


@pytest.fixture()
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[sock.send(view):]


def test_importing_topics_installs_the_larger_reads_on_both_transports():
    assert socket_reads.installed()
    for cls in (transport.KafkaTCPTransport, transport.KafkaSSLTransport):
        assert cls._sock_recv.__qualname__ == "astraflow_sock_recv", cls


def test_the_larger_reads_return_what_the_stock_reads_return_in_far_fewer_calls(pair):
    a, b = pair
    data = os.urandom(600_000)  # more than one read of RECV_BYTES, less than the socket buffers
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    calls = []

    class Counting:
        def __init__(self, sock):
            self.sock = sock

        def recv(self, n):
            calls.append(n)
            return self.sock.recv(n)

    conn = _Conn(Counting(a))
    _send_all(b, data)
    got, err = transport.KafkaTCPTransport._sock_recv(conn)
    assert err is None and got == data
    assert len(calls) <= -(-len(data) // socket_reads.RECV_BYTES) + 1  # the stock loop: ~147 calls of 4 KiB
    socket_reads.uninstall()
    try:
        calls.clear()
        _send_all(b, data)
        stock, err = transport.KafkaTCPTransport._sock_recv(conn)
        assert err is None and stock == data and len(calls) > 100
    finally:
        socket_reads.install()


def test_nothing_to_read_returns_no_bytes_and_no_error(pair):
    a, _ = pair
    assert transport.KafkaTCPTransport._sock_recv(_Conn(a)) == (b"", None)


def test_a_transport_closed_under_the_read_is_a_connection_error_without_a_traceback(caplog):
    with caplog.at_level("ERROR", logger="astraflow.topics.socket_reads"):
        got, err = transport.KafkaTCPTransport._sock_recv(_Conn(None))
    assert got == b"" and isinstance(err, errors.KafkaConnectionError) and "closed" in str(err)
    assert not caplog.records


def test_a_closed_peer_is_a_connection_error_after_the_bytes_it_sent(pair):
    a, b = pair
    b.sendall(b"last words")
    b.close()
    got, err = transport.KafkaTCPTransport._sock_recv(_Conn(a))
    assert got == b"last words"
    assert isinstance(err, errors.KafkaConnectionError) and "disconnected" in str(err)


def test_other_kafka_python_versions_keep_their_stock_reads(monkeypatch):
    socket_reads.uninstall()
    try:
        stock = transport.KafkaTCPTransport.__dict__["_sock_recv"]
        monkeypatch.setattr(kafka, "__version__", "9.9.9")
        assert socket_reads.install() is False and not socket_reads.installed()
        assert transport.KafkaTCPTransport.__dict__["_sock_recv"] is stock
        monkeypatch.undo()
        monkeypatch.setenv("ASTRAFLOW_KAFKA_STOCK_RECV", "1")
        assert socket_reads.install() is False and not socket_reads.installed()
    finally:
        monkeypatch.undo()
        assert socket_reads.install()
