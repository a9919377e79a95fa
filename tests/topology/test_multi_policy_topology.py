"""A topology for a multi-policy job: every trainer / RaaS pool names its policy, every
policy has both, and each node is started as a node of its policy (``--policy``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.config import load_config
from astraflow.topology.launch import load_plan, node_command_for
from astraflow.topology.schema import TopologyError

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "examples" / "topology_solver_verifier.yaml"
JOB = ROOT / "examples" / "solver_verifier.yaml"


def test_each_node_starts_for_its_policy(tmp_path):
    cfg = load_config(JOB)
    plan = load_plan(TOPOLOGY, cfg)
    command = node_command_for(cfg, "127.0.0.1:9092", tmp_path, [])
    cmds = {n.node_id: command(n) for n in plan.nodes}
    policy_of = {nid: (c[c.index("--policy") + 1] if "--policy" in c else None) for nid, c in cmds.items()}
    assert policy_of == {"dataflow": None, "solver-trainer": "solver", "verifier-trainer": "verifier",
                         "solver-raas-0": "solver", "verifier-raas-0": "verifier"}


def _variant(tmp_path, edit) -> Path:
    data = yaml.safe_load(TOPOLOGY.read_text())
    edit(data["regions"]["local"]["pools"])
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_pool_without_a_policy_or_a_policy_without_pools_is_refused(tmp_path):
    cfg = load_config(JOB)
    # a trained policy without a RaaS pool, in a job whose rows of it no other pool serves
    with pytest.raises(TopologyError, match=r"policy 'verifier' of .* has no raas pool"):
        load_plan(_variant(tmp_path, lambda p: p.pop("verifier-raas")), cfg)
    # the file alone cannot tell (another policy's pool may serve it: rollout.pool); the job can
    load_plan(_variant(tmp_path, lambda p: p.pop("verifier-raas")))
    # with the job: a pool of a multi-policy job must say whose it is
    with pytest.raises(TopologyError, match="name the one this (trainer|raas) pool serves") as e:
        load_plan(_variant(tmp_path, lambda p: (p["solver-raas"].pop("policy"), p["solver-trainer"].pop("policy"))),
                  cfg)
    assert e.value.key.endswith(".policy")
    with pytest.raises(TopologyError, match="policy 'verifier' of .* has no raas and no trainer pool"):
        load_plan(_variant(tmp_path, lambda p: (p.pop("verifier-raas"), p.pop("verifier-trainer"))), cfg)
    with pytest.raises(TopologyError, match="serves policy 'critic'"):
        load_plan(_variant(tmp_path, lambda p: (p["verifier-raas"].update(policy="critic"),
                                                p["verifier-trainer"].update(policy="critic"))), cfg)


def test_the_autoscaler_runs_for_every_policy_with_a_raas_pool(tmp_path):
    from astraflow.topology.launch import autoscaled_policies
    cfg = load_config(JOB)
    assert autoscaled_policies(load_plan(TOPOLOGY, cfg), cfg) == ["solver", "verifier"]
    single = load_config(ROOT / "examples" / "arithmetic_grpo.yaml")
    assert autoscaled_policies(load_plan(ROOT / "examples" / "topology_local.yaml", single), single) == ["policy"]


def test_a_shared_pool_is_placed_as_the_leads_pool_and_serves_every_policy_on_it(tmp_path):
    """examples/topology_solver_verifier_lora_shared.yaml: the LoRA team whose verifier's rows
    run on the solver's pool has one RaaS pool; its nodes start as the solver's (and the node
    serves the verifier's adapter because the job says so); the autoscaler scales that pool."""
    from astraflow.topology.launch import autoscaled_policies
    cfg = load_config(ROOT / "examples" / "solver_verifier_lora_shared.yaml")
    plan = load_plan(ROOT / "examples" / "topology_solver_verifier_lora_shared.yaml", cfg)
    command = node_command_for(cfg, "127.0.0.1:9092", tmp_path, [])
    cmds = {n.node_id: command(n) for n in plan.nodes}
    policy_of = {nid: (c[c.index("--policy") + 1] if "--policy" in c else None) for nid, c in cmds.items()}
    assert policy_of == {"dataflow": None, "solver-trainer": "solver", "verifier-trainer": "verifier",
                         "solver-raas-0": "solver"}
    assert cfg.pool_policies("solver") == ("solver", "verifier")
    assert autoscaled_policies(plan, cfg) == ["solver"]
    # the same file for the team on two pools: the verifier's rows have nowhere to run
    with pytest.raises(TopologyError, match=r"policy 'verifier' of .* has no raas pool"):
        load_plan(ROOT / "examples" / "topology_solver_verifier_lora_shared.yaml", load_config(JOB))

