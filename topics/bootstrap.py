"""Bootstrap servers: the ``host:port[,host:port]`` string every Kafka client starts from.

:func:`parse_bootstrap` checks its shape (a port that is not a number is a typo, not a
broker that is down); :func:`wait_reachable` opens a TCP connection to any of the servers
within a bound, so a command pointed at nothing says so in seconds instead of after a
client's 30 s metadata timeout and its traceback. A TCP connection is all it checks: it
speaks no Kafka and sends nothing, so it works the same for plaintext, TLS and SASL
listeners. ``source`` names where the string came from (``--bootstrap-servers``,
``kafka.bootstrap_servers in job.yaml``) in every error.
"""

from __future__ import annotations

import re
import socket
import time

from .exceptions import TopicsError

__all__ = ["BOOTSTRAP_TIMEOUT_S", "BadBootstrapServers", "BrokerUnreachable", "parse_bootstrap", "wait_reachable"]

#: How long a command waits for a TCP connection to one of its bootstrap servers.
BOOTSTRAP_TIMEOUT_S = 10.0

_SERVER = re.compile(r"(?:[A-Za-z_]+://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[^:]*)")


class BadBootstrapServers(TopicsError, ValueError):
    """The bootstrap string is not ``host:port[,host:port]``: fatal, a retry reads the same typo."""

    retriable = False


class BrokerUnreachable(TopicsError):
    """No bootstrap server accepted a connection within the bound; the broker may yet start."""

    retriable = True


def parse_bootstrap(servers: object, source: str = "bootstrap servers") -> list[tuple[str, int]]:
    """``[(host, port), ...]`` of ``servers``; :class:`BadBootstrapServers` naming ``source``."""
    if not isinstance(servers, str) or not servers.strip():
        raise BadBootstrapServers(f"{source}: expected host:port[,host:port], got {servers!r}")
    out = []
    for part in servers.split(","):
        m = _SERVER.fullmatch(part.strip())
        if not m:
            raise BadBootstrapServers(f"{source}: {part.strip()!r} is not host:port (in {servers!r})")
        port = m["port"]
        if not port.isdigit() or not 1 <= int(port) <= 65_535:
            raise BadBootstrapServers(f"{source}: {part.strip()!r} has port {port!r}; a port is a number "
                                      f"1-65535 (in {servers!r})")
        out.append((m["host"].strip("[]"), int(port)))
    return out


def wait_reachable(servers: str, source: str = "bootstrap servers", timeout_s: float = BOOTSTRAP_TIMEOUT_S) -> None:
    """Return once one of ``servers`` accepts a TCP connection; :class:`BrokerUnreachable` after
    ``timeout_s`` (refused connections are retried until then: a broker may be starting)."""
    addresses = parse_bootstrap(servers, source)
    deadline = time.monotonic() + timeout_s
    why = "no attempt"
    while True:
        for host, port in addresses:
            left = deadline - time.monotonic()
            try:
                socket.create_connection((host, port), timeout=max(0.05, min(left, 2.0))).close()
                return
            except socket.gaierror as e:
                why = f"{host}: {e.strerror or 'name does not resolve'}"
            except OSError as e:
                why = f"{host}:{port}: {e.strerror or str(e) or type(e).__name__}"
        if time.monotonic() >= deadline:
            raise BrokerUnreachable(f"{source} {servers}: no broker accepted a connection within {timeout_s:g} s "
                                    f"(last: {why}); start one (`astraflow broker start`) or fix the address")
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
