"""A LoRA policy out: ``astraflow export --model`` writes peft's adapter directory, and with
``--merged`` the base with the adapter merged in; both load with peft / transformers and give
the trainer's log-probs at that version.

The real DeepSpeed trainer trains a peft adapter of the ``smol_random`` model; the real
publisher writes its adapter-only versions (snapshots + deltas, naming the base) to the real
broker; the export rebuilds them from the log.
"""

from __future__ import annotations

import os

import pytest
import torch
import yaml

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from astraflow.replay.recorded import RecordError  # noqa: E402
from tests.engines.test_lora import LORA, make_trainer, rollout  # noqa: E402
from tests.replay.test_model_export import POLICY, _astraflow, _logprobs  # noqa: E402


@pytest.fixture(scope="module")
def published(smol_random):
    """A LoRA trainer's three versions on a batch of its base (published by the test below)."""
    from transformers import AutoTokenizer

    from astraflow.engines.cpu import CpuEngine

    return rollout(CpuEngine(smol_random), AutoTokenizer.from_pretrained(str(smol_random)))


def test_a_lora_version_exports_as_an_adapter_and_merged_and_both_load_with_the_trainers_logprobs(
        bootstrap, job_topics, smol_random, published, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.replay.model_export import export_model
    from astraflow.weights import WeightPublisher
    from astraflow.weights.adapters import base_digest

    batch = published
    trainer = make_trainer(smol_random)
    pub = WeightPublisher(bootstrap, job_topics, POLICY, snapshot_every=2, trim=False,
                          base_model=base_digest(smol_random))
    try:
        pub.resume(trainer.named_weights(), 0)
        for _ in range(3):  # version 3: snapshot 2 + a delta
            trainer.train_step(batch)
            pub.publish(trainer.named_weights(), trainer.step)
        pub.flush(timeout=120)
    finally:
        pub.close()
    reference = _logprobs(trainer.engine.module.eval(), batch)

    adapter_dir, rebuilt = export_model(bootstrap, job_topics.job, POLICY, tmp_path / "adapter", base_model=smol_random,
                                        lora=LORA)
    assert rebuilt.version == 3 and rebuilt.base_model == base_digest(smol_random)
    assert {p.name for p in adapter_dir.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors",
                                                       "tokenizer.json"}
    base = AutoModelForCausalLM.from_pretrained(str(smol_random), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    torch.testing.assert_close(_logprobs(peft_model, batch), reference, rtol=0, atol=1e-5)

    # The merged model: a plain HF directory (no peft to load it), as the CLI writes it.
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"job": job_topics.job, "model": {"path": str(smol_random)},
                                      "trainer": {"engine": {"lora": {"rank": LORA.rank, "alpha": LORA.alpha,
                                                                      "target_modules": list(LORA.target_modules)}}}}))
    merged_dir = tmp_path / "merged"
    ex = _astraflow("export", "--model", "--merged", "--job", job_topics.job, "--bootstrap-servers", bootstrap,
                    "--config", str(config), "--out", str(merged_dir))
    assert ex.returncode == 0, ex.stderr[-2000:]
    assert "exported version 3 of policy" in ex.stdout and "the base with the LoRA adapter merged in" in ex.stdout
    assert not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()
    AutoTokenizer.from_pretrained(str(merged_dir))
    assert not any("lora" in n for n in merged.state_dict())
    torch.testing.assert_close(_logprobs(merged, batch), reference, rtol=0, atol=1e-4)
    # ... and not those of the base (a fresh one: peft wrapped the other in place): the checks can fail.
    fresh = AutoModelForCausalLM.from_pretrained(str(smol_random), dtype=torch.float32).eval()
    assert not torch.allclose(_logprobs(fresh, batch), reference, rtol=0, atol=1e-4)

    # An adapter needs its settings, and the base it was trained on.
    with pytest.raises(RecordError, match=r"is a LoRA adapter, and its settings .* give --config"):
        export_model(bootstrap, job_topics.job, POLICY, tmp_path / "x", base_model=smol_random)
    with pytest.raises(RecordError, match=r"is a LoRA adapter of base .*another model"):
        export_model(bootstrap, job_topics.job, POLICY, tmp_path / "y", base_model=ensure_tiny_model(), lora=LORA)
    trainer.close()
