"""Table 2's arm (d) (benchmarks/multi_policy_lora.py): the job it runs, built from the written
Table 2's settings, is the team as two LoRA adapters of one base on one pool and one trainer's
devices, and loads as a valid config; its two trainers are one resource of the bound."""

from __future__ import annotations

import argparse

import yaml

from astraflow.benchmarks import multi_policy_lora as ml
from astraflow.benchmarks.lib.emulated import merge_shared
from astraflow.benchmarks.multi_policy_emulated import RESULTS
from astraflow.benchmarks.multi_policy_resplit import steady_table2, with_table2_settings


def _args(**kw):
    base = dict(out=str(RESULTS), polls_in_flight=4, eval_problems=50, run_root="runs", lora_split="6,2",
                lora_rank=8, repeats=3)
    return argparse.Namespace(**{**base, **kw})


def test_arm_d_is_the_team_as_adapters_of_one_base_on_one_pool_and_one_trainers_devices(tmp_path):
    from astraflow.config import load_config
    args = _args()
    table2 = steady_table2(args.out, "test")
    base = with_table2_settings(args, table2)
    data = ml.lora_team_config(base, args, 6, 2, "async", "bench-d", str(tmp_path), 8)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert cfg.pool_policies("solver") == ("solver", "verifier") and cfg.pool_of("verifier") == "solver"
    for p in ("solver", "verifier"):
        v = cfg.view(p)
        assert v.model.task == "team" and v.trainer.engine.lora.rank == 8 and len(v.trainer.engine.lora.target_modules) == 7
        assert (v.trainer.device.count, v.trainer.device.share) == (2, ml.TRAINERS)
        assert v.rollout.device.count == 6 and v.rollout.device.profile == table2["profile"]
    assert cfg.pool_device_shares() == set()  # trainers alone: no swap
    assert cfg.view("solver").rollout.nodes == 1
    assert cfg.trainer.steps > table2["steps"]  # trained past the window (work in flight at its end)


def test_the_two_trainers_work_adds_up_as_one_resource():
    work = {"raas-solver-0": 50.0, "trainer.solver": 20.0, "trainer.verifier": 15.0}
    shared = {"trainer.solver": "shared.lora-trainers", "trainer.verifier": "shared.lora-trainers"}
    assert merge_shared(work, shared) == {"raas-solver-0": 50.0, "shared.lora-trainers": 35.0}
    assert merge_shared(work, {"solver"}) == {"shared.solver": 70.0, "trainer.verifier": 15.0}


def test_arm_d_renders_in_table_2_only_beside_the_table_2_it_was_paired_with():
    import json

    from astraflow.benchmarks import multi_policy_emulated as mpe
    from astraflow.benchmarks.lib.stats import spread
    from astraflow.benchmarks.lib.steady import whole_run_fields
    d = json.loads(RESULTS.read_text())
    arm = {"s_per_iter": spread([60.0, 62.0, 70.0]), "lower_bound_s_per_iter": spread([58.0, 60.0, 61.0]),
           "scheduling_efficiency": spread([0.9, 0.95, 0.97]), "speedup_vs_sequential": spread([3.0, 3.1, 2.7]),
           "speedup_vs_table2_async": spread([1.4, 1.5, 1.3]), "busiest": ["raas-solver-0"] * 3}
    reps = [{"s_per_iter": w, "whole_run_bound_s_per_iter": b} for w, b in ((60.0, 63.0), (62.0, 61.0), (70.0, 64.0))]
    arm.update(whole_run_fields(reps))
    d["lora_shared"] = {"arm": arm, "split": {"pool": 6, "trainer": 2}, "lora": {"rank": 8}, "base_task": "team",
                        "table2_created": d["created"], "repetitions": reps}
    text = "\n".join(mpe.report_rows(lambda name: d))
    assert ("| (d) both policies LoRA adapters (rank 8) of one base: one shared pool (6 devices) and one trainer's "
            "devices (2) (`--lora-arm`, 3 repetitions) | 62.0 (60.0–70.0) | 60.0 (58.0–61.0) |") in text
    assert "(d) vs Table 2's (a), paired by repetition: 1.40 (1.30–1.50)x" in text
    # the cross-check no steady state beats: the busiest resource's whole-run work, and the
    # windows that measured faster than it (60 < 63: one of three)
    assert ("Busiest resource of (d): raas-solver-0; its whole-run work per batch, which no steady state beats: "
            "63.0 (61.0–64.0) s/iter (1 of 3 windows measured faster than it)") in text
    assert whole_run_fields([{"s_per_iter": 5.0}]) == {}  # (c) records none
    d["lora_shared"]["table2_created"] = "an older Table 2"
    assert "(d) both policies" not in "\n".join(mpe.report_rows(lambda name: d))
