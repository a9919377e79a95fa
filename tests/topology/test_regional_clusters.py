"""A region with a Kafka cluster of its own under `astraflow launch` (topology/regional.py,
topology/launch.py): the topology's checks, the plan's wording, the node commands, and, with a
real home broker, a real regional broker and a real MirrorMaker 2 inside the region's network
namespace behind a shaped link, weights that cross the link once for two readers in the region.
The end-to-end launch is the slow test at the end."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from astraflow.config import ConfigError, load_config
from astraflow.topics import EmbeddedBroker, JobTopics, ensure_topics
from astraflow.topology.launch import TopologyRun, load_plan, node_command_for
from astraflow.status import format_status, job_status
from astraflow.topology.plan import check_launchable, format_plan, resolve
from astraflow.topology.region_watch import MirroredWeights, RegionWatchActor, regions_status
from astraflow.topology.schema import TopologyError
from astraflow.topology.validation import load_topology
from astraflow.weights import WeightPublisher, WeightSubscriber
from astraflow.weights.codec import weights_digest

ROOT = Path(__file__).resolve().parents[2]
MIRRORED = ROOT / "examples" / "topology_two_regions_mirrored.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"


def _write(tmp_path, change) -> Path:
    data = yaml.safe_load(MIRRORED.read_text())
    change(data)
    path = tmp_path / f"topo-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_plan_gives_the_remote_region_its_own_mirrored_cluster():
    plan = resolve(load_topology(MIRRORED))
    assert plan.home.declared_by == "us-east" and [c.declared_by for c in plan.mirrored_clusters()] == ["eu-west"]
    check_launchable(plan)  # launch starts it
    assert plan.emulated_links() == [{"region": "eu-west", "kafka_region": "us-east", "latency_ms": 20,
                                      "bandwidth_mbps": 100, "own_cluster": True}]
    text = format_plan(plan)
    assert "[own cluster: weights and versions mirrored from us-east by MirrorMaker 2]" in text
    assert "with the region's own cluster and its MirrorMaker 2" in text


def test_a_trainer_or_dataflow_on_a_regions_own_cluster_names_key_and_file(tmp_path):
    def move(d):
        del d["regions"]["us-east"]["pools"]["trainer"]
        d["regions"]["eu-west"]["pools"]["trainer-eu"] = {"component": "trainer", "hosts": ["eu-0"]}
    path = _write(tmp_path, move)
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert (e.value.file, e.value.key) == (str(path), "regions.eu-west.pools.trainer-eu")
    assert "home cluster" in str(e.value) and "region:us-east" in str(e.value)


def test_launch_takes_an_existing_regional_cluster_and_refuses_an_unreachable_shared_one_naming_the_key(tmp_path):
    path = _write(tmp_path, lambda d: d["regions"]["eu-west"].update(kafka="10.1.0.1:9092"))
    plan = resolve(load_topology(path))
    check_launchable(plan)  # launch runs its MirrorMaker 2 (tests/topology/test_existing_regional_clusters.py)
    assert [c.name for c in plan.mirrored_clusters()] == ["10.1.0.1:9092"]
    assert plan.emulated_links() == []  # an existing cluster cannot be put behind the emulated link
    assert "eu-west (an existing cluster of its own: not emulated" in format_plan(plan)

    def third(d, kafka):
        d["regions"]["eu-west"]["kafka"] = kafka
        d["regions"]["ap-south"] = {"kafka": "region:eu-west", "hosts": ["ap-0"],
                                    "pools": {"raas-ap": {"component": "raas", "hosts": ["ap-0"]}}}
    # an existing cluster shared by two regions: every node reaches it, launch takes it
    shared = resolve(load_topology(_write(tmp_path, lambda d: third(d, "10.1.0.1:9092"))))
    check_launchable(shared)
    assert [c.regions for c in shared.mirrored_clusters()] == [("eu-west", "ap-south")]
    # eu-west's embedded broker sits in eu-west's namespace behind its emulated link: ap-south's
    # nodes cannot reach it, so launch refuses naming ap-south's key
    path = _write(tmp_path, lambda d: third(d, "embedded"))
    with pytest.raises(TopologyError) as e:
        check_launchable(resolve(load_topology(path)))
    assert (e.value.file, e.value.key) == (str(path), "regions.ap-south.kafka")
    assert "eu-west" in str(e.value) and "emulate_links: false" in str(e.value)


def test_node_topology_refuses_an_embedded_regional_cluster_naming_the_key(tmp_path):
    from astraflow.topology.launch import run_host
    with pytest.raises(TopologyError) as e:
        run_host(MIRRORED, load_config(str(JOB), {}), "eu-0", bootstrap="127.0.0.1:9", run_dir=tmp_path)
    assert (e.value.file, e.value.key) == (str(MIRRORED), "regions.eu-west.kafka")
    assert "'embedded'" in str(e.value) and "astraflow mirror" in str(e.value)


def test_a_bad_weights_cluster_in_the_job_names_the_key():
    with pytest.raises(ConfigError, match="rollout.weights_bootstrap_servers"):
        load_config(str(JOB), {"rollout.weights_bootstrap_servers": "no-port"})


def test_only_the_regions_raas_nodes_are_told_to_read_weights_from_its_cluster(tmp_path):
    cfg = load_config(str(JOB), {})
    plan = load_plan(MIRRORED, cfg)
    command_for = node_command_for(cfg, "127.0.0.1:9", tmp_path, [], {"eu-west": "10.250.0.2:7"},
                                   {"eu-west": lambda argv: ["wrapped", *argv]}, {"eu-west": "127.0.0.1:8"})
    nodes = {n.node_id: n for n in plan.nodes}
    for node_id in ("raas-eu-0", "raas-eu-1"):
        cmd = command_for(nodes[node_id])
        assert cmd[0] == "wrapped" and "rollout.weights_bootstrap_servers=127.0.0.1:8" in cmd
        assert cmd[cmd.index("--bootstrap-servers") + 1] == "10.250.0.2:7"  # tasks etc.: home, over the link
    for node_id in ("raas-us-0", "trainer", "dataflow"):
        assert not any("weights_bootstrap" in a for a in command_for(nodes[node_id]))


def test_status_regions_take_the_newest_report_and_the_regions_nodes():
    from astraflow.topics import Metric
    labels = {"region": "eu-west", "pools": "raas-eu", "cluster": "eu-west (own)", "bootstrap": "127.0.0.1:1"}
    metrics = [Metric("region-watch", "region.mirror_lag_records", 7, labels={**labels, "mirror_running": True}),
               Metric("region-watch", "region.mirror_lag_records", 0, labels={**labels, "mirror_running": True}),
               Metric("region-watch", "region.mirror_lag_versions", 2, labels=labels),
               Metric("region-watch", "region.mirror_lag_versions", 0, labels=labels),
               Metric("region-watch", "region.link_bytes_down", 5000, labels=labels),
               Metric("region-watch", "region.link_bytes_up", 300, labels=labels),
               Metric("region-watch", "region.mirrored_weight_bytes", 4000, labels=labels),
               Metric("region-watch", "region.mirrored_versions", 3, labels=labels),
               Metric("trainer.policy", "trainer.train_s", 1.0)]
    nodes = [{"node": "raas-eu-0"}, {"node": "raas-eu-1"}, {"node": "raas-us-0"}, {"node": "raas-eu"}]
    got = regions_status(metrics, nodes)
    assert got == {"eu-west": {"cluster": "eu-west (own)", "mirror_lag_records": 0, "mirror_lag_versions": 0,
                               "mirror_running": True, "mirrored_weight_bytes": 4000, "mirrored_versions": 3,
                               "link_bytes_down": 5000, "link_bytes_up": 300, "pools": ["raas-eu"],
                               "nodes": ["raas-eu-0", "raas-eu-1", "raas-eu"]}}


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(512, 256, generator=g), "proj": torch.randn(256, 256, generator=g)}


def test_weights_cross_the_link_once_for_two_readers_in_the_region(tmp_path):
    """launch's wiring without the job: the region's broker and MirrorMaker 2 run inside its
    namespace; two subscribers there read every version from the region's cluster, and the
    link carries the weights about once, not once per reader."""
    cfg = load_config(str(JOB), {"job": "rc" + uuid.uuid4().hex[:8]})
    plan = load_plan(MIRRORED, cfg)
    run = TopologyRun(plan, cfg, [])
    broker = EmbeddedBroker(tmp_path / "kafka", heap="384m")
    topics = JobTopics(job=cfg.job, policies=("policy",), task_partitions=2, trajectory_partitions=1)
    with run.broker_setup(broker):
        try:
            broker.start()
            ensure_topics(broker.bootstrap_servers, topics.specs())
            run.start_regions(broker.bootstrap_servers, tmp_path)
            rc, link = run.regions["eu-west"], run.wan["eu-west"]
            assert rc.local.startswith("127.0.0.1:") and rc.here != rc.local  # in the namespace; home dials across
            before = link.stats()["bytes_down"]
            history = [_weights(1)]
            for v in range(1, 4):
                nxt = {k: t.clone() for k, t in history[-1].items()}
                nxt["embed"][v] += 0.5  # a sparse step: one row changes
                history.append(nxt)
            pub = WeightPublisher(broker.bootstrap_servers, topics, "policy", snapshot_every=2,
                                  chunk_size=64 * 1024)
            try:
                for v, named in enumerate(history):
                    pub.publish(named, v)
                    pub.flush(60)
                published = sum(p.payload_bytes for p in pub.published)
            finally:
                pub.close()
            # two readers in the region, on its own cluster (their threads start inside the namespace)
            readers = [link.in_region(lambda i=i: WeightSubscriber(rc.local, topics, "policy",
                                                                   node_id=f"eu-{i}").start()) for i in range(2)]
            try:
                for r in readers:
                    assert r.wait_for(3, timeout=180), r.faults
                    assert r.digest() == weights_digest(history[3])
            finally:
                for r in readers:
                    r.close()
            rc.mirror.wait_caught_up(60)
            down = link.stats()["bytes_down"] - before
            assert published > 1_000_000
            # MirrorMaker's copy crossed, the readers' did not: about once, not twice
            assert published * 0.9 < down < published * 1.5, (down, published)

            # a late joiner in the region loads the newest snapshot (+ deltas) from the region's
            # cluster: the link carries no weights for it (only MirrorMaker's idle fetches)
            at_join = link.stats()["bytes_down"]
            late = link.in_region(lambda: WeightSubscriber(rc.local, topics, "policy", node_id="eu-late").start())
            try:
                assert late.wait_for(3, timeout=180), late.faults
                assert late.digest() == weights_digest(history[3])
                assert late.path_counts["snapshot"] >= 1
            finally:
                late.close()
            grew = link.stats()["bytes_down"] - at_join
            assert grew < 0.05 * published, (grew, published)
            down = link.stats()["bytes_down"] - before
            described = rc.describe()
            assert described["in_namespace"] and described["mirror"]["mirrored_records"] > 0
            assert set(described["mirror"]["lag_records"].values()) == {0}

            # region-aware status: the launcher's watcher reports the region, status reads it back
            watch = RegionWatchActor(None, "region-watch", plan, broker.bootstrap_servers, topics, run.wan,
                                     run.regions)
            watch.setup()
            try:
                watch.report()
            finally:
                watch.producer.close()
            status = job_status(broker.bootstrap_servers, cfg.job)
            eu = status["regions"]["eu-west"]
            assert eu["cluster"] == "eu-west (own)" and eu["mirror_lag_records"] == 0 and eu["pools"] == ["raas-eu"]
            assert eu["mirror_lag_versions"] == 0  # version 3, the newest at home, is announced in the region
            assert eu["link_bytes_down"] >= down and eu["link_bytes_up"] > 0
            home = MirroredWeights(broker.bootstrap_servers, topics.versions)
            try:
                assert eu["mirrored_weight_bytes"] == home.update()[0] > 0  # every version's payload, once
            finally:
                home.close()
            assert eu["mirrored_versions"] == 4 and eu["mirrored_weight_bytes"] <= eu["link_bytes_down"]
            assert "region eu-west: cluster eu-west (own), mirror lag 0 versions (0 records); link" in format_status(status)
        finally:
            run.close_regions()
            broker.stop()
    assert rc.broker.exit_code() is None and not rc.mirror.running()


@pytest.mark.slow
def test_a_launch_with_a_regional_cluster_reads_weights_there_and_crosses_the_link_once(tmp_path):
    """`astraflow launch` of the mirrored example: 2 RaaS nodes in eu-west read every version
    from eu-west's own cluster (MirrorMaker 2 from home), their tasks and trajectories go home
    over the link, the audit holds, and the weights crossed the link about once, not twice."""
    from tests.topology.test_wan import launch_short_job
    summary = launch_short_job(MIRRORED, tmp_path / "run", "regional", timeout=1500)
    assert summary["audit"]["ok"], summary["audit"]
    topo = summary["topology"]
    sources = topo["weights_from"]
    for node in ("raas-eu-0", "raas-eu-1"):
        assert sources[node]["cluster"] == "eu-west (own)" and sources[node]["versions_loaded"] >= 1, sources
    assert sources["raas-us-0"]["cluster"] == "home"
    (link,) = topo["emulated_links"]
    assert link["region"] == "eu-west" and link["weights_bytes_published"] > 1_000_000
    # once per link: well under the two crossings two nodes reading from home would make
    assert 0.8 < link["weights_crossings"] < 1.5, link
    mirror = topo["regional_clusters"]["eu-west"]["mirror"]
    assert mirror["mirrored_records"] > 0 and set(mirror["lag_records"].values()) == {0}
