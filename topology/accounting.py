"""Device-hours from heartbeats: per pool, per device kind, with cost.

A node is up from its ``starting`` heartbeat (sent for it by whoever started it, so boot
time counts: the device is held while the model loads) or its first heartbeat, through
each later heartbeat, until its ``stopping`` one. A gap longer than ``max_gap_s`` between
two heartbeats is time the node was down (killed, restarting) and is not counted. Device
hours are node hours times the devices a node of its pool holds (a trainer pool: times
its hosts, since only rank 0 heartbeats); cost is device hours times the pool's price.
Nodes no plan knows (``astraflow run`` jobs) are counted under their role, kind
``unknown``, one device, no cost.

This module knows nothing about Kafka clients: feed it :class:`~astraflow.topics.Heartbeat`
records in log order.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.topics import Heartbeat

from .plan import Plan

#: Heartbeats come every ``rollout.heartbeat_s`` (2 s) and between training steps; a
#: longer silence than this means the node was not running.
MAX_GAP_S = 60.0


@dataclass
class _Node:
    pool: str
    role: str
    kind: str
    devices: int
    cost: float
    last: float | None = None  #: ts of the newest heartbeat while up
    booting: bool = False  #: up since a ``starting`` heartbeat, no heartbeat of its own yet
    seconds: float = 0.0


class DeviceHours:
    def __init__(self, plan: Plan | None = None, max_gap_s: float = MAX_GAP_S) -> None:
        self.plan, self.max_gap_s = plan, max_gap_s
        self.nodes: dict[str, _Node] = {}

    def observe(self, hb: Heartbeat) -> None:
        n = self._node(hb)
        if hb.status == "starting":
            if n.last is None:
                n.last, n.booting = hb.ts, True
            return
        if n.last is not None:
            gap = hb.ts - n.last
            if gap > 0 and (gap <= self.max_gap_s or n.booting):
                n.seconds += gap
        n.booting = False
        n.last = None if hb.status in ("stopping", "failed") else max(hb.ts, n.last or hb.ts)  # (its last words)

    def _node(self, hb: Heartbeat) -> _Node:
        pool = self.plan.pool_of(hb.node_id, hb.role, hb.policy) if self.plan else None
        # A trainer beats as trainer.<policy> (rank 0) whatever its launcher called it.
        key = pool.name if pool is not None and pool.component == "trainer" else hb.node_id
        if key not in self.nodes:
            if pool is None:
                self.nodes[key] = _Node(hb.role, hb.role, "unknown", 1, 0.0)
            else:
                hosts = len(pool.hosts) if pool.component == "trainer" else 1
                self.nodes[key] = _Node(pool.name, pool.component, pool.device_kind,
                                        pool.devices_per_node * hosts, pool.cost_per_device_hour)
        return self.nodes[key]

    def totals(self) -> dict:
        """``{pools: {...}, kinds: {...}, rollout, trainer, total, cost}`` (hours)."""
        pools: dict[str, dict] = {}
        for n in self.nodes.values():
            p = pools.setdefault(n.pool, {"role": n.role, "kind": n.kind, "node_hours": 0.0, "device_hours": 0.0,
                                          "cost": 0.0, "nodes": 0})
            p["nodes"] += 1
            p["node_hours"] += n.seconds / 3600
            p["device_hours"] += n.seconds * n.devices / 3600
            p["cost"] += n.seconds * n.devices / 3600 * n.cost
        return pool_totals(pools)


def pool_totals(pools: dict[str, dict]) -> dict:
    """``pools`` (name -> ``{role, kind, device_hours, cost, ...}``) with their sums: per device
    kind, the rollout and trainer roles' device-hours, the total and the cost (the heartbeats'
    count and Slurm's job completion log add up alike)."""
    kinds: dict[str, dict] = {}
    for p in pools.values():
        k = kinds.setdefault(p["kind"], {"device_hours": 0.0, "cost": 0.0})
        k["device_hours"] += p["device_hours"]
        k["cost"] += p["cost"]

    def role(r: str) -> float:
        return sum(p["device_hours"] for p in pools.values() if p["role"] == r)
    return {"pools": pools, "kinds": kinds, "rollout": role("raas"), "trainer": role("trainer"),
            "total": sum(p["device_hours"] for p in pools.values()), "cost": sum(p["cost"] for p in pools.values())}


def starting_heartbeat(node_id: str, role: str, policy: str | None, ts: float) -> Heartbeat:
    """What a launcher sends for a node it has just started: the node's time begins now."""
    return Heartbeat(node_id, role, policy or "", 0, ts=ts, status="starting")
