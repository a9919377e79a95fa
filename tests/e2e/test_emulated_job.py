"""A job whose RaaS node, trainer and evaluator stand for emulated H100s: it trains for real,
every component's calls are held for their modelled time, and the run says so."""

from __future__ import annotations

import json

import pytest

from astraflow.chaos.invariants import audit_job
from astraflow.launcher import run_job

pytestmark = [pytest.mark.slow, pytest.mark.core]

DEVICE = {"kind": "emulated", "profile": "h100-qwen3-8b", "token_scale": 16, "dilation": 0.5}


def test_a_job_on_emulated_devices_trains_and_labels_its_modelled_times(make_job_config, bootstrap):
    cfg = make_job_config({"mode": "sync", "rollout": {"device": DEVICE}, "trainer": {"device": {**DEVICE, "count": 2}},
                           "eval": {"device": DEVICE}}, name="emulated")
    summary = run_job(cfg, bootstrap=bootstrap, progress=False, timeout_s=600)
    assert summary["steps_trained"] == cfg.trainer.steps and summary["error"] is None
    emulated = summary["emulated"]
    assert set(emulated) == {"raas-0", f"trainer.{cfg.policy}", f"eval.{cfg.policy}"}, emulated
    assert all(d["profile"] == "h100-qwen3-8b" for d in emulated.values())
    assert emulated[f"trainer.{cfg.policy}"]["devices"] == 2
    trainer, raas = emulated[f"trainer.{cfg.policy}"]["train"], emulated["raas-0"]["generate"]
    assert trainer["calls"] == cfg.trainer.steps and raas["calls"] >= cfg.trainer.steps
    for stats in (trainer, raas, emulated[f"eval.{cfg.policy}"]["generate"]):
        assert stats["modelled_s"] > 0 and stats["held_s"] >= DEVICE["dilation"] * stats["modelled_s"] * 0.999
    # the weight loads of every new version are priced on the rollout side too
    assert emulated["raas-0"]["weight_load"]["calls"] >= 1
    with open(f"{summary['run_dir']}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert any(r["name"] == "emulated.generate.modelled_s" and r["label.profile"] == "h100-qwen3-8b" for r in rows)
    assert all(a.ok for a in audit_job(bootstrap, cfg).values())
