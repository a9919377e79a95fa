"""The trainer's token log-probs, and how far they are from the behaviour ones.

Owns how a forward's logits become per-token log-probs under the rollout's sampling
distribution (temperature, top-k, top-p, as the engine recorded them; a token outside
the truncated support is floored at ``LOGP_FLOOR``), under the full tempered softmax (what
KL terms compare) and the entropy; the no-grad pass that computes them per sample over a
whole batch (each rank its shard, packed by token budget, then all-gathered); and the
gap metrics between trainer and behaviour log-probs. Trainer log-probs are those of the
sampling distribution so that they agree with the behaviour ones; the step reports the
residual gap on tokens generated at the trained version.

It does not know about optimizers, losses or DeepSpeed: the model is anything whose
forward returns ``.logits``, and a caller whose model's forward enters collectives
supplies the pass that keeps a short rank in step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from .config import TrainerConfig
from .corrections import ratio_percentiles
from .distributed import Ranks
from .packing import collate, pack_rows, row_tokens
from .sampling import sampling_logprobs

__all__ = ["LOGP_FLOOR", "token_logprobs", "batch_logprobs", "logp_gaps"]

# Trainer log-prob of a token outside the truncated sampling support (see ``token_logprobs``):
# e^-100 is 0 in every ratio, yet finite, so masked products stay 0 rather than NaN.
LOGP_FLOOR = -100.0


def token_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, cfg: TrainerConfig, full: bool = False,
                   entropy: bool = False, sampled: bool = True
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs of the next tokens under the rollout's sampling distribution
    (temperature, top-k, top-p: ``sampling.sampling_logprobs``, what the engine
    recorded), under the full tempered softmax (``full``: what KL terms compare,
    since truncated distributions have no finite KL to one another), and the entropy
    of the latter. Positions outside ``mask`` are 0. Of ``cfg`` only the sampling
    settings count (``temperature``, ``top_p``, ``top_k``)."""
    # Right padding needs no attention mask: causal attention never looks right, and
    # padded positions are masked out of the loss.
    # Only the columns from the first one any row trains on get logits: a chat prompt (system
    # message, template, question) is most of a row, and a real vocabulary's logits, their
    # tempered log-softmax and its gradient are most of a step's memory. Columns before are 0.
    on_cols = (mask > 0).any(0).nonzero()
    first = int(on_cols[0]) if len(on_cols) else 0
    if first and _keeps_logits(model):
        logits = model(input_ids=ids, logits_to_keep=ids.shape[1] - first).logits[:, :-1]
    else:
        logits = model(input_ids=ids).logits[:, first:-1]
    target = ids[:, first + 1:].unsqueeze(-1)
    on = mask[:, first:] > 0
    truncated = cfg.top_p < 1.0 or cfg.top_k > 0
    full_all = torch.log_softmax(logits.float() / cfg.temperature, dim=-1) if (truncated or not sampled) else None
    logp = None
    if sampled:
        sampled_all = sampling_logprobs(logits, cfg.temperature, cfg.top_p, cfg.top_k)
        full_all = sampled_all if full_all is None else full_all
        # A token outside the trainer's truncated support (a stale sample the current
        # weights would no longer draw) has logp -inf: floor it so its ratio is 0 and
        # no inf * 0 turns a loss into NaN; its gradient is 0 either way.
        logp = _widen(torch.where(on, sampled_all.gather(-1, target).squeeze(-1).clamp(min=LOGP_FLOOR), 0.0), first)
    logp_full = _widen(torch.where(on, full_all.gather(-1, target).squeeze(-1), 0.0), first) if full else None
    ent = None
    if entropy:
        with torch.no_grad():
            ent = _widen(-(full_all.exp() * full_all).sum(-1), first)
    return logp, logp_full, ent


def _widen(values: torch.Tensor, first: int) -> torch.Tensor:
    """``values`` of the columns from ``first`` on, as the whole [B, L - 1] (0 before)."""
    return torch.nn.functional.pad(values, (first, 0)) if first else values


_KEEPS_LOGITS: dict[type, bool] = {}


def _keeps_logits(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (transformers' causal LMs do: the
    head then runs on the last positions only). Looks through a DeepSpeed engine (``.module``)
    and a PEFT wrapper (``get_base_model``), which pass keyword arguments on."""
    inner = getattr(model, "module", model)
    base = getattr(inner, "get_base_model", None)
    inner = base() if callable(base) else inner
    kind = type(inner)
    if kind not in _KEEPS_LOGITS:
        try:
            _KEEPS_LOGITS[kind] = "logits_to_keep" in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):
            _KEEPS_LOGITS[kind] = False
    return _KEEPS_LOGITS[kind]


@torch.no_grad()
def batch_logprobs(model, samples, cfg: TrainerConfig, ranks: Ranks, device: torch.device, full: bool,
                   sampled: bool = True, keep_step: Callable[[], None] | None = None
                   ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
    """Per-sample completion-token log-probs of ``model`` in eval mode, micro-batched
    by budget: under the sampling distribution (``sampled``) and the full tempered
    softmax (``full``). Each rank computes its shard (``ranks.shard``) and every rank
    gets the whole batch's values. When ``model``'s forward enters collectives (the
    DeepSpeed engine under ZeRO-3), ``keep_step`` is a zero-loss forward the caller
    supplies: it runs once for each micro-batch this rank has fewer than its peers."""
    was_training = model.training
    model.eval()
    out_sampled: dict[int, torch.Tensor] = {}
    out_full: dict[int, torch.Tensor] = {}
    micro = pack_rows(samples, ranks.shard(list(range(len(samples)))), cfg.token_budget)
    try:
        if keep_step is not None:
            for _ in range(len(micro), ranks.common_count(len(micro))):
                keep_step()
        for rows in micro:
            part = [samples[i] for i in rows]
            ids, mask, _ = collate(part, device)
            logp, logp_full, _ = token_logprobs(model, ids, mask, cfg, full=full, sampled=sampled)
            for j, i in enumerate(rows):
                if sampled:
                    out_sampled[i] = row_tokens(logp, j, part[j])
                if full:
                    out_full[i] = row_tokens(logp_full, j, part[j])
    finally:
        model.train(was_training)
    if ranks.world > 1:  # every rank needs the whole batch's values (advantages, KL shaping, batch masks)
        for part in ranks.all_gather(({i: t.cpu() for i, t in out_sampled.items()},
                                      {i: t.cpu() for i, t in out_full.items()})):
            out_sampled.update({i: t.to(device) for i, t in part[0].items()})
            out_full.update({i: t.to(device) for i, t in part[1].items()})
    return ([out_sampled[i] for i in range(len(samples))] if sampled else None,
            [out_full[i] for i in range(len(samples))] if full else None)


def logp_gaps(samples, logp: list[torch.Tensor], version: int, ranks: Ranks) -> dict[str, float]:
    """Mean |logp_trainer - logp_behaviour| over all tokens (``behav_logp_gap``:
    staleness plus mismatch) and over the tokens generated at ``version``, the
    weights the trainer held before this step (``train_inference_logp_gap``: the
    training-inference mismatch alone). The latter is absent when no token of the
    batch was generated at ``version`` (nothing to compare). Over all tokens too: the
    gap's p99 and the ratio ``exp(logp_trainer - logp_behaviour)``'s p1, p50 and p99
    (``corrections.ratio_percentiles``). ``logp`` is None for the samples of other
    ranks, which add their own."""
    signed: list[torch.Tensor] = []  # log p_trainer - log p_behaviour, per trained token
    at: list[torch.Tensor] = []  # whether that token was generated at ``version``
    for s, lp in zip(samples, logp):
        if lp is None:  # another rank's sample: it adds its own
            continue
        own = torch.tensor(s.mask_values(), dtype=torch.bool)  # context tokens have no behaviour logprob
        signed.append((lp.float().cpu() - torch.tensor(s.behaviour_logprobs, dtype=torch.float32))[own])
        at.append(torch.tensor(s.token_versions or (s.version,) * len(s.completion_ids))[own] == version)
    diffs = torch.cat(signed) if signed else torch.zeros(0)
    at_version = torch.cat(at) if at else torch.zeros(0, dtype=torch.bool)
    if ranks.world > 1:
        parts = ranks.all_gather((diffs.tolist(), at_version.tolist()))
        diffs = torch.tensor([d for p in parts for d in p[0]], dtype=torch.float32)
        at_version = torch.tensor([a for p in parts for a in p[1]], dtype=torch.bool)
    gap = diffs.abs()
    out = {"behav_logp_gap": float(gap.mean()) if gap.numel() else 0.0, **ratio_percentiles(diffs)}
    if bool(at_version.any()):
        out["train_inference_logp_gap"] = float(gap[at_version].mean())
    return out
