"""RL losses: hand-computed values, clipping/capping/masking where expected, gradient signs."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.engines.losses import (
    aggregate,
    decoupled_ppo_loss,
    grpo_advantages,
    kl_penalty,
    m2po_loss,
    ppo_clip_loss,
)

ln = math.log


def test_grpo_advantages_with_and_without_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0])
    groups = ["a", "a", "a", "a", "b", "b"]
    # group a: mean 0.5, population std 0.5 -> +-1; group b: identical rewards -> 0.
    adv = grpo_advantages(rewards, groups, normalize_std=True, eps=0.0)
    torch.testing.assert_close(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    torch.testing.assert_close(adv[4:], torch.zeros(2))
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0]), [0, 0, 7], normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0]))


def test_ppo_clip_values_and_clipping():
    logp_old = torch.tensor([[ln(0.5), ln(0.5), ln(0.5), ln(0.5)]])
    logp = torch.tensor([[ln(0.75), ln(0.75), ln(0.25), ln(0.55)]])  # ratios 1.5, 1.5, 0.5, 1.1
    adv = torch.tensor([[1.0, -1.0, -2.0, 1.0]])
    loss, stats = ppo_clip_loss(logp, logp_old, adv, clip_eps=0.2)
    # A>0, r=1.5: -min(1.5, 1.2) = -1.2 (clipped); A<0, r=1.5: -min(-1.5, -1.2) = 1.5
    # A<0, r=0.5: -min(-1.0, -1.6) = 1.6 (clipped); A>0, r=1.1: -1.1
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.5, 1.6, -1.1]]))
    torch.testing.assert_close(stats["clipped"], torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    # Clip-higher: eps_high = 0.6 leaves r = 1.5 unclipped.
    loss, _ = ppo_clip_loss(logp, logp_old, adv, clip_eps=0.2, clip_eps_high=0.6)
    assert loss[0, 0].item() == pytest.approx(-1.5)


def test_decoupled_ppo_values_and_iw_cap():
    logp_behav = torch.tensor([[ln(0.1), ln(0.4)]])
    logp_prox = torch.tensor([[ln(0.8), ln(0.2)]])  # iw = 8 (capped to 5), 0.5
    logp = torch.tensor([[ln(0.8), ln(0.3)]])  # r = 1, 1.5
    adv = torch.tensor([[1.0, 1.0]])
    loss, stats = decoupled_ppo_loss(logp, logp_prox, logp_behav, adv, clip_eps=0.2, iw_cap=5.0)
    # token 0: -5 * min(1, 1) = -5; token 1: -0.5 * min(1.5, 1.2) = -0.6
    torch.testing.assert_close(loss, torch.tensor([[-5.0, -0.6]]))
    torch.testing.assert_close(stats["iw_capped"], torch.tensor([[1.0, 0.0]]))
    torch.testing.assert_close(stats["clipped"], torch.tensor([[0.0, 1.0]]))


def test_m2po_masks_largest_outliers_until_second_moment_fits():
    logp_behav = torch.zeros(1, 4)
    logp = torch.tensor([[0.1, -0.1, 1.0, 0.0]])  # (log r)^2 = 0.01, 0.01, 1.0, 0
    adv = torch.ones(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # last token is padding
    loss, stats = m2po_loss(logp, logp_behav, adv, mask, tau=0.04)
    # M2 over 3 tokens = 1.02 / 3 > 0.04; dropping the 1.0 outlier leaves 0.01 <= 0.04.
    torch.testing.assert_close(stats["m2po_masked"], torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    expected = torch.tensor([[-math.exp(0.1), -math.exp(-0.1), 0.0, 0.0]])
    torch.testing.assert_close(loss * mask, expected)
    assert stats["m2"][0, 0].item() == pytest.approx(1.02 / 3)
    # Loose tau: nothing masked.
    _, stats = m2po_loss(logp, logp_behav, adv, mask, tau=1.0)
    assert stats["m2po_masked"].sum() == 0


def test_kl_estimators():
    logp = torch.tensor([ln(0.5), ln(0.2)])
    logp_ref = torch.tensor([ln(0.25), ln(0.4)])
    # d = logp_ref - logp = ln 0.5, ln 2
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k1"), torch.tensor([ln(2.0), -ln(2.0)]))
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k3"), torch.tensor([0.5 - ln(0.5) - 1, 2 - ln(2.0) - 1]))
    same = torch.log(torch.tensor([0.3, 0.6, 0.1]))
    for est in ("k1", "k3"):
        assert torch.equal(kl_penalty(same, same.clone(), est), torch.zeros(3))
    with pytest.raises(ValueError):
        kl_penalty(logp, logp_ref, "k2")


def test_token_and_sequence_aggregation():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "sequence").item() == pytest.approx((2 + 4) / 2)
    # Micro-batch normalisers: the two halves sum to the whole.
    halves = [aggregate(per_token[i : i + 1], mask[i : i + 1], "token", num_tokens=4.0) for i in range(2)]
    assert sum(h.item() for h in halves) == pytest.approx(10 / 4)
    halves = [aggregate(per_token[i : i + 1], mask[i : i + 1], "sequence", num_sequences=2.0) for i in range(2)]
    assert sum(h.item() for h in halves) == pytest.approx(3.0)


@pytest.mark.parametrize("which", ["ppo", "decoupled", "m2po"])
def test_positive_advantage_raises_sampled_logprob(which):
    token = 2
    mask = torch.ones(1, 1)
    for sign in (1.0, -1.0):
        logits = torch.zeros(1, 5, requires_grad=True)
        logp = torch.log_softmax(logits, -1)[:, token].unsqueeze(0)  # [1, 1]
        old = logp.detach()
        adv = torch.tensor([[sign]])
        if which == "ppo":
            per_tok, _ = ppo_clip_loss(logp, old, adv)
        elif which == "decoupled":
            per_tok, _ = decoupled_ppo_loss(logp, old, old, adv)
        else:
            per_tok, _ = m2po_loss(logp, old, adv, mask)
        (grad,) = torch.autograd.grad(aggregate(per_tok, mask), logits)
        # A gradient-descent step moves the sampled token's logit along -grad.
        assert (-grad[0, token]).item() * sign > 0


def test_kl_gradient_pulls_toward_reference():
    ref = torch.log_softmax(torch.tensor([1.0, 0.0, 0.0]), -1)
    logits = torch.tensor([0.0, 0.0, 2.0], requires_grad=True)
    logp = torch.log_softmax(logits, -1)
    loss = kl_penalty(logp, ref, "k3").mean()
    (grad,) = torch.autograd.grad(loss, logits)
    # Token 2 is over-weighted relative to the reference: descent must lower it.
    assert grad[2] > 0
