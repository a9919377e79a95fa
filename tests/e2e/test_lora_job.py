"""A LoRA job end to end (``trainer.engine.lora``): real processes train and publish the
adapter alone, the RaaS node and the evaluator serve it on their base, the audit holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from astraflow.launcher import run_job


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_lora_job_publishes_adapter_versions_of_its_base_and_audits_ok(make_job_config, bootstrap):
    from transformers import AutoModelForCausalLM

    from astraflow.actors.common import model_path
    from astraflow.engines.lora import is_adapter_name, wrap
    from astraflow.topics import VersionAnnouncement, job_topics
    from astraflow.topics.replay import read_topic
    from astraflow.weights.adapters import base_digest

    cfg = make_job_config({"trainer": {"steps": 3, "engine": {"lora": {"rank": 8}}}})
    summary = run_job(cfg, bootstrap=bootstrap, progress=False, timeout_s=600)
    assert summary["error"] is None and summary["steps_trained"] == 3
    assert summary["audit"]["ok"] is True, summary["audit"]

    base = model_path(cfg)
    anns = [m for _, _, m in read_topic(bootstrap, job_topics(cfg).versions) if isinstance(m, VersionAnnouncement)]
    assert {a.version for a in anns} == {0, 1, 2, 3} and {a.base_model for a in anns} == {base_digest(base)}
    # A snapshot is the adapter's share of the model, not the model.
    model = wrap(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), cfg.trainer.engine.lora)
    adapter = sum(p.numel() for n, p in model.named_parameters() if is_adapter_name(n))
    full = sum(p.numel() for n, p in model.named_parameters() if not is_adapter_name(n))
    snapshot = summary["weights_snapshot_bytes_mean"]  # fp32 (publish_dtype)
    assert 0 < snapshot <= 2 * 4 * adapter and snapshot < 4 * full / 25, (snapshot, adapter, full)
    assert (Path(summary["models"]["policy"]) / "adapter_config.json").exists()
