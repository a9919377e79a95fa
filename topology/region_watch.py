"""The region watcher of ``astraflow launch``: per remote region, its cluster, its mirror's lag
and the bytes its link carried, written to the home cluster's ``metrics`` topic.

``astraflow status`` reads the job from its topics alone; a region's own cluster and its link
are not among them, so the launcher, which holds both, reports them as metrics every
``interval_s`` (``region.mirror_lag_records``, ``region.mirror_lag_versions``,
``region.link_bytes_down``, ``region.link_bytes_up``, labelled with the region, its cluster and
its pools; for a region with a mirror also ``region.mirrored_weight_bytes`` and
``region.mirrored_versions``: :class:`MirroredWeights`) and
:func:`regions_status` turns the newest of each into the status's ``regions`` section. It
knows the plan, the links and the regional clusters it is given; no nodes.
"""

from __future__ import annotations

import time

from astraflow.actors.supervisor import LoopActor
from astraflow.actors.telemetry import MetricsEmitter
from astraflow.topics import JobTopics, Producer
from astraflow.weights.announcements import read_latest_announcement

#: Seconds between two reports (a lag query opens consumers on both clusters, across the link).
INTERVAL_S = 5.0


class MirroredWeights:
    """The weight bytes a region's mirror delivered, counted from the mirrored ``versions`` on the
    region's cluster: each announcement there says which payload it made usable (a delta's
    ``manifest``, a snapshot's ``snapshot_manifest``), and an announcement crosses only after its
    chunks (docs/cross_region_mirror.md). So with or without an emulated link it measures, at the
    region, the payload bytes that crossed its link for the weights, each version once (a copy the
    mirror made twice after a crash is counted once; protocol overhead and tasks are not). It reads
    only the small ``versions`` topic, from its beginning: a compacted-away announcement is not
    counted (compaction never touches the active segment, so in practice none is lost)."""

    def __init__(self, bootstrap: str, versions_topic: str, security_setting=None) -> None:
        from astraflow.topics import TopicPartition, security
        self.tp = TopicPartition(versions_topic, 0)
        self.consumer = security.consumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                          isolation_level="read_committed", client_id="astraflow-mirrored-bytes",
                                          max_partition_fetch_bytes=8 * 1024 * 1024, security=security_setting)
        self.consumer.assign([self.tp])
        self.consumer.seek_to_beginning(self.tp)
        self.bytes = 0
        self._seen: set[tuple] = set()

    def update(self) -> tuple[int, int]:
        """Read what arrived since the last call; returns (payload bytes, versions) so far."""
        from astraflow.topics.codec import decode
        from astraflow.topics.exceptions import DecodeError
        from astraflow.topics.messages import VersionAnnouncement
        end = self.consumer.end_offsets([self.tp])[self.tp]
        while self.consumer.position(self.tp) < end:
            records = self.consumer.poll(timeout_ms=1000).get(self.tp, [])
            if not records:
                break
            for r in records:
                try:
                    ann = decode(r.value, r.headers)
                except DecodeError:
                    continue
                if not isinstance(ann, VersionAnnouncement):
                    continue
                key = (ann.policy, ann.epoch, ann.version, ann.kind)
                if key in self._seen:
                    continue
                self._seen.add(key)
                new = ann.snapshot_manifest if ann.kind == "snapshot" else ann.manifest
                self.bytes += new.total_bytes if new is not None else 0
        return self.bytes, len({k[:3] for k in self._seen})

    def close(self) -> None:
        self.consumer.close()


class RegionWatchActor(LoopActor):
    """Reports every remote region (a link, a regional cluster, or both) to ``metrics``.

    ``regions``: region -> the :class:`~.regional.RegionalCluster` its nodes read weights from.
    Regions that share one cluster map to the same object; its mirror is measured once per report
    and reported on each of their lines, labelled with the cluster's name (its declaring region)."""

    def __init__(self, supervisor, name: str, plan, bootstrap: str, topics: JobTopics, wan, regions: dict,
                 interval_s: float = INTERVAL_S) -> None:
        super().__init__(supervisor, name)
        self.plan, self.bootstrap, self.topics, self.topic = plan, bootstrap, topics, topics.metrics
        self.wan, self.regions, self.interval_s = wan, regions, interval_s
        self.producer = self.metrics = None
        self.next_report = 0.0
        self.mirrored: dict[str, MirroredWeights] = {}

    def setup(self) -> None:
        self.producer = Producer(self.bootstrap, client_id=self.name)
        self.metrics = MetricsEmitter(self.producer, self.topic, self.name)

    def step(self) -> None:
        now = time.monotonic()
        if now < self.next_report:
            time.sleep(min(0.2, self.next_report - now))
            return
        self.next_report = now + self.interval_s
        self.report()

    def report(self) -> None:
        links = {s["region"]: s for s in (self.wan.stats() if self.wan is not None else [])}
        measured: dict[str, dict] = {}  # cluster (its declaring region) -> its mirror's figures, this report
        for region in sorted(set(links) | set(self.regions)):
            rc = self.regions.get(region)
            pools = ",".join(p.name for p in self.plan.pools.values() if p.region == region)
            labels = {"region": region, "pools": pools,
                      "cluster": f"{rc.region} (own)" if rc is not None else f"home ({self.plan.kafka_region})",
                      "bootstrap": rc.local if rc is not None else ""}
            if rc is not None and rc.mirror is not None:
                if rc.region not in measured:
                    measured[rc.region] = self.measure(rc)
                m = measured[rc.region]
                self.metrics.emit("region.mirror_lag_records", m["lag"], mirror_running=m["running"],
                                  mirror_starts=m["starts"], **labels)
                self.metrics.emit("region.mirror_lag_versions", m["behind"], **labels)
                if m["mirrored"] is not None:
                    self.metrics.emit_many({"region.mirrored_weight_bytes": m["mirrored"][0],
                                            "region.mirrored_versions": m["mirrored"][1]}, **labels)
            link = links.get(region)
            if link is not None:
                self.metrics.emit_many({"region.link_bytes_down": link["bytes_down"],
                                        "region.link_bytes_up": link["bytes_up"]}, cut=link["cut"], **labels)
        self.producer.flush()

    def measure(self, rc) -> dict:
        """One regional cluster's mirror now: its lag in records and versions (-1: not measurable),
        whether it runs, its starts, and the weight bytes and versions it delivered (None: not now)."""
        try:
            lag = sum(pl.lag for pl in rc.mirror.lag().values())
        except Exception:  # noqa: BLE001 - a cut link or a restarting MirrorMaker: report it, go on
            lag = -1
        out = {"lag": lag, "running": rc.mirror.running(), "starts": rc.mirror.starts,
               "behind": self.lag_versions(rc.here, rc.security), "mirrored": None}
        try:
            if rc.region not in self.mirrored:
                self.mirrored[rc.region] = MirroredWeights(rc.here, self.topics.versions, rc.security)
            out["mirrored"] = self.mirrored[rc.region].update()
        except Exception:  # noqa: BLE001 - a cut link: the next report counts on
            pass
        return out

    def lag_versions(self, region_bootstrap: str, region_security=None) -> int:
        """How many versions the region's cluster is behind home: per policy, the newest version
        announced at home minus the newest mirrored into the region (all of home's when the region
        has none, or is still in an older lineage epoch); the largest over policies; -1 when a
        cluster cannot be read (a cut link)."""
        worst = 0
        for policy in self.topics.policies:
            try:
                home = read_latest_announcement(self.bootstrap, self.topics.versions, policy, timeout=10)
                there = read_latest_announcement(region_bootstrap, self.topics.versions, policy, timeout=10,
                                                 security_setting=region_security)
            except Exception:  # noqa: BLE001 - not measurable now; the next report tries again
                return -1
            if home is None:
                continue
            behind = (home.version - there.version if there is not None and there.epoch == home.epoch
                      else home.version + 1)
            worst = max(worst, behind)
        return worst

    def teardown(self) -> None:
        if self.producer is not None:
            self.report_quietly()
            self.producer.close()
            self.producer = None
        for counter in self.mirrored.values():
            counter.close()
        self.mirrored.clear()

    def report_quietly(self) -> None:
        try:
            self.report()  # the last word: what crossed until the end
        except Exception:  # noqa: BLE001 - stopping anyway
            pass


def regions_status(metrics, nodes: list[dict]) -> dict:
    """The ``regions`` section of ``astraflow status`` from the region watcher's newest metrics:
    per region its cluster, mirror lag (in records and in versions; -1: not measurable then,
    None: no mirror), the weight bytes and versions its mirror delivered, bytes across its
    (emulated) link each way, and the nodes of its pools (from ``nodes``, the status's)."""
    out: dict = {}
    for m in metrics:
        if not m.name.startswith("region."):
            continue
        r = out.setdefault(m.labels.get("region", "?"), {"cluster": None, "mirror_lag_records": None,
                                                         "mirror_lag_versions": None, "mirror_running": None,
                                                         "mirrored_weight_bytes": None, "mirrored_versions": None,
                                                         "link_bytes_down": None, "link_bytes_up": None, "pools": []})
        r["cluster"] = m.labels.get("cluster")
        r["pools"] = [p for p in str(m.labels.get("pools", "")).split(",") if p]
        if m.name == "region.mirror_lag_records":
            r["mirror_lag_records"] = int(m.value)
            r["mirror_running"] = m.labels.get("mirror_running")
        elif m.name == "region.mirror_lag_versions":
            r["mirror_lag_versions"] = int(m.value)
        elif m.name in ("region.link_bytes_down", "region.link_bytes_up", "region.mirrored_weight_bytes",
                        "region.mirrored_versions"):
            r[m.name[len("region."):]] = int(m.value)
    for r in out.values():
        r["nodes"] = [n["node"] for n in nodes
                      if any(n["node"] == p or n["node"].startswith(p + "-") for p in r["pools"])]
    return out
