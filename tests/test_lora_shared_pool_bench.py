"""benchmarks/lora_shared_pool.py: the two arms' jobs differ by the shared pool alone, and the
runs are read and compared as documented (on hand-made figures; the runs are the benchmark)."""

from __future__ import annotations

import pytest
import yaml

from astraflow.benchmarks import lora, lora_shared_pool as lsp


def test_two_pools_is_the_shared_job_with_the_pool_key_removed_and_nothing_else():
    base = yaml.safe_load(lsp.CONFIG.read_text())
    shared, two = lsp.arm_config(base, "shared"), lsp.arm_config(base, "two_pools")
    assert shared == base and shared["policies"]["verifier"]["rollout"]["pool"] == "solver"
    assert "pool" not in two["policies"]["verifier"]["rollout"]
    two["policies"]["verifier"]["rollout"]["pool"] = "solver"
    assert two == base  # the one difference
    assert base["policies"]["verifier"]["rollout"]["pool"] == "solver"  # base itself untouched
    with pytest.raises(ValueError, match="nothing to compare"):
        lsp.arm_config({"policies": {"solver": {}}}, "two_pools")
    with pytest.raises(ValueError, match="one of shared, two_pools"):
        lsp.arm_config(base, "three")


def test_a_shared_job_and_its_two_pool_twin_both_load_as_valid_configs(tmp_path):
    from astraflow.config import load_config
    base = yaml.safe_load(lsp.CONFIG.read_text())
    for arm in lsp.ARMS:
        path = tmp_path / f"{arm}.yaml"
        path.write_text(yaml.safe_dump(lsp.arm_config(base, arm)))
        cfg = load_config(path)
        assert (cfg.view("verifier").rollout.pool == "solver") == (arm == "shared")


def test_reward_curves_are_per_policy_and_version():
    rows = [{"name": "trainer.reward", "component": "trainer.solver", "step": 1, "value": 0.25},
            {"name": "trainer.reward", "component": "trainer.verifier", "step": 1, "value": 0.5},
            {"name": "trainer.reward", "component": "trainer.solver", "step": 2, "value": 0.75},
            {"name": "raas.busy_s", "component": "raas.solver-0", "step": 2, "value": 9.0}]
    assert lsp.reward_curves(rows) == {"solver": {"1": 0.25, "2": 0.75}, "verifier": {"1": 0.5}}


def _run(s_per_iter, acc_end, audit=True):
    return {"s_per_iter": s_per_iter, "wall_s": 10 * s_per_iter, "team_accuracy": acc_end,
            "team_accuracy_by_version": {"0": 0.1, "20": acc_end}, "steps_by_policy": {"solver": 20, "verifier": 20},
            "audit_ok": audit}


def test_the_ratio_is_paired_per_repetition_and_one_failed_audit_fails_the_arm():
    reps = [{"shared": _run(2.0, 0.3), "two_pools": _run(4.0, 0.3)},
            {"shared": _run(3.0, 0.4), "two_pools": _run(3.0, 0.2, audit=False)},
            {"shared": _run(2.0, 0.5), "two_pools": _run(1.0, 0.4)}]
    agg = lsp.aggregate(reps)
    assert agg["shared_over_two_pools"]["runs"] == pytest.approx([0.5, 1.0, 2.0])
    assert agg["arms"]["shared"]["audit_ok"] and not agg["arms"]["two_pools"]["audit_ok"]
    assert agg["arms"]["shared"]["team_accuracy_initial"]["median"] == pytest.approx(0.1)
    text = "\n".join(lora.shared_pool_rows({"config": "examples/x.yaml", "steps": 20, "repeats": 3, **agg}))
    assert "| one (shared) | 2.00 (2.00–3.00) | solver 20, verifier 20 | 0.100 (0.100–0.100) → 0.400 (0.300–0.500) | ok |" \
        in text
    assert "| two | 3.00 (1.00–4.00) |" in text and "FAILED" in text
    assert "paired: 1.00 (0.50–2.00)" in text
    assert lora.shared_pool_rows(None) == []
