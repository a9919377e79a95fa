"""RL losses: hand-computed values, clipping/capping/masking where expected, gradient signs,
and the expected gradients of the KL terms against finite differences (exact expectations
over a tiny categorical policy, no sampling noise)."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.engines.losses import (
    aggregate,
    decoupled_ppo_loss,
    grpo_advantages,
    kl_penalty,
    kl_shaped_rewards,
    m2po_loss,
    m2po_mask,
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
    logp_prox = torch.tensor([[0.1, -0.1, 1.0, 0.0]])  # (log r)^2 = 0.01, 0.01, 1.0, 0
    adv = torch.ones(1, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # last token is padding
    keep, m2 = m2po_mask(logp_prox, logp_behav, mask, tau=0.04)
    # M2 over 3 tokens = 1.02 / 3 > 0.04; dropping the 1.0 outlier leaves 0.01 <= 0.04.
    torch.testing.assert_close(keep, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    assert m2.item() == pytest.approx(1.02 / 3)
    logp = torch.tensor([[0.2, -0.1, 1.0, 0.0]])
    loss, _ = m2po_loss(logp, logp_behav, adv, keep)
    expected = torch.tensor([[-math.exp(0.2), -math.exp(-0.1), 0.0, 0.0]])
    torch.testing.assert_close(loss * mask, expected)
    # Loose tau: nothing masked.
    keep, _ = m2po_mask(logp_prox, logp_behav, mask, tau=1.0)
    assert torch.equal(keep, mask)


def test_m2po_mask_of_a_batch_is_not_the_union_of_its_parts():
    # Each half alone fits tau = 0.04 only after dropping its own outlier; over the whole
    # batch one outlier is enough. A mask computed per micro-batch would drop both.
    logp_prox = torch.tensor([[0.3, 0.0, 0.0, 0.0], [0.25, 0.0, 0.0, 0.0]])
    behav, mask = torch.zeros(2, 4), torch.ones(2, 4)
    keep, _ = m2po_mask(logp_prox, behav, mask, tau=0.01)
    assert keep.sum() == 7 and keep[0, 0] == 0
    halves = [m2po_mask(logp_prox[i : i + 1], behav[i : i + 1], mask[i : i + 1], tau=0.01)[0] for i in range(2)]
    assert sum(h.sum() for h in halves) == 6


def test_kl_estimators():
    logp = torch.tensor([ln(0.5), ln(0.2)])
    logp_ref = torch.tensor([ln(0.25), ln(0.4)])
    # d = logp_ref - logp = ln 0.5, ln 2
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k1"), torch.tensor([ln(2.0), -ln(2.0)]))
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k3"), torch.tensor([0.5 - ln(0.5) - 1, 2 - ln(2.0) - 1]))
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k2"), torch.tensor([ln(0.5) ** 2 / 2, ln(2.0) ** 2 / 2]))
    same = torch.log(torch.tensor([0.3, 0.6, 0.1]))
    for est in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(same, same.clone(), est), torch.zeros(3))
    with pytest.raises(ValueError):
        kl_penalty(logp, logp_ref, "k4")


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
            per_tok, _ = m2po_loss(logp, old, adv, m2po_mask(old, old, mask)[0])
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


# --- KL: expected gradients on a tiny categorical policy -------------------------------
# π_θ = softmax(θ) over 5 categories, each category a one-token sequence; expectations
# over y ~ π_θ are exact sums weighted by π_θ(y) (held constant: the score-function /
# sampled-token view an RL loss takes).

THETA = torch.tensor([0.3, -1.2, 0.8, 0.0, 0.5], dtype=torch.float64)
THETA_REF = torch.tensor([-0.4, 0.6, 0.1, 1.0, -0.2], dtype=torch.float64)


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax p || softmax q), exactly."""
    logp, logq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return (logp.exp() * (logp - logq)).sum()


def finite_difference(f, x: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    grad = torch.zeros_like(x)
    for i in range(x.numel()):
        e = torch.zeros_like(x)
        e[i] = h
        grad[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def expected_loss_gradient(per_token_loss) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E_{y~π}[loss(y)], ∇_θ of it with π(y) held fixed)`` for ``per_token_loss(logp, logp_ref)``."""
    theta = THETA.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    logp_ref = torch.log_softmax(THETA_REF, -1)
    weights = logp.detach().exp()
    expected = (weights * per_token_loss(logp, logp_ref)).sum()
    (grad,) = torch.autograd.grad(expected, theta)
    return expected.detach(), grad


def test_k1_in_reward_policy_gradient_is_minus_beta_grad_reverse_kl():
    beta = 0.3

    def reinforce_loss(logp, logp_ref):
        # Each category is a sequence of one token; reward 0 before shaping.
        rewards, _ = kl_shaped_rewards(torch.zeros(5, dtype=torch.float64), list(logp.detach().unsqueeze(-1)),
                                       list(logp_ref.unsqueeze(-1)), beta)
        # At ratio 1 the PPO-clip surrogate is the REINFORCE loss -A log π.
        loss, _ = ppo_clip_loss(logp, logp.detach(), rewards)
        return loss

    _, grad = expected_loss_gradient(reinforce_loss)
    # Gradient *descent* on the loss follows -grad; the policy gradient is -grad.
    fd = finite_difference(lambda t: kl(t, THETA_REF), THETA)
    torch.testing.assert_close(-grad, -beta * fd, atol=1e-8, rtol=1e-6)
    assert fd.abs().max() > 0.1  # a real gradient, not two zeros


def test_kl_shaped_rewards_sum_k1_over_each_sequence():
    rewards = torch.tensor([1.0, 0.0])
    old = [torch.tensor([-0.5, -1.0]), torch.tensor([-2.0])]
    ref = [torch.tensor([-1.0, -1.5]), torch.tensor([-1.0])]
    shaped, kl_seq = kl_shaped_rewards(rewards, old, ref, coef=0.1)
    torch.testing.assert_close(kl_seq, torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(shaped, torch.tensor([0.9, 0.1]))
    with pytest.raises(ValueError, match="2 rewards"):
        kl_shaped_rewards(rewards, old[:1], ref[:1], coef=0.1)


def test_k3_loss_term_gradient_is_the_forward_kl_gradient():
    value, grad = expected_loss_gradient(lambda logp, ref: kl_penalty(logp, ref, "k3"))
    # Its value is an unbiased estimate of the reverse KL(π || π_ref) ...
    assert value.item() == pytest.approx(kl(THETA, THETA_REF).item(), rel=1e-9)
    # ... but its expected gradient is that of the forward KL(π_ref || π).
    forward = finite_difference(lambda t: kl(THETA_REF, t), THETA)
    torch.testing.assert_close(grad, forward, atol=1e-8, rtol=1e-6)
    reverse = finite_difference(lambda t: kl(t, THETA_REF), THETA)
    assert not torch.allclose(grad, reverse, atol=1e-3)


def test_k2_loss_term_gradient_is_the_reverse_kl_gradient():
    _, grad = expected_loss_gradient(lambda logp, ref: kl_penalty(logp, ref, "k2"))
    torch.testing.assert_close(grad, finite_difference(lambda t: kl(t, THETA_REF), THETA), atol=1e-8, rtol=1e-6)


def test_k1_as_a_loss_term_has_zero_expected_gradient():
    # Why the trainer refuses kl_estimator 'k1': E_π[∇ log π] = 0.
    _, grad = expected_loss_gradient(lambda logp, ref: kl_penalty(logp, ref, "k1"))
    torch.testing.assert_close(grad, torch.zeros_like(grad), atol=1e-12, rtol=0)
