"""The detached broker of ``astraflow broker start``: start it, record it, find it, stop it.

``start`` runs an :class:`~.broker.EmbeddedBroker` (or an :class:`~.cluster.EmbeddedCluster`
of several nodes) in its own session, so that it outlives the command, and writes what it
started to a state file (default :func:`~.broker.state_file`): the bootstrap servers, each
node's pid, ports, data dir and log, and for a secured broker where its CA and super user's
password are. ``status`` and ``stop`` read that file back. A data dir keeps what it was made
for: a secured broker's dir is never restarted in plaintext, nor a cluster's as one node.

It knows nothing about the command line: the CLI checks its flags and prints.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .broker import EmbeddedBroker, pid_alive

__all__ = ["DataDirConflict", "Detached", "alive", "read_state", "start", "stop"]


@dataclass
class Detached:
    """What a state file records of a detached broker or cluster."""

    bootstrap_servers: str
    nodes: list[dict]  #: each node's :class:`~.broker.BrokerInfo` fields
    #: a secured broker's :meth:`~.secured.SecureSetup.describe` and its mutual-TLS listener
    secure: dict | None = None


class DataDirConflict(ValueError):
    """The data dir holds another kind of broker (``held``: ``"secured broker"``,
    ``"plaintext broker"`` or ``"multi-node cluster"``) than the one asked for."""

    def __init__(self, data_dir: Path, held: str) -> None:
        self.data_dir, self.held = data_dir, held
        super().__init__(f"{data_dir} holds a {held}")


def read_state(path: Path) -> Detached | None:
    """The state file's record, or None when there is none."""
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if "nodes" not in state:  # a state file written before clusters existed
        return Detached(state["bootstrap_servers"], [state])
    return Detached(state["bootstrap_servers"], state["nodes"], state.get("secure"))


def alive(nodes: list[dict]) -> list[dict]:
    """The nodes whose process still runs."""
    return [n for n in nodes if pid_alive(n["pid"])]


def stop(path: Path, nodes: list[dict], timeout_s: float = 30.0) -> None:
    """SIGTERM every node at once (stopped one by one, the last nodes lose their quorum),
    SIGKILL those still running after ``timeout_s``; the state file is removed, the data kept."""
    for n in nodes:
        os.kill(n["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(n["pid"]) for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    for n in nodes:
        if pid_alive(n["pid"]):
            os.kill(n["pid"], signal.SIGKILL)
    path.unlink(missing_ok=True)


def start(path: Path, data_dir: Path, *, nodes: int = 1, port: int = 9092, controller_port: int = 0,
          heap: str | None = None, secure: bool = False) -> Detached:
    """Start ``nodes`` detached nodes on ``data_dir`` (``secure``: one SASL_SSL node with ACLs
    enforced and a CA made for the dir) and record them in the state file ``path``.
    :class:`DataDirConflict` when the dir holds another kind of broker."""
    if (data_dir / "secure").exists() != secure and (data_dir / "meta").exists():
        raise DataDirConflict(data_dir, "plaintext broker" if secure else "secured broker")
    if nodes == 1 and (data_dir / "cluster.json").exists():
        raise DataDirConflict(data_dir, "multi-node cluster")
    setup = None
    if secure:
        if nodes != 1:
            raise ValueError("a secured broker is a lone node")
        from .secured import SecureSetup
        setup = SecureSetup.create(data_dir / "secure")
    if nodes == 1:
        broker = EmbeddedBroker(data_dir, port=port, controller_port=controller_port, heap=heap or "1g", detach=True,
                                secure=setup, startup_timeout=180 if setup else 90).start()
        infos, bootstrap = [broker.info()], broker.bootstrap_servers
    else:
        from .cluster import EmbeddedCluster
        cluster = EmbeddedCluster(data_dir, nodes=nodes, port=port, heap=heap or "512m", detach=True).start()
        infos, bootstrap = cluster.info(), cluster.bootstrap_servers
    record = Detached(bootstrap, [i.__dict__ for i in infos],
                      secure={**setup.describe(), "mtls_bootstrap_servers": broker.mtls_bootstrap_servers}
                      if setup else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bootstrap_servers": record.bootstrap_servers, "nodes": record.nodes,
                                **({"secure": record.secure} if record.secure else {})}))
    return record
