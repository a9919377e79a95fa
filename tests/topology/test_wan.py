"""WAN link emulation: the shaping proxy (latency, bandwidth, close) on real sockets, a real
broker reached through its shaped listener, and the topology wiring (plan, node commands)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.config import load_config
from astraflow.topics import Consumer, EmbeddedBroker, Producer, Prompt, TopicSpec, ensure_topics
from astraflow.topology.launch import TopologyRun, load_plan, node_command_for
from astraflow.topology.plan import format_plan, resolve, without_emulation
from astraflow.topology.schema import TopologyError, load_topology
from astraflow.topology.wan import ShapedProxy

ROOT = Path(__file__).resolve().parents[2]
TWO_REGIONS = ROOT / "examples" / "topology_two_regions.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"


@contextlib.contextmanager
def server(handler):
    """A loopback TCP server running ``handler(conn)`` per connection; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
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
            c.close()


def echo(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := conn.recv(65536):
            conn.sendall(data)


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def eventually(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_round_trip_takes_twice_the_latency():
    with server(echo) as port, ShapedProxy(port, latency_ms=60, bandwidth_mbps=1000) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            trips = []
            for i in range(5):
                t = time.monotonic()
                s.sendall(b"ping %d" % i)
                assert recv_exactly(s, 6) == b"ping %d" % i
                trips.append(time.monotonic() - t)
        # each direction held the chunk >= 60 ms; the upper bound only catches a runaway delay
        assert min(trips) >= 0.120 * 0.98, trips
        assert max(trips) < 1.5, trips
        eventually(lambda: (proxy.bytes_up, proxy.bytes_down) == (30, 30))  # counted just after the send


def test_latency_does_not_cap_throughput():
    """Many chunks are in flight at once: 40 round trips' worth of data pipelined takes about
    one round trip, not forty."""
    with server(echo) as port, ShapedProxy(port, latency_ms=100, bandwidth_mbps=1000) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            t = time.monotonic()
            got = bytearray()
            for i in range(40):
                s.sendall(bytes([i]) * 1000)
                time.sleep(0.005)  # separate chunks, each stamped on its own
            while len(got) < 40_000:
                got += s.recv(65536)
            took = time.monotonic() - t
        assert got == b"".join(bytes([i]) * 1000 for i in range(40))  # in order, intact
        assert 0.2 * 0.98 <= took < 2.0, took  # 40 x 0.2 s = 8 s if each chunk waited for the previous


def test_bandwidth_is_capped_per_direction():
    received = {"n": 0, "done": threading.Event()}
    total = 400_000

    def sink(conn):
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                received["n"] += len(data)
                if received["n"] >= total:
                    received["done"].set()

    with server(sink) as port, ShapedProxy(port, latency_ms=0, bandwidth_mbps=8) as proxy:  # 1 MB/s
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            t = time.monotonic()
            s.sendall(b"x" * total)
            assert received["done"].wait(10)
            took = time.monotonic() - t
        assert took >= total / 1e6 * 0.98, took  # N bytes take at least N / rate
        assert took < 3.0, took
        eventually(lambda: proxy.bytes_up == total)
        assert proxy.bytes_down == 0


def test_close_closes_every_connection():
    with server(echo) as port:
        proxy = ShapedProxy(port, latency_ms=5, bandwidth_mbps=100)
        clients = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(3)]
        for c in clients:  # every connection is up and forwarding
            c.sendall(b"hi")
            assert recv_exactly(c, 2) == b"hi"
        assert proxy.open_connections == 3 and proxy.connections == 3
        proxy.close()
        for c in clients:
            try:
                assert c.recv(10) == b""  # closed by the proxy, not left hanging
            except ConnectionResetError:
                pass
            c.close()
        assert proxy.open_connections == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


def test_a_region_reaches_a_real_broker_through_its_shaped_listener(tmp_path):
    """launch's wiring without the processes: the plan's remote region gets a listener and a
    proxy; a transactional producer and a read_committed consumer given that region's address
    do all their traffic through it (the broker advertises the proxy), and node commands of the
    region, the autoscaler's too, name the proxy while the Kafka region's name the broker."""
    cfg = load_config(str(JOB), {})
    plan = load_plan(TWO_REGIONS, cfg)
    run = TopologyRun(plan, cfg, [])
    broker = EmbeddedBroker(tmp_path / "kafka", heap="256m")
    with run.broker_setup(broker):
        try:
            broker.start()
            proxy = run.wan.proxies["eu-west"]
            eu = run.wan.bootstrap_for()["eu-west"]
            assert eu == proxy.address and set(run.wan.bootstrap_for()) == {"eu-west"}
            topic = "wan-" + uuid.uuid4().hex[:8]
            ensure_topics(broker.bootstrap_servers, [TopicSpec(topic, partitions=1)])
            p = Producer(eu, client_id="eu-node", transactional_id=f"{topic}-tx")
            try:
                with p.transaction():
                    for i in range(5):
                        p.send(topic, Prompt(f"p{i}", secrets.token_urlsafe(3000), "1"))  # ~3 KB after zstd
                # the broker told the client to come back through the proxy, not to its own port
                assert {b.port for b in p._kp._metadata.brokers()} == {proxy.port}
            finally:
                p.close()
            with Consumer(eu, topics=[topic], group_id=f"{topic}-g", client_id="eu-reader") as c:
                got: list[str] = []
                for _ in range(30):
                    got += [d.message.prompt_id for d in c.poll(1000)]
                    if len(got) >= 5:
                        break
                c.commit()
            assert got == [f"p{i}" for i in range(5)]
            stats = run.wan.stats()[0]
            assert (stats["region"], stats["to"], stats["latency_ms"], stats["bandwidth_mbps"]) == \
                ("eu-west", "us-east", 40, 1000)
            # the records went up through the proxy, and came back down it to the consumer
            assert stats["bytes_to_broker"] > 5 * 2000 and stats["bytes_from_broker"] > 5 * 2000, stats

            command_for = node_command_for(cfg, broker.bootstrap_servers, tmp_path, [], run.wan.bootstrap_for())
            nodes = {n.node_id: n for n in plan.nodes}
            def server_of(argv):
                return argv[argv.index("--bootstrap-servers") + 1]
            assert server_of(command_for(nodes["raas-eu-0"])) == eu
            assert server_of(command_for(nodes["raas-us-0"])) == broker.bootstrap_servers
            assert server_of(command_for(nodes["trainer"])) == broker.bootstrap_servers
            # an elastic node the autoscaler adds later is started through the same command_for
            assert server_of(command_for(plan.node_spec(plan.pools["raas-eu"], 5))) == eu
        finally:
            broker.stop()
    assert proxy.open_connections == 0  # leaving broker_setup closed the proxy


def _two_regions(tmp_path, **changes) -> Path:
    data = yaml.safe_load(TWO_REGIONS.read_text())
    data.update(changes)
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_plan_says_whether_links_are_emulated(tmp_path):
    plan = resolve(load_topology(TWO_REGIONS))
    assert plan.emulate_links and plan.kafka_region == "us-east"
    assert plan.emulated_links() == [{"region": "eu-west", "kafka_region": "us-east", "latency_ms": 40,
                                      "bandwidth_mbps": 1000}]
    text = format_plan(plan)
    assert "[EMULATED by launch" in text and "adding 40 ms each way" in text
    assert plan.to_dict()["emulated_links"][0]["region"] == "eu-west"

    off = resolve(load_topology(_two_regions(tmp_path, emulate_links=False)))
    assert off.emulated_links() == [] and "[not emulated]" in format_plan(off)
    assert "emulate_links: false" in format_plan(off)

    data = yaml.safe_load(TWO_REGIONS.read_text())
    data["regions"]["us-east"]["kafka"] = "10.0.0.1:9092"
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump(data))
    external = resolve(load_topology(path))
    assert external.emulated_links() == []
    assert "the Kafka cluster is external (10.0.0.1:9092)" in format_plan(external)

    # launch --bootstrap-servers: the file's embedded broker is replaced, so nothing is emulated
    plan = resolve(load_topology(TWO_REGIONS))
    without_emulation(plan, "10.0.0.2:9092")
    assert plan.emulated_links() == [] and "[not emulated]" in format_plan(plan)
    assert any("uses the existing cluster 10.0.0.2:9092" in n for n in plan.notes)
    assert not any(n.startswith("EMULATION of links") for n in plan.notes)


@pytest.mark.parametrize("value", ["maybe", 1, [True]])
def test_a_bad_emulate_links_names_key_and_file(tmp_path, value):
    path = _two_regions(tmp_path, emulate_links=value)
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert e.value.file == str(path) and e.value.key == "emulate_links", str(e.value)
