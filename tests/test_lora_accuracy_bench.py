"""benchmarks/lora_accuracy.py: the LoRA lr sweep's choice, the paired LoRA-minus-full difference,
and the overrides a LoRA run is started with, on hand-made run dirs (the runs themselves take
~10 minutes each on SmolLM2: the benchmark, not a test)."""

from __future__ import annotations

import json

import pytest

from astraflow.benchmarks import lora_accuracy as la
from astraflow.cli.args import overrides
from astraflow.config import load_config


def _run_dir(tmp_path, name, v0: dict, final: dict, versions=(0, 10)):
    d = tmp_path / name
    d.mkdir()
    per = {str(versions[0]): {str(k): v for k, v in v0.items()}, str(versions[1]): {str(k): v for k, v in final.items()}}
    (d / "summary.json").write_text(json.dumps({"eval_task_reward_by_version": per, "wall_s": 60.0,
                                                "steps_trained": versions[1], "audit": {"ok": True}}))
    return d


def test_the_sweep_takes_the_highest_final_accuracy_and_a_tie_goes_to_the_smaller_lr():
    def acc(x):
        return {"accuracy_final": {"mean": x, "se": 0.0, "n": 1}}
    assert la.choose_lr({5e-5: acc(0.3), 2e-4: acc(0.5), 1e-3: acc(0.4)}) == 2e-4
    assert la.choose_lr({5e-5: acc(0.5), 2e-4: acc(0.5), 1e-3: acc(0.1)}) == 5e-5


def test_lora_minus_full_is_paired_over_the_problems_both_evaluated(tmp_path):
    full = la.held_out(_run_dir(tmp_path, "f", {1: 0, 2: 0, 3: 1, 4: 0}, {1: 1, 2: 0, 3: 1, 4: 0}))
    lora = la.held_out(_run_dir(tmp_path, "l", {1: 0, 2: 0, 3: 1, 4: 0}, {1: 1, 2: 1, 3: 0, 4: 1}))
    d = la.paired_difference(full, lora)
    # per problem: 0, +1, -1, +1 -> mean 0.25, sd 0.957, se 0.479
    assert d["mean"] == pytest.approx(0.25) and d["se"] == pytest.approx(0.9574271 / 2) and d["n"] == 4
    out = la.compare([(0, full, lora), (1, full, lora), (2, lora, full)])
    assert out["arms"]["full"]["seeds"]["0"]["accuracy_final"]["mean"] == pytest.approx(0.5)
    assert out["arms"]["lora"]["seeds"]["0"]["accuracy_final"]["mean"] == pytest.approx(0.75)
    assert [out["lora_minus_full"][s]["mean"] for s in "012"] == pytest.approx([0.25, 0.25, -0.25])
    assert out["lora_minus_full_over_seeds"]["mean"] == pytest.approx(0.25 / 3)
    other = la.held_out(_run_dir(tmp_path, "o", {7: 1}, {7: 1}))
    with pytest.raises(ValueError, match="share no held-out problem"):
        la.paired_difference(full, other)


def test_a_run_that_evaluated_once_is_refused(tmp_path):
    d = tmp_path / "once"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"eval_task_reward_by_version": {"0": {"1": 1.0}}}))
    with pytest.raises(ValueError, match="two needed"):
        la.held_out(d)


def test_a_lora_runs_overrides_make_the_adapter_the_job_trains():
    cfg = load_config(la.ROOT / la.CONFIG, overrides(la.lora_sets(32, 2e-4, ["q_proj", "v_proj"])))
    lora = cfg.trainer.engine.lora
    assert (lora.rank, lora.alpha, list(lora.target_modules)) == (32, 64.0, ["q_proj", "v_proj"])
    assert cfg.trainer.engine.lr == pytest.approx(2e-4)


def test_the_accuracy_section_renders_under_the_lora_table(tmp_path):
    from astraflow.benchmarks import lora
    full = la.held_out(_run_dir(tmp_path, "f", {1: 0, 2: 0}, {1: 1, 2: 0}))
    low = la.held_out(_run_dir(tmp_path, "l", {1: 0, 2: 0}, {1: 0, 2: 0}))
    section = {"steps": 10, "rank": 8, "sweep": {"chosen_lr": 2e-4, "lrs": [5e-5, 2e-4], "seed": 100},
               **la.compare([(0, full, low), (1, full, low), (2, full, full)])}
    text = "\n".join(lora.accuracy_rows(section))
    assert "| 0 | 0.000 ± 0.000 | 0.500 ± 0.500 | 0.000 ± 0.000 | 0.000 ± 0.000 | -0.500 ± 0.500 |" in text
    assert "LoRA lr 0.0002, chosen by a sweep of 5e-05, 0.0002 at seed 100" in text
    assert "Over 3 seeds, LoRA − full at the end: -0.333 ± 0.167" in text
    assert lora.accuracy_rows(None) == []
    section["full_lr"] = 5e-6
    assert "full fine-tuning at the job's lr 5e-06, not swept" in "\n".join(lora.accuracy_rows(section))
