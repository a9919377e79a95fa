"""Token sampling shared by the CPU engine and its tests.

Owns how logits become a sampled token and that token's logprob: temperature, top-k,
top-p, and inverse-CDF sampling driven by pre-drawn per-row uniforms (so a row's tokens
depend only on its own seed, never on batch composition).
"""

from __future__ import annotations

import torch

__all__ = ["sampling_logprobs", "sample"]


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Log-probabilities of the distribution tokens are actually drawn from.

    ``log softmax(logits / T)`` restricted to the top-k tokens and to the smallest set of
    most likely tokens whose mass reaches ``top_p``, renormalised (``-inf`` elsewhere).
    ``temperature == 0`` returns the untempered ``log softmax(logits)``.
    """
    x = logits.float()
    if temperature == 0:
        return torch.log_softmax(x, dim=-1)
    x = x / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first token
        # is always kept.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(token ids [B], their logprobs [B])``.

    ``uniforms`` [B] in (0, 1] pick the token by inverse CDF over token-id order, which
    never selects a zero-probability token.
    """
    logp = sampling_logprobs(logits, temperature, top_p, top_k)
    if temperature == 0:
        tokens = logp.argmax(-1)
    else:
        cdf = logp.exp().cumsum(-1)
        target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
        tokens = torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=logp.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
