"""A local multi-node Kafka cluster: N embedded KRaft nodes with one static controller quorum.

Every node is broker and controller (:class:`~.broker.EmbeddedBroker` with a shared
cluster id and ``controller.quorum.voters`` naming all of them), so three nodes survive
the loss of any one: the quorum keeps its majority and every partition, the internal
``__consumer_offsets`` and ``__transaction_state`` included, has replicas on the others.
The layout (node ids, ports, cluster id) is kept in ``cluster.json`` in the data dir, so a
stopped cluster restarts with the quorum its storage was formatted for. This module knows
how to run the nodes; which replication a job's topics get is :mod:`.registry`'s concern.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import security
from .broker import BrokerInfo, EmbeddedBroker, free_port, kafka_cluster_id
from .exceptions import BrokerStartError

if TYPE_CHECKING:
    from .secured import SecureSetup


def replication_for(brokers: int) -> tuple[int, int]:
    """The default replication factor and ``min.insync.replicas`` on a cluster of ``brokers``.

    Three copies at most (the common production choice); one copy may be missing and
    ``acks=all`` writes still succeed, so losing one broker stops nothing.
    """
    if brokers < 1:
        raise ValueError(f"a cluster needs at least one broker, got {brokers}")
    factor = min(3, brokers)
    return factor, max(1, factor - 1)


#: How long the controller waits for a silent broker before it fences it and moves its
#: partitions' leadership (and with it the group and transaction coordinators it held):
#: every transaction that touches the dead broker waits at least this long. Kafka's default
#: is 9 s with a heartbeat every 2 s; 6 s with one a second still tolerates five missed
#: heartbeats, and takes 3 s off the stall a broker loss costs (benchmarks/broker_loss.py).
BROKER_SESSION_TIMEOUT_MS = 6_000
BROKER_HEARTBEAT_INTERVAL_MS = 1_000


def cluster_properties(nodes: int) -> dict[str, str]:
    """Broker settings for a node of an ``nodes``-node cluster: internal topics replicated too,
    and a dead broker fenced after :data:`BROKER_SESSION_TIMEOUT_MS`."""
    factor, min_isr = replication_for(nodes)
    return {
        "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS),
        "broker.heartbeat.interval.ms": str(BROKER_HEARTBEAT_INTERVAL_MS),
        "offsets.topic.replication.factor": str(factor),
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
    }


class EmbeddedCluster:
    """``nodes`` Kafka 4.x KRaft nodes (broker + controller each) on loopback.

    Args:
        data_dir: holds ``node-<id>/`` per node and ``cluster.json``; a temp dir when omitted.
        nodes: how many nodes (3 survives the loss of one).
        port: client port of the first node, the others follow (+1, +2, ...); 0: free ports.
        heap: JVM max heap of each node.
        startup_timeout: seconds each node may take to answer.
        detach: the nodes outlive this process (the CLI's ``broker start --nodes N``).
        properties: extra ``server.properties`` entries for every node.
        secure: a :class:`~.secured.SecureSetup` every node shares: SASL_SSL (SCRAM-SHA-512)
            for clients and between brokers, mutual TLS between the controllers (each node
            presents the one broker certificate), ACLs enforced; None: plaintext.
    """

    def __init__(self, data_dir: str | Path | None = None, *, nodes: int = 3, port: int = 0,
                 heap: str = "512m", startup_timeout: float = 120.0, detach: bool = False,
                 properties: dict[str, str] | None = None, secure: "SecureSetup | None" = None) -> None:
        if nodes < 1:
            raise ValueError(f"EmbeddedCluster: nodes must be >= 1, got {nodes}")
        self._own_dir = data_dir is None and not detach
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="astraflow-kafka-cluster-"))
        self.startup_timeout = startup_timeout
        self.secure = secure
        layout = self._layout(nodes, port)
        voters = ",".join(f"{n['node_id']}@127.0.0.1:{n['controller_port']}" for n in layout["nodes"])
        props = {**cluster_properties(nodes), **(properties or {})}
        self.nodes = [EmbeddedBroker(self.data_dir / f"node-{n['node_id']}", port=n["port"],
                                     controller_port=n["controller_port"], heap=heap,
                                     startup_timeout=startup_timeout, detach=detach, properties=props,
                                     node_id=n["node_id"], voters=voters, cluster_id=layout["cluster_id"],
                                     secure=secure)
                      for n in layout["nodes"]]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def info(self) -> list[BrokerInfo]:
        return [n.info() for n in self.nodes if n.pid is not None]

    def node(self, node_id: int) -> EmbeddedBroker:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in this cluster (nodes: {[n.node_id for n in self.nodes]})")

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "EmbeddedCluster":
        try:
            for n in self.nodes:  # a node is ready only once a majority of the quorum runs
                n.launch()
            for n in self.nodes:
                n.wait_ready()
            self.wait_for_brokers(len(self.nodes))
        except BaseException:
            self.kill_all()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every node at once: stopped one by one, the last ones lose their quorum and hang."""
        for n in self.nodes:
            n.terminate()
        deadline = time.monotonic() + timeout
        for n in self.nodes:
            n.stop(timeout=max(0.1, deadline - time.monotonic()))

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (chaos): its broker and its controller vote are gone at once."""
        self.node(node_id).kill()

    def kill_all(self) -> None:
        for n in self.nodes:
            n.kill()

    def restart(self, node_id: int) -> None:
        """Start a stopped or killed node again on its own storage and ports."""
        n = self.node(node_id)
        n.start()
        self.wait_for_brokers(sum(1 for m in self.nodes if m.pid is not None))

    def wait_for_brokers(self, count: int) -> None:
        """Until ``count`` brokers are registered and unfenced: topics created earlier get fewer replicas."""
        live = [n.bootstrap_servers for n in self.nodes if n.pid is not None]
        deadline = time.monotonic() + self.startup_timeout
        admin = security.admin(bootstrap_servers=",".join(live), client_id="astraflow-cluster",
                               **({"security": self.secure.client_security()} if self.secure else {}))
        try:
            while True:
                brokers = [b for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced")]
                if len(brokers) >= count:
                    return
                if time.monotonic() > deadline:
                    raise BrokerStartError(
                        f"only {len(brokers)} of {count} Kafka brokers registered within "
                        f"{self.startup_timeout:.0f}s (data dir {self.data_dir}); see each node's server.log")
                time.sleep(0.2)
        finally:
            admin.close()

    def close(self, timeout: float = 30.0) -> None:
        """Stop every node and delete the data dir when this object made it (see EmbeddedBroker.close)."""
        self.stop(timeout)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------
    def _layout(self, nodes: int, port: int) -> dict:
        path = self.data_dir / "cluster.json"
        if path.exists():
            layout = json.loads(path.read_text())
            if len(layout["nodes"]) != nodes:
                raise BrokerStartError(
                    f"{path}: this data dir holds a {len(layout['nodes'])}-node cluster, not {nodes} nodes; "
                    f"start it with --nodes {len(layout['nodes'])} or use another data dir")
            return layout
        ports: set[int] = set()
        while len(ports) < 2 * nodes:  # free_port may hand out one port twice
            ports.add(free_port())
        free = sorted(ports)
        layout = {"cluster_id": kafka_cluster_id(),
                  "nodes": [{"node_id": i + 1, "port": port + i if port else free[2 * i],
                             "controller_port": free[2 * i + 1]} for i in range(nodes)]}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(layout, indent=2))
        return layout
