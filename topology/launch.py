"""``astraflow topology check``, ``astraflow launch``'s additions and ``astraflow node --topology``.

``check`` loads a topology (and optionally a job config), resolves its plan and prints it.
:class:`TopologyRun` is what ``astraflow launch`` (:func:`astraflow.launcher.launch`) adds
to the launcher's own run (:func:`astraflow.launcher.run_job`: broker, topics, progress,
restarts, run directory): the plan's processes instead of the job config's (``--backend
slurm``: a Slurm batch job each, :mod:`.slurm`, supervised by the same loop, the autoscaler
acting through Slurm too), and the autoscaler actor beside them; with the embedded broker, nodes of a region other than the
Kafka cluster's run in a network namespace of their own and reach it through an emulation
of their link (:mod:`.links`: bandwidth shared by all the region's connections, latency, cuts). ``node
--topology F --host H`` (:func:`run_host`) is one host's share of the same plan on a real
deployment: its nodes as processes, supervised with :mod:`.processes`, and the autoscaler
when it lives on this host; a host without a trainer or dataflow stops when the trainer
announces it is done.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from astraflow.actors.signing import unkeyed
from astraflow.actors.supervisor import ChildSpec, Outcome, Supervisor
from astraflow.config import JobConfig, load_config
from astraflow.topics import Consumer, DeadLetters, Heartbeat, Metric, Producer, TopicPartition, job_topics
from astraflow.topics.claim import ExclusiveClaim
from astraflow.topics.replay import read_topic
from astraflow.typed_config import ConfigError

from .accounting import DeviceHours, starting_heartbeat
from .autoscaler import AutoscalerActor
from .actuators import make_backend
from .job_mirror import claim_group, snapshot_bytes
from .links import LinkEmulation
from .plan import (Plan, check_launchable, check_multi_host, cluster_security, format_plan, region_clusters,
                   resolve)
from .processes import Proc, RunFailed, node_command, stop_processes, supervise
from .regional import RegionalCluster, job_mirror_plan
from .schema import TopologyError
from .slurm import Slurm, check_slurm_launchable, slurm_proc, slurm_summary
from .validation import load_topology, local_backend_misplaced, validate_for_job


def load_plan(topology: str | Path, cfg: JobConfig | None = None) -> Plan:
    t = load_topology(topology)
    if cfg is not None:
        validate_for_job(t, cfg.policy_names, cfg.kafka.task_partitions, cfg.source,
                         served_by={p: cfg.pool_of(p) for p in cfg.policy_names if cfg.pool_of(p) != p},
                         trained_by={p: cfg.trainer_process_of(p) for p in cfg.policy_names
                                     if cfg.trainer_process_of(p) != p})
    return resolve(t, cfg.policy if cfg is not None else None)


def check_topology(path: str, *, job: str | None = None, overrides: dict | None = None,
                   as_json: bool = False) -> int:
    cfg = load_config(job, overrides) if job else None
    plan = load_plan(path, cfg)
    print(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))
    try:
        check_launchable(plan)
    except TopologyError as e:
        print(f"warning: `astraflow launch` refuses it: {e}", file=sys.stderr)
    print(f"{path}: valid" + (f" for {job}" if job else ""), file=sys.stderr)
    return 0


def node_command_for(cfg: JobConfig, bootstrap: str, run_dir: Path, overrides: list[str],
                     region_bootstrap: dict[str, str] | None = None, region_wrap: dict | None = None,
                     region_weights: dict[str, str] | None = None,
                     region_security: dict[str, list[str]] | None = None):
    """``NodePlan -> argv``: :func:`.processes.node_command` with the node's pool settings and flags.

    ``region_bootstrap``: region -> the address its nodes reach Kafka at instead of
    ``bootstrap`` (an emulated link's, :mod:`.links`); ``region_wrap``: region -> a function
    of argv that runs it inside the region (its network namespace); ``region_weights``: region
    -> the regional cluster (its own, or one it shares with other regions) where its RaaS nodes
    read versions and weights (``rollout.weights_bootstrap_servers``), and ``region_security``:
    region -> the overrides of ``rollout.weights_security`` when that cluster has a
    ``kafka_security`` (:func:`weights_security`).
    The autoscaler's backend starts nodes through this same function, so its nodes get them too."""
    region_bootstrap, region_wrap, region_weights = region_bootstrap or {}, region_wrap or {}, region_weights or {}
    region_security = region_security or {}

    def command(node) -> list[str]:
        view = cfg.view(node.policy) if len(cfg.policy_names) > 1 and node.policy else cfg
        weights = ([f"rollout.weights_bootstrap_servers={region_weights[node.region]}",
                    *region_security.get(node.region, [])]
                   if node.role == "raas" and node.region in region_weights else [])
        argv = (node_command(node.role, view, region_bootstrap.get(node.region, bootstrap), run_dir, node.node_id,
                             [*overrides, *node.overrides, *weights])
                + list(node.flags))
        wrap = region_wrap.get(node.region)
        return wrap(argv) if wrap is not None else argv
    return command


def weights_security(plan: Plan) -> dict[str, list[str]]:
    """Region -> the ``--set rollout.weights_security.*`` pairs of its RaaS nodes, for each region
    whose regional cluster (its own or a shared one) has a ``kafka_security`` (paths made absolute
    from the topology file's folder; file and variable names only, never a password)."""
    return {r: c.security.absolute(Path(plan.source).parent).overrides("rollout.weights_security")
            for r, c in region_clusters(plan).items() if c.security is not None}


def announce_started(bootstrap: str, cfg: JobConfig, nodes) -> None:
    """``starting`` heartbeats for nodes just started: their device time begins now, not at their first beat."""
    topics = job_topics(cfg)
    with contextlib.closing(Producer(bootstrap, client_id="launcher")) as p:
        for n in (n for n in nodes if n.role != "dataflow"):  # the dataflow holds no device and never beats
            p.send(topics.control, starting_heartbeat(n.node_id, n.role, n.policy, time.time()), key=n.node_id,
                   trace=False)
        p.flush()


def autoscaled_policies(plan: Plan, cfg: JobConfig) -> list[str]:
    """The policies the autoscaler runs for: those with a RaaS pool, in the job's order."""
    served = {p.policy or cfg.policy for p in plan.pools.values() if p.component == "raas"}
    return [p for p in cfg.policy_names if p in served]


@contextlib.contextmanager
def autoscaler_running(plan: Plan, cfg: JobConfig, bootstrap: str, backend):
    """The autoscaler actor under a supervisor (restarted with backoff); yields its :class:`Outcome`."""
    outcome = Outcome()

    def spec(policy: str, name: str, hours: bool) -> ChildSpec:
        view = cfg.view(policy) if len(cfg.policy_names) > 1 else cfg
        return ChildSpec(name, lambda sup, n: AutoscalerActor.start(sup, n, plan, view, bootstrap, backend,
                                                                    report_hours=hours), required=False)
    # One actor per policy with a RaaS pool: each sizes its own pools from its own trainer's
    # wait and its own task lag; the first also reports the job's device-hours.
    policies = autoscaled_policies(plan, cfg)
    ref = Supervisor.start([spec(p, "autoscaler" if len(policies) == 1 else f"autoscaler.{p}", i == 0)
                            for i, p in enumerate(policies)], outcome)
    try:
        yield outcome
    finally:
        ref.stop(block=True, timeout=60)


def recount_device_hours(bootstrap: str, cfg: JobConfig, plan: Plan | None) -> dict:
    """Device-hours of the whole run, from every heartbeat on ``control`` (the summary's figures)."""
    hours = DeviceHours(plan)
    for _, _, m in read_topic(bootstrap, job_topics(cfg).control):
        if isinstance(m, Heartbeat):
            hours.observe(m)
    return hours.totals()


class TopologyRun:
    """What ``astraflow launch`` (:func:`astraflow.launcher.launch`) adds to the launcher's run
    (see :func:`astraflow.launcher.run_job`)."""

    def __init__(self, plan: Plan, cfg: JobConfig, overrides: list[str], backend: str = "local") -> None:
        self.plan, self.cfg, self.overrides = plan, cfg, overrides
        if backend not in ("local", "slurm"):
            raise ValueError(f"backend must be local or slurm, got {backend!r}")
        #: ``launch --backend slurm``: every node a Slurm job (:mod:`.slurm`), None: processes here
        self.slurm = Slurm(plan.slurm) if backend == "slurm" else None
        if self.slurm is not None:
            check_slurm_launchable(plan)
        self.backend = None
        self.outcome = None
        self.wan = None  #: the emulated links (:class:`~.links.LinkEmulation`), with the embedded broker
        #: declaring region -> its regional cluster (:class:`~.regional.RegionalCluster`), one per cluster
        self.regions: dict = {}
        self.claims: list = []  #: the mirror claims held on existing regional clusters
        self.extra: dict = {}
        self.job_feed = None  #: with Slurm: the producer of the ``slurm.job`` metrics
        self.reported: set[str] = set()  #: the Slurm job ids on ``metrics`` already

    @contextlib.contextmanager
    def broker_setup(self, broker):
        """Before the embedded broker starts: per emulated link, the region's namespace, its
        shaped link and a broker listener advertised at the link's address in the region."""
        links = self.plan.emulated_links()
        if not links:
            yield
            return
        self.wan = LinkEmulation()
        try:
            for e in links:
                self.wan.add(e["region"], bandwidth_mbps=e["bandwidth_mbps"], latency_ms=e["latency_ms"])
            broker.extra.update(self.wan.broker_properties(broker.port, broker.controller_port))
        except BaseException:
            self.wan.close()
            raise
        try:
            yield
        finally:
            self.close_regions()  # their processes live in the links' namespaces
            self.wan.close()

    def start_regions(self, bootstrap: str, run_dir: Path) -> None:
        """Each regional cluster, once however many regions share it, named after the region that
        declares it: its broker (embedded: started here, in that region's namespace when its link
        is emulated; existing: nothing to start) and one MirrorMaker 2 copying ``weights.<p>`` and
        ``versions`` from home."""
        there = self.wan.bootstrap_for() if self.wan is not None else {}
        try:
            for c in self.plan.mirrored_clusters():
                region = c.declared_by
                link = self.wan.links.get(region) if self.wan is not None else None
                rc = self.regions[region] = RegionalCluster(region, run_dir / "regions" / region, link,
                                                            bootstrap=None if c.embedded else c.name,
                                                            security=cluster_security(self.plan, c))
                rc.start()
                if rc.existing:  # an `astraflow mirror` elsewhere must not copy this job into it too
                    self.claims.append(ExclusiveClaim(rc.here, claim_group(self.cfg.job),
                                                      f"astraflow launch (mirror {region})",
                                                      security_setting=rc.security).acquire())
                rc.mirror_from(job_topics(self.cfg), bootstrap, there.get(region, bootstrap),
                               snapshot_bytes=snapshot_bytes(self.cfg))
        except BaseException:
            self.close_regions()
            raise

    def by_region(self) -> dict:
        """Region -> the :class:`~.regional.RegionalCluster` its nodes read weights from (regions
        that share a cluster map to the same one)."""
        return {r: self.regions[c.declared_by] for r, c in region_clusters(self.plan).items()
                if c.declared_by in self.regions}

    def close_regions(self) -> None:
        for rc in self.regions.values():
            rc.close()
        for claim in self.claims:  # after the mirrors stopped
            claim.release()
        self.claims.clear()

    def command_for(self, bootstrap: str, run_dir: Path):
        """``NodePlan -> argv`` of this run's nodes (the autoscaler's too): a node of a region behind
        an emulated link runs in its namespace and dials the link; a RaaS node of a region with a
        regional cluster (its own or a shared one, once :meth:`start_regions` ran) reads its weights
        there."""
        links = self.wan
        return node_command_for(self.cfg, bootstrap, run_dir, self.overrides,
                                links.bootstrap_for() if links is not None else None,
                                {r: links[r].wrap for r in links.links} if links is not None else None,
                                {r: rc.local for r, rc in self.by_region().items()}, weights_security(self.plan))

    def processes(self, bootstrap: str, run_dir: Path):
        self.start_regions(bootstrap, run_dir)
        command_for = self.command_for(bootstrap, run_dir)
        self.backend = make_backend(self.plan, self.cfg, command_for, run_dir / "logs", self.slurm)
        mine = [n for n in self.plan.nodes if n.owner == "host"]
        announce_started(bootstrap, self.cfg, mine)
        if self.slurm is not None:
            return [slurm_proc(self.slurm, n, self.plan.pools[n.pool], command_for(n), run_dir / "logs", self.cfg.job)
                    for n in mine]
        return [Proc(n.role, n.node_id, command_for(n), run_dir / "logs" / f"{n.node_id}.log") for n in mine]

    @contextlib.contextmanager
    def running(self, bootstrap: str, run_dir: Path, procs):
        watch = self._watch_regions(bootstrap)
        if self.slurm is not None:  # each job id on `metrics` (`astraflow status` lists them)
            self.job_feed = Producer(bootstrap, client_id="launcher-slurm")
        try:
            with autoscaler_running(self.plan, self.cfg, bootstrap, self.backend) as self.outcome:
                yield self
        finally:
            # Everything stopped (the nodes' last heartbeats written) before the recount.
            self.backend.retire_all()
            stop_processes(procs)
            self.backend.tick(procs)
            if watch is not None:
                watch.stop(block=True, timeout=60)  # (its last report: the mirror's and the links' final word)
            # (the mirror's final lag; the regions whose nodes read weights from it)
            clusters = {r: {**rc.describe(), "regions": list(self.plan.cluster_of(r).regions)}
                        for r, rc in self.regions.items()}
            self.close_regions()
            links = self.wan.stats() if self.wan is not None else []
            published = weights_published(bootstrap, self.cfg)
            for link in links:  # how many times the weights crossed: ~1 with a region's own cluster
                link["weights_bytes_published"] = published
                link["weights_crossings"] = round(link["bytes_down"] / published, 3) if published else None
            self.extra = {"topology": {"name": self.plan.name, "file": self.plan.source,
                                       "notes": self.plan.notes,
                                       # per link: region, latency, bandwidth, bytes each way across it
                                       "emulated_links": links,
                                       # per regional cluster (by its declaring region): where it is,
                                       # its one mirror, the regions reading from it
                                       "regional_clusters": clusters,
                                       # per RaaS node: the cluster it read versions and weights from
                                       "weights_from": weights_sources(bootstrap, self.cfg, self.regions)},
                          "device_hours": recount_device_hours(bootstrap, self.cfg, self.plan),
                          # 0: the node finished its in-flight tasks and left the group on SIGTERM
                          "retired_exit_codes": dict(getattr(self.backend, "exits", {}))}
            if self.slurm is not None:  # every job stopped: Slurm has accounted for them
                try:
                    self.extra["slurm"] = slurm_summary(self.slurm, self.plan, self.cfg.job, procs)
                    self._report_jobs(procs)
                finally:
                    self.job_feed.close()

    def _watch_regions(self, bootstrap: str):
        """The region watcher (:mod:`.region_watch`) under a supervisor, when there is a remote
        region to report (an emulated link, a regional cluster); its supervisor's ref or None."""
        if self.wan is None and not self.regions:
            return None
        # (at first use: the watcher reads announcements through astraflow.weights.publisher, which
        # imports torch, ~1.6 s, in the launcher process that otherwise never needs it)
        from .region_watch import RegionWatchActor
        spec = ChildSpec("region-watch", lambda sup, n: RegionWatchActor.start(
            sup, n, self.plan, bootstrap, job_topics(self.cfg), self.wan, self.by_region()), required=False)
        return Supervisor.start([spec], Outcome())

    def _report_jobs(self, procs) -> None:
        for p in procs:
            for job_id in getattr(p, "job_ids", ()):
                if job_id not in self.reported:
                    self.reported.add(job_id)
                    self.job_feed.send(job_topics(self.cfg).metrics, Metric(
                        "launcher", "slurm.job", float(job_id), 0, time.time(), {"node": p.node_id, "job_id": job_id}),
                        key="launcher", trace=False)

    def tick(self, procs):
        self.backend.tick(procs)
        if self.slurm is not None:
            self._report_jobs(procs)
        if self.outcome is not None and self.outcome.fatal:
            return RunFailed(f"autoscaler: {self.outcome.fatal}", node_id="autoscaler",
                             retriable=self.outcome.retriable)
        for region, rc in self.regions.items():
            if rc.exit_code() is not None:
                return RunFailed(f"region {region}'s Kafka broker exited with code {rc.exit_code()}; its log: "
                                 f"{rc.broker.log_path}", node_id=f"kafka-{region}", log_path=rc.broker.log_path)
            if rc.mirror is not None and rc.mirror.starts and not rc.mirror.running():
                rc.mirror.start(wait=False)  # a dead MirrorMaker resumes from the offsets it committed
        return None

    def summary(self) -> dict:
        return self.extra


def _metrics(bootstrap: str, cfg: JobConfig):
    for _, _, m in read_topic(bootstrap, job_topics(cfg).metrics):
        if isinstance(m, Metric):
            yield m


def weights_published(bootstrap: str, cfg: JobConfig) -> int:
    """Payload bytes the trainers published (every snapshot and delta), from their metrics."""
    return int(sum(m.value for m in _metrics(bootstrap, cfg)
                   if m.name in ("weights.snapshot_bytes", "weights.delta_bytes")))


def weights_sources(bootstrap: str, cfg: JobConfig, regions: dict) -> dict:
    """Per RaaS node, the cluster it read versions and weights from (its last ``raas.weights_loaded``):
    ``cluster`` (``home`` or ``<region> (own)``, named after the region that declares it, also for
    the nodes of a region that shares it), ``bootstrap``, ``versions_loaded``, ``snapshots``, ``deltas``."""
    names = {rc.local: f"{r} (own)" for r, rc in regions.items()}
    out: dict = {}
    for m in _metrics(bootstrap, cfg):
        if m.name == "raas.weights_loaded":
            where = m.labels.get("bootstrap", "")
            out[m.labels.get("node", m.component)] = {
                "cluster": names.get(where, "home"), "bootstrap": where, "versions_loaded": int(m.value),
                "snapshots": m.labels.get("snapshots", 0), "deltas": m.labels.get("deltas", 0)}
    return out


def check_keys_on_hosts(plan: Plan, cfg: JobConfig) -> None:
    """On several hosts every signing key must be configured (:func:`~astraflow.actors.signing.unkeyed`):
    each host's own run dir would make up its own pair, and the readers on the other hosts would
    dead-letter every announcement and trajectory group it signs, so the job would never train.
    Raises a :class:`~astraflow.typed_config.ConfigError` naming the first such key and the job file."""
    hosts = {h for h in plan.host_addresses if plan.nodes_on(h)}
    missing = unkeyed(cfg) if len(hosts) > 1 else []
    if missing:
        raise ConfigError(cfg.source, missing[0], (
            f"this topology runs on {len(hosts)} hosts ({', '.join(sorted(hosts))}), and each host's run dir would make up "
            f"its own key pair, which the readers on the other hosts refuse; configure every pair ({', '.join(missing)}): "
            "generate one per key (openssl genpkey -algorithm ed25519 -out F; openssl pkey -in F -pubout -out F.pub), "
            "give the private key only to the hosts that sign (trainer: the trainer's host; rollout: every RaaS host) "
            "and the public one (verify_key) to the others, or set require_signatures: false (docs/security.md)"))


def run_host(topology: str | Path, cfg: JobConfig, host: str, *, bootstrap: str | None, run_dir: str | Path,
             overrides: list[str] | None = None, max_restarts: int = 3) -> int:
    """``astraflow node --topology F --host H``: this host's nodes (and the autoscaler, if it lives
    here) until the host's trainer/dataflow finish — on a host without them, until the trainer
    reports done — or SIGTERM/SIGINT; returns 0, raises :class:`~.processes.RunFailed`."""
    overrides = list(overrides or [])
    plan = load_plan(topology, cfg)
    if host not in plan.host_addresses:
        raise TopologyError(plan.source, "--host", f"unknown host {host!r} (hosts: {', '.join(plan.host_addresses)})")
    check_multi_host(plan)
    misplaced = local_backend_misplaced(load_topology(topology))
    if misplaced:
        raise TopologyError(plan.source, misplaced[0], f"elastic pool {misplaced[1]} is on host {misplaced[2]}, but "
                                                       f"the local backend starts nodes on the autoscaler's host "
                                                       f"({plan.autoscaler_host}); use autoscaler.backend: command or slurm")
    # Every topic lives on the home cluster; a region with a regional cluster reads only weights there.
    bootstrap = home_bootstrap(plan, cfg, bootstrap)
    check_keys_on_hosts(plan, cfg)
    region = next(r for r, hosts in plan.region_hosts.items() if host in hosts)
    clusters = region_clusters(plan)
    own = {r: c.name for r, c in clusters.items()}
    if region in own:  # the mirrored topics exist, with their bound, before a node of the region looks
        regional_mirror_plan(plan, cfg, region, bootstrap).prepare_target()
    run_dir = Path(run_dir)
    command_for = node_command_for(cfg, bootstrap, run_dir, overrides, region_weights=own,
                                   region_security=weights_security(plan))
    mine = [n for n in plan.nodes_on(host) if n.owner == "host"]
    procs = [Proc(n.role, n.node_id, command_for(n), run_dir / "logs" / f"{n.node_id}.log") for n in mine]
    here = plan.autoscaler_host == host
    print(f"host {host}: {', '.join(n.node_id for n in mine) or 'no nodes'}"
          + ("; the autoscaler" if here else "")
          + (f"; weights from region {clusters[region].declared_by}'s own cluster {own[region]} (its MirrorMaker 2, "
             f"one for the cluster: `astraflow mirror --topology {topology} --region "
             f"{clusters[region].declared_by}`)" if region in own else ""), flush=True)
    stop = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    with contextlib.ExitStack() as stack:
        announce_started(bootstrap, cfg, mine)
        for p in procs:
            p.start()
        stack.callback(stop_processes, procs)
        backend = make_backend(plan, cfg, command_for, run_dir / "logs") if here else None
        if backend is not None:
            # After the autoscaler has stopped (exits run last first): nodes it started on other
            # hosts through a command backend would outlive the job otherwise. Local ones are
            # in `procs`, stopped above.
            stack.callback(backend.retire_all)
        outcome = stack.enter_context(autoscaler_running(plan, cfg, bootstrap, backend)) if here else None
        mains = [p for p in procs if p.role in ("trainer", "dataflow")]
        # nothing here ends by itself: follow the trainer
        done_feed = None if mains else trainer_done_feed(stack, bootstrap, cfg, f"host.{host}")
        while not stop["now"]:
            if backend is not None:
                backend.tick(procs)
            error = supervise(procs, max_restarts, True)
            if error is None and outcome is not None and outcome.fatal:
                error = RunFailed(f"autoscaler: {outcome.fatal}", node_id="autoscaler", retriable=outcome.retriable)
            if error is not None:
                raise error
            if mains and all(p.done for p in mains):
                break
            if done_feed is not None:
                if trainer_done(done_feed):
                    break
            else:
                time.sleep(0.5)
    print(f"host {host}: done", flush=True)
    return 0


def home_bootstrap(plan: Plan, cfg: JobConfig, bootstrap: str | None) -> str:
    """The home cluster as this host reaches it: ``--bootstrap-servers``, the job's
    ``kafka.bootstrap_servers``, or the home region's ``kafka`` when it names servers."""
    home = plan.home
    out = bootstrap or cfg.kafka.bootstrap_servers or (None if home.embedded else home.name)
    if not out:
        raise TopologyError(plan.source, f"regions.{home.declared_by}.kafka",
                            "is 'embedded', which only `astraflow launch` starts (one machine); give the cluster's "
                            "bootstrap servers there or --bootstrap-servers")
    return out


def regional_mirror_plan(plan: Plan, cfg: JobConfig, region: str, home: str):
    """The MirrorMaker 2 flow into region ``region``'s regional cluster on a multi-host deployment
    (an existing cluster). It is the cluster's one flow, named after its declaring region, so the
    regions that share a cluster get the same plan (aliases, Connect group, internal topics)."""
    cluster = region_clusters(plan)[region]
    return job_mirror_plan(cluster.declared_by, job_topics(cfg), home, cluster.name, snapshot_bytes(cfg),
                           target_security=cluster_security(plan, cluster))


def trainer_done_feed(stack: contextlib.ExitStack, bootstrap: str, cfg: JobConfig, client_id: str):
    """A reader of the job's ``metrics`` from the start, for :func:`trainer_done` (closed with ``stack``)."""
    dead = DeadLetters.own(bootstrap, job_topics(cfg).dlq, client_id)
    stack.callback(dead.close)
    feed = stack.enter_context(Consumer(bootstrap, client_id=client_id, dead_letters=dead,
                                        partitions=[TopicPartition(job_topics(cfg).metrics, 0)], expect=(Metric,)))
    feed.seek_to_beginning()
    return feed


def trainer_done(feed, timeout_ms: int = 500) -> bool:
    """Whether the next poll of ``feed`` holds the trainer's ``trainer.done``."""
    return any(isinstance(d.message, Metric) and d.message.name == "trainer.done" for d in feed.poll(timeout_ms))
