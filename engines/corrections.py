"""Rollout–trainer mismatch corrections: per-token weights that multiply any policy loss.

A rollout engine's log-probs differ from the trainer's for the same weights (bf16 against
fp32, other kernels, other reduction orders) and, in asynchronous RL, the tokens were drawn
from older weights. With ``log ρ_t = logp_trainer_t - logp_behav_t`` — the trainer's
recomputed log-prob (the proximal pass: the weights before the batch's first update) against
the behaviour log-prob the trajectory carries — a correction turns ``ρ`` into a weight
``w_t`` (no gradient) that multiplies the loss's per-token term:

========== ================================================= ===============================
method     weight                                            kind
========== ================================================= ===============================
tis        ``min(ρ_t, cap)``                                 token, truncated IS
mis_token  ``ρ_t · 1[lo ≤ ρ_t ≤ hi]``                        token, masked IS
mis_seq    ``ρ_i · 1[lo ≤ ρ_i ≤ hi]``, ``ρ_i = Π_t ρ_t``     sequence, masked IS
icepop     ``1[lo ≤ ρ_t ≤ hi]``                              token, accept/reject only
geo_seq    ``1[lo ≤ ρ̄_i ≤ hi]``, ``ρ̄_i = exp(mean_t log ρ_t)`` sequence, accept/reject only
========== ================================================= ===============================

``tis`` and the masked-IS pair reweight the kept tokens toward the trainer's distribution;
``icepop`` and ``geo_seq`` only decide which tokens (sequences) the loss may learn from,
leaving the kept ones unweighted, so a large but accepted ratio adds no variance. The
sequence ratio ``ρ_i`` multiplies every token's ratio, so it drifts with length; ``geo_seq``
is its length-normalised form. Sums and means run over the sample's trained tokens only
(``mask``: an agent's context tokens are not the policy's).

Under a correction the loss takes its trust region around the trainer's own log-probs
(it is called with ``logp_behav := logp_trainer``), and the correction owns the gap to the
engine; without one the loss sees the behaviour log-probs, as before. So for ``grpo`` the
clip moves from ``π_θ/μ`` to ``π_θ/π_prox``; for ``decoupled_ppo`` its own capped weight
becomes 1 and the correction's replaces it (``tis`` with ``cap = iw_cap`` *is* decoupled
PPO's weight); ``m2po`` keeps its batch mask, chosen from the behaviour gap.
"""

from __future__ import annotations

import math

import torch

from .loss_names import CORRECTIONS

__all__ = ["CORRECTIONS", "correction_weights", "ratio_percentiles"]


def _band(log_ratio: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """1 where ``lo <= exp(log_ratio) <= hi``, compared in log space (no overflow)."""
    log_lo = math.log(lo) if lo > 0 else -math.inf
    return ((log_ratio >= log_lo) & (log_ratio <= math.log(hi))).float()


def correction_weights(
    logp_train: torch.Tensor,
    logp_behav: torch.Tensor,
    mask: torch.Tensor,
    method: str,
    cap: float = 2.0,
    lo: float = 0.5,
    hi: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token weights ``w`` ([B, T], detached, 0 outside ``mask``) of ``method``
    (module table) for rows of ``[B, T]`` log-probs aligned with ``mask``.

    Diagnostics, 1 on the tokens they count: ``correction_masked`` (weight set to 0 by
    the band), ``correction_capped`` (``tis``: ratio above ``cap``).
    """
    mask = mask.float()
    log_ratio = (logp_train - logp_behav).detach().float() * mask
    stats: dict[str, torch.Tensor] = {}
    if method == "tis":
        w = torch.exp(log_ratio.clamp(max=math.log(cap)))
        stats["correction_capped"] = (log_ratio > math.log(cap)).float() * mask
        return w * mask, stats
    if method in ("mis_token", "icepop"):
        keep = _band(log_ratio, lo, hi) * mask
        w = keep * torch.exp(log_ratio.clamp(max=math.log(hi))) if method == "mis_token" else keep
    elif method in ("mis_seq", "geo_seq"):
        seq = log_ratio.sum(-1, keepdim=True)
        if method == "geo_seq":
            seq = seq / mask.sum(-1, keepdim=True).clamp(min=1)
        keep_row = _band(seq, lo, hi)
        keep = keep_row.expand_as(mask) * mask
        w = keep * torch.exp(seq.clamp(max=math.log(hi))) if method == "mis_seq" else keep
    else:
        raise ValueError(f"unknown correction {method!r}; use one of {sorted(CORRECTIONS)}")
    stats["correction_masked"] = mask - keep
    return w, stats


def ratio_percentiles(log_ratios: torch.Tensor) -> dict[str, float]:
    """Over a batch's tokens (a flat tensor of ``log ρ_t``): the log-prob gap's p99
    (``|log ρ|``) and the ratio's p1, p50 and p99 (``ρ = exp(log ρ)``)."""
    if log_ratios.numel() == 0:
        return {}
    d = log_ratios.double()
    q = torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)
    p01, p50, p99 = torch.quantile(d, q).exp().tolist()
    return {"behav_logp_gap_p99": float(torch.quantile(d.abs(), 0.99)),
            "rollout_ratio_p01": p01, "rollout_ratio_p50": p50, "rollout_ratio_p99": p99}
