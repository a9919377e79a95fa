"""How a ``TrainBatch``'s samples become tensors for the trainer's forward passes.

Owns the split of a batch into contiguous minibatches (one optimizer step each), the
greedy in-order packing of rows into micro-batches of at most ``token_budget`` padded
tokens, the collation of a micro-batch (right-padded ``prompt + completion`` ids with the
completion mask, behaviour log-probs and any per-token values aligned to the predicting
position) and the way back from a collated row to a sample's completion tokens.

It knows nothing about ranks, models or losses: the trainer says which rows are this
rank's (``distributed.Ranks.shard``) and what to compute on the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["minibatches", "micro_batches", "pack_rows", "collate", "row_tokens"]


def minibatches(n: int, m: int) -> list[list[int]]:
    """``m`` contiguous slices of a batch of ``n`` samples by sample index (GRPO groups
    stay together where the sizes allow); the same batch always splits the same way."""
    if m > n:
        raise ValueError(f"trainer.minibatches is {m} but the batch has only {n} samples; "
                         f"lower minibatches or raise the batch size")
    return [list(range(j * n // m, (j + 1) * n // m)) for j in range(m)]


def micro_batches(samples, token_budget: int) -> list[list[int]]:
    """Greedy in-order packing: a micro-batch's padded size (rows x longest row)
    stays within ``token_budget``; a single over-long sample gets its own."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, s in enumerate(samples):
        n = len(s.prompt_ids) + len(s.completion_ids)
        if cur and max(longest, n) * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    out.append(cur)
    return out


def pack_rows(samples: Sequence, rows: list[int], token_budget: int) -> list[list[int]]:
    """``rows`` (indices into ``samples``, e.g. this rank's shard) packed into token-budget
    micro-batches (``micro_batches``), each a list of indices into ``samples``; none
    when ``rows`` is empty."""
    return [[rows[j] for j in m] for m in micro_batches([samples[i] for i in rows], token_budget)] if rows else []


def collate(samples, device: torch.device, *per_token: list[torch.Tensor] | None) -> tuple[torch.Tensor | None, ...]:
    """Right-padded ``prompt + completion`` ids [B, L] and, aligned with the
    *predicting* position (column j predicts token j + 1), the completion mask, the
    behaviour logprobs and each of ``per_token`` (per-sample completion-token values,
    or None) as [B, L - 1], all on ``device``."""
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    aligned = [torch.zeros((len(samples), width - 1)) for _ in range(2 + len(per_token))]
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, : p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids))
        aligned[0][i, p - 1 : p - 1 + c] = torch.tensor(s.mask_values(), dtype=torch.float32)
        aligned[1][i, p - 1 : p - 1 + c] = torch.tensor(s.behaviour_logprobs)
        for values, out in zip(per_token, aligned[2:]):
            if values is not None:
                out[i, p - 1 : p - 1 + c] = values[i].detach().float().cpu()
    tensors = [t.to(device) for t in aligned]
    extra = [None if v is None else t for v, t in zip(per_token, tensors[2:])]
    return (ids.to(device), tensors[0], tensors[1], *extra)


def row_tokens(values: torch.Tensor, row: int, sample) -> torch.Tensor:
    """A sample's completion-token values from a collated [B, L - 1] tensor."""
    p = len(sample.prompt_ids)
    return values[row, p - 1 : p - 1 + len(sample.completion_ids)]
