"""Rollout–trainer mismatch corrections (engines/corrections.py): hand-computed weights for
each method on small tensors — a flipped ratio (behaviour over trainer), a wrong cap or band
edge, or sums that take a context token in all change the numbers — and, through the real
trainer on the tiny model, that a correction composes with the loss as a weight."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from astraflow.engines.corrections import correction_weights, ratio_percentiles

ln = torch.log
T = torch.tensor


def weights(train, behav, mask, method, **kw):
    return correction_weights(ln(T(train)), ln(T(behav)), T(mask), method, **kw)


def test_tis_truncates_the_trainer_over_behaviour_ratio_at_the_cap():
    # rho = 0.5 / behav = 1, 5, 1.25, 5/9
    w, stats = weights([[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.1, 0.4, 0.9]], [[1.0, 1.0, 1.0, 1.0]], "tis", cap=2.0)
    torch.testing.assert_close(w, T([[1.0, 2.0, 1.25, 5 / 9]]))
    torch.testing.assert_close(stats["correction_capped"], T([[0.0, 1.0, 0.0, 0.0]]))
    w, _ = weights([[0.5, 0.5]], [[0.5, 0.1]], [[1.0, 1.0]], "tis", cap=3.0)
    torch.testing.assert_close(w, T([[1.0, 3.0]]))
    # outside the mask: no weight
    w, _ = weights([[0.5, 0.5]], [[0.1, 0.1]], [[1.0, 0.0]], "tis", cap=2.0)
    torch.testing.assert_close(w, T([[2.0, 0.0]]))


def test_mis_token_keeps_the_ratio_inside_the_band_and_zeroes_the_rest():
    w, stats = weights([[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.1, 0.4, 0.9]], [[1.0, 1.0, 1.0, 1.0]], "mis_token",
                       lo=0.6, hi=2.0)
    torch.testing.assert_close(w, T([[1.0, 0.0, 1.25, 0.0]]))
    torch.testing.assert_close(stats["correction_masked"], T([[0.0, 1.0, 0.0, 1.0]]))
    assert "correction_capped" not in stats
    # the band is closed: rho == hi and rho == lo are kept
    w, _ = weights([[0.5, 0.5]], [[0.25, 1.0]], [[1.0, 1.0]], "mis_token", lo=0.5, hi=2.0)
    torch.testing.assert_close(w, T([[2.0, 0.5]]))


def test_icepop_accepts_or_rejects_without_reweighting():
    w, stats = weights([[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.1, 0.4, 0.9]], [[1.0, 1.0, 1.0, 1.0]], "icepop",
                       lo=0.5, hi=4.0)
    torch.testing.assert_close(w, T([[1.0, 0.0, 1.0, 1.0]]))  # rho 5 > 4 rejected; 5/9 >= 0.5 kept unweighted
    torch.testing.assert_close(stats["correction_masked"], T([[0.0, 1.0, 0.0, 0.0]]))
    w, _ = weights([[0.5, 0.5, 0.5, 0.5]], [[0.5, 0.1, 0.4, 0.9]], [[1.0, 1.0, 1.0, 1.0]], "icepop", lo=0.5, hi=5.0)
    torch.testing.assert_close(w, torch.ones(1, 4))


def test_mis_seq_multiplies_the_trained_tokens_ratios_only():
    train = [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
    behav = [[0.25, 0.5, 0.5],   # rho_seq = 2: kept, every token weighted 2
             [0.25, 0.5, 0.1],   # the 0.1 token is context (mask 0): rho_seq = 2, not 10
             [0.1, 0.5, 0.5]]    # rho_seq = 5: the whole row dropped
    mask = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    w, stats = weights(train, behav, mask, "mis_seq", lo=0.5, hi=2.0)
    torch.testing.assert_close(w, T([[2.0, 2.0, 2.0], [2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(stats["correction_masked"], T([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    # a low sequence ratio is dropped too: rho_seq = 0.25 < lo
    w, _ = weights([[0.5, 0.5]], [[1.0, 1.0]], [[1.0, 1.0]], "mis_seq", lo=0.5, hi=2.0)
    torch.testing.assert_close(w, torch.zeros(1, 2))


def test_geo_seq_compares_the_length_normalised_ratio():
    # rho_t = 4, 1: product 4 (> 2), geometric mean 2 (kept, unweighted)
    w, _ = weights([[0.5, 0.5]], [[0.125, 0.5]], [[1.0, 1.0]], "geo_seq", lo=0.5, hi=2.0)
    torch.testing.assert_close(w, torch.ones(1, 2))
    w, stats = weights([[0.5, 0.5]], [[0.125, 0.5]], [[1.0, 1.0]], "geo_seq", lo=0.5, hi=1.9)
    torch.testing.assert_close(w, torch.zeros(1, 2))
    torch.testing.assert_close(stats["correction_masked"], torch.ones(1, 2))
    # the mean runs over trained tokens: rho_t = 2, 2 and a context token that would pull it below 2
    w, _ = weights([[0.5, 0.5, 0.5]], [[0.25, 0.25, 0.9]], [[1.0, 1.0, 0.0]], "geo_seq", lo=0.5, hi=2.0)
    torch.testing.assert_close(w, T([[1.0, 1.0, 0.0]]))
    w, _ = weights([[0.5, 0.5, 0.5]], [[0.25, 0.25, 0.9]], [[1.0, 1.0, 1.0]], "geo_seq", lo=1.5, hi=2.0)
    torch.testing.assert_close(w, torch.zeros(1, 3))  # (ln 2 + ln 2 + ln 5/9) / 3 -> 1.39 < 1.5


def test_long_sequences_do_not_overflow():
    n = 4000
    w, stats = correction_weights(torch.zeros(1, n), torch.full((1, n), -1.0), torch.ones(1, n), "mis_seq")
    assert torch.isfinite(w).all() and w.sum() == 0 and stats["correction_masked"].sum() == n


def test_no_gradient_flows_through_the_weight():
    train = ln(T([[0.5, 0.5]])).requires_grad_()
    w, _ = correction_weights(train, ln(T([[0.25, 0.5]])), torch.ones(1, 2), "tis")
    assert not w.requires_grad


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown correction 'tiss'"):
        weights([[0.5]], [[0.5]], [[1.0]], "tiss")


def test_ratio_percentiles():
    d = torch.log(torch.linspace(1.0, 3.0, 1001))
    out = ratio_percentiles(d)
    assert out["rollout_ratio_p50"] == pytest.approx(2.0, rel=1e-6)
    assert out["rollout_ratio_p01"] == pytest.approx(1.02, rel=1e-6)
    assert out["rollout_ratio_p99"] == pytest.approx(2.98, rel=1e-6)
    assert out["behav_logp_gap_p99"] == pytest.approx(math.log(2.98), rel=1e-6)
    flipped = ratio_percentiles(-d)  # the gap is sign-blind; the ratio is not
    assert flipped["behav_logp_gap_p99"] == pytest.approx(math.log(2.98), rel=1e-6)
    assert flipped["rollout_ratio_p01"] == pytest.approx(1 / 2.98, rel=1e-6)
    assert ratio_percentiles(torch.zeros(0)) == {}


def test_config_names_the_key():
    from astraflow.engines.config import TrainerConfig, from_dict

    cfg = from_dict(TrainerConfig, {"correction": {"method": "icepop", "lo": 0.5, "hi": 5}})
    assert cfg.correction.method == "icepop" and cfg.correction.hi == 5
    with pytest.raises(ValueError, match="trainer.engine.correction.method must be one of"):
        from_dict(TrainerConfig, {"correction": {"method": "clip"}})
    with pytest.raises(ValueError, match="correction.cap"):
        from_dict(TrainerConfig, {"correction": {"method": "tis", "cap": 0.5}})


# --- through the trainer ----------------------------------------------------------------


def _batch(cpu_engine, tokenizer):
    from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
    from astraflow.workflows.arithmetic import generate_problems

    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(tokenizer.eos_token_id,), seed=5)
    prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in generate_problems(4, seed=3)]
    gens = cpu_engine.generate(prompts * 2, params)
    return TrainBatch(tuple(
        TrainSample(g.prompt_ids, g.tokens, g.logprobs, reward=float(i % 3 == 0), group_id=i % 4, version=0,
                    token_versions=(0,) * len(g.tokens))
        for i, g in enumerate(gens)))


def _trainer(model_path, correction=None, loss="grpo"):
    from astraflow.actors.common import make_train_engine
    from astraflow.config import JobConfig
    from astraflow.engines.config import TrainerConfig

    cfg = JobConfig(job="corr")
    engine = TrainerConfig(loss=loss, correction=correction, lr=1e-3)
    return make_train_engine(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, engine=engine)),
                             model_path)


def _params(trainer):
    return torch.cat([p.detach().flatten().clone() for p in trainer.engine.module.parameters()])


def test_a_correction_weights_the_loss_inside_the_trainer(tiny_model_path, tokenizer, cpu_engine):
    from astraflow.engines.base import TrainBatch
    from astraflow.engines.config import CorrectionConfig

    batch = _batch(cpu_engine, tokenizer)
    # Agreeing log-probs (rho = 1 everywhere): TIS changes nothing, bit for bit.
    plain, tis = _trainer(tiny_model_path), _trainer(tiny_model_path, CorrectionConfig("tis", cap=2.0))
    m_plain, m_tis = plain.train_step(batch), tis.train_step(batch)
    assert m_tis["loss"] == pytest.approx(m_plain["loss"], rel=1e-6)
    assert torch.equal(_params(plain), _params(tis))
    assert m_tis["correction_capped_frac"] == 0.0 and m_tis["rollout_ratio_p50"] == pytest.approx(1.0, abs=1e-4)

    # Every sample's first token made 3x likelier to the engine than to the trainer (rho = 1/3):
    # icepop's band [0.5, 5] rejects exactly those tokens.
    shifted = TrainBatch(tuple(
        dataclasses.replace(s, behaviour_logprobs=(s.behaviour_logprobs[0] + math.log(3), *s.behaviour_logprobs[1:]))
        for s in batch.samples))
    first_tokens = len(batch.samples) / sum(len(s.completion_ids) for s in batch.samples)
    ice = _trainer(tiny_model_path, CorrectionConfig("icepop", lo=0.5, hi=5.0))
    m = ice.train_step(shifted)
    assert m["correction_masked_frac"] == pytest.approx(first_tokens, rel=1e-6)
    assert m["rollout_ratio_p01"] == pytest.approx(1 / 3, rel=1e-3)
    # Without the correction the same batch trains on the shifted tokens: other weights.
    uncorrected, corrected = _trainer(tiny_model_path), _trainer(tiny_model_path, CorrectionConfig("icepop", lo=0.5, hi=5.0))
    uncorrected.train_step(shifted)
    corrected.train_step(shifted)
    assert not torch.equal(_params(uncorrected), _params(corrected))


def test_a_bf16_engine_is_a_real_mismatch(tiny_model_path, tokenizer, cpu_engine):
    """``rollout.engine.dtype: bf16``: the engine holds and runs bfloat16 weights (fp32 ones it
    is given are rounded), and the trainer sees the gap an fp32 engine does not have."""
    from astraflow.engines.config import RolloutConfig, from_dict
    from astraflow.engines.cpu import CpuEngine
    from astraflow.engines.factory import make_rollout_engine

    bf16 = make_rollout_engine({"model_path": str(tiny_model_path), "dtype": "bf16"})
    try:
        assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
        name, value = next(iter(cpu_engine.model.state_dict().items()))
        bf16.load_weights({name: value + 1e-4}, 1)
        assert torch.equal(bf16.model.state_dict()[name], (value + 1e-4).to(torch.bfloat16))
        bf16.load_weights(dict(cpu_engine.model.state_dict()), 0)
        gap_bf16 = _trainer(tiny_model_path).train_step(_batch(bf16, tokenizer))["behav_logp_gap"]
    finally:
        bf16.close()
    gap_fp32 = _trainer(tiny_model_path).train_step(_batch(cpu_engine, tokenizer))["behav_logp_gap"]
    assert gap_fp32 < 1e-5 < 1e-3 < gap_bf16
    with pytest.raises(ValueError, match="rollout.engine.dtype applies to kind cpu"):
        from_dict(RolloutConfig, {"kind": "sglang", "dtype": "bf16"})
    with pytest.raises(ValueError, match="rollout.engine.dtype must be"):
        from_dict(RolloutConfig, {"dtype": "fp16"})
    with pytest.raises(ValueError, match="LoRA adapters in fp32 only"):
        from astraflow.engines.config import LoraConfig
        CpuEngine(tiny_model_path, lora=LoraConfig(), dtype="bf16")
