"""``astraflow mirror --topology F --region R``: region R's MirrorMaker 2 on a multi-host deployment.

On one machine ``astraflow launch`` runs every region's MirrorMaker 2 itself (:mod:`.launch`).
On real hosts the mirror is a service of its own, one per regional cluster (however many regions
share it: ``--region`` of any of them names the same mirror, called after the region that
declares the cluster, :func:`mirror_cluster`), run by this command where it reaches both clusters
(Kafka's advice: in the region, beside its cluster: the consumer crosses the WAN, the producer
stays local). Not a host's ``astraflow node --topology``: that runner lives and dies with the
region's RaaS nodes, and the autoscaler may retire the very host; the region's weights must not
stop with it, nor be copied twice because two hosts each ran one.

It creates the mirrored topics on the region's cluster with their own bound, starts a dedicated
MirrorMaker 2 (``topics/mirror.py``), restarts it with backoff when it dies (it resumes from the
source offsets it committed with its writes), reports the region's mirror lag to the home
cluster's ``metrics`` for ``astraflow status`` (:mod:`.region_watch`), and stops when the
trainer reports it is done (after the mirror caught up) or on SIGTERM/SIGINT. It knows the plan,
the two clusters and the job's topics; no nodes.

One command per target: before anything starts it takes the claim :func:`~.job_mirror.claim_group` on the
region's cluster (:class:`~astraflow.topics.claim.ExclusiveClaim`: consumer-group membership,
so it holds across hosts and lapses with its holder). A second command for the same job and
cluster is refused, naming the pid and host of the one that runs; once that one exits (at once)
or dies (after the claim's session timeout) a new one starts. The claim lives on the cluster the
copies would be duplicated in, keyed by the job, so it also catches the same job mirrored there
under another topology or region name.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from astraflow.actors.supervisor import ChildSpec, Outcome, Supervisor
from astraflow.config import JobConfig
from astraflow.topics import job_topics
from astraflow.topics.claim import ExclusiveClaim

from .job_mirror import claim_group, snapshot_bytes
from .launch import home_bootstrap, load_plan, trainer_done, trainer_done_feed
from .plan import Cluster, Plan, check_multi_host, cluster_security, region_clusters
from .processes import RunFailed
from .region_watch import RegionWatchActor
from .regional import RegionalCluster
from .schema import TopologyError

#: Restart backoff of a MirrorMaker that died: doubles from the first to the last.
BACKOFF_S = (1.0, 30.0)
#: After the trainer's done, how long the mirror may take to copy the last versions before it stops.
DRAIN_S = 60.0


def mirror_cluster(plan: Plan, region: str) -> Cluster:
    """The regional cluster ``astraflow mirror --region REGION`` fills: the region's own, or the one
    it shares with other regions (then ``--region`` of any of them is the same mirror, named after
    :attr:`~.plan.Cluster.declared_by`); :class:`TopologyError` naming the key and the file for an
    unknown region or one on the home cluster."""
    clusters = region_clusters(plan)
    if region in clusters:
        return clusters[region]
    where = plan.cluster_of(region).declared_by if region in plan.region_hosts else None
    why = (f"unknown region (regions: {', '.join(plan.region_hosts)})" if where is None else
           f"region {region} has no cluster of its own (it uses region {where}'s): nothing to mirror; regions "
           f"with one: {', '.join(clusters) or 'none'}")
    raise TopologyError(plan.source, "--region" if where is None else f"regions.{region}.kafka", why)


def run_mirror(topology: str | Path, cfg: JobConfig, region: str, *, bootstrap: str | None, run_dir: str | Path,
               max_restarts: int | None = None, stop: Callable[[], bool] | None = None) -> int:
    """Run the MirrorMaker 2 from home into region ``region``'s cluster (:func:`mirror_cluster`)
    until the trainer is done, SIGTERM/SIGINT or ``stop()``; ``max_restarts`` (None: unbounded)
    deaths in a row without a successful start raise :class:`~.processes.RunFailed`. Returns 0."""
    plan = load_plan(topology, cfg)
    cluster = mirror_cluster(plan, region)
    check_multi_host(plan)
    if cluster.declared_by != region:
        print(f"mirror {cluster.declared_by}: region {region} shares region {cluster.declared_by}'s cluster; its one "
              f"mirror (for {', '.join(cluster.regions)}) is {cluster.declared_by}'s", flush=True)
    region = cluster.declared_by  # the mirror's name: its work dir, MirrorMaker's aliases, the claim's holder
    home = home_bootstrap(plan, cfg, bootstrap)
    halt = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: halt.set())
    stopping = (lambda: halt.is_set() or stop()) if stop is not None else halt.is_set
    rc = RegionalCluster(region, Path(run_dir) / "regions" / region, bootstrap=cluster.name,
                         security=cluster_security(plan, cluster))
    topics = job_topics(cfg)
    print(f"mirror {region}: {topics.versions}, {', '.join(topics.weights(p) for p in topics.policies)} from {home} "
          f"into {rc.local} (MirrorMaker 2, dedicated; log {rc.work_dir / 'mirror' / 'mm2.log'})", flush=True)
    with contextlib.ExitStack() as stack:
        claim = stack.enter_context(ExclusiveClaim(rc.here, claim_group(cfg.job), f"astraflow mirror {region}",
                                                   security_setting=rc.security))
        print(f"mirror {region}: holds claim {claim.group!r} on {rc.here} as {claim.client_id}", flush=True)
        stack.callback(rc.close)
        mirror = rc.mirror_from(topics, home, home, snapshot_bytes(cfg))
        watch = Supervisor.start([ChildSpec("region-watch", lambda sup, n: RegionWatchActor.start(
            sup, n, plan, home, topics, None, {r: rc for r in cluster.regions}), required=False)], Outcome())
        stack.callback(lambda: watch.stop(block=True, timeout=60))  # (its last report: the final lag)
        feed = trainer_done_feed(stack, home, cfg, f"mirror.{region}")
        deaths, backoff, retry_at, done = 0, BACKOFF_S[0], 0.0, False
        while not stopping():
            if trainer_done(feed):
                done = True
                break
            if claim.lost.is_set():
                raise RunFailed(f"region {region}'s mirror lost its claim {claim.group!r} on {rc.here} (this process "
                                f"was expelled from the group: paused or cut off longer than its session); another "
                                f"mirror may hold it now, so this one stops", node_id=f"mirror-{region}",
                                log_path=mirror.log_path)
            if mirror.running():
                continue
            now = time.monotonic()
            if now < retry_at:
                continue
            deaths += 1
            if max_restarts is not None and deaths > max_restarts:
                raise RunFailed(f"region {region}'s MirrorMaker 2 died {deaths} times in a row; its log: "
                                f"{mirror.log_path}", node_id=f"mirror-{region}", log_path=mirror.log_path)
            print(f"mirror {region}: MirrorMaker 2 exited; restart {deaths} (it resumes from its committed offsets)",
                  flush=True)
            try:
                mirror.start()  # waits until its source task runs again
                deaths, backoff = 0, BACKOFF_S[0]
            except Exception as e:  # noqa: BLE001 - a failed start is retried after the backoff
                print(f"mirror {region}: restart failed: {e}", flush=True)
                retry_at, backoff = now + backoff, min(backoff * 2, BACKOFF_S[1])
        if done:  # the last versions reach the region before the mirror stops
            try:
                mirror.wait_caught_up(DRAIN_S)
            except Exception as e:  # noqa: BLE001 - stopping anyway; say what was left
                print(f"mirror {region}: not caught up at the end: {e}", flush=True)
    print(f"mirror {region}: done", flush=True)
    return 0
