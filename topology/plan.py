"""The resolved plan of a topology: which node runs where, on which cluster, owned by whom.

:func:`resolve` turns a validated :class:`~.schema.Topology` (and, when given, the job's
policy) into :class:`NodePlan` records, one per node started at launch, each with the
``--set`` overrides and flags its ``astraflow node`` command needs; :class:`PoolPlan`
records with everything the autoscaler and the device-hours accounting need; and the
Kafka clusters, with the regions that share each. Nodes of elastic pools belong to the
autoscaler when it is on (it starts and retires them), every other node to its host.
:func:`format_plan` is what ``astraflow topology check`` prints.

This module knows nothing about processes or Kafka clients.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .schema import (EMBEDDED, REGION_REF, ClusterSecurityConfig, Device, SlurmResources, SlurmSpec, Topology,
                     TopologyError)
from .validation import autoscaler_host, local_backend_misplaced, pools

#: The job's policy when a pool names none and no job is given.
JOB_POLICY = "(job policy)"


@dataclass(frozen=True)
class Cluster:
    """One Kafka cluster and the regions that use it."""

    name: str  #: "embedded" or the bootstrap servers
    declared_by: str  #: the region that declares it
    regions: tuple[str, ...]
    security: ClusterSecurityConfig | None = None  #: its declaring region's ``kafka_security`` (None: the job's)

    @property
    def embedded(self) -> bool:
        return self.name == EMBEDDED


@dataclass(frozen=True)
class PoolPlan:
    name: str
    component: str
    region: str
    hosts: tuple[str, ...]
    policy: str | None  #: None for the dataflow
    count: int
    min: int
    max: int
    elastic: bool  #: the autoscaler starts and retires its nodes
    device_kind: str
    devices_per_node: int
    speed: float
    cost_per_device_hour: float
    device: Device  #: its nodes' devices (emulated or not: ``Device.device_config``)
    threads: int | None
    slurm: SlurmResources = SlurmResources()  #: what sbatch asks for one of its nodes

    @property
    def cost_per_speed(self) -> float:
        """What a unit of throughput costs an hour: the autoscaler grows the cheapest pools first."""
        return self.cost_per_device_hour * self.devices_per_node / self.speed

    def node_id(self, index: int) -> str:
        if self.component == "raas" or (self.component == "trainer" and len(self.hosts) > 1):
            return f"{self.name}-{index}"
        return self.name

    def overrides(self) -> list[str]:
        """``--set`` items that give a node of this pool its pool's settings."""
        out = []
        if self.threads is not None:
            key = {"raas": "rollout.engine.threads", "trainer": "trainer.engine.threads", "dataflow": "eval.threads"}
            out.append(f"{key[self.component]}={self.threads}")
        if self.device.emulated:  # the node's engine calls are held for their emulated time
            section = {"raas": "rollout", "trainer": "trainer", "dataflow": "eval"}[self.component]
            d = self.device.device_config()
            keys = ("kind", "profile", "slowdown", "count", "dilation", "token_scale", "prompt_token_scale", "workload")
            out += [f"{section}.device.{k}={getattr(d, k)}" for k in keys if getattr(d, k) not in ("", None)]
        return out


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    role: str
    pool: str
    region: str
    host: str
    address: str
    policy: str | None
    overrides: tuple[str, ...] = ()  #: ``--set KEY=VALUE`` items
    flags: tuple[str, ...] = ()  #: extra ``astraflow node`` flags (a trainer group's placement)
    owner: str = "host"  #: "host" (its host's runner starts it) or "autoscaler"


@dataclass
class Plan:
    name: str
    source: str
    clusters: list[Cluster]
    pools: dict[str, PoolPlan]
    nodes: list[NodePlan]  #: every node started at launch
    links: list[dict]
    autoscaler: dict
    autoscaler_host: str
    host_addresses: dict[str, str]
    region_hosts: dict[str, list[str]]  #: region -> its hosts, in file order
    notes: list[str] = field(default_factory=list)
    emulate_links: bool = True  #: the topology's ``emulate_links``
    slurm: SlurmSpec = SlurmSpec()  #: the topology's ``slurm`` (``conf`` made absolute)

    @property
    def shared_cluster(self) -> bool:
        return len(self.clusters) == 1

    @property
    def home(self) -> Cluster:
        """The home cluster: the dataflow's (and every trainer's: :mod:`.validation` checks it).
        It holds every topic; a region with a cluster of its own gets ``weights.<p>`` and
        ``versions`` mirrored from it (docs/cross_region_mirror.md)."""
        region = next((p.region for p in self.pools.values() if p.component == "dataflow"), None)
        return self.cluster_of(region) if region is not None else self.clusters[0]

    @property
    def kafka_region(self) -> str:
        """The region of the home cluster (the region that declares it)."""
        return self.home.declared_by

    def mirrored_clusters(self) -> list[Cluster]:
        """The regions' own clusters: every cluster but home's."""
        return [c for c in self.clusters if c != self.home]

    def link_to_home(self, region: str) -> dict | None:
        return next((lk for lk in self.links if set(lk["between"]) == {region, self.kafka_region}), None)

    def emulated_links(self) -> list[dict]:
        """The links ``astraflow launch`` emulates with its embedded broker: per region other than
        the home cluster's own with a link to it, that link (``region``, ``kafka_region``,
        ``latency_ms``, ``bandwidth_mbps``, ``own_cluster``: whether the region runs a cluster of
        its own, mirrored from home, inside its namespace). Empty when ``emulate_links`` is off or
        the home cluster is not the embedded broker."""
        if not self.emulate_links or not self.home.embedded:
            return []
        home = self.kafka_region
        out = []
        for region in self.region_hosts:
            link = self.link_to_home(region)
            own = self.cluster_of(region) != self.home
            if region != home and link is not None and (not own or self.cluster_of(region).embedded):
                out.append({"region": region, "kafka_region": home, "latency_ms": link["latency_ms"],
                            "bandwidth_mbps": link["bandwidth_mbps"], "own_cluster": own})
        return out

    def cluster_of(self, region: str) -> Cluster:
        return next(c for c in self.clusters if region in c.regions)

    def nodes_on(self, host: str) -> list[NodePlan]:
        return [n for n in self.nodes if n.host == host]

    def pool_of(self, node_id: str, role: str = "", policy: str | None = None) -> PoolPlan | None:
        """The pool a node belongs to, from its id (``<pool>-<i>``; on Kubernetes a RaaS pod's
        ``<pool>-<pod name>``, the longest pool name that prefixes it) or, for a trainer, its policy."""
        if role == "trainer":
            return next((p for p in self.pools.values() if p.component == "trainer"
                         and p.policy in (policy, None)), None)
        name, _, index = node_id.rpartition("-")
        if index.isdigit() and name in self.pools:
            return self.pools[name]
        if node_id in self.pools:
            return self.pools[node_id]
        return max((p for p in self.pools.values() if p.component == "raas" and node_id.startswith(p.name + "-")),
                   key=lambda p: len(p.name), default=None)

    def node_spec(self, pool: PoolPlan, index: int) -> NodePlan:
        """Node ``index`` of ``pool`` (the autoscaler makes these as it grows a pool)."""
        return _node(pool, index, self.host_addresses)

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source,
                "clusters": [asdict(c) for c in self.clusters], "shared_cluster": self.shared_cluster,
                "pools": {n: asdict(p) for n, p in self.pools.items()},
                "nodes": [asdict(n) for n in self.nodes], "links": self.links,
                "autoscaler": {**self.autoscaler, "host": self.autoscaler_host}, "notes": self.notes,
                "emulate_links": self.emulate_links, "emulated_links": self.emulated_links(),
                "slurm": asdict(self.slurm)}


def resolve(t: Topology, job_policy: str | None = None) -> Plan:
    """The plan of a validated topology; ``job_policy`` fills pools that name no policy."""
    scaling = t.autoscaler.enabled
    addresses = {h: host.address for region in t.regions.values() for h, host in region.hosts.items()}
    pool_plans: dict[str, PoolPlan] = {}
    for rname, pname, p in pools(t):
        policy = None if p.component == "dataflow" else (p.policy or job_policy)
        pool_plans[pname] = PoolPlan(
            pname, p.component, rname, p.hosts, policy, p.count, p.lo, p.hi, scaling and p.elastic,
            p.device.kind, p.device.count, p.node_speed, p.cost_per_device_hour, p.device, p.threads, p.slurm)
    nodes: list[NodePlan] = []
    for rname, pname, p in pools(t):
        pp = pool_plans[pname]
        for i in range(p.count):
            node = _node(pp, i, addresses)
            if p.component == "trainer" and len(p.hosts) > 1:
                node = replace(node, flags=("--nnodes", str(len(p.hosts)), "--node-rank", str(i),
                                             "--master-addr", addresses[p.hosts[0]],
                                             "--master-port", str(p.master_port)))
            nodes.append(node)
    plan = Plan(t.name, t.source, _clusters(t), pool_plans, nodes,
                [{"between": list(link.between), "bandwidth_mbps": link.bandwidth_mbps,
                  "latency_ms": link.latency_ms} for link in t.links],
                {k: v for k, v in asdict(t.autoscaler).items() if k != "host"}, autoscaler_host(t), addresses,
                {r: list(region.hosts) for r, region in t.regions.items()}, emulate_links=t.emulate_links,
                slurm=_absolute_conf(t))
    if plan.home.security is not None:
        raise TopologyError(t.source, f"regions.{plan.home.declared_by}.kafka_security",
                            "set on the home cluster, whose clients (every component of the job) authenticate with "
                            "the job config's kafka.security: set it there")
    plan.notes = _notes(plan)
    misplaced = local_backend_misplaced(t)
    if misplaced:
        plan.notes.append(f"the local backend starts nodes on the autoscaler's host ({plan.autoscaler_host}) but "
                          f"elastic pool {misplaced[1]} is on {misplaced[2]}: fine for `astraflow launch` (one "
                          f"machine), refused by `astraflow node --topology` (use autoscaler.backend: command or slurm)")
    return plan


def _absolute_conf(t: Topology) -> SlurmSpec:
    conf = t.slurm.conf
    if conf is None or Path(conf).is_absolute():
        return t.slurm
    return replace(t.slurm, conf=str(Path(t.source).parent.resolve() / conf))


def _node(pool: PoolPlan, index: int, addresses: dict[str, str]) -> NodePlan:
    host = pool.hosts[index % len(pool.hosts)]
    return NodePlan(pool.node_id(index), pool.component, pool.name, pool.region, host, addresses[host],
                    pool.policy, tuple(pool.overrides()), owner="autoscaler" if pool.elastic else "host")


def _clusters(t: Topology) -> list[Cluster]:
    declared: dict[str, list[str]] = {}  # declaring region -> regions using its cluster
    for rname, region in t.regions.items():
        k = region.kafka.strip()
        owner = k[len(REGION_REF):].strip() if k.startswith(REGION_REF) else rname
        declared.setdefault(owner, []).append(rname)
    # Two regions that write the same bootstrap servers share a cluster too.
    by_servers: dict[str, Cluster] = {}
    out: list[Cluster] = []
    for owner, regions in declared.items():
        k = t.regions[owner].kafka.strip()
        servers = EMBEDDED if k == EMBEDDED else ",".join(sorted(s.strip() for s in k.split(",")))
        if servers != EMBEDDED and servers in by_servers:
            c = by_servers[servers]
            if t.regions[owner].kafka_security != c.security:  # one cluster, one way in for its clients
                raise TopologyError(t.source, f"regions.{owner}.kafka_security",
                                    f"differs from region {c.declared_by}'s, which names the same cluster "
                                    f"({servers}); give it once, there, and write kafka: 'region:{c.declared_by}'")
            merged = replace(c, regions=c.regions + tuple(regions))
            out[out.index(c)] = merged
            by_servers[servers] = merged
            continue
        c = Cluster(servers, owner, tuple(regions), t.regions[owner].kafka_security)
        out.append(c)
        if servers != EMBEDDED:
            by_servers[servers] = c
    return out


def _notes(plan: Plan) -> list[str]:
    notes = []
    if len(plan.clusters) > 1:
        own = ", ".join(c.declared_by + (f" (shared with {', '.join(_sharers(c))})" if _sharers(c) else "")
                        for c in plan.mirrored_clusters())
        notes.append(f"{len(plan.clusters)} Kafka clusters: the home cluster (region {plan.kafka_region}) holds every "
                     f"topic; MirrorMaker 2 copies weights.<policy> and versions one way from it into the own "
                     f"cluster of {own}; the RaaS nodes of the regions on such a cluster read their weights there "
                     f"(once per cluster over the link) and everything else from home")
        for c in plan.mirrored_clusters():
            r = c.declared_by
            shared = f" (the one mirror of the cluster {' and '.join(c.regions)} share)" if _sharers(c) else ""
            also = (f"; `--region {' or --region '.join(_sharers(c))}` names the same mirror (a second one is "
                    f"refused by its claim on the cluster)" if _sharers(c) else "")
            notes.append(f"region {r}'s MirrorMaker 2{shared}: run by `astraflow launch` on one machine" + (
                f"; on hosts (`astraflow node --topology`), run `astraflow mirror --topology {plan.source} --region "
                f"{r} --config JOB` where it reaches both clusters{also}" if not c.embedded else
                f" (its cluster is 'embedded', so `astraflow node --topology` refuses it: name an existing cluster)"))
    elif len(plan.clusters[0].regions) > 1:
        notes.append(f"regions {', '.join(plan.clusters[0].regions)} share one Kafka cluster: no replication "
                     f"between them (each record crosses the region link at most once, to or from that cluster)")
    if plan.links:
        notes.append("links are used for placement (the autoscaler prefers pools near the trainer at equal cost)")
        notes.append(_emulation_note(plan))
    for p in plan.pools.values():
        if p.device.emulated:
            what = {"raas": "engine call", "trainer": "training step", "dataflow": "evaluation call"}[p.component]
            how = (f"held for its modelled time on {p.device.emulate}" if p.device.emulate
                   else f"stretched x{p.device.slowdown:g}")
            notes.append(f"pool {p.name}: EMULATION — its {p.device_kind} nodes run on CPU, every {what} {how} (sleep)")
    return notes


def _emulation_note(plan: Plan) -> str:
    if not plan.emulate_links:
        return "links are not emulated (emulate_links: false): every node reaches the broker directly"
    if not plan.home.embedded:
        return (f"links are not emulated: the Kafka cluster is external ({plan.home.name}); emulation "
                f"needs the embedded broker `astraflow launch` starts")
    emulated = plan.emulated_links()
    if not emulated and not any(not c.embedded for c in plan.mirrored_clusters()):
        return f"links are not emulated: no region is linked to the Kafka region {plan.kafka_region}"
    parts = [f"{e['region']} nodes run in a network namespace of their own"
             + (" with the region's own cluster and its MirrorMaker 2" if e["own_cluster"] else "")
             + f" and reach the broker in {e['kafka_region']} through a link adding {e['latency_ms']:g} ms each way, "
               f"{e['bandwidth_mbps']:g} Mbit/s per direction shared by all their connections" for e in emulated]
    done = {e["region"] for e in emulated}
    existing = [r for r in plan.region_hosts if r not in done and r != plan.kafka_region
                and plan.cluster_of(r) != plan.home and not plan.cluster_of(r).embedded]
    unlinked = [r for r in plan.region_hosts if r != plan.kafka_region and r not in done and r not in existing]
    tail = f"; {', '.join(unlinked)} (no link to {plan.kafka_region}) connect directly" if unlinked else ""
    which = ("an existing cluster of its own" if all(plan.cluster_of(r).declared_by == r for r in existing)
             else "an existing regional cluster")
    tail += (f"; {', '.join(existing)} ({which}: not emulated, emulation needs the embedded "
             f"broker) connect directly" if existing else "")
    if not parts:
        return "links are not emulated" + tail
    return "EMULATION of links by `astraflow launch` (embedded broker only): " + "; ".join(parts) + tail


def without_emulation(plan: Plan, bootstrap: str) -> None:
    """``launch`` given an existing cluster (``--bootstrap-servers``) instead of the embedded
    broker the file names: no links emulated, and a note that says so."""
    if not plan.emulated_links():
        return
    plan.emulate_links = False
    note = (f"links are not emulated: this run uses the existing cluster {bootstrap} (--bootstrap-servers or "
            f"kafka.bootstrap_servers), and emulation needs the embedded broker")
    plan.notes = [note if n.startswith("EMULATION of links") else n for n in plan.notes]


def check_launchable(plan: Plan) -> None:
    """``astraflow launch`` refuses what it cannot run, naming why. A regional cluster (embedded,
    which launch starts, or existing, named by its bootstrap servers; launch runs its one
    MirrorMaker 2 either way) may serve several regions when all their nodes reach it: an existing
    cluster always (it is never behind an emulated link); an embedded one only when none of those
    regions sits behind an emulated link. Behind emulated links each region's nodes run in a
    network namespace of their own that reaches only the home broker across its link, so a broker
    in one region's namespace (or outside them all) is out of another's reach."""
    emulated = {e["region"] for e in plan.emulated_links()}
    for c in plan.mirrored_clusters():
        behind = [r for r in c.regions if r in emulated]
        if not (c.embedded and _sharers(c) and behind):
            continue
        owner = c.declared_by
        # the key to name: a sharer cut off from the broker (any, when the broker is the one behind a link)
        other = next(r for r in _sharers(c) if owner in behind or r in behind)
        where = f"inside region {owner}'s namespace" if owner in behind else "outside the regions' namespaces"
        raise TopologyError(plan.source, f"regions.{other}.kafka",
                            f"shares the embedded cluster of region {owner}, but `astraflow launch` emulates the "
                            f"link of {', '.join(behind)} to {plan.kafka_region}: a region behind an emulated link "
                            f"runs its nodes (and an embedded cluster of its own) in a network namespace that "
                            f"reaches only the home broker across the link, so region {owner}'s broker, {where}, is "
                            f"not where region {other}'s nodes can reach Kafka. Put {other}'s hosts in region {owner}, give the "
                            f"cluster's bootstrap servers (an existing cluster, not emulated), give {other} 'kafka: "
                            f"embedded' (a cluster of its own) or 'region:{plan.kafka_region}' (direct mode), or set "
                            f"emulate_links: false")


def check_multi_host(plan: Plan) -> None:
    """``astraflow node --topology`` and ``astraflow mirror`` start no broker: a region's own
    cluster must be an existing one (bootstrap servers); several regions may share it."""
    for c in plan.mirrored_clusters():
        if c.embedded:
            raise TopologyError(plan.source, f"regions.{c.declared_by}.kafka",
                                "is 'embedded', a cluster only `astraflow launch` starts (one machine); on a "
                                "multi-host deployment give the region's existing cluster as 'host:port,...' "
                                f"(its MirrorMaker 2: `astraflow mirror --region {c.declared_by}`), or "
                                f"'region:{plan.kafka_region}' (direct mode)")
    check_launchable(plan)


def cluster_security(plan: Plan, cluster: Cluster):
    """The :class:`~astraflow.topics.security.ClientSecurity` of a regional cluster's
    ``kafka_security`` (its password read now), or None (the process's setting: the job's
    ``kafka.security``); :class:`TopologyError` naming the key and the topology file."""
    if cluster.security is None:
        return None
    return cluster.security.client(plan.source, f"regions.{cluster.declared_by}.kafka_security",
                                   Path(plan.source).parent, TopologyError)


def own_clusters(plan: Plan) -> dict[str, Cluster]:
    """Declaring region -> its regional cluster (mirrored from home): one entry per cluster, whose
    one MirrorMaker 2 is named after that region. Where a node's region picks the cluster it reads
    weights from, use :func:`region_clusters` (a region may share another's cluster)."""
    return {c.declared_by: c for c in plan.mirrored_clusters()}


def region_clusters(plan: Plan) -> dict[str, Cluster]:
    """Region -> the regional cluster its RaaS nodes read versions and weights from, for every
    region whose cluster is not home's; regions that share a cluster map to the same one."""
    home = plan.home
    return {r: c for r in plan.region_hosts if (c := plan.cluster_of(r)) != home}


def _sharers(c: Cluster) -> list[str]:
    """The regions that use ``c`` besides the one that declares it."""
    return [r for r in c.regions if r != c.declared_by]


def format_plan(plan: Plan) -> str:
    lines = [f"topology {plan.name} ({plan.source})"]
    lines.append(f"kafka: {len(plan.clusters)} cluster(s)")
    for c in plan.clusters:
        what = "embedded broker, started by `astraflow launch`" if c.embedded else f"bootstrap {c.name}"
        mirrored = f"weights and versions mirrored from {plan.kafka_region}"
        role = ("home: every topic" if c == plan.home else
                f"own cluster: {mirrored} by MirrorMaker 2" if not _sharers(c) else
                f"own cluster of {c.declared_by}, shared with {', '.join(_sharers(c))}: {mirrored} by one "
                f"MirrorMaker 2 ({c.declared_by}'s); the RaaS nodes of {', '.join(c.regions)} read their weights there")
        lines.append(f"  {what}: region(s) {', '.join(c.regions)}" + (f" [{role}]" if len(plan.clusters) > 1 else ""))
    for rname, hosts in plan.region_hosts.items():
        lines.append(f"region {rname}: hosts {', '.join(f'{h} ({plan.host_addresses[h]})' for h in hosts)}")
        for p in (p for p in plan.pools.values() if p.region == rname):
            lines.append("  " + _pool_line(p))
    emulated = [{e["region"], e["kafka_region"]} for e in plan.emulated_links()]
    for link in plan.links:
        a, b = link["between"]
        how = ("  [EMULATED by launch: a shaped link to the broker]" if {a, b} in emulated
               else "  [not emulated]")
        lines.append(f"link {a} <-> {b}: {link['bandwidth_mbps']:g} Mbit/s, {link['latency_ms']:g} ms{how}")
    a = plan.autoscaler
    if a["enabled"]:
        lines.append(f"autoscaler: on, on host {plan.autoscaler_host}, backend {a['backend']}; every "
                     f"{a['interval_s']:g}s over a {a['window_s']:g}s window: trainer wait w > {a['scale_up_wait']:g} "
                     f"-> ceil(G/(1-w)), w < {a['scale_down_wait']:g} -> busy/{a['target_utilization']:g}; "
                     f"cooldown {a['cooldown_s']:g}s, {a['confirm']} agreeing decisions")
        order = sorted((p for p in plan.pools.values() if p.elastic), key=_grow_key(plan))
        lines.append(f"  grows {', '.join(p.name for p in order)} first (cost per unit of speed, then link latency)")
    else:
        lines.append(f"autoscaler: off (pools stay at count; device-hours are still accounted on host "
                     f"{plan.autoscaler_host})")
    lines.append("nodes at launch:")
    for host in plan.host_addresses:
        mine = plan.nodes_on(host)
        if mine:
            lines.append(f"  {host}: " + ", ".join(n.node_id + (" (autoscaler)" if n.owner == "autoscaler" else "")
                                                 for n in mine))
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _pool_line(p: PoolPlan) -> str:
    where = f"on {', '.join(p.hosts)}"
    if p.component == "dataflow":
        return f"{p.name}: dataflow {where}"
    size = f"{p.count} node(s)" + (f", elastic {p.min}..{p.max}" if p.elastic else
                                   f", {p.min}..{p.max} (autoscaler off)" if p.min < p.max else ", fixed")
    line = (f"{p.name}: {p.component} of {p.policy or JOB_POLICY}, {size} {where}; {p.devices_per_node} x "
            f"{p.device_kind} per node, speed {p.speed:.3g}, {p.cost_per_device_hour:g}/device-hour")
    if p.device.emulated:
        line += (f"  [EMULATED on CPU: {p.device.emulate}]" if p.device.emulate
                 else f"  [EMULATED on CPU: slowdown x{p.device.slowdown:g}]")
    return line


def link_latency(plan: Plan, a: str, b: str) -> float:
    if a == b:
        return 0.0
    for link in plan.links:
        if set(link["between"]) == {a, b}:
            return float(link["latency_ms"])
    return float("inf")


def trainer_region(plan: Plan, policy: str | None) -> str | None:
    return next((p.region for p in plan.pools.values() if p.component == "trainer" and p.policy == policy), None)


def _grow_key(plan: Plan):
    def key(p: PoolPlan):
        return (p.cost_per_speed, link_latency(plan, p.region, trainer_region(plan, p.policy) or p.region), p.name)
    return key


def grow_order(plan: Plan, policy: str | None) -> list[PoolPlan]:
    """Elastic pools of a policy, the one to grow first first (cheapest per speed, nearest the trainer)."""
    return sorted((p for p in plan.pools.values() if p.elastic and p.policy == policy), key=_grow_key(plan))
