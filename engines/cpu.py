"""The embedded CPU rollout engine: a Hugging Face causal LM driven by our own decode loop.

Owns batched generation on CPU with a KV cache and weight loading for one model. The
model is any ``AutoModelForCausalLM`` checkpoint (the tiny Qwen3 by default), so the
same directory is servable by SGLang on GPUs.

Why not ``model.generate``: it keeps finished rows in the batch until the longest one is
done, grows its KV cache by concatenation (copying the whole cache every token), runs a
generic logits-processor / stopping-criteria pipeline every step and, to return
logprobs, keeps full-vocabulary scores for every step. This loop drops finished rows,
writes into a preallocated KV buffer (``kv_cache.py``), computes only last-position
logits, and returns the sampled token's logprob directly
(``benchmarks/engine_throughput.py`` measures the gap).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .base import Generation, NamedTensors, RolloutEngine, SamplingParams, iter_named_tensors, row_seeds
from .kv_cache import preallocated_cache
from .sampling import sample

__all__ = ["CpuEngine"]


class CpuEngine(RolloutEngine):
    """Rollout engine for one HF causal LM on CPU (float32)."""

    def __init__(self, model: str | Path | PreTrainedModel, threads: int | None = None, version: int = 0) -> None:
        """``model`` is an HF model directory, or a live model to share (the bootstrap
        evaluates the model it is training this way; the caller keeps ownership)."""
        if threads:
            torch.set_num_threads(threads)
        if isinstance(model, PreTrainedModel):
            self.model_path = Path(str(getattr(model.config, "_name_or_path", "") or "<in-memory>"))
            self.model = model
        else:
            self.model_path = Path(model)
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
            self.model.eval()
            self.model.requires_grad_(False)
        pad = self.model.config.pad_token_id
        self._pad_id = int(pad) if pad is not None else 0
        self._version = version
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        # Dropping the model frees its memory; further calls fail loudly.
        self._closed = True
        self.model = None  # type: ignore[assignment]

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self._check_open()
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in iter_named_tensors(named_tensors):
                target = state.get(name)
                if target is None:
                    raise KeyError(f"load_weights: {name!r} is not a parameter of {self.model_path}")
                if target.shape != tensor.shape:
                    raise ValueError(f"load_weights: {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)}")
                target.copy_(tensor)
        self._version = version

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        self._check_open()
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        batch = len(prompts)
        seeds = row_seeds(prompts, params, seeds)
        if seeds is None:
            fresh = secrets.randbits(48)
            seeds = [fresh + i for i in range(batch)]
        # One uniform per (row, step), drawn up front from the row's own seed.
        uniforms = torch.stack(
            [
                1.0 - torch.rand(params.max_new_tokens, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                for s in seeds
            ]
        )
        stop = torch.tensor(sorted(set(params.stop_token_ids)) or [-1])

        # Left-pad so every row's next token sits in the last column.
        width = max(len(p) for p in prompts)
        ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        padded = bool((mask == 0).any())

        cache = preallocated_cache(self.model.config.num_hidden_layers, width + params.max_new_tokens)
        out = self.model(
            input_ids=ids,
            attention_mask=mask if padded else None,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]
        next_pos = positions[:, -1] + 1

        rows = torch.arange(batch)  # original row of each live batch entry
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str] = ["length"] * batch
        for step in range(params.max_new_tokens):
            tok, lp = sample(logits, params.temperature, params.top_p, params.top_k, uniforms[rows, step])
            for r, t, l in zip(rows.tolist(), tok.tolist(), lp.tolist()):
                tokens[r].append(t)
                logprobs[r].append(l)
            stopped = torch.isin(tok, stop)
            for r in rows[stopped].tolist():
                reasons[r] = "stop"
            if step + 1 == params.max_new_tokens:
                break
            live = ~stopped
            if not bool(live.any()):
                break
            if not bool(live.all()):
                keep = live.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, tok, next_pos, mask = rows[keep], tok[keep], next_pos[keep], mask[keep]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=-1)
            out = self.model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=mask if padded else None,
                position_ids=next_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
            next_pos = next_pos + 1

        return [
            Generation(
                prompt_ids=tuple(int(x) for x in prompts[i]),
                tokens=tuple(tokens[i]),
                logprobs=tuple(logprobs[i]),
                finish_reason=reasons[i],  # type: ignore[arg-type]
                version=self._version,
            )
            for i in range(batch)
        ]

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("CpuEngine is closed")

