"""The loss mask: context tokens inside a completion (another role's text, environment
feedback) are never trained on — a masked tail changes nothing, a masked token in the
middle is context only."""

from __future__ import annotations

import pytest
import torch

from astraflow.engines.base import TrainBatch, TrainSample
from astraflow.engines.config import TrainerConfig


def _trainer(path, **kw):
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer
    return DeepSpeedTrainer(path, TrainerConfig(**{"lr": 1e-3, "seed": 0, "grad_clip": 1.0, **kw}))


_ROWS: list = []


@pytest.fixture(scope="module", autouse=True)
def _rows(cpu_engine, tokenizer):
    """Real samples of the tiny model (so behaviour logprobs are its own), rewards varied."""
    from astraflow.engines.base import SamplingParams
    ids = tokenizer.encode("12+7=", add_special_tokens=False)
    gens = cpu_engine.generate([ids] * 4, SamplingParams(temperature=1.0, max_new_tokens=4), seeds=[1, 2, 3, 4])
    _ROWS[:] = [(tuple(ids), g.tokens, g.logprobs, r) for g, r in zip(gens, (1.0, 0.0, 0.5, 0.0))]


def _batch(extra_tail: bool) -> TrainBatch:
    samples = []
    for prompt, toks, lps, r in _ROWS:
        if extra_tail:  # another role's two tokens after ours: context the loss must ignore
            samples.append(TrainSample(prompt, toks + (50, 51), lps + (0.0, 0.0), reward=r, group_id=0,
                                       loss_mask=(1,) * len(toks) + (0, 0), token_versions=(0,) * (len(toks) + 2)))
        else:
            samples.append(TrainSample(prompt, toks, lps, reward=r, group_id=0))
    return TrainBatch(tuple(samples))


@pytest.mark.parametrize("loss", ["grpo", "m2po"])
def test_a_masked_tail_trains_exactly_like_no_tail(tiny_model_path, loss):
    a, b = _trainer(tiny_model_path, loss=loss), _trainer(tiny_model_path, loss=loss)
    ma, mb = a.train_step(_batch(False)), b.train_step(_batch(True))
    assert ma["tokens"] == mb["tokens"] == sum(len(t) for _, t, _, _ in _ROWS)  # trained tokens only
    wa, wb = a.named_weights(), b.named_weights()
    moved = max(float((wa[n] - a0).abs().max()) for n, a0 in _initial(tiny_model_path).items())
    assert moved > 1e-4  # the step did train
    for name, t in wa.items():
        assert torch.allclose(t, wb[name], atol=1e-6), name
    a.close()
    b.close()


def test_unmasking_the_tail_changes_the_update(tiny_model_path):
    masked = _batch(True)
    unmasked = TrainBatch(tuple(TrainSample(s.prompt_ids, s.completion_ids, s.behaviour_logprobs, reward=s.reward,
                                            group_id=0) for s in masked.samples))
    a, b = _trainer(tiny_model_path), _trainer(tiny_model_path)
    a.train_step(masked)
    b.train_step(unmasked)
    wa, wb = a.named_weights(), b.named_weights()
    assert any(not torch.allclose(t, wb[n], atol=1e-6) for n, t in wa.items())
    a.close()
    b.close()


def test_a_sample_with_nothing_to_train_is_refused():
    with pytest.raises(ValueError, match="at least one token to train on"):
        TrainSample((1,), (2, 3), (-0.1, -0.1), loss_mask=(0, 0))
    with pytest.raises(ValueError, match="loss-mask values"):
        TrainSample((1,), (2, 3), (-0.1, -0.1), loss_mask=(1,))


_INIT: dict = {}


def _initial(path):
    if not _INIT:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(str(path))
        _INIT.update({n: p.detach().float().clone() for n, p in model.state_dict().items()})
    return _INIT
