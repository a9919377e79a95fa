"""RL losses as pure tensor functions (no model, no engine, no config objects).

Owns the algorithms' math: GRPO group advantages, PPO-clip, decoupled PPO, M2PO (its
batch-level token mask and its surrogate), the KL against a reference policy (estimators
for a loss term, k1 shaping of the reward), and token- vs sequence-level aggregation.
Per-token functions take ``[B, T]`` tensors aligned with a ``mask`` (1 on completion
tokens) and return a per-token loss ``[B, T]`` plus a dict of diagnostics; ``aggregate``
reduces. Notation: ``logp`` = log π_θ (current, with grad), ``logp_behav`` = log μ (the
policy that generated the tokens), ``logp_prox`` = log π_prox (the proximal policy: the
weights before the batch's first update), ``A`` = advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .loss_names import LOSS_PARAMS, RETIRED_LOSSES  # noqa: F401 - re-exported: the names beside the math

__all__ = [
    "grpo_advantages",
    "ppo_clip_loss",
    "decoupled_ppo_loss",
    "m2po_mask",
    "m2po_loss",
    "kl_penalty",
    "kl_shaped_rewards",
    "aggregate",
    "masked_mean",
    "POLICY_LOSSES",
    "LOSS_PARAMS",
    "BATCH_MASKS",
]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(x * mask) / max(sum(mask), 1)``."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[object] | torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages (GRPO).

    For sample ``i`` in group ``g`` with rewards ``r_g``::

        A_i = (r_i - mean(r_g)) / (std(r_g) + eps)   if normalize_std
        A_i =  r_i - mean(r_g)                        otherwise (Dr. GRPO)

    ``std`` is the population standard deviation (``unbiased=False``), so a group of one
    gets ``A = 0`` rather than NaN, and a group with identical rewards gets ``A = 0``.
    """
    rewards = rewards.float()
    keys = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(keys) != rewards.numel():
        raise ValueError(f"{rewards.numel()} rewards but {len(keys)} group ids")
    index: dict[object, int] = {}
    inverse = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)
    n_groups = len(index)
    count = torch.zeros(n_groups).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(n_groups).index_add_(0, inverse, rewards) / count
    centered = rewards - mean[inverse]
    if not normalize_std:
        return centered
    var = torch.zeros(n_groups).index_add_(0, inverse, centered**2) / count
    denom = var.sqrt()[inverse] + eps
    # A constant group has centered == 0; keep it 0 even when eps == 0.
    return centered / torch.where(denom > 0, denom, torch.ones_like(denom))


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate, per token::

        r    = exp(logp - logp_old)
        loss = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

    ``eps_high`` defaults to ``eps_low`` (``clip_eps``); a larger one is DAPO's clip-higher.
    With ``logp_old`` = the behaviour policy this is the GRPO/PPO objective.
    Diagnostics: ``clipped`` (1 where the clipped branch is the active minimum).
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - logp_old)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_eps, 1 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, {"clipped": (clipped < unclipped).float(), "ratio": ratio.detach()}


def decoupled_ppo_loss(
    logp: torch.Tensor,
    logp_prox: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    iw_cap: float = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Decoupled PPO (asynchronous RL with stale behaviour policies), per token::

        w    = min(exp(logp_prox - logp_behav), iw_cap)        (no gradient)
        r    = exp(logp - logp_prox)
        loss = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)

    The trust region is taken around the proximal policy π_prox (recent weights), while
    the importance weight ``w`` corrects for sampling from the older μ; capping ``w``
    bounds the variance that very stale tokens would add.
    Diagnostics: ``clipped``, ``iw`` (uncapped weights), ``iw_capped`` (1 where capped).
    """
    raw_iw = torch.exp((logp_prox - logp_behav).detach())
    iw = raw_iw.clamp(max=iw_cap)
    surrogate, stats = ppo_clip_loss(logp, logp_prox.detach(), advantages, clip_eps)
    stats.update(iw=raw_iw, iw_capped=(raw_iw > iw_cap).float())
    return iw * surrogate, stats


def m2po_mask(
    logp_prox: torch.Tensor,
    logp_behav: torch.Tensor,
    mask: torch.Tensor,
    tau: float = 0.04,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M2PO's token selection: bound the second moment of the log importance weights.

    With ``s = (logp_prox - logp_behav)^2`` on the tokens of ``mask`` and
    ``M2 = mean of s over the kept tokens``, tokens are dropped greedily, largest ``s``
    first, until ``M2 <= tau``. Returns ``(keep, M2 before masking)``; ``keep`` is 1 on
    kept tokens, 0 on dropped tokens and outside ``mask``.

    Call it once over the whole batch (any shape; ``mask`` says which entries are
    tokens): the selection is a property of the batch, so it must not depend on how the
    trainer splits the batch into micro- or minibatches.
    """
    sq = ((logp_prox - logp_behav).detach() ** 2) * mask
    n = int(mask.sum().item())
    keep = mask.detach().clone().float()
    if n:
        flat = sq.flatten()
        order = torch.argsort(flat, descending=True)[:n]  # masked-out entries are 0: last
        sorted_sq = flat[order]
        # Mean of the tokens left after dropping the first j (j = 0..n-1).
        suffix_sum = sorted_sq.flip(0).cumsum(0).flip(0)
        remaining = torch.arange(n, 0, -1, dtype=sorted_sq.dtype, device=sorted_sq.device)
        ok = (suffix_sum / remaining <= tau).nonzero()
        drop = int(ok[0].item()) if len(ok) else n
        keep.view(-1)[order[:drop]] = 0.0
    return keep, sq.sum() / max(n, 1)


def m2po_loss(
    logp: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    keep: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """M2PO surrogate on the tokens ``m2po_mask`` kept, per token::

        r    = exp(logp - logp_behav)
        loss = -m * r * A,    m = keep (1 for kept tokens, 0 for masked ones)

    No ratio clipping: only the few tokens that would blow up the second moment are
    dropped, so stale samples keep contributing (unlike PPO's per-token clip).
    """
    ratio = torch.exp(logp - logp_behav)
    return -keep * ratio * advantages, {"ratio": ratio.detach()}


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) from tokens sampled from π_θ.

    With ``d = logp_ref - logp``::

        k1 = -d                    (unbiased, can be negative, high variance)
        k2 = d^2 / 2               (biased, >= 0)
        k3 = exp(d) - d - 1        (unbiased, always >= 0, low variance)

    All are 0 where the policy equals the reference. Their *values* estimate
    KL(π_θ || π_ref); as loss terms (differentiated through ``logp`` with the sampled
    tokens held fixed) their expected gradients differ:

        E_π[∇ k1] = E_π[∇ log π_θ] = 0                  (useless as a loss term)
        E_π[∇ k2] = E_π[(log π_θ - log π_ref) ∇ log π_θ] = ∇ KL(π_θ || π_ref)
        E_π[∇ k3] = E_π[(1 - π_ref / π_θ) ∇ log π_θ] = -Σ_y π_ref(y) ∇ log π_θ(y)
                  = ∇ KL(π_ref || π_θ)                   (the *forward* KL)

    so a k3 loss term pulls toward the reference along the forward KL; k1 belongs in the
    reward (``kl_shaped_rewards``), where REINFORCE turns it into -∇ KL(π_θ || π_ref).
    """
    d = logp_ref - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1', 'k2' or 'k3'")


def kl_shaped_rewards(
    rewards: torch.Tensor,
    logp_old: Sequence[torch.Tensor],
    logp_ref: Sequence[torch.Tensor],
    coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL in the reward (verl's ``use_kl_in_reward``), per sequence ``i``::

        kl_i = sum_t (logp_old_it - logp_ref_it)        (k1 over the sequence's tokens)
        r'_i = r_i - coef * kl_i

    ``logp_old`` / ``logp_ref`` hold one 1-D tensor per sequence (its completion tokens);
    no gradient flows. Advantages are then computed from ``r'``; the policy-gradient term
    ``E[A ∇ log π]`` of ``-coef * kl`` is ``-coef * ∇ KL(π_θ || π_ref)`` (for ``logp_old``
    = the policy being updated). Returns ``(r', kl)``.
    """
    if not (len(logp_old) == len(logp_ref) == rewards.numel()):
        raise ValueError(f"{rewards.numel()} rewards, {len(logp_old)} old and {len(logp_ref)} reference sequences")
    kl = torch.stack([(o.detach() - r.detach()).sum() for o, r in zip(logp_old, logp_ref)]).to(rewards)
    return rewards - coef * kl, kl


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token",
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    token:     L = sum_{i,t} m_it * l_it / sum_{i,t} m_it
    sequence:  L = (1 / B) * sum_i ( sum_t m_it * l_it / sum_t m_it )

    ``num_tokens`` / ``num_sequences`` replace the denominators when a batch is split into
    micro-batches: passing the whole batch's counts makes the micro-batch losses add up to
    the loss of the whole batch.
    """
    masked = per_token * mask
    if mode == "token":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
        return masked.sum() / denom
    if mode == "sequence":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        denom = num_sequences if num_sequences is not None else per_token.shape[0]
        return per_seq.sum() / denom
    raise ValueError(f"unknown aggregation {mode!r}; use 'token' or 'sequence'")


def _ppo(logp, logp_prox, logp_behav, advantages, mask, params, keep):
    return ppo_clip_loss(logp, logp_behav, advantages, params.get("clip_eps", 0.2), params.get("clip_eps_high"))


def _decoupled(logp, logp_prox, logp_behav, advantages, mask, params, keep):
    return decoupled_ppo_loss(logp, logp_prox, logp_behav, advantages, params.get("clip_eps", 0.2), params.get("iw_cap", 5.0))


def _m2po(logp, logp_prox, logp_behav, advantages, mask, params, keep):
    if keep is None:
        raise ValueError("m2po needs the batch-level mask from BATCH_MASKS['m2po'] (computed once per batch)")
    loss, stats = m2po_loss(logp, logp_behav, advantages, keep)
    stats["m2po_masked"] = (mask - keep).clamp(min=0)
    return loss, stats


# name -> fn(logp, logp_prox, logp_behav, advantages, mask, params, keep) -> (per-token, stats).
# "grpo" is PPO-clip against the behaviour policy with group advantages (the advantage
# source is the trainer's choice, not the loss's). ``keep`` is the loss's batch-level
# token selection (``BATCH_MASKS``), or None for losses without one.
POLICY_LOSSES = {"grpo": _ppo, "decoupled_ppo": _decoupled, "m2po": _m2po}
# Losses that select tokens over the whole batch before any update:
# name -> fn(logp_prox, logp_behav, mask, params) -> keep (same shape, 0/1).
BATCH_MASKS = {"m2po": lambda logp_prox, logp_behav, mask, params: m2po_mask(logp_prox, logp_behav, mask, params.get("tau", 0.04))[0]}
