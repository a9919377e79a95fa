"""Topology files: strict loading, cross-checks that name file and key, the resolved plan."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from astraflow.cli import main
from astraflow.errors import EXIT_FATAL
from astraflow.topology.plan import check_launchable, format_plan, grow_order, resolve
from astraflow.topology.schema import TopologyError
from astraflow.topology.validation import load_topology, validate_for_job

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "regions": {
        "us": {"kafka": "embedded", "hosts": ["us-0", "us-1"],
               "pools": {"dataflow": {"component": "dataflow", "hosts": ["us-0"]},
                         "trainer": {"component": "trainer", "hosts": ["us-0"], "device": {"kind": "h100"}},
                         "fast": {"component": "raas", "hosts": ["us-1"], "count": 1, "min": 1, "max": 3,
                                  "device": {"kind": "h100"}, "cost_per_device_hour": 4.0}}},
        "eu": {"kafka": "region:us", "hosts": {"eu-0": {"address": "10.0.0.9"}},
               "pools": {"slow": {"component": "raas", "hosts": ["eu-0"], "count": 1, "min": 0, "max": 2,
                                  "device": {"kind": "a10", "slowdown": 2.0}, "cost_per_device_hour": 1.0}}},
    },
    "links": [{"between": ["us", "eu"], "bandwidth_mbps": 1000, "latency_ms": 40}],
    "autoscaler": {"enabled": True, "cooldown_s": 10},
}


def write(tmp_path, data, name="topo.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def changed(edit) -> dict:
    data = copy.deepcopy(BASE)
    edit(data)
    return data


def error_of(tmp_path, data) -> TopologyError:
    path = write(tmp_path, data)
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert e.value.file == str(path)  # every error names the file ...
    return e.value


@pytest.mark.parametrize("edit, key, words", [
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(hosts=["nowhere"]),
     "regions.us.pools.fast.hosts[0]", "unknown host 'nowhere'"),
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(colour="red"),
     "regions.us.pools.fast.colour", "unknown key"),
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(count="two"),
     "regions.us.pools.fast.count", "expected int"),
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(count=5),
     "regions.us.pools.fast.count", "within min..max (1..3)"),
    (lambda d: d["regions"]["us"]["pools"]["trainer"].update(max=2),
     "regions.us.pools.trainer.max", "only RaaS pools are elastic"),
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(component="gpu"),
     "regions.us.pools.fast.component", "must be one of"),
    (lambda d: d["regions"]["eu"].update(kafka="region:mars"), "regions.eu.kafka", "region 'mars'"),
    (lambda d: d["regions"]["eu"].update(kafka="not a server"), "regions.eu.kafka", "bootstrap servers"),
    (lambda d: d["links"][0].update(between=["us", "asia"]), "links[0].between", "unknown region 'asia'"),
    (lambda d: d["links"][0].update(bandwidth_mbps=0), "links[0].bandwidth_mbps", "must be in (0, 1000000000], got 0"),
    (lambda d: d["regions"]["eu"]["pools"].update(fast={"component": "raas", "hosts": ["eu-0"]}),
     "regions.eu.pools.fast", "pool names are unique"),
    (lambda d: d["regions"]["us"]["pools"].pop("trainer"), "regions.*.pools", "no trainer pool"),
    (lambda d: d["regions"]["us"]["pools"]["fast"].update(min=0), "regions.*.pools.*.min", "shrink to 0 nodes"),
    (lambda d: d["autoscaler"].update(scale_down_wait=0.2), "autoscaler", "scale_down_wait < scale_up_wait"),
    (lambda d: d["autoscaler"].update(backend="command"), "autoscaler", "needs command"),
    (lambda d: d["autoscaler"].update(backend="command", command={"start": "run {cmd} on {gpu}",
                                                                  "stop": "kill {node_id}"}),
     "autoscaler.command.start", "unknown placeholder {gpu}"),
    (lambda d: [p.update(max=p.get("count", 1), min=None) for p in
                (d["regions"]["us"]["pools"]["fast"], d["regions"]["eu"]["pools"]["slow"])],
     "autoscaler.enabled", "no RaaS pool is elastic"),
    (lambda d: d["regions"]["us"]["pools"]["trainer"].update(hosts=["us-0", "us-1"], count=2),
     "regions.us.pools.trainer.master_port", "needs the port"),
    (lambda d: d.update(emulate_links="sometimes"), "emulate_links", "expected bool"),
])
def test_validation_errors_name_the_key(tmp_path, edit, key, words):
    e = error_of(tmp_path, changed(edit))
    assert e.key == key, str(e)  # ... and the dotted key
    assert words in e.problem, str(e)


def test_bad_yaml_and_missing_file_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("regions: [unclosed")
    with pytest.raises(TopologyError, match="bad.yaml: <file>: not valid YAML"):
        load_topology(bad)
    with pytest.raises(TopologyError, match="no such file"):
        load_topology(tmp_path / "absent.yaml")


def test_job_checks_policy_and_partitions(tmp_path):
    # a pool naming a policy no trainer trains is caught by the file alone
    e = error_of(tmp_path, changed(lambda d: d["regions"]["eu"]["pools"]["slow"].update(policy="other")))
    assert e.key == "regions.eu.pools.slow.policy" and "no trainer pool trains policy other" in e.problem
    t = load_topology(write(tmp_path, BASE))
    with pytest.raises(TopologyError) as e:
        validate_for_job(t, "policy", task_partitions=4, job_file="job.yaml")
    assert e.value.key == "regions.*.pools.*.max" and "may run 5 nodes" in e.value.problem
    validate_for_job(t, "policy", task_partitions=8, job_file="job.yaml")


def test_plan_places_nodes_and_hands_elastic_pools_to_the_autoscaler(tmp_path):
    plan = resolve(load_topology(write(tmp_path, BASE)), "policy")
    nodes = {n.node_id: n for n in plan.nodes}
    assert set(nodes) == {"dataflow", "trainer", "fast-0", "slow-0"}
    assert (nodes["fast-0"].host, nodes["fast-0"].owner) == ("us-1", "autoscaler")
    assert nodes["trainer"].owner == "host" and nodes["trainer"].policy == "policy"
    assert nodes["slow-0"].address == "10.0.0.9"
    # the emulated pool's nodes are told their slowdown; its speed follows from it
    assert {"rollout.device.kind=emulated", "rollout.device.slowdown=2.0"} <= set(nodes["slow-0"].overrides)
    assert plan.pools["slow"].speed == 0.5
    # cheapest per unit of speed first: slow costs 1.0/0.5 = 2 per speed-hour, fast 4
    assert [p.name for p in grow_order(plan, "policy")] == ["slow", "fast"]
    assert plan.pool_of("slow-7").name == "slow" and plan.pool_of("trainer.policy", "trainer", "policy").name == "trainer"
    text = format_plan(plan)
    assert "regions us, eu share one Kafka cluster" in text
    assert "EMULATED on CPU: slowdown x2" in text and "EMULATION" in text


def test_autoscaler_off_leaves_every_node_to_its_host(tmp_path):
    plan = resolve(load_topology(write(tmp_path, changed(lambda d: d["autoscaler"].update(enabled=False)))))
    assert {n.owner for n in plan.nodes} == {"host"}
    assert "autoscaler: off" in format_plan(plan)


def test_an_existing_regional_cluster_is_said_and_launchable(tmp_path):
    plan = resolve(load_topology(write(tmp_path, changed(lambda d: d["regions"]["eu"].update(kafka="10.1.0.1:9092")))))
    assert len(plan.clusters) == 2 and not plan.shared_cluster
    assert "MirrorMaker 2" in format_plan(plan) and "astraflow mirror" in format_plan(plan)
    check_launchable(plan)  # launch runs its MirrorMaker 2 (tests/topology/test_existing_regional_clusters.py)
    # the same servers written twice are one cluster, not two
    same = changed(lambda d: (d["regions"]["us"].update(kafka="b:1,a:2"), d["regions"]["eu"].update(kafka="a:2, b:1")))
    assert resolve(load_topology(write(tmp_path, same))).shared_cluster


def test_trainer_on_two_hosts_gets_its_group_flags(tmp_path):
    data = changed(lambda d: d["regions"]["us"]["pools"]["trainer"].update(hosts=["us-0", "us-1"], count=2,
                                                                           master_port=29500))
    plan = resolve(load_topology(write(tmp_path, data)))
    t0, t1 = [n for n in plan.nodes if n.role == "trainer"]
    assert (t0.node_id, t1.node_id) == ("trainer-0", "trainer-1")
    assert t1.flags == ("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29500")


@pytest.mark.parametrize("name", ["topology_local.yaml", "topology_two_regions.yaml", "topology_three_hosts.yaml",
                                  "topology_two_regions_mirrored.yaml", "topology_two_regions_existing.yaml"])
def test_examples_are_valid_for_the_demo_job(name, capsys):
    cfg_path = ROOT / "examples" / "arithmetic_grpo.yaml"
    assert main(["topology", "check", str(ROOT / "examples" / name), "--job", str(cfg_path), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["shared_cluster"] == (name.rsplit("_", 1)[-1] not in ("mirrored.yaml", "existing.yaml")) and "valid for" in out.err
    assert "refuses" not in out.err


def test_cli_check_prints_the_error_line(tmp_path, capsys):
    path = write(tmp_path, changed(lambda d: d["regions"]["us"]["pools"]["fast"].update(hosts=["nowhere"])))
    assert main(["topology", "check", str(path)]) == EXIT_FATAL
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"astraflow: error: {path}: regions.us.pools.fast.hosts[0]: unknown host 'nowhere' (hosts of region us: "
        f"us-0, us-1)")


def test_an_emulated_pools_workload_reaches_its_nodes_and_a_workload_without_emulate_is_refused(tmp_path):
    emulated = changed(lambda d: d["regions"]["eu"]["pools"]["slow"].update(
        device={"kind": "h100", "emulate": "h100-qwen3-8b", "token_scale": 256, "workload": "reasoning"}))
    nodes = {n.node_id: n for n in resolve(load_topology(write(tmp_path, emulated)), "policy").nodes}
    assert {"rollout.device.profile=h100-qwen3-8b", "rollout.device.workload=reasoning"} <= set(nodes["slow-0"].overrides)
    e = error_of(tmp_path, changed(lambda d: d["regions"]["eu"]["pools"]["slow"].update(
        device={"kind": "a10", "workload": "reasoning"})))
    assert e.key == "regions.eu.pools.slow.device" and "workload" in e.problem
