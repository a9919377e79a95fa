"""WAN links whose bandwidth is shared by all their connections: network namespaces
(:mod:`.netns`), ``tc tbf`` on a veth pair, and Toxiproxy (:mod:`.toxiproxy`) for latency and cuts.

A per-connection cap (a shaping proxy, Toxiproxy's ``bandwidth`` toxic) gives a region that
opens six Kafka connections six times its link. Here a remote region's processes run in a
network namespace of their own (*R*), whose only interface is one end of a veth pair; the
other end is in a per-link namespace (*L*). Each end's egress has a ``tbf`` qdisc at the
link's rate, so every byte toward home (R's end) and every byte toward the region (L's end)
shares one token bucket per direction, however many connections carry it. ``tc netem`` is not
available on this kernel, so the latency, and a cut (``enabled: false``), come from a
:class:`Toxiproxy` in this process's own namespace (*home*, untouched: no interface, no
qdisc, no setting is made there). Between L and home, a byte relay of this process holds a
socket in each namespace (a thread enters a namespace with ``setns``, and a socket stays in
the namespace it was created in), so no interface is needed on the home side::

    R process -> veth R->L (tbf) -> relay in L -> [home] Toxiproxy (latency) -> target    (reach)
    home client -> Toxiproxy (latency) -> relay [home] -> in L -> veth L->R (tbf) -> R    (expose)

The namespaces are held by ``unshare -n sleep infinity`` processes that die with the thread
that made them (``PR_SET_PDEATHSIG``); a namespace vanishes with the last process in it, so
:meth:`RegionLink.close` (or this process's death) removes everything. Bytes that crossed a
link are counted twice: the relays' payload bytes per direction (what the applications sent)
and ``tc -s qdisc``'s bytes sent by each veth end (frames on the wire: payload plus TCP/IP
headers, acknowledgements included).

A Kafka broker in home reached from R needs a listener per link advertised at the link's
address in R (:meth:`LinkEmulation.broker_properties`), or clients would reconnect to an
address R cannot reach. This module knows nothing about Kafka clients, jobs or topologies.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

from astraflow.topics.broker import free_port

from .netns import LinkError, LinkUnavailable, Netns, Relay, call_in, check_capabilities, die_with_parent
from .toxiproxy import Toxiproxy, toxiproxy_binary

T = TypeVar("T")

__all__ = ["Forward", "LinkEmulation", "LinkError", "LinkUnavailable", "RegionLink", "Toxiproxy",
           "check_capabilities", "toxiproxy_binary"]


@dataclass(frozen=True)
class Forward:
    """One path across a link: dial ``host:port`` (in R for :meth:`RegionLink.reach`, in home for
    :meth:`RegionLink.expose`) to reach ``target`` on the other side."""

    host: str
    port: int
    target: str
    proxy: str  #: its Toxiproxy proxy's name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _tbf_burst(rate_bytes_s: float) -> int:
    # at least a few full frames; at high rates what the bucket refills in 4 ms (a kernel tick at HZ=250)
    return max(16 * 1024, int(rate_bytes_s * 0.004))


class RegionLink:
    """Region ``region``'s link to home: ``bandwidth_mbps`` per direction shared by every connection,
    ``latency_ms`` each way (Toxiproxy), cuttable. See the module docstring for the path.

    Run the region's processes with :meth:`wrap` / :meth:`popen`; give them home's services with
    :meth:`reach`, give home theirs with :meth:`expose`. :meth:`stats` says what crossed.
    """

    VETH_R, VETH_L = "afwan0", "afwan1"

    def __init__(self, region: str, *, bandwidth_mbps: float, latency_ms: float, toxiproxy: Toxiproxy,
                 subnet: int = 0) -> None:
        if bandwidth_mbps <= 0 or latency_ms < 0:
            raise ValueError(f"link {region}: need bandwidth_mbps > 0 and latency_ms >= 0, "
                             f"got {bandwidth_mbps}, {latency_ms}")
        if not 0 <= subnet < 64:
            raise ValueError(f"link {region}: subnet must be in [0, 64), got {subnet}")
        check_capabilities()
        self.region, self.bandwidth_mbps, self.latency_ms = region, bandwidth_mbps, latency_ms
        self.toxiproxy = toxiproxy
        self.region_ip, self.link_ip = f"10.250.{subnet}.1", f"10.250.{subnet}.2"
        self.bytes_up = self.bytes_down = 0  # relays' payload bytes toward home / toward the region
        self.forwards: list[Forward] = []
        self._relays: list[Relay] = []
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._cut: str | None = None  # None, "disabled" or "blackhole"
        self._closed = False
        self._home_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)  # home: where we are
        self.ns_region: Netns | None = None
        self.ns_link: Netns | None = None
        try:
            self.ns_region, self.ns_link = Netns(f"{region}/region"), Netns(f"{region}/link")
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        r, l = self.ns_region, self.ns_link
        assert r is not None and l is not None
        rate = f"{self.bandwidth_mbps * 1000:g}kbit"
        burst = str(_tbf_burst(self.bandwidth_mbps * 1e6 / 8))
        l.run("ip", "link", "add", self.VETH_L, "type", "veth", "peer", "name", self.VETH_R,
              "netns", str(r.holder.pid))
        for ns, dev, ip in ((r, self.VETH_R, self.region_ip), (l, self.VETH_L, self.link_ip)):
            ns.run("ip", "link", "set", "lo", "up")
            ns.run("ip", "addr", "add", f"{ip}/30", "dev", dev)
            ns.run("ip", "link", "set", dev, "up")
            # latency: how long a packet may wait in the bucket's queue before tbf drops it (the
            # queue a full link builds); not the link's latency, which Toxiproxy adds
            ns.run("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "100ms")

    # -- processes in the region
    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the region's namespace (as long as this link lives)."""
        assert self.ns_region is not None
        return [*self.ns_region.enter_argv(), *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in the region; killed by :meth:`close` (and by default when this thread dies)."""
        kwargs.setdefault("preexec_fn", die_with_parent)
        p = subprocess.Popen(self.wrap(argv), **kwargs)
        self._procs.append(p)
        return p

    def in_region(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a thread inside the region's namespace: sockets it makes belong to the region."""
        assert self.ns_region is not None
        return self.ns_region.call(fn)

    def connect(self, address: tuple[str, int], timeout: float = 10) -> socket.socket:
        """A TCP connection made from inside the region."""
        return self.in_region(lambda: socket.create_connection(address, timeout=timeout))

    # -- paths across
    def reach(self, target_port: int, target_host: str = "127.0.0.1", *, name: str = "") -> Forward:
        """A path from the region to home's ``target_host:target_port``; the region dials the result."""
        proxy = f"{self.region}-up-{name or target_port}"
        assert self.ns_link is not None
        tport = self._proxy(proxy, f"{target_host}:{target_port}")
        try:
            listener = self.ns_link.call(lambda: socket.create_server((self.link_ip, 0), backlog=128))
        except BaseException:
            self.toxiproxy.delete(proxy)
            raise
        relay = Relay(listener, ("127.0.0.1", tport), self._home_fd, self._count_up_first, proxy)
        return self._add(relay, Forward(self.link_ip, relay.port, f"{target_host}:{target_port}", proxy))

    def expose(self, region_port: int, *, name: str = "") -> Forward:
        """A path from home to the region's listener on ``region_ip:region_port``; home dials the result."""
        proxy = f"{self.region}-down-{name or region_port}"
        listener = call_in(self._home_fd, lambda: socket.create_server(("127.0.0.1", 0), backlog=128))
        assert self.ns_link is not None
        relay = Relay(listener, (self.region_ip, region_port), self.ns_link.fd, self._count_down_first, proxy)
        try:
            port = self._proxy(proxy, f"127.0.0.1:{relay.port}")
        except BaseException:
            relay.close()
            raise
        return self._add(relay, Forward("127.0.0.1", port, f"{self.region_ip}:{region_port}", proxy))

    def _proxy(self, name: str, upstream: str) -> int:
        port = self.toxiproxy.create(name, upstream)
        try:
            if self.latency_ms:
                self.toxiproxy.add_latency(name, self.latency_ms)
            self._cut_proxy(name)
        except BaseException:
            self.toxiproxy.delete(name)
            raise
        return port

    def _add(self, relay: Relay, fwd: Forward) -> Forward:
        with self._lock:
            self._relays.append(relay)
            self.forwards.append(fwd)
        return fwd

    def _count_up_first(self, outbound: bool, n: int) -> None:  # a reach: the client is in the region
        with self._lock:
            if outbound:
                self.bytes_up += n
            else:
                self.bytes_down += n

    def _count_down_first(self, outbound: bool, n: int) -> None:  # an expose: the client is in home
        self._count_up_first(not outbound, n)

    # -- faults
    @property
    def is_cut(self) -> bool:
        return self._cut is not None

    def cut(self, blackhole: bool = False) -> None:
        """Cut every path of the link.

        Default: each Toxiproxy proxy ``enabled: false``: open connections close, new ones
        reach the region's end of the link and are closed at once (clients see resets).
        ``blackhole``: a ``timeout`` toxic (0: never closes) each way instead: connections stay
        open and new ones are accepted, every byte is dropped, as packets vanish in a real
        partition (clients time out); :meth:`heal` then closes the connections that lived
        through the cut (their streams lost bytes), as the chaos runner's partitions did.
        """
        if self._cut is not None:
            raise LinkError(f"link {self.region} is already cut ({self._cut})")
        self._cut = "blackhole" if blackhole else "disabled"
        for f in self.forwards:
            self._cut_proxy(f.proxy)

    def _cut_proxy(self, proxy: str) -> None:
        if self._cut == "disabled":
            self.toxiproxy.set_enabled(proxy, False)
        elif self._cut == "blackhole":
            for stream in ("upstream", "downstream"):
                self.toxiproxy.add_toxic(proxy, f"cut_{stream}", "timeout", stream, timeout=0)

    def heal(self) -> None:
        cut, self._cut = self._cut, None
        for f in self.forwards:
            if cut == "disabled":
                self.toxiproxy.set_enabled(f.proxy, True)
            elif cut == "blackhole":
                for stream in ("upstream", "downstream"):
                    self.toxiproxy.remove_toxic(f.proxy, f"cut_{stream}")

    # -- what crossed
    def wire_bytes(self) -> dict[str, int]:
        """Bytes each veth end's ``tbf`` sent (``tc -s qdisc``): frames, headers and acks included."""
        out = {}
        for key, ns, dev in (("up", self.ns_region, self.VETH_R), ("down", self.ns_link, self.VETH_L)):
            assert ns is not None
            m = re.search(r"Sent (\d+) bytes", ns.run("tc", "-s", "qdisc", "show", "dev", dev))
            out[key] = int(m.group(1)) if m else 0
        return out

    def stats(self) -> dict:
        wire = self.wire_bytes()
        with self._lock:
            return {"region": self.region, "bandwidth_mbps": self.bandwidth_mbps, "latency_ms": self.latency_ms,
                    "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                    "wire_bytes_up": wire["up"], "wire_bytes_down": wire["down"],
                    "connections": sum(r.connections for r in self._relays), "cut": self._cut or "",
                    "forwards": [f.address + "->" + f.target for f in self.forwards]}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        for r in self._relays:
            r.close()
        for f in self.forwards:
            with contextlib.suppress(LinkError):
                self.toxiproxy.delete(f.proxy)
        for ns in (self.ns_region, self.ns_link):
            if ns is not None:
                ns.close()
        with contextlib.suppress(OSError):
            os.close(self._home_fd)

    def __enter__(self) -> "RegionLink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LinkEmulation:
    """The links of a launch: one Toxiproxy, one :class:`RegionLink` per remote region.

    For a broker in home: :meth:`broker_properties` (with the broker's own ports, before it
    starts) gives each link a broker listener on an internal port, advertised at the link's
    address in the region; :meth:`bootstrap_for` is what a region's nodes dial (from inside
    the region: start them with ``links[region].wrap(argv)``).
    """

    def __init__(self, toxiproxy_log: str | os.PathLike | None = None) -> None:
        check_capabilities()
        self.toxiproxy = Toxiproxy(log_path=toxiproxy_log)
        self.links: dict[str, RegionLink] = {}
        self._kafka: dict[str, Forward] = {}

    def add(self, region: str, *, bandwidth_mbps: float, latency_ms: float) -> RegionLink:
        if region in self.links:
            raise ValueError(f"region {region!r} already has a link")
        link = RegionLink(region, bandwidth_mbps=bandwidth_mbps, latency_ms=latency_ms, toxiproxy=self.toxiproxy,
                          subnet=len(self.links))
        self.links[region] = link
        return link

    def __getitem__(self, region: str) -> RegionLink:
        return self.links[region]

    def broker_properties(self, port: int, controller_port: int) -> dict[str, str]:
        listeners = [f"PLAINTEXT://127.0.0.1:{port}", f"CONTROLLER://127.0.0.1:{controller_port}"]
        advertised = list(listeners)
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        for i, (region, link) in enumerate(self.links.items()):
            internal = free_port()
            fwd = link.reach(internal, name="kafka")
            self._kafka[region] = fwd
            name = f"WAN{i}"  # listener names are identifiers; region names may not be
            listeners.append(f"{name}://127.0.0.1:{internal}")
            advertised.append(f"{name}://{fwd.address}")
            protocols.append(f"{name}:PLAINTEXT")
        return {"listeners": ",".join(listeners), "advertised.listeners": ",".join(advertised),
                "listener.security.protocol.map": ",".join(protocols)}

    def bootstrap_for(self) -> dict[str, str]:
        """Region -> the bootstrap address its nodes dial from inside the region."""
        return {region: f.address for region, f in self._kafka.items()}

    def stats(self) -> list[dict]:
        return [link.stats() for link in self.links.values()]

    def close(self) -> None:
        for link in self.links.values():
            link.close()
        self.toxiproxy.close()

    def __enter__(self) -> "LinkEmulation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
