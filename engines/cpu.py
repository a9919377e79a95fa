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
adapter's tensors only, applied to the base itself (:class:`~.lora.AdapterSlots`). One
engine may hold several adapters of its base (``adapters``: one per policy, each at its own
version; :meth:`CpuEngine.adapter` is one of them as an engine of its own), and one call may
mix their rows (``generate(..., adapters=[...])``): each row is computed under its own
adapter and reports its adapter's version. A call whose rows share one adapter runs on the
adapter merged into the weights (the base's cost); a mixed call adds each row's update.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from .base import (AdapterEngine, Generation, NamedTensors, RolloutEngine, SamplingParams, context_budgets,
                   finish_of, iter_named_tensors, out_of_context, row_adapters, row_seeds)
from .config import LoraConfig
from .kv_cache import preallocated_cache
from .lora import ADAPTER, AdapterSlots, is_adapter_name
from .sampling import sample

__all__ = ["AdapterEngine", "CpuEngine", "DTYPES"]  # AdapterEngine: .base's, re-exported

#: ``rollout.engine.dtype`` -> the torch dtype the CPU engine holds and computes in
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class CpuEngine(RolloutEngine):
    """Rollout engine for one HF causal LM on CPU (float32, or bfloat16 with ``dtype="bf16"``)."""

    def __init__(self, model: str | Path | PreTrainedModel, threads: int | None = None, version: int = 0,
                 tokenizer=None, lora: LoraConfig | None = None,
                 adapters: Mapping[str, LoraConfig] | None = None, dtype: str = "fp32") -> None:
        """``model`` is an HF model directory, or a live model to share (the bootstrap
        evaluates the model it is training this way; the caller keeps ownership).
        ``tokenizer`` decodes for stop strings; by default the model directory's, loaded
        the first time a call asks for stop strings. ``lora``: the policy is a LoRA adapter
        of ``model`` (its settings give the adapter's scale): versions are adapters.
        ``adapters``: several adapters of ``model`` by name (policy -> its LoRA settings), each
        loaded and versioned on its own (:meth:`adapter`); the first is the default one.
        ``dtype``: ``bf16`` holds the weights and computes the forward in bfloat16, as a GPU
        engine does (weights loaded later are rounded to it), against a trainer in float32:
        a real rollout–trainer mismatch. Log-probs and sampling are float32 either way."""
        if dtype not in DTYPES:
            raise ValueError(f"rollout.engine.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if dtype != "fp32" and (lora is not None or adapters):
            raise ValueError("rollout.engine.dtype bf16: the CPU engine serves LoRA adapters in fp32 only")
        if lora is not None and adapters:
            raise ValueError("CpuEngine: give lora (one adapter) or adapters (several by name), not both")
        if threads:
            torch.set_num_threads(threads)
        if isinstance(model, PreTrainedModel):
            self.model_path = Path(str(getattr(model.config, "_name_or_path", "") or "<in-memory>"))
            self.model = model
        else:
            self.model_path = Path(model)
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=DTYPES[dtype])
            self.model.eval()
            self.model.requires_grad_(False)
        pad = self.model.config.pad_token_id
        self._pad_id = int(pad) if pad is not None else 0
        self._version = version
        self._closed = False
        self._tokenizer = tokenizer
        self._refresh: Callable[[], object] | None = None  #: partial rollouts: loads newer weights mid-call
        self._max_versions = 0
        #: rows continued under newer weights, and the prefix tokens their KV cache was recomputed for
        self.refreshes = {"rows": 0, "recomputed_tokens": 0}
        named = {ADAPTER: lora} if lora is not None else dict(adapters or {})
        self._slots = AdapterSlots(self.model, named, version) if named else None
        #: the model's context window: no row's prompt + completion exceeds it
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None

    @property
    def version(self) -> int:
        """The weights' version; on an adapter engine, the default adapter's."""
        return self._slots.version(self._slots.names[0]) if self._slots is not None else self._version

    def adapter(self, name: str) -> AdapterEngine:
        """Adapter ``name`` of this engine as a rollout engine of its own: its loads, its
        version, its rows (the base and the calls are this engine's)."""
        if self._slots is None or name not in self._slots.names:
            raise KeyError(f"no adapter {name!r} on this engine "
                           f"(it serves {', '.join(self._slots.names) if self._slots else 'full weights'})")
        return AdapterEngine(self, name)

    def adapter_version(self, name: str) -> int:
        """The version adapter ``name`` holds (KeyError: no such adapter)."""
        if self._slots is None:
            raise KeyError(f"no adapter {name!r}: this engine serves full weights")
        return self._slots.version(name)

    def close(self) -> None:
        # Dropping the model frees its memory; further calls fail loudly.
        self._closed = True
        self.model = None  # type: ignore[assignment]

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Copy ``named_tensors`` into the model (any subset of its weights); for a LoRA
        engine they are a whole adapter, applied to the base (the default adapter's slot)."""
        self._check_open()
        if self._slots is not None:
            self.load_adapter(self._slots.names[0], named_tensors, version)
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

    def set_weight_refresh(self, refresh: Callable[[], object] | None, max_versions: int = 0) -> None:
        """Partial rollouts (see ``RolloutEngine.set_weight_refresh``). Between two tokens of a
        call the engine calls ``refresh``; when it loaded newer weights, the rows in flight are
        prefilled again — prompt and tokens so far, under the new weights — and go on from
        there. The KV cache is recomputed, not kept: keys and values of the old weights would
        make every later token a function of two versions, and its log-prob no version's. The
        price is one prefill of the live rows per version they cross. Full-weight engines only:
        an adapter engine's versions are its adapters' and are loaded between calls."""
        if refresh is not None and self._slots is not None:
            raise ValueError("rollout.partial: an engine serving LoRA adapters loads them between calls only")
        if max_versions < 0:
            raise ValueError(f"max_versions must be >= 0 (0: no bound), got {max_versions}")
        self._refresh, self._max_versions = refresh, max_versions

    def load_adapter(self, name: str, named_tensors: NamedTensors, version: int) -> None:
        """Adapter ``name`` becomes ``named_tensors`` (a whole adapter of the base) at ``version``."""
        self._check_open()
        if self._slots is None:
            raise KeyError(f"load_adapter: this engine serves full weights of {self.model_path}, not adapters")
        named = list(iter_named_tensors(named_tensors))
        plain = [n for n, _ in named if not is_adapter_name(n)]
        if plain:
            raise KeyError(f"load_weights: this engine serves LoRA adapters of {self.model_path}, and "
                           f"{plain[0]!r} is not an adapter tensor (a full-weights version of another policy?)")
        self._slots.load(name, named, version)

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None, adapters: Sequence[str] | None = None) -> list[Generation]:
        """``adapters`` (an adapter engine): the adapter of each row (default: the default one)."""
        self._check_open()
        if not prompts:
            return []
        names = row_adapters(adapters, len(prompts), self._slots.names if self._slots is not None else ())
        versions = [self._slots.version(n) for n in names] if names is not None else [self._version] * len(prompts)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        seeds = row_seeds(prompts, params, seeds)
        if seeds is None:
            fresh = secrets.randbits(48)
            seeds = [fresh + i for i in range(len(prompts))]
        budgets = context_budgets(prompts, params.max_new_tokens, self.max_positions)
        fits = [i for i, b in enumerate(budgets) if b > 0]
        out: list[Generation | None] = [None if b > 0 else out_of_context(prompts[i], versions[i])
                                        for i, b in enumerate(budgets)]
        if fits:
            with (self._slots.serving([names[i] for i in fits]) if names is not None
                  else contextlib.nullcontext()) as per_row:
                gens = self._decode([prompts[i] for i in fits], params, [seeds[i] for i in fits],
                                    [budgets[i] for i in fits], [versions[i] for i in fits], per_row)
            for i, g in zip(fits, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _decode(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: list[int],
                budgets: list[int], versions: list[int], per_row=None) -> list[Generation]:
        """``per_row``: the rows' adapter updates (a mixed call), told the live rows before each forward.
        ``versions``: each row's version, moved on in place when the row goes on under newer weights."""
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

        logits, cache, mask, next_pos, padded = self._prefill([list(p) for p in prompts], longest)

        rows = torch.arange(batch)  # original row of each live batch entry
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        token_versions: list[list[int]] = [[] for _ in range(batch)]
        spans = [1] * batch  # versions each row has spanned so far
        reasons: list[str] = [finish_of("length", b, params) for b in budgets]
        refresh = self._refresh if per_row is None else None
        for step in range(longest):
            if refresh is not None and step and self._may_refresh(rows, spans):
                before = self._version
                refresh()
                if self._version != before:  # newer weights: the live rows go on under them
                    live = rows.tolist()
                    logits, cache, mask, next_pos, padded = self._prefill(
                        [list(prompts[r]) + tokens[r] for r in live], max(budgets[r] - len(tokens[r]) for r in live))
                    self.refreshes["rows"] += len(live)
                    self.refreshes["recomputed_tokens"] += sum(len(prompts[r]) + len(tokens[r]) for r in live)
                    for r in live:
                        spans[r] += 1
                        versions[r] = self._version
            tok, lp = sample(logits, params.temperature, params.top_p, params.top_k, uniforms[rows, step])
            for r, t, l in zip(rows.tolist(), tok.tolist(), lp.tolist()):
                tokens[r].append(t)
                logprobs[r].append(l)
                token_versions[r].append(versions[r])
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
                if per_row is not None:
                    per_row.select(rows)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=-1)
            out = self.model(
                input_ids=tok.unsqueeze(-1),
                attention_mask=mask if padded else None,
                position_ids=next_pos.unsqueeze(-1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1].float()
            next_pos = next_pos + 1

        return [
            Generation(
                prompt_ids=tuple(int(x) for x in prompts[i]),
                tokens=tuple(tokens[i]),
                logprobs=tuple(logprobs[i]),
                finish_reason=reasons[i],  # type: ignore[arg-type]
                version=token_versions[i][0],
                token_versions=tuple(token_versions[i]) if spans[i] > 1 else (),
            )
            for i in range(batch)
        ]

    def _may_refresh(self, rows: torch.Tensor, spans: list[int]) -> bool:
        """Newer weights may come in now: no live row would span more than ``max_versions``."""
        return not self._max_versions or all(spans[r] < self._max_versions for r in rows.tolist())

    def _prefill(self, seqs: list[list[int]], room: int):
        """``seqs`` left-padded so every row's next token sits in the last column, run through the
        model under the weights it holds now, into a fresh cache with ``room`` more positions: the
        next logits, the cache, the attention mask, the next positions and whether any row is
        padded. A call's first pass, and a partial rollout's pass again over prompt + tokens so far."""
        width = max(len(q) for q in seqs)
        ids = torch.full((len(seqs), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, q in enumerate(seqs):
            ids[i, width - len(q):] = torch.as_tensor(q, dtype=torch.long)
            mask[i, width - len(q):] = 1
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        padded = bool((mask == 0).any())
        cache = preallocated_cache(self.model.config.num_hidden_layers, width + room)
        out = self.model(input_ids=ids, attention_mask=mask if padded else None, position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float(), cache, mask, positions[:, -1] + 1, padded

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
