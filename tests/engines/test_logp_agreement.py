"""Trainer and rollout engine agree on log-probs: the trainer (built from a job config as
the trainer actor builds it) scores the engine's tokens under the same temperature-scaled,
top-k/top-p truncated distribution, and reports the residual training-inference gap."""

from __future__ import annotations

import pytest

from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample

CASES = [
    (0.6, 1.0, 0),
    (0.6, 0.9, 0),
    (0.6, 1.0, 5),
    (1.0, 1.0, 0),
    (1.0, 0.9, 0),
    (1.0, 1.0, 5),
    (1.0, 0.9, 5),
]


def job_trainer(model_path, temperature: float, top_p: float, top_k: int):
    """The train engine ``actors.common.make_train_engine`` builds for a job with this rollout."""
    from astraflow.actors.common import make_train_engine
    from astraflow.config import JobConfig, RolloutConfig

    cfg = JobConfig(job="agree", rollout=RolloutConfig(temperature=temperature, top_p=top_p, top_k=top_k))
    return make_train_engine(cfg, model_path)


def rollout_batch(cpu_engine, tokenizer, params: SamplingParams) -> TrainBatch:
    from astraflow.workflows.arithmetic import generate_problems

    prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in generate_problems(4, seed=2)]
    gens = cpu_engine.generate(prompts * 2, params)
    return TrainBatch(tuple(
        TrainSample(g.prompt_ids, g.tokens, g.logprobs, reward=float(i % 2), group_id=i % 4, version=g.version,
                    token_versions=(g.version,) * len(g.tokens))
        for i, g in enumerate(gens)))


@pytest.mark.parametrize("temperature,top_p,top_k", CASES)
def test_trainer_logprobs_match_the_engine(tiny_model_path, tokenizer, cpu_engine, temperature, top_p, top_k):
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=8,
                            stop_token_ids=(tokenizer.eos_token_id,), seed=7)
    batch = rollout_batch(cpu_engine, tokenizer, params)
    assert cpu_engine.version == 0
    trainer = job_trainer(tiny_model_path, temperature, top_p, top_k)
    assert (trainer.cfg.temperature, trainer.cfg.top_p, trainer.cfg.top_k) == (temperature, top_p, top_k)
    assert trainer.step == 0
    metrics = trainer.train_step(batch)
    assert metrics["train_inference_logp_gap"] < 1e-4


def test_gap_covers_only_tokens_of_the_trained_version(tiny_model_path, tokenizer, cpu_engine):
    import dataclasses

    from astraflow.actors.common import to_train_batch
    from astraflow.topics.messages import Batch, Sample, TrajectoryGroup

    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,), seed=3)
    batch = rollout_batch(cpu_engine, tokenizer, params)
    # Through the topic message: per-token versions reach the TrainSample. The first
    # token of every sample claims version 1, so at step 0 only the others count.
    groups = [TrajectoryGroup(task_id=f"t{i}", prompt_id=f"p{i}", policy="policy", node_id="n", prompt_ids=list(s.prompt_ids),
                              samples=[Sample(list(s.completion_ids), list(s.behaviour_logprobs),
                                              [1] + [0] * (len(s.completion_ids) - 1), s.reward, "stop")])
              for i, s in enumerate(batch.samples)]
    train_batch = to_train_batch(Batch(policy="policy", step=0, groups=groups, sources=[]))
    assert train_batch.samples[0].token_versions[:2] == (1, 0)
    # Corrupt the version-1 tokens' behaviour logprobs: the gap must not see them.
    corrupted = TrainBatch(tuple(
        dataclasses.replace(s, behaviour_logprobs=(s.behaviour_logprobs[0] - 1.0, *s.behaviour_logprobs[1:]))
        for s in train_batch.samples))
    trainer = job_trainer(tiny_model_path, 1.0, 0.9, 0)
    first = trainer.train_step(corrupted)
    assert first["train_inference_logp_gap"] < 1e-4
    assert first["behav_logp_gap"] > 0.05
    # At step 1 the only version-1 tokens are the corrupted ones; version 0 is not trained.
    assert trainer.train_step(corrupted)["train_inference_logp_gap"] > 0.9
    # No token at the trained version (step 2): nothing to measure, so no metric.
    assert "train_inference_logp_gap" not in trainer.train_step(corrupted)
