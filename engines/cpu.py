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

Two guards a model server has live here too: no row generates past the model's positions
(``max_position_embeddings``; a row's budget is clipped to what fits and it finishes
``"context"``, a prompt that fills them alone gets no token), and stop strings
(``SamplingParams.stop``) end a row at the first token whose decoded completion spells one,
which is the one place this engine reads the model directory's tokenizer.

A LoRA policy (``lora``): the model directory is the base, loaded once; a version is an
adapter's tensors only, which :class:`~.lora.MergedAdapter` merges into a working copy of
the targeted weights, the base kept aside, so every version applies to the base itself.
Merging suits one adapter serving the whole batch (the forward is the base's); rows of
several adapters in one batch would need the adapter applied per row instead.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .base import (Generation, NamedTensors, RolloutEngine, SamplingParams, context_budgets, finish_of,
                   iter_named_tensors, out_of_context, row_seeds)
from .config import LoraConfig
from .kv_cache import preallocated_cache
from .lora import MergedAdapter, is_adapter_name
from .sampling import sample

__all__ = ["CpuEngine"]


class CpuEngine(RolloutEngine):
    """Rollout engine for one HF causal LM on CPU (float32)."""

    def __init__(self, model: str | Path | PreTrainedModel, threads: int | None = None, version: int = 0,
                 tokenizer=None, lora: LoraConfig | None = None) -> None:
        """``model`` is an HF model directory, or a live model to share (the bootstrap
        evaluates the model it is training this way; the caller keeps ownership).
        ``tokenizer`` decodes for stop strings; by default the model directory's, loaded
        the first time a call asks for stop strings. ``lora``: the policy is a LoRA adapter
        of ``model`` (its settings give the adapter's scale): versions are adapters."""
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
        self._tokenizer = tokenizer
        self._adapter = MergedAdapter(self.model, lora) if lora is not None else None
        #: the model's context window: no row's prompt + completion exceeds it
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        # Dropping the model frees its memory; further calls fail loudly.
        self._closed = True
        self.model = None  # type: ignore[assignment]

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Copy ``named_tensors`` into the model (any subset of its weights); for a LoRA
        engine they are a whole adapter, applied to the base (:class:`~.lora.MergedAdapter`)."""
        self._check_open()
        if self._adapter is not None:
            named = list(iter_named_tensors(named_tensors))
            plain = [name for name, _ in named if not is_adapter_name(name)]
            if plain:
                raise KeyError(f"load_weights: this engine serves a LoRA adapter of {self.model_path}, and "
                               f"{plain[0]!r} is not an adapter tensor (a full-weights version of another policy?)")
            self._adapter.apply(named)
            self._version = version
            return
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
        seeds = row_seeds(prompts, params, seeds)
        if seeds is None:
            fresh = secrets.randbits(48)
            seeds = [fresh + i for i in range(len(prompts))]
        budgets = context_budgets(prompts, params.max_new_tokens, self.max_positions)
        fits = [i for i, b in enumerate(budgets) if b > 0]
        out: list[Generation | None] = [None if b > 0 else out_of_context(prompts[i], self._version)
                                        for i, b in enumerate(budgets)]
        if fits:
            gens = self._decode([prompts[i] for i in fits], params, [seeds[i] for i in fits],
                                [budgets[i] for i in fits])
            for i, g in zip(fits, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _decode(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: list[int],
                budgets: list[int]) -> list[Generation]:
        batch = len(prompts)
        longest = max(budgets)
        # One uniform per (row, step), drawn up front from the row's own seed (the same draws
        # whatever the row's budget, so clipping a row never changes its first tokens).
        uniforms = torch.stack(
            [
                1.0 - torch.rand(params.max_new_tokens, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                for s in seeds
            ]
        )
        stop = torch.tensor(sorted(set(params.stop_token_ids)) or [-1])
        stop_text = _StopStrings(params.stop, self._stop_tokenizer()) if params.stop else None
        budget_of = torch.tensor(budgets)

        # Left-pad so every row's next token sits in the last column.
        width = max(len(p) for p in prompts)
        ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        padded = bool((mask == 0).any())

        cache = preallocated_cache(self.model.config.num_hidden_layers, width + longest)
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
        reasons: list[str] = [finish_of("length", b, params) for b in budgets]
        for step in range(longest):
            tok, lp = sample(logits, params.temperature, params.top_p, params.top_k, uniforms[rows, step])
            for r, t, l in zip(rows.tolist(), tok.tolist(), lp.tolist()):
                tokens[r].append(t)
                logprobs[r].append(l)
            stopped = torch.isin(tok, stop)
            if stop_text is not None:
                stopped |= torch.tensor([stop_text.hit(tokens[r]) for r in rows.tolist()])
            for r in rows[stopped].tolist():
                reasons[r] = "stop"
            done = stopped | (budget_of[rows] <= step + 1)
            if step + 1 == longest:
                break
            live = ~done
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

    def _stop_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
            except (OSError, ValueError) as e:
                raise ValueError(f"generate: stop strings need the model's tokenizer, and {self.model_path} has none "
                                 f"loadable ({e}); pass CpuEngine(tokenizer=...) or stop on token ids "
                                 f"(stop_token_ids)") from e
        return self._tokenizer

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("CpuEngine is closed")



class _StopStrings:
    """Whether a row's completion has just spelled a stop string. Only the tail is decoded:
    checked after every token, a match is new iff it ends in the last token, so it lies in
    the last ``longest stop`` tokens (a token decodes to one character or more; the margin
    covers tokens that decode to nothing, such as skipped special tokens)."""

    def __init__(self, stops: Sequence[str], tokenizer) -> None:
        self.stops, self.tokenizer = tuple(stops), tokenizer
        self.window = max(len(x) for x in self.stops) + 8

    def hit(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens[-self.window:], skip_special_tokens=True)
        return any(x in text for x in self.stops)
