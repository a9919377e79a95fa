"""DeepSpeed trainer on CPU (gloo): learning, micro-batching, bit-exact checkpoint resume,
PPO minibatch updates around the proximal policy, batch-level M2PO masks, KL wiring."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
from astraflow.engines.config import TrainerConfig


@pytest.fixture(scope="module")
def fixed_batch(tiny_model_path, tokenizer, cpu_engine):
    """Samples from the tiny model on arithmetic prompts, rewarded by exact match."""
    from astraflow.workflows.arithmetic import generate_problems, reward

    problems = generate_problems(6, seed=5)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), seed=11)
    samples = []
    for gi, prob in enumerate(problems):
        ids = tokenizer.encode(prob.prompt, add_special_tokens=False)
        gens = cpu_engine.generate([ids] * 4, params)
        for g in gens:
            r = reward(tokenizer.decode(g.tokens, skip_special_tokens=True), prob.answer)
            # Alternate a synthetic bonus so every group has reward variance.
            samples.append(TrainSample(tuple(ids), g.tokens, g.logprobs, reward=r + (len(samples) % 2), group_id=gi))
    return TrainBatch(tuple(samples))


def make_trainer(path, **overrides):
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    cfg = TrainerConfig(**{"lr": 1e-3, "seed": 0, "grad_clip": 1.0, **overrides})
    return DeepSpeedTrainer(path, cfg)


def test_steps_on_fixed_batch_raise_objective(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, lr=5e-4)
    first = trainer.train_step(fixed_batch)
    for _ in range(3):
        last = trainer.train_step(fixed_batch)
    # PPO surrogate at ratio 1 is -mean(A) ~ 0; improving the policy makes it negative.
    assert last["loss"] < first["loss"]
    assert trainer.step == 4
    assert last["grad_norm"] > 0 and last["micro_batches"] >= 1


def test_token_budget_micro_batching_matches_single_batch(tiny_model_path, fixed_batch):
    whole = make_trainer(tiny_model_path, token_budget=100_000)
    m_whole = whole.train_step(fixed_batch)
    w_whole = whole.named_weights()
    split = make_trainer(tiny_model_path, token_budget=48)
    m_split = split.train_step(fixed_batch)
    w_split = split.named_weights()
    assert m_whole["micro_batches"] == 1 and m_split["micro_batches"] > 2
    assert m_split["loss"] == pytest.approx(m_whole["loss"], abs=1e-5)
    for name, t in w_whole.items():
        # Adam normalises each update to ~lr, so compare at a fraction of lr (1e-3).
        torch.testing.assert_close(w_split[name], t, atol=2e-5, rtol=0)


def test_gradient_checkpointing_recomputes_and_trains_to_the_same_weights(tiny_model_path, fixed_batch):
    """``gradient_checkpointing`` changes where activations come from, not the step: the same batch
    gives the same loss and the same weights as a trainer that keeps its activations."""
    kept = make_trainer(tiny_model_path, token_budget=64)
    m_kept = kept.train_step(fixed_batch)
    recomputed = make_trainer(tiny_model_path, token_budget=64, gradient_checkpointing=True)
    assert recomputed.engine.module.is_activation_checkpointing and not kept.engine.module.is_activation_checkpointing
    m_rec = recomputed.train_step(fixed_batch)
    assert m_rec["loss"] == pytest.approx(m_kept["loss"], abs=1e-6) and m_rec["grad_norm"] > 0
    w_kept, w_rec = kept.named_weights(), recomputed.named_weights()
    for name, t in w_kept.items():
        torch.testing.assert_close(w_rec[name], t, atol=1e-6, rtol=0)
    assert m_kept["grad_norm"] == pytest.approx(m_rec["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("loss,params,zero", [("grpo", {}, 0), ("decoupled_ppo", {"iw_cap": 2.0}, 1), ("m2po", {"tau": 0.04}, 2)])
def test_checkpoint_resume_is_bit_identical(tiny_model_path, fixed_batch, tmp_path, loss, params, zero):
    common = dict(loss=loss, loss_params=params, zero_stage=zero, warmup_steps=2, kl_coef=0.01 if loss == "grpo" else 0.0)
    straight = make_trainer(tiny_model_path, **common)
    for _ in range(2):
        straight.train_step(fixed_batch)
    straight.save_checkpoint(tmp_path / "ckpt", {"offsets": {"batches.p": 41}})
    expected = straight.train_step(fixed_batch)
    expected_w = straight.named_weights()

    resumed = make_trainer(tiny_model_path, **common)
    extra = resumed.load_checkpoint(tmp_path / "ckpt")
    assert extra == {"offsets": {"batches.p": 41}}
    assert resumed.step == 2
    got = resumed.train_step(fixed_batch)
    assert got["loss"] == expected["loss"] and got["lr"] == expected["lr"]
    for name, t in expected_w.items():
        assert torch.equal(resumed.named_weights()[name], t), name


def test_export_hf_reloads_with_transformers(tiny_model_path, fixed_batch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = make_trainer(tiny_model_path)
    trainer.train_step(fixed_batch)
    out = trainer.export_hf(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(out))
    for name, t in trainer.named_weights().items():
        torch.testing.assert_close(model.state_dict()[name], t)


def test_advantages_given_override_rewards(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, lr=0.0)
    zero_adv = TrainBatch(tuple(dataclasses.replace(s, advantage=0.0) for s in fixed_batch.samples))
    metrics = trainer.train_step(zero_adv)
    assert metrics["advantage_mean"] == 0.0 and metrics["loss"] == 0.0


def test_config_rejects_unknown_keys_and_bad_params():
    from astraflow.engines.config import from_dict

    with pytest.raises(ValueError, match="lr_typo"):
        from_dict(TrainerConfig, {"lr_typo": 1.0}, "trainer")
    with pytest.raises(ValueError, match="iw_cap"):
        TrainerConfig(loss="grpo", loss_params={"iw_cap": 2.0})
    with pytest.raises(ValueError, match="minibatches"):
        TrainerConfig(minibatches=0)
    with pytest.raises(ValueError, match="top_p"):
        TrainerConfig(top_p=0.0)


def test_ppo_is_not_a_second_name_for_grpo():
    from astraflow.engines.config import from_dict

    # Once an alias of grpo; a config that still says it learns what to write instead.
    with pytest.raises(ValueError, match="alias of 'grpo'.*use 'grpo'.*'decoupled_ppo'"):
        from_dict(TrainerConfig, {"loss": "ppo"}, "trainer")
    from astraflow.engines.losses import POLICY_LOSSES

    assert "ppo" not in POLICY_LOSSES


def test_k1_kl_loss_term_is_refused_with_the_alternatives():
    with pytest.raises(ValueError, match="zero expected gradient.*kl_in_reward_coef.*'k3'"):
        TrainerConfig(kl_coef=0.1, kl_estimator="k1")


# --- PPO updates: minibatches and epochs around the proximal policy ---------------------


@pytest.mark.parametrize("loss", ["grpo", "decoupled_ppo"])
def test_minibatch_updates_clip_only_after_the_first_update(tiny_model_path, fixed_batch, loss):
    # A deliberately large LR: each minibatch's step moves the policy well beyond the
    # clip range for the minibatches that follow it.
    trainer = make_trainer(tiny_model_path, loss=loss, lr=2e-2, minibatches=4, warmup_steps=2)
    m = trainer.train_step(fixed_batch)
    assert m["updates"] == 4
    assert m["clipped_frac_mb0"] == 0.0
    assert all(m[f"clipped_frac_mb{k}"] > 0 for k in (1, 2, 3)), m
    # One version per batch, and the LR schedule counts versions (warm-up: 1/2, 2/2).
    assert trainer.step == 1 and m["lr"] == pytest.approx(1e-2)
    assert trainer.train_step(fixed_batch)["lr"] == pytest.approx(2e-2)


def test_ppo_epochs_revisit_the_batch_against_the_same_proximal_policy(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, loss="decoupled_ppo", lr=2e-2, ppo_epochs=2)
    m = trainer.train_step(fixed_batch)
    assert m["updates"] == 2 and trainer.step == 1
    assert m["clipped_frac_mb0"] == 0.0 and m["clipped_frac_mb1"] > 0


def test_more_minibatches_than_samples_is_a_clear_error(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, minibatches=len(fixed_batch.samples) + 1)
    with pytest.raises(ValueError, match="minibatches is 25 but the batch has only 24 samples"):
        trainer.train_step(fixed_batch)


# --- M2PO: one token mask per batch ------------------------------------------------------


def test_m2po_mask_does_not_depend_on_token_budget(tiny_model_path, fixed_batch):
    # Stale-looking behaviour logprobs, so the second-moment bound has tokens to drop.
    noise = torch.Generator().manual_seed(3)
    stale = TrainBatch(tuple(
        dataclasses.replace(s, behaviour_logprobs=tuple(
            (torch.tensor(s.behaviour_logprobs) + 0.3 * torch.randn(len(s.behaviour_logprobs), generator=noise)).tolist()))
        for s in fixed_batch.samples))
    runs = []
    for budget in (100_000, 48):
        trainer = make_trainer(tiny_model_path, loss="m2po", loss_params={"tau": 0.04}, token_budget=budget)
        keep = trainer.prepare(stale).keep
        runs.append((keep, trainer.train_step(stale)))
    (keep_whole, m_whole), (keep_split, m_split) = runs
    assert m_whole["micro_batches"] == 1 and m_split["micro_batches"] > 2
    assert 0 < m_whole["m2po_masked_frac"] < 0.5
    for a, b in zip(keep_whole, keep_split, strict=True):
        assert torch.equal(a, b)
    assert m_split["m2po_masked_frac"] == m_whole["m2po_masked_frac"]
    assert m_split["loss"] == pytest.approx(m_whole["loss"], abs=1e-5)


# --- KL -----------------------------------------------------------------------------------


def test_kl_in_reward_shapes_rewards_before_advantages(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, kl_in_reward_coef=0.5, lr=1e-2)
    first = trainer.prepare(fixed_batch)
    # The reference is the initial weights: nothing to subtract yet.
    assert first.kl_in_reward.abs().max() < 1e-4
    trainer.train_step(fixed_batch)
    plan = trainer.prepare(fixed_batch)
    raw = torch.tensor([s.reward for s in fixed_batch.samples])
    torch.testing.assert_close(plan.rewards, raw - 0.5 * plan.kl_in_reward)
    assert plan.kl_in_reward.abs().max() > 1e-2
    zero_adv = TrainBatch(tuple(dataclasses.replace(s, advantage=0.0) for s in fixed_batch.samples))
    with pytest.raises(ValueError, match="kl_in_reward_coef needs rewards"):
        trainer.train_step(zero_adv)


def test_kl_loss_term_is_zero_at_the_reference_and_reported(tiny_model_path, fixed_batch):
    trainer = make_trainer(tiny_model_path, kl_coef=0.1, kl_estimator="k3", lr=1e-2)
    assert trainer.train_step(fixed_batch)["kl"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.train_step(fixed_batch)["kl"] > 0
