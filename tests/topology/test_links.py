"""WAN links with a shared bandwidth (topology/links.py) on real namespaces, veth pairs, ``tc tbf``
and a real Toxiproxy: bandwidth shared by connections in both directions, latency, a cut that
heals, a real Kafka client in a region talking to a broker at home, and nothing left behind.

Timings are lower bounds only (a loaded machine only makes things slower)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from astraflow.topics import EmbeddedBroker, TopicSpec, ensure_topics, security
from astraflow.topics.broker import free_port
from astraflow.topology import links, netns, toxiproxy as toxiproxy_mod
from astraflow.topology.links import LinkEmulation, LinkUnavailable, RegionLink, Toxiproxy
from tests.waiting import wait_until

RATE_MBPS = 8  # 1 MB/s
RATE_BYTES_S = RATE_MBPS * 1e6 / 8
N = 400_000
ACK = b"ok"


@pytest.fixture(scope="module")
def toxiproxy():
    with Toxiproxy() as t:
        yield t


@pytest.fixture
def link(toxiproxy):
    with RegionLink("b", bandwidth_mbps=RATE_MBPS, latency_ms=0, toxiproxy=toxiproxy) as lk:
        yield lk


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


@contextlib.contextmanager
def serving(listener: socket.socket, handler):
    """Run ``handler(conn)`` per connection accepted on ``listener`` (in whatever namespace it was made)."""
    conns: list[socket.socket] = []

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=handler, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()


def sink(conn: socket.socket) -> None:
    """Read N bytes, answer ACK (Toxiproxy closes both ways on a half-close, so no FIN tricks)."""
    with contextlib.suppress(OSError, ConnectionError):
        recv_exactly(conn, N)
        conn.sendall(ACK)


def echo(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := conn.recv(65536):
            conn.sendall(data)


def send_concurrently(dial, connections: int) -> float:
    """Seconds until ``connections`` connections made by ``dial()`` have each delivered N bytes."""
    socks = [dial() for _ in range(connections)]
    errors: list[BaseException] = []

    def send(s: socket.socket) -> None:
        try:
            s.sendall(b"x" * N)
            assert recv_exactly(s, len(ACK)) == ACK
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=send, args=(s,)) for s in socks]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    took = time.monotonic() - t
    for s in socks:
        s.close()
    assert not errors, errors
    return took


@pytest.mark.parametrize("direction", ["up", "down"])
def test_a_links_bandwidth_is_shared_by_its_connections(link, direction):
    """Toward home (a region's client, :meth:`reach`) and toward the region (a home client,
    :meth:`expose`): two connections each moving N bytes take at least 2N / rate together,
    one alone N / rate. A per-connection cap (topology/wan.py, Toxiproxy's bandwidth toxic)
    lets the two finish in N / rate (benchmarks/wan_links.py measures both)."""
    if direction == "up":
        listener = socket.create_server(("127.0.0.1", 0))
    else:
        listener = link.in_region(lambda: socket.create_server((link.region_ip, 0)))
    with serving(listener, sink) as port:
        if direction == "up":
            fwd = link.reach(port)
            dial = lambda: link.connect((fwd.host, fwd.port))  # noqa: E731
        else:
            fwd = link.expose(port)
            dial = lambda: socket.create_connection((fwd.host, fwd.port), timeout=10)  # noqa: E731
        one = send_concurrently(dial, 1)
        two = send_concurrently(dial, 2)
    print(f"\n{direction}: 1 x {N} B in {one:.3f} s, 2 x {N} B in {two:.3f} s at {RATE_MBPS} Mbit/s")
    assert one >= 0.8 * N / RATE_BYTES_S, one
    assert two >= 0.8 * 2 * N / RATE_BYTES_S, two  # a per-connection cap: ~N / rate
    key = "bytes_up" if direction == "up" else "bytes_down"
    # the relays' payload count, in the right direction (counted just after each write)
    wait_until(lambda: link.stats()[key] == 3 * N, 10.0, "condition not met in time", interval_s=0.02)
    assert link.stats()["wire_" + key] >= 3 * N  # the tbf at that end sent every byte (plus headers)


def test_a_round_trip_takes_twice_the_latency(toxiproxy):
    with RegionLink("lat", bandwidth_mbps=100, latency_ms=60, toxiproxy=toxiproxy) as link:
        with serving(socket.create_server(("127.0.0.1", 0)), echo) as port:
            fwd = link.reach(port)
            with link.connect((fwd.host, fwd.port)) as s:
                trips = []
                for i in range(4):
                    t = time.monotonic()
                    s.sendall(b"ping %d" % i)
                    assert recv_exactly(s, 6) == b"ping %d" % i
                    trips.append(time.monotonic() - t)
        assert min(trips) >= 2 * 0.060 * 0.98, trips


def _closed_by_peer(s: socket.socket, timeout: float = 10) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(10) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _heal_and_round_trip(link, fwd) -> None:
    link.heal()
    assert not link.is_cut
    deadline = time.monotonic() + 10
    while True:
        try:
            with link.connect((fwd.host, fwd.port)) as s:
                s.settimeout(10)
                s.sendall(b"after")
                assert recv_exactly(s, 5) == b"after"
            return
        except ConnectionError:  # Toxiproxy's listener may take a moment to come back
            assert time.monotonic() < deadline, "the link never healed"
            time.sleep(0.1)


@pytest.mark.parametrize("blackhole", [False, True], ids=["disabled", "blackhole"])
def test_a_cut_link_stops_traffic_and_heals(link, blackhole):
    """Disabled (Toxiproxy ``enabled: false``): connections close and new ones are closed at
    once. Black hole (a ``timeout`` toxic): connections stay open, bytes vanish, and the ones
    that lived through the cut close when it heals. Either way nothing crosses while cut."""
    got = {"n": 0}

    def counting_echo(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                got["n"] += len(data)
                conn.sendall(data)

    with serving(socket.create_server(("127.0.0.1", 0)), counting_echo) as port:
        fwd = link.reach(port)
        live = link.connect((fwd.host, fwd.port))
        live.sendall(b"before")
        assert recv_exactly(live, 6) == b"before"

        link.cut(blackhole=blackhole)
        assert link.is_cut and link.stats()["cut"] == ("blackhole" if blackhole else "disabled")
        with link.connect((fwd.host, fwd.port)) as new:  # the region's end of the link still answers
            if blackhole:
                for s in (live, new):
                    s.sendall(b"lost")
                    assert not _closed_by_peer(s, timeout=0.5)  # open, silent
            else:
                assert _closed_by_peer(live) and _closed_by_peer(new)
            assert got["n"] == 6  # nothing crossed while cut
            _heal_and_round_trip(link, fwd)
            if blackhole:
                assert _closed_by_peer(live) and _closed_by_peer(new)  # their streams lost bytes
        live.close()
        assert got["n"] == 11  # "lost" never arrived, "after" did


REGION_CLIENT = textwrap.dedent("""
    import json, socket, sys
    from astraflow.topics import security
    bootstrap, topic, home_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:  # home's loopback is not reachable from the region: the link is the only way
        socket.create_connection(("127.0.0.1", home_port), timeout=2).close()
        home = "reachable"
    except OSError as e:
        home = type(e).__name__
    p = security.producer(bootstrap_servers=bootstrap, client_id="region-b", acks="all")
    for i in range(20):
        p.send(topic, value=b"from-b-%d" % i)
    p.flush(30)
    p.close()
    c = security.consumer(topic, bootstrap_servers=bootstrap, client_id="region-b", group_id=topic + "-b",
                          auto_offset_reset="earliest", consumer_timeout_ms=20000)
    seen = []
    for rec in c:
        seen.append(rec.value.decode())
        if len(seen) == 25:
            break
    c.close()
    print(json.dumps({"home": home, "seen": seen}))
""")


def test_a_kafka_client_in_a_region_uses_the_broker_at_home_through_the_link(tmp_path):
    with LinkEmulation(toxiproxy_log=tmp_path / "toxiproxy.log") as em:
        link = em.add("b", bandwidth_mbps=RATE_MBPS, latency_ms=20)
        port, controller = free_port(), free_port()
        broker = EmbeddedBroker(tmp_path / "kafka", port=port, controller_port=controller, heap="256m",
                                properties=em.broker_properties(port, controller))
        broker.start()
        try:
            topic = "links-" + uuid.uuid4().hex[:8]
            ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, partitions=1)])
            p = security.producer(bootstrap_servers=broker.bootstrap_servers, client_id="home")
            for i in range(5):
                p.send(topic, value=b"from-a-%d" % i)
            p.flush(30)
            p.close()
            bootstrap = em.bootstrap_for()["b"]
            assert bootstrap.startswith(link.link_ip + ":")
            out = subprocess.run(link.wrap([sys.executable, "-c", REGION_CLIENT, bootstrap, topic, str(port)]),
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr[-3000:]
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["home"] == "ConnectionRefusedError"
            assert sorted(result["seen"]) == sorted([f"from-a-{i}" for i in range(5)]
                                                    + [f"from-b-{i}" for i in range(20)])
            # and home sees what the region produced
            c = security.consumer(topic, bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                                  consumer_timeout_ms=10000)
            home_seen = set()
            for r in c:
                home_seen.add(r.value.decode())
                if len(home_seen) == 25:
                    break
            c.close()
            assert {f"from-b-{i}" for i in range(20)} <= home_seen
        finally:
            broker.stop()
        stats = em.stats()[0]
        assert stats["bytes_up"] > 20 * len(b"from-b-0") and stats["bytes_down"] > 25 * len(b"from-a-0")
        assert stats["wire_bytes_up"] > stats["bytes_up"] and stats["connections"] >= 2
        # what the relay handed Toxiproxy is what Toxiproxy counted in
        wait_until(lambda: em.toxiproxy.stats()["b-up-kafka"]["received_upstream"] == em.stats()[0]["bytes_up"],
                   10.0, "condition not met in time", interval_s=0.02)


def _netns_inodes() -> set[str]:
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/ns/net"))
    return found


def _home_links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in
            subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()}


def test_close_leaves_nothing_behind(toxiproxy):
    before = _home_links()
    link = RegionLink("gone", bandwidth_mbps=RATE_MBPS, latency_ms=5, toxiproxy=toxiproxy)
    assert _home_links() == before  # home got no interface
    fwd = link.reach(free_port())
    sleeper = link.popen(["sleep", "600"])
    namespaces = {link.ns_region.inode, link.ns_link.inode}
    holders = [link.ns_region.holder, link.ns_link.holder]
    assert namespaces <= _netns_inodes() and os.readlink("/proc/self/ns/net") not in namespaces
    deadline = time.monotonic() + 10  # nsenter enters the namespace, then execs sleep
    sleep = os.path.realpath(shutil.which("sleep"))
    while os.readlink(f"/proc/{sleeper.pid}/exe") != sleep and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.readlink(f"/proc/{sleeper.pid}/ns/net") == link.ns_region.inode  # popen runs in the region
    link.close()
    assert all(h.poll() is not None for h in holders) and sleeper.poll() is not None
    assert not namespaces & _netns_inodes()  # no process holds them: the kernel freed them
    with pytest.raises(links.LinkError, match="HTTP 404"):
        toxiproxy.show(fwd.proxy)
    assert _home_links() == before


def test_missing_tools_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "_checked", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LinkUnavailable, match=r"ip, tc, unshare, nsenter.*iproute2"):
        links.check_capabilities()
    monkeypatch.setenv(toxiproxy_mod.TOXIPROXY_ENV, str(tmp_path / "nope"))
    with pytest.raises(LinkUnavailable, match="ASTRAFLOW_TOXIPROXY=.*nope"):
        links.toxiproxy_binary()


BUILDER = textwrap.dedent("""
    import json, sys, time
    from astraflow.topology.links import LinkEmulation
    em = LinkEmulation()
    link = em.add("doomed", bandwidth_mbps=8, latency_ms=5)
    link.reach(1)
    sleeper = link.popen(["sleep", "600"])
    print(json.dumps({"pids": [link.ns_region.holder.pid, link.ns_link.holder.pid, em.toxiproxy.proc.pid,
                               sleeper.pid],
                      "namespaces": [link.ns_region.inode, link.ns_link.inode]}), flush=True)
    time.sleep(600)
""")


def test_a_killed_owner_leaves_nothing_behind():
    """SIGKILL of the process that built a link: its holders, its Toxiproxy and the processes it
    started in the region die with it, and the namespaces with them."""
    owner = subprocess.Popen([sys.executable, "-c", BUILDER], stdout=subprocess.PIPE, text=True)
    try:
        made = json.loads(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait(10)
        owner.stdout.close()

    def gone(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1].startswith("Z")  # a zombie until init reaps it
        except FileNotFoundError:
            return True
    wait_until(lambda: all(gone(pid) for pid in made["pids"]), 10.0, "condition not met in time", interval_s=0.02)
    wait_until(lambda: not set(made["namespaces"]) & _netns_inodes(), 10.0, "condition not met in time", interval_s=0.02)
