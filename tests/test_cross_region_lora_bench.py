"""benchmarks/cross_region_lora.py: the LoRA arm is the demo job with an adapter and nothing else,
and the two arms are compared paired per repetition (hand-made cells; the launches, on an
emulated link, are the benchmark)."""

from __future__ import annotations

import pytest
import yaml

from astraflow.benchmarks import cross_region, cross_region_lora as xl


def test_the_lora_arm_is_the_demo_job_with_an_adapter_at_its_own_lr(tmp_path):
    from argparse import Namespace

    from astraflow.config import load_config
    a = Namespace(steps=30, snapshot_every=10, problems=200, k=2, lr=None)
    base = cross_region._merge(yaml.safe_load((xl.ROOT / "examples" / "arithmetic_grpo.yaml").read_text()),
                               cross_region.job_settings(a, "delta"))
    data = cross_region._merge(base, xl.lora_settings(8, 2e-3, ["q_proj", "v_proj"]))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    lora = cfg.trainer.engine.lora
    assert (lora.rank, lora.alpha, list(lora.target_modules)) == (8, 16.0, ["q_proj", "v_proj"])
    assert cfg.trainer.engine.lr == pytest.approx(2e-3)
    # everything else is the full arm's
    data["trainer"]["engine"].pop("lora")
    data["trainer"]["engine"]["lr"] = base["trainer"]["engine"]["lr"]
    assert data == base


def _cell(link, published, acc=0.3, audit=True):
    return {"link_bytes_per_version": link, "weights_bytes_per_version": published, "weights_crossings": 1.0,
            "lag_versions_p95": 1.0, "s_per_step": 0.5, "accuracy": acc, "audit_ok": audit}


def test_the_link_bytes_ratio_is_paired_and_the_table_renders():
    reps = [{"full": _cell(1_000_000, 900_000), "lora": _cell(20_000, 10_000)},
            {"full": _cell(2_000_000, 900_000), "lora": _cell(20_000, 10_000, audit=False)},
            {"full": _cell(1_000_000, 900_000), "lora": _cell(50_000, 10_000)}]
    agg = xl.aggregate(reps)
    assert agg["lora_over_full"]["runs"] == pytest.approx([0.02, 0.01, 0.05])
    assert agg["arms"]["full"]["audit_ok"] and not agg["arms"]["lora"]["audit_ok"]
    d = {"quick": False, **agg, "settings": {"steps": 30, "delta_snapshot_every": 10, "repeats": 3,
                                             "lora": {"rank": 8, "targets": ["q_proj"], "lr": 2e-3},
                                             "link": {"bandwidth_mbps": 100.0}}}
    text = "\n".join(xl.report_rows(lambda name: d))
    assert "| full model | 1,000,000 (1,000,000–2,000,000) | 900,000 (900,000–900,000) | 0.300 (0.300–0.300) | ok |" \
        in text
    assert "| LoRA | 20,000 (20,000–50,000) |" in text and "FAIL" in text
    assert "0.0200 (0.0100–0.0500) of the full arm's bytes" in text
    assert xl.report_rows(lambda name: {**d, "quick": True}) == []
