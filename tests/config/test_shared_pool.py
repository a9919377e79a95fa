"""A pool shared by LoRA policies of one base (``policies.<p>.rollout.pool``): where its nodes
go, and the configs refused at load time with one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "solver_verifier_lora_shared.yaml"


def _load(tmp_path, change=None):
    data = yaml.safe_load(EXAMPLE.read_text())
    if change:
        change(data)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_the_shared_pool_is_the_leads_and_the_other_policy_starts_no_node(tmp_path):
    from astraflow.launcher import default_processes

    cfg = load_config(EXAMPLE)
    assert cfg.pool_of("verifier") == "solver" and cfg.pool_of("solver") == "solver"
    assert cfg.pool_policies("solver") == ("solver", "verifier") and cfg.pool_policies("verifier") == ()
    procs = {(p.role, p.node_id) for p in default_processes(cfg, tmp_path)}
    assert procs == {("dataflow", "dataflow"), ("trainer", "trainer-solver"), ("trainer", "trainer-verifier"),
                     ("raas", "raas-solver-0")}
    # the same pool named at the top level: every policy on the lead's (the lead's own is itself)
    cfg = _load(tmp_path, lambda d: (d["rollout"].update(pool="solver"), d["policies"]["verifier"]["rollout"].pop("pool")))
    assert cfg.pool_policies("solver") == ("solver", "verifier")


@pytest.mark.parametrize("change, match", [
    (lambda d: d["policies"]["verifier"].update(trainer={"engine": {"lora": None}}),
     r"policies.verifier.rollout.pool: a shared pool holds LoRA adapters of one base, and 'verifier' is full "
     r"fine-tuning"),
    (lambda d: d["policies"]["solver"].update(trainer={"engine": {"lora": None}}),
     r"policies.verifier.rollout.pool: .* and 'solver' is full fine-tuning"),
    (lambda d: d["policies"]["verifier"].update(model={"task": "verifier"}),
     r"policies.verifier.rollout.pool: a shared pool holds adapters of one base model, and 'verifier' is on the "
     r"tiny verifier model .* while 'solver' is on the tiny arithmetic model"),
    (lambda d: d["policies"]["verifier"]["rollout"].update(pool="critic"),
     r"policies.verifier.rollout.pool: no policy 'critic' \(policies: solver, verifier\)"),
    (lambda d: (d["policies"]["verifier"]["rollout"].pop("pool"), d["policies"]["solver"].update(
        rollout={"pool": "verifier"})),
     r"policies.solver.rollout.pool: 'verifier''s pool runs no episodes: only the lead policy 'solver''s pool"),
    (lambda d: d["policies"]["verifier"]["rollout"].update(engine={"kind": "sglang"}),
     r"policies.verifier.rollout.engine.kind: 'verifier''s rows run on 'solver''s pool, so on its engine \(cpu, .*\); "
     r"this says sglang: leave it unset or make it 'solver''s"),
    (lambda d: d["policies"]["verifier"]["rollout"].update(device={"kind": "emulated", "slowdown": 2.0}),
     r"policies.verifier.rollout.device: 'verifier''s rows run on 'solver''s pool, so on its devices \(cpu\); this "
     r"says emulated"),
])
def test_a_shared_pool_of_policies_that_are_not_lora_adapters_of_one_base_is_refused(tmp_path, change, match):
    with pytest.raises(ConfigError, match=match) as e:
        _load(tmp_path, change)
    assert "\n" not in str(e.value)


def test_a_shared_pool_on_sglang_is_one_engine_kind_for_every_policy_on_it(tmp_path):
    def on_sglang(d):
        d["policies"]["solver"].setdefault("rollout", {})["engine"] = {"kind": "sglang"}
        d["policies"]["verifier"]["rollout"]["engine"] = {"kind": "sglang"}
    cfg = _load(tmp_path, on_sglang)
    assert cfg.pool_policies("solver") == ("solver", "verifier")
    assert cfg.view("solver").rollout.engine.kind == "sglang"


def test_a_topology_that_places_a_pool_for_a_policy_served_by_another_is_refused(tmp_path):
    from astraflow.topology.launch import load_plan
    from astraflow.topology.schema import TopologyError

    cfg = load_config(EXAMPLE)
    topo = yaml.safe_load((ROOT / "examples" / "topology_solver_verifier.yaml").read_text())
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    with pytest.raises(TopologyError, match=r"pools.verifier-raas.policy: policy 'verifier''s rows are served by "
                                            r"'solver''s pool \(rollout.pool"):
        load_plan(path, cfg)
