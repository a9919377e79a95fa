"""The means of injecting faults: signals to component processes, a Toxiproxy path that can cut
a node from the broker, and the Kafka cluster the runner owns (kill, restart, fill its disk).

Nothing here decides *when* a fault lands or what it proves: :mod:`.runner` schedules and
:mod:`.report` judges. Each fault that lasts (a stopped process, a cut link, a full disk)
runs in its own thread and ends by restoring what it took away, so the runner can always
put the world back before it audits.

A partitioned node reaches the broker only through its own :class:`CutLink`. A
broker advertises its own address to clients, which then connect there directly, so a
proxy in front of the bootstrap address alone would be bypassed after the first metadata
request: the broker gets one extra listener per proxied node, bound on an internal port
and *advertised* at that node's proxy, so every connection of the node goes through it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from astraflow.topics import EmbeddedBroker
from astraflow.topics.broker import free_port
from astraflow.topics import security
from astraflow.topology.netns import LinkError
from astraflow.topology.toxiproxy import Toxiproxy

log = logging.getLogger(__name__)


# -- processes ----------------------------------------------------------------------------

def signal_proc(popen: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to a child still running; False when it is gone already."""
    if popen.poll() is not None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(popen.pid, sig)
        return True
    return False


def stop_for(popen: subprocess.Popen, seconds: float, cancel: threading.Event) -> None:
    """SIGSTOP, wait ``seconds`` (or until cancelled), SIGCONT: a zombie past its session timeout."""
    if signal_proc(popen, signal.SIGSTOP):
        cancel.wait(seconds)
        signal_proc(popen, signal.SIGCONT)


def slow_down(popen: subprocess.Popen, duration_s: float, period_s: float, stopped_frac: float,
              cancel: threading.Event) -> None:
    """A slow node: stopped ``stopped_frac`` of every ``period_s`` for ``duration_s``."""
    end = time.monotonic() + duration_s
    try:
        while time.monotonic() < end and not cancel.is_set() and signal_proc(popen, signal.SIGSTOP):
            cancel.wait(period_s * stopped_frac)
            signal_proc(popen, signal.SIGCONT)
            cancel.wait(period_s * (1 - stopped_frac))
    finally:
        signal_proc(popen, signal.SIGCONT)


# -- a cuttable link ------------------------------------------------------------------------

class CutLink:
    """A node's own path to the broker: a Toxiproxy proxy (:mod:`astraflow.topology.toxiproxy`,
    the tool the emulated WAN links use) from a loopback port to ``upstream_port``, until cut.

    Cut: a ``timeout`` toxic (0: never closes) on each stream: no byte passes either way on any
    connection, and new connections are accepted but answered by nothing, as packets vanish in a
    real partition (clients time out rather than being refused). Restored: the toxics go, and the
    proxy is disabled and enabled again, which closes every connection that lived through the cut
    (its stream lost bytes and cannot continue); new ones forward again on the same port.
    """

    def __init__(self, toxiproxy: Toxiproxy, upstream_port: int, name: str = "") -> None:
        self.toxiproxy, self.name = toxiproxy, f"chaos-{name or upstream_port}"
        self.port = toxiproxy.create(self.name, f"127.0.0.1:{upstream_port}")
        self._cut = False

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        self._cut = True
        for stream in ("upstream", "downstream"):
            self.toxiproxy.add_toxic(self.name, f"cut_{stream}", "timeout", stream, timeout=0)

    def restore(self) -> None:
        for stream in ("upstream", "downstream"):
            self.toxiproxy.remove_toxic(self.name, f"cut_{stream}")
        self.toxiproxy.set_enabled(self.name, False)  # closes the connections that lived through the cut
        self.toxiproxy.set_enabled(self.name, True)
        self._cut = False

    def close(self) -> None:
        with contextlib.suppress(LinkError):
            self.toxiproxy.delete(self.name)


# -- the Kafka cluster the runner owns ------------------------------------------------------

class ChaosKafka:
    """One embedded broker (with a proxied listener per node that may be partitioned, and
    optionally a data dir on a size-limited tmpfs for ``disk_full``) or a 3-node cluster.

    Args:
        data_dir: the brokers' data.
        brokers: 1 or 3.
        proxied: node ids that get their own cuttable link (single broker only).
        disk_mb: mount a tmpfs of this size on ``data_dir`` first (needs root).
    """

    def __init__(self, data_dir: Path, brokers: int = 1, proxied: tuple[str, ...] = (),
                 disk_mb: int | None = None) -> None:
        self.data_dir, self.brokers, self.disk_mb = Path(data_dir), brokers, disk_mb
        self.proxies: dict[str, CutLink] = {}
        self.toxiproxy: Toxiproxy | None = None
        self._mounted = False
        self.cluster = None
        self.broker: EmbeddedBroker | None = None
        self._proxied = proxied

    # -- lifecycle
    def start(self) -> "ChaosKafka":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.disk_mb:
            self._mount()
        if self.brokers == 1:
            self.broker = EmbeddedBroker(self.data_dir / "node-1", heap="512m")
            self._add_listeners(self.broker)
            self.broker.start()
        else:
            from astraflow.topics import EmbeddedCluster
            self.cluster = EmbeddedCluster(self.data_dir, nodes=self.brokers, heap="384m").start()
        return self

    def stop(self) -> None:
        for p in self.proxies.values():
            p.close()
        self.proxies = {}
        if self.toxiproxy is not None:
            self.toxiproxy.close()
            self.toxiproxy = None
        if self.broker is not None:
            self.broker.stop()
        if self.cluster is not None:
            self.cluster.stop()
        if self._mounted:
            subprocess.run(["umount", "-l", str(self.data_dir)], check=False)
            self._mounted = False

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers if self.broker else self.cluster.bootstrap_servers

    def bootstrap_for(self, node_id: str) -> str:
        """Where ``node_id`` connects: its proxy when it has one, else the brokers themselves."""
        proxy = self.proxies.get(node_id)
        return f"127.0.0.1:{proxy.port}" if proxy else self.bootstrap_servers

    def nodes(self) -> list[EmbeddedBroker]:
        return [self.broker] if self.broker else list(self.cluster.nodes)

    # -- faults
    def pick(self, target: str, topic: str, rng, *, group: str = "", transactional_id: str = "") -> int:
        """A broker node id: ``leader`` (of ``topic``'s partition 0), ``coordinator`` (of consumer
        ``group``), ``txn_coordinator`` (of ``transactional_id``), ``any`` (drawn) or a number."""
        live = [n.node_id for n in self.nodes() if n.pid is not None]
        if target == "any":
            return rng.choice(live)
        if target in ("leader", "coordinator", "txn_coordinator"):
            if target == "leader":
                node = self.leader(topic)
            elif target == "coordinator":
                node = self.leader("__consumer_offsets", coordinator_partition(group, self._partitions("__consumer_offsets")))
            else:
                node = self.leader("__transaction_state",
                                   coordinator_partition(transactional_id, self._partitions("__transaction_state")))
            return node if node in live else live[0]
        return int(target)

    def _partitions(self, topic: str) -> int:
        admin = security.admin(bootstrap_servers=self.bootstrap_servers, client_id="chaos")
        try:
            return len(admin.describe_topics([topic])[0]["partitions"])
        finally:
            admin.close()

    def leader(self, topic: str, partition: int = 0) -> int | None:
        admin = security.admin(bootstrap_servers=self.bootstrap_servers, client_id="chaos")
        try:
            parts = admin.describe_topics([topic])[0]["partitions"]
            return next(p["leader_id"] for p in parts if p["partition_index"] == partition)
        finally:
            admin.close()

    def kill(self, node_id: int) -> None:
        self._node(node_id).kill()

    def restart(self, node_id: int) -> None:
        """The same node on the same data dir and ports (its committed log is all it has)."""
        if self.cluster is not None:
            self.cluster.restart(node_id)
        else:
            self._node(node_id).start()

    def alive(self, node_id: int) -> bool:
        proc = self._node(node_id)._proc
        return proc is not None and proc.poll() is None

    def fill_disk(self) -> int:
        """Write a ballast file until the data dir's filesystem is full; the bytes written."""
        ballast = self.data_dir / "ballast"
        chunk = b"\0" * (1 << 20)
        written = 0
        with open(ballast, "wb", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk)
            except OSError:
                pass
        return written

    def free_disk(self) -> None:
        """Delete the ballast and restart the broker, as an operator would: Kafka takes a log dir
        that failed a write offline until restart (alone, it halts), whether or not it did here."""
        (self.data_dir / "ballast").unlink(missing_ok=True)
        b = self.broker
        assert b is not None
        b.kill()
        b.start()

    # -- internals
    def _node(self, node_id: int) -> EmbeddedBroker:
        for n in self.nodes():
            if n.node_id == node_id:
                return n
        raise KeyError(f"no broker {node_id} (brokers: {[n.node_id for n in self.nodes()]})")

    def _add_listeners(self, b: EmbeddedBroker) -> None:
        if not self._proxied:
            return
        listeners = [f"PLAINTEXT://127.0.0.1:{b.port}", f"CONTROLLER://127.0.0.1:{b.controller_port}"]
        advertised = list(listeners)
        protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        self.toxiproxy = self.toxiproxy or Toxiproxy(log_path=self.data_dir / "toxiproxy.log")
        for i, node in enumerate(self._proxied):
            internal = free_port()
            proxy = CutLink(self.toxiproxy, internal, node)
            self.proxies[node] = proxy
            name = f"NODE{i}"
            listeners.append(f"{name}://127.0.0.1:{internal}")
            advertised.append(f"{name}://127.0.0.1:{proxy.port}")
            protocols.append(f"{name}:PLAINTEXT")
        b.extra.update({"listeners": ",".join(listeners), "advertised.listeners": ",".join(advertised),
                        "listener.security.protocol.map": ",".join(protocols)})

    def _mount(self) -> None:
        if os.geteuid() != 0 or not shutil.which("mount"):
            raise PermissionError(f"disk_full mounts a {self.disk_mb} MB tmpfs on the broker's data dir "
                                  f"({self.data_dir}) and needs root; run the scenario as root or drop disk_full")
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.disk_mb}m", "tmpfs", str(self.data_dir)],
                       check=True, capture_output=True)
        self._mounted = True


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` (a group id) or ``__transaction_state`` (a
    transactional id) whose leader coordinates ``key``: Kafka takes abs(Java
    ``String.hashCode``) modulo the partitions."""
    h = 0
    for ch in key:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions

