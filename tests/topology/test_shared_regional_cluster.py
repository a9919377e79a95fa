"""A regional Kafka cluster shared by two remote regions (topology/plan.py's `region_clusters`):
eu-west declares it, eu-north uses it (`kafka: region:eu-west`, or the same bootstrap servers).
The RaaS nodes of both regions read their weights there; one MirrorMaker 2, eu-west's, fills it,
and `astraflow mirror --region eu-north` is that same mirror (its names, its claim). Refused, naming
key and file: an embedded shared cluster behind emulated links (one region's namespace cannot
reach a broker in another's). The "existing" cluster of the real tests is a second embedded
broker (the module's `region_cluster`), home the session broker or the one launch starts."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.cli import main
from astraflow.config import load_config
from astraflow.topics.claim import ClaimRefused, ExclusiveClaim
from astraflow.topics.mirror_plan import connect_group, internal_topics
from astraflow.topology.job_mirror import claim_group
from astraflow.topology.launch import TopologyRun, load_plan, node_command_for, regional_mirror_plan, weights_security
from astraflow.topology.mirror_run import mirror_cluster, run_mirror
from astraflow.topology.plan import (check_launchable, check_multi_host, format_plan, own_clusters,
                                     region_clusters, resolve)
from astraflow.topology.regional import RegionalCluster
from astraflow.topology.schema import TopologyError
from astraflow.topology.validation import load_topology

from .test_existing_regional_clusters import region_cluster  # noqa: F401 - the module's second real cluster

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "examples" / "topology_three_regions_shared.yaml"
MIRRORED = ROOT / "examples" / "topology_two_regions_mirrored.yaml"
JOB = ROOT / "examples" / "arithmetic_grpo.yaml"
HOME, EU = "10.0.0.1:9092", "10.1.0.1:9092"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"topo-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _shared(tmp_path: Path, home: str, region: str, **eu_west) -> Path:
    data = yaml.safe_load(SHARED.read_text())
    data["regions"]["us-east"]["kafka"] = home
    data["regions"]["eu-west"]["kafka"] = region
    data["regions"]["eu-west"].update(eu_west)
    return _write(tmp_path, data)


def _mirrored_with_eu_north(tmp_path: Path, eu_west_kafka: str, **top) -> Path:
    """The mirrored example (home embedded, eu-west `kafka: eu_west_kafka`) with a third region
    eu-north on eu-west's cluster, linked to home like eu-west."""
    data = yaml.safe_load(MIRRORED.read_text())
    data["regions"]["eu-west"]["kafka"] = eu_west_kafka
    data["regions"]["eu-west"]["pools"]["raas-eu"]["count"] = 1
    data["regions"]["eu-north"] = {"kafka": "region:eu-west", "hosts": ["no-0"],
                                   "pools": {"raas-no": {"component": "raas", "hosts": ["no-0"], "count": 1,
                                                         "threads": 1, "device": {"kind": "a10", "count": 1},
                                                         "cost_per_device_hour": 0.9}}}
    data["links"].append({"between": ["us-east", "eu-north"], "bandwidth_mbps": 100, "latency_ms": 30})
    data.update(top)
    return _write(tmp_path, data)


def _weights(cmd: list[str]) -> list[str]:
    return [a for a in cmd if a.startswith("rollout.weights_")]


def test_two_regions_share_an_existing_cluster_on_hosts_and_under_launch(tmp_path):
    plan = resolve(load_topology(SHARED))
    check_multi_host(plan)  # node --topology and mirror take it
    check_launchable(plan)
    clusters = region_clusters(plan)
    assert set(clusters) == {"eu-west", "eu-north"} and clusters["eu-west"] is clusters["eu-north"]
    assert clusters["eu-north"].name == EU and clusters["eu-north"].regions == ("eu-west", "eu-north")
    assert list(own_clusters(plan)) == ["eu-west"]  # one cluster, one mirror, named after its declaring region
    # the same bootstrap servers written twice are that one cluster too
    data = yaml.safe_load(SHARED.read_text())
    data["regions"]["eu-north"]["kafka"] = "10.1.0.1:9092"
    same = resolve(load_topology(_write(tmp_path, data)))
    check_multi_host(same)
    assert region_clusters(same)["eu-north"] is region_clusters(same)["eu-west"]


def test_every_raas_node_of_both_regions_reads_weights_from_the_shared_cluster_and_the_rest_from_home(tmp_path):
    cfg = load_config(str(JOB), {})
    plan = load_plan(SHARED, cfg)
    # on hosts (`astraflow node --topology`): run_host's mapping
    command_for = node_command_for(cfg, HOME, tmp_path, [],
                                   region_weights={r: c.name for r, c in region_clusters(plan).items()},
                                   region_security=weights_security(plan))
    # under `astraflow launch`: the run's regional clusters (an existing one starts nothing)
    run = TopologyRun(plan, cfg, [])
    run.regions = {"eu-west": RegionalCluster("eu-west", tmp_path / "eu-west", bootstrap=EU)}
    launched = run.command_for(HOME, tmp_path)
    raas = {n.node_id: n.region for n in plan.nodes if n.role == "raas"}
    assert raas == {"raas-us-0": "us-east", "raas-eu-0": "eu-west", "raas-no-0": "eu-north"}
    for node in plan.nodes:
        for cmd in (command_for(node), launched(node)):
            assert cmd[cmd.index("--bootstrap-servers") + 1] == HOME  # tasks, trajectories, control: home
            expected = ([f"rollout.weights_bootstrap_servers={EU}"]
                        if node.role == "raas" and node.region != "us-east" else [])
            assert _weights(cmd) == expected, (node.node_id, cmd)


def test_a_secured_shared_cluster_gives_both_regions_its_login_and_one_setting_only(tmp_path):
    security = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": "mirror-eu",
                "password_env": "EU_PASSWORD", "ca_file": "eu-ca.pem"}
    path = _shared(tmp_path, HOME, EU, kafka_security=security)
    cfg = load_config(str(JOB), {})
    plan = load_plan(path, cfg)
    pairs = weights_security(plan)
    assert set(pairs) == {"eu-west", "eu-north"} and pairs["eu-west"] == pairs["eu-north"]
    assert "rollout.weights_security.username=mirror-eu" in pairs["eu-north"]
    command_for = node_command_for(cfg, HOME, tmp_path, [],
                                   region_weights={r: c.name for r, c in region_clusters(plan).items()},
                                   region_security=pairs)
    node = next(n for n in plan.nodes if n.node_id == "raas-no-0")
    assert _weights(command_for(node)) == [f"rollout.weights_bootstrap_servers={EU}", *pairs["eu-north"]]
    assert not any("EU_PASSWORD=" in a or "password=" in a for a in command_for(node))
    # the same servers with another login: one cluster has one way in, given where it is declared
    data = yaml.safe_load(path.read_text())
    data["regions"]["eu-north"]["kafka"] = EU
    data["regions"]["eu-north"]["kafka_security"] = {**security, "username": "someone-else"}
    other = _write(tmp_path, data)
    with pytest.raises(TopologyError) as e:
        load_plan(other, cfg)
    assert (e.value.file, e.value.key) == (str(other), "regions.eu-north.kafka_security")
    assert "region:eu-west" in str(e.value)


def test_mirror_for_either_region_is_the_same_mirror(tmp_path):
    cfg = load_config(str(JOB), {})
    plan = load_plan(SHARED, cfg)
    assert mirror_cluster(plan, "eu-north") is mirror_cluster(plan, "eu-west")
    west = regional_mirror_plan(plan, cfg, "eu-west", HOME)
    north = regional_mirror_plan(plan, cfg, "eu-north", HOME)
    assert north == west  # one flow: aliases, topics and their bounds, target
    assert (north.flow, north.target_bootstrap) == ("home->region_eu_west", EU)
    assert north.properties(rest_port=1) == west.properties(rest_port=1)
    assert connect_group(north.source_alias) == connect_group(west.source_alias) == "home-mm2"
    assert internal_topics(north.source_alias) == internal_topics(west.source_alias)
    with pytest.raises(TopologyError) as e:  # home is no regional cluster
        mirror_cluster(plan, "us-east")
    assert e.value.key == "regions.us-east.kafka" and "eu-west, eu-north" in str(e.value)


def test_a_mirror_for_eu_north_is_refused_while_eu_wests_runs(tmp_path, bootstrap, region_cluster):  # noqa: F811
    """`astraflow mirror --region eu-north` takes the claim `astraflow mirror --region eu-west` holds
    (the same group on the same cluster): refused, naming the holder, before it makes anything."""
    job = "ms" + uuid.uuid4().hex[:8]
    cfg = load_config(str(JOB), {"job": job})
    path = _shared(tmp_path, bootstrap, region_cluster.bootstrap_servers)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ExclusiveClaim(region_cluster.bootstrap_servers, claim_group(job), "astraflow mirror eu-west"):
            with pytest.raises(ClaimRefused, match=f"astraflow mirror eu-west already runs: .*pid {os.getpid()}"):
                run_mirror(path, cfg, "eu-north", bootstrap=bootstrap, run_dir=tmp_path / "run")
    finally:
        for s, h in handlers.items():  # run_mirror installs its own in the main thread
            signal.signal(s, h)
    assert not (tmp_path / "run" / "regions" / "eu-west" / "mirror" / "mm2.properties").exists()
    assert not (tmp_path / "run" / "regions" / "eu-north").exists()  # its files would be eu-west's


def test_an_embedded_shared_cluster_behind_emulated_links_is_refused_naming_key_and_file(tmp_path):
    path = _mirrored_with_eu_north(tmp_path, "embedded")
    plan = resolve(load_topology(path))
    with pytest.raises(TopologyError) as e:
        check_launchable(plan)
    assert (e.value.file, e.value.key) == (str(path), "regions.eu-north.kafka")
    assert all(w in str(e.value) for w in ("namespace", "bootstrap servers", "hosts in region eu-west",
                                           "emulate_links: false"))
    # without emulated links the embedded regional broker is a plain local process: every node reaches it
    path = _mirrored_with_eu_north(tmp_path, "embedded", emulate_links=False)
    plan = resolve(load_topology(path))
    check_launchable(plan)
    assert region_clusters(plan)["eu-north"] is region_clusters(plan)["eu-west"]
    with pytest.raises(TopologyError) as e:  # on hosts an embedded cluster is refused as before
        check_multi_host(plan)
    assert e.value.key == "regions.eu-west.kafka" and "'embedded'" in str(e.value)
    # an existing cluster is never behind an emulated link: shared, it launches
    check_launchable(resolve(load_topology(_mirrored_with_eu_north(tmp_path, EU))))


def test_topology_check_names_both_regions_and_the_one_mirror(capsys):
    assert main(["topology", "check", str(SHARED), "--job", str(JOB)]) == 0
    out = capsys.readouterr()
    assert "refuses" not in out.err and "valid for" in out.err
    assert ("bootstrap 10.1.0.1:9092: region(s) eu-west, eu-north [own cluster of eu-west, shared with eu-north: "
            "weights and versions mirrored from us-east by one MirrorMaker 2 (eu-west's); the RaaS nodes of eu-west, "
            "eu-north read their weights there]") in out.out
    assert "region eu-west's MirrorMaker 2 (the one mirror of the cluster eu-west and eu-north share)" in out.out
    assert "--region eu-west --config JOB" in out.out and "`--region eu-north` names the same mirror" in out.out
    text = format_plan(resolve(load_topology(SHARED)))
    assert "into the own cluster of eu-west (shared with eu-north)" in text


def _records(bootstrap: str, topics: list[str]) -> list[bytes]:
    """A digest of every committed record of ``topics`` (key, value, headers and the timestamp,
    which MirrorMaker copies: a record copied twice has two equal digests)."""
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed",
                             max_partition_fetch_bytes=32 * 1024 * 1024)
    try:
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[bytes] = []
        while any(consumer.position(tp) < end[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out += [hashlib.blake2b(repr((r.key, r.value, r.headers, r.timestamp)).encode()).digest()
                        for r in records]
        return out
    finally:
        consumer.close()


@pytest.mark.slow
@pytest.mark.timeout(2100)  # a launch of 3 RaaS nodes, 2 brokers and a MirrorMaker JVM on 2 busy cores
def test_a_launch_with_two_regions_on_one_existing_regional_cluster(tmp_path, region_cluster):  # noqa: F811
    """`astraflow launch`: home embedded, eu-west and eu-north on one existing regional cluster.
    Every remote RaaS node loads every version from it, one MirrorMaker 2 (eu-west's) copies each
    weight record into it once, both regions' lines report that mirror, and the audit holds."""
    from tests.topology.test_wan import launch_short_job
    path = _mirrored_with_eu_north(tmp_path, region_cluster.bootstrap_servers)
    summary = launch_short_job(path, tmp_path / "run", "shared", timeout=1800)
    topo = summary["topology"]
    assert topo["emulated_links"] == []  # existing regional clusters are not emulated
    sources = topo["weights_from"]
    for node in ("raas-eu-0", "raas-no-0"):
        assert sources[node]["cluster"] == "eu-west (own)", sources
        assert sources[node]["bootstrap"] == region_cluster.bootstrap_servers, sources
        assert sources[node]["versions_loaded"] >= 4, sources
    assert sources["raas-us-0"]["cluster"] == "home"
    # one mirror for the cluster, named after eu-west, serving both regions
    assert list(topo["regional_clusters"]) == ["eu-west"], topo["regional_clusters"]
    eu = topo["regional_clusters"]["eu-west"]
    assert eu["existing"] and eu["regions"] == ["eu-west", "eu-north"]
    assert eu["mirror"]["starts"] >= 1 and eu["mirror"]["mirrored_records"] > 0
    assert set(eu["mirror"]["lag_records"].values()) == {0}, eu["mirror"]
    assert [d.name for d in (tmp_path / "run" / "regions").iterdir()] == ["eu-west"]
    # each weight record is on the shared cluster once
    copies = _records(region_cluster.bootstrap_servers, eu["mirror"]["topics"])
    assert copies and len(copies) == len(set(copies))
    # the region watcher reported the one mirror on both regions' lines (what `astraflow status` prints)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = {}
    for r in rows:
        if r["name"].startswith("region.mirror"):
            last[(r["label.region"], r["name"])] = r
    for region in ("eu-west", "eu-north"):
        assert last[(region, "region.mirror_lag_versions")]["value"] == 0, last
        assert last[(region, "region.mirror_lag_versions")]["label.cluster"] == "eu-west (own)"
    assert last[("eu-north", "region.mirror_lag_records")]["label.pools"] == "raas-no"
