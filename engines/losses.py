"""RL losses as pure tensor functions (no model, no engine, no config objects).

Owns the algorithms' math: GRPO group advantages, PPO-clip, decoupled PPO, M2PO, the KL
penalty against a reference policy, and token- vs sequence-level aggregation. Per-token
functions take ``[B, T]`` tensors aligned with a ``mask`` (1 on completion tokens) and
return a per-token loss ``[B, T]`` plus a dict of diagnostics; ``aggregate`` reduces.
Notation: ``logp`` = log π_θ (current, with grad), ``logp_behav`` = log μ (the policy that
generated the tokens), ``logp_prox`` = log π_prox (the proximal policy, i.e. the weights
before this update), ``A`` = advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "grpo_advantages",
    "ppo_clip_loss",
    "decoupled_ppo_loss",
    "m2po_loss",
    "kl_penalty",
    "aggregate",
    "masked_mean",
    "POLICY_LOSSES",
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


def m2po_loss(
    logp: torch.Tensor,
    logp_behav: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau: float = 0.04,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """M2PO: constrain the second moment of the log importance weights by masking outliers.

    With ``r = exp(logp - logp_behav)`` and ``M2 = mean over unmasked tokens of (log r)^2``,
    tokens are masked greedily, largest ``(log r)^2`` first, until ``M2 <= tau``; then::

        loss = -m * r * A,    m = 1 for kept tokens, 0 for masked ones

    No ratio clipping: only the few tokens that would blow up the second moment are
    dropped, so stale samples keep contributing (unlike PPO's per-token clip).
    Diagnostics: ``m2po_masked`` (1 where dropped), ``m2`` (second moment before masking).
    """
    log_ratio = logp - logp_behav
    sq = (log_ratio.detach() ** 2) * mask
    n = int(mask.sum().item())
    keep = mask.clone().float()
    if n:
        flat = sq.flatten()
        order = torch.argsort(flat, descending=True)[:n]  # masked-out entries are 0: last
        sorted_sq = flat[order]
        # Mean of the tokens left after dropping the first j (j = 0..n-1).
        suffix_sum = sorted_sq.flip(0).cumsum(0).flip(0)
        remaining = torch.arange(n, 0, -1, dtype=sorted_sq.dtype)
        means = suffix_sum / remaining
        ok = (means <= tau).nonzero()
        drop = int(ok[0].item()) if len(ok) else n
        keep.view(-1)[order[:drop]] = 0.0
    ratio = torch.exp(log_ratio)
    loss = -keep * ratio * advantages
    m2 = sq.sum() / max(n, 1)
    return loss, {"m2po_masked": (mask - keep).clamp(min=0), "m2": m2.expand_as(logp), "ratio": ratio.detach()}


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ || π_ref) from samples of π_θ.

    With ``d = logp_ref - logp``::

        k1 = -d                    (unbiased, can be negative, high variance)
        k3 = exp(d) - d - 1        (unbiased, always >= 0, low variance)

    Both are 0 where the policy equals the reference.
    """
    d = logp_ref - logp
    if estimator == "k1":
        return -d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1' or 'k3'")


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


def _ppo(logp, logp_prox, logp_behav, advantages, mask, params):
    return ppo_clip_loss(logp, logp_behav, advantages, params.get("clip_eps", 0.2), params.get("clip_eps_high"))


def _decoupled(logp, logp_prox, logp_behav, advantages, mask, params):
    return decoupled_ppo_loss(logp, logp_prox, logp_behav, advantages, params.get("clip_eps", 0.2), params.get("iw_cap", 5.0))


def _m2po(logp, logp_prox, logp_behav, advantages, mask, params):
    return m2po_loss(logp, logp_behav, advantages, mask, params.get("tau", 0.04))


# name -> fn(logp, logp_prox, logp_behav, advantages, mask, params) -> (per-token, stats).
# "grpo" is PPO-clip against the behaviour policy with group advantages (the advantage
# source is the trainer's choice, not the loss's).
POLICY_LOSSES = {"grpo": _ppo, "ppo": _ppo, "decoupled_ppo": _decoupled, "m2po": _m2po}
LOSS_PARAMS = {
    "grpo": {"clip_eps", "clip_eps_high"},
    "ppo": {"clip_eps", "clip_eps_high"},
    "decoupled_ppo": {"clip_eps", "iw_cap"},
    "m2po": {"tau"},
}
