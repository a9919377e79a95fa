"""The engine boundary: what rollout and training look like to the rest of AstraFlow.

Owns the two interfaces (``RolloutEngine``, ``TrainEngine``) and the typed messages that
cross them (``SamplingParams``, ``Generation``, ``TrainSample``, ``TrainBatch``).
Implementations live in their own modules and are chosen only in ``factory.py``.
Engines work on token ids; tokenization belongs to workflows (the one exception: stop
strings, ``SamplingParams.stop``, which an engine matches on the text its tokenizer decodes,
as a model server does). Every engine keeps a row inside the model's positions
(:func:`context_budgets`): it never generates past them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:  # annotations only: config loading (launcher, CLI) imports this module without torch
    import torch

__all__ = [
    "PromptRow",
    "generated_context",
    "prompt_rows",
    "SamplingParams",
    "Generation",
    "TrainSample",
    "TrainBatch",
    "RolloutEngine",
    "AdapterEngine",
    "TrainEngine",
    "NamedTensors",
    "iter_named_tensors",
    "row_seeds",
    "context_budgets",
    "row_adapters",
    "finish_of",
    "out_of_context",
    "CONTEXT",
]

FinishReason = Literal["stop", "length", "context"]

#: the finish reason of a row that reached the model's positions: its prompt and completion
#: fill the context window (a prompt that fills it alone gets no token at all)
CONTEXT = "context"
NamedTensors: TypeAlias = "Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample. Shared by every row of one ``generate`` call.

    Attributes:
        temperature: softmax temperature; ``0`` means greedy.
        top_p: nucleus mass kept (``1.0`` disables).
        top_k: keep the ``k`` most likely tokens (``0`` disables).
        max_new_tokens: generation stops with ``"length"`` after this many tokens.
        stop_token_ids: generation stops with ``"stop"`` after emitting one of these
            (the stop token is included in ``Generation.tokens``).
        stop: stop strings: generation stops with ``"stop"`` at the first token whose
            decoded completion contains one of them; the tokens that spell it are kept in
            ``Generation.tokens`` (SGLang's ``stop`` with ``no_stop_trim``). An engine needs
            the model's tokenizer for these; token ids alone stop through ``stop_token_ids``.
        seed: row ``i`` of a call samples with seed ``seed + i`` (unless ``generate`` is
            given per-row ``seeds``). ``None`` draws a fresh seed.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        # Accept any iterable (lists arrive from JSON) but store a hashable tuple.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        stop = tuple(self.stop)
        if any(not isinstance(x, str) or not x for x in stop):
            raise ValueError(f"stop must be non-empty strings, got {list(stop)[:4]!r}")
        object.__setattr__(self, "stop", stop)

    @classmethod
    def from_mapping(cls, sampling: Mapping[str, object], *, stop_token_ids: Iterable[int] = (),
                     max_new_tokens: int | None = None, temperature: float | None = None) -> SamplingParams:
        """The params a sampling mapping asks for: the ``temperature``, ``top_p``, ``top_k``
        and ``max_new_tokens`` keys of a task's or a generation request's ``sampling``
        (missing keys: 1.0, 1.0, 0, 8; other keys are ignored), stopping at
        ``stop_token_ids`` and at the mapping's own ``stop_token_ids`` and ``stop`` strings
        (a role call's stop sequences). ``temperature`` (when not ``None``) and
        ``max_new_tokens`` (when truthy) override the mapping's, as a workflow's role call may."""
        s = sampling
        ids = tuple(stop_token_ids) + tuple(int(t) for t in (s.get("stop_token_ids") or ()))
        return cls(temperature=float(s.get("temperature", 1.0) if temperature is None else temperature),
                   top_p=float(s.get("top_p", 1.0)), top_k=int(s.get("top_k", 0)),
                   max_new_tokens=int(max_new_tokens or s.get("max_new_tokens", 8)),
                   stop_token_ids=tuple(dict.fromkeys(ids)), stop=tuple(s.get("stop") or ()))


class PromptRow(list):
    """One row's prompt ids, saying how many of them a model generated: the earlier turns a
    workflow carries as context (the solver's answer inside the verifier's prompt, the answer
    and verdict inside a retry). A list, so every engine reads it as the ids it is; only an
    emulated device looks at :attr:`generated`, to price those tokens as the generated tokens
    they stood for (one real generated token stands for ``token_scale`` modelled ones, a
    written one for ``prompt_token_scale``). The count travels with the row: role calls keep
    it, a remote role's request carries it (:attr:`GenerationRequest.context_generated`), and
    the turn it yields keeps it for training (``Turn.context_generated``)."""

    __slots__ = ("generated",)

    def __init__(self, ids=(), generated: int = 0) -> None:
        super().__init__(ids)
        if not 0 <= generated <= len(self):
            raise ValueError(f"a prompt of {len(self)} tokens cannot hold {generated} generated ones")
        self.generated = int(generated)


def generated_context(prompt: Sequence[int]) -> int:
    """Of ``prompt``'s tokens, how many a model generated (:class:`PromptRow`; 0 for plain ids)."""
    return getattr(prompt, "generated", 0)


def prompt_rows(prompts: Iterable[Sequence[int]]) -> list[PromptRow]:
    """Copies of ``prompts`` as :class:`PromptRow` s, each keeping its generated count."""
    return [PromptRow(p, generated_context(p)) for p in prompts]


@dataclass(frozen=True, slots=True)
class Generation:
    """One generated sample.

    Attributes:
        prompt_ids: the prompt as given.
        tokens: generated token ids (a matched stop token is the last one).
        logprobs: per generated token, its log-probability under the distribution it was
            sampled from (temperature-scaled, top-k/top-p truncated and renormalised;
            for greedy decoding, the untempered softmax).
        finish_reason: ``"stop"`` (a stop token or string), ``"length"``
            (``max_new_tokens``) or ``"context"`` (:data:`CONTEXT`: the prompt and the
            completion reached the model's positions; a prompt that fills them alone has no
            token at all — the engine never generates past the context window).
        version: the engine's weight version that generated the first token (the oldest).
        token_versions: per token, the version that generated it, when the row went on under
            newer weights mid-generation (a partial rollout: :meth:`RolloutEngine.set_weight_refresh`);
            empty when one version generated every token.
    """

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    version: int = 0
    token_versions: tuple[int, ...] = ()

    def versions(self) -> tuple[int, ...]:
        """The version of each token (``token_versions``, or ``version`` for every one)."""
        return self.token_versions or (self.version,) * len(self.tokens)


@dataclass(frozen=True, slots=True)
class TrainSample:
    """One completion to learn from.

    Attributes:
        prompt_ids: prompt tokens (not trained on).
        completion_ids: generated tokens (trained on).
        behaviour_logprobs: logprob of each completion token under the policy that
            generated it (``Generation.logprobs``).
        reward: scalar reward; used when ``advantage`` is ``None``.
        group_id: samples sharing a prompt share a group; GRPO normalises within it.
        advantage: precomputed advantage; overrides ``reward``/``group_id``.
        version: policy version that generated the sample (for staleness metrics).
        token_versions: policy version that generated each completion token (the
            trajectory's ``versions``); empty means every token is at ``version``.
        loss_mask: per completion token, 1 to train on it and 0 for context written by
            another role or the environment inside the completion (multi-turn episodes);
            empty means every token is trained on.
        context_generated: of the context (``prompt_ids`` and the completion tokens the loss
            mask leaves out), how many a model generated (earlier turns): an emulated
            trainer prices them as generated tokens, the rest as written ones.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    reward: float = 0.0
    group_id: str | int = 0
    advantage: float | None = None
    version: int = 0
    token_versions: tuple[int, ...] = ()
    loss_mask: tuple[int, ...] = ()
    context_generated: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask) if self.loss_mask else len(self.completion_ids)

    def mask_values(self) -> tuple[int, ...]:
        return self.loss_mask or (1,) * len(self.completion_ids)

    def __post_init__(self) -> None:
        if self.loss_mask and len(self.loss_mask) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but {len(self.loss_mask)} loss-mask values")
        if self.loss_mask and not any(self.loss_mask):
            raise ValueError("a train sample needs at least one token to train on (loss_mask is all 0)")
        if self.token_versions and len(self.token_versions) != len(self.completion_ids):
            raise ValueError(f"{len(self.completion_ids)} completion tokens but {len(self.token_versions)} token versions")
        if len(self.completion_ids) != len(self.behaviour_logprobs):
            raise ValueError(
                f"{len(self.completion_ids)} completion tokens but "
                f"{len(self.behaviour_logprobs)} behaviour logprobs"
            )
        if not self.completion_ids:
            raise ValueError("a train sample needs at least one completion token")
        context = len(self.prompt_ids) + len(self.completion_ids) - self.trained_tokens
        if not 0 <= self.context_generated <= context:
            raise ValueError(f"context_generated is {self.context_generated}; the sample's context has {context} tokens")


@dataclass(frozen=True, slots=True)
class TrainBatch:
    """The samples of one optimizer step (the trainer splits them into micro-batches)."""

    samples: tuple[TrainSample, ...]
    step: int = 0
    metadata: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", tuple(self.samples))
        if not self.samples:
            raise ValueError("an empty TrainBatch cannot be trained on")
        has_adv = [s.advantage is not None for s in self.samples]
        if any(has_adv) and not all(has_adv):
            raise ValueError("either every sample carries an advantage or none does")


def row_seeds(prompts: Sequence[Sequence[int]], params: SamplingParams,
              seeds: Sequence[int] | None) -> list[int] | None:
    """The seed of each row of a ``generate`` call, or ``None`` when neither is given."""
    if seeds is None:
        return None if params.seed is None else [params.seed + i for i in range(len(prompts))]
    seeds = [int(s) for s in seeds]
    if len(seeds) != len(prompts):
        raise ValueError(f"generate: {len(seeds)} seeds for {len(prompts)} prompts (one seed per prompt)")
    bad = [s for s in seeds if not 0 <= s < 2**63]
    if bad:
        raise ValueError(f"generate: seeds must be in [0, 2**63), got {bad[:3]}")
    return seeds


def row_adapters(adapters: Sequence[str] | None, n: int, served: Sequence[str]) -> list[str] | None:
    """The adapter of each of a call's ``n`` rows on an engine serving the LoRA adapters
    ``served`` (in order; none: full weights, and None is returned): ``adapters`` as given,
    one per row, or the first served for every row. ValueError for adapters named on a
    full-weights engine, or not one per row."""
    if not served:
        if adapters is not None:
            raise ValueError("generate: adapters name LoRA adapters, and this engine serves full weights")
        return None
    names = list(adapters) if adapters is not None else [served[0]] * n
    if len(names) != n:
        raise ValueError(f"generate: {len(names)} adapters for {n} prompts (one per prompt)")
    return names


def context_budgets(prompts: Sequence[Sequence[int]], max_new_tokens: int, max_positions: int | None) -> list[int]:
    """Per row, the tokens it may generate: ``max_new_tokens``, clipped so that prompt and
    completion fit in ``max_positions`` (None: no limit known). 0 or less: the prompt alone
    fills the window and the row gets no token (:func:`out_of_context`)."""
    if not max_positions:
        return [max_new_tokens] * len(prompts)
    return [min(max_new_tokens, int(max_positions) - len(p)) for p in prompts]


def finish_of(reason: str, budget: int, params: SamplingParams) -> str:
    """A row's finish reason once it ran out of tokens: ``"context"`` when its budget was
    clipped by the context window (:func:`context_budgets`), else ``reason``."""
    return CONTEXT if reason == "length" and budget < params.max_new_tokens else reason


def out_of_context(prompt: Sequence[int], version: int) -> Generation:
    """The answer for a row whose prompt leaves no room in the context window."""
    return Generation(tuple(int(x) for x in prompt), (), (), CONTEXT, version)  # type: ignore[arg-type]


def iter_named_tensors(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """Accept a mapping or an iterable of pairs (the two shapes weight updates arrive in)."""
    if isinstance(named_tensors, Mapping):
        return named_tensors.items()
    return named_tensors


class RolloutEngine(abc.ABC):
    """Generates completions with per-token logprobs and takes new weights.

    Not thread-safe: one owner (an actor) calls it; weight loads happen between calls.
    """

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """One ``Generation`` per prompt, in order.

        ``seeds`` (one per prompt, overriding ``params.seed``) makes each row's sampling a
        function of its prompt, its seed and the weights, whatever else shares the call
        (callers derive them from stable ids: ``astraflow.workflows.seeds``). Bit-exact
        results also need the same rows in the call: batched kernels change their
        reduction order with the row count, which moves logprobs in the last bits (and,
        rarely, a token whose uniform falls on a sampling boundary).
        """

    @abc.abstractmethod
    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Replace the named parameters (HF names) and set ``version``.

        A subset of the parameters is allowed; unknown names raise ``KeyError``.
        """

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Weight version the next ``generate`` will use."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release processes, threads and memory. Idempotent."""

    def set_weight_refresh(self, refresh: Callable[[], object] | None, max_versions: int = 0) -> None:
        """Partial rollouts: call ``refresh`` between tokens of a call, which may load newer
        weights (``load_weights``, on the calling thread); rows in flight then continue under
        them, each token keeping the version that produced it (``Generation.token_versions``).
        ``max_versions`` (> 0): a row never spans more versions — a load that would take a
        row past it waits for the call's end. None turns it off. Engines that cannot
        continue rows across weights refuse it."""
        raise NotImplementedError(f"{type(self).__name__} does not continue rows across weight updates "
                                  f"(rollout.partial)")

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TrainEngine(abc.ABC):
    """Takes optimizer steps on ``TrainBatch``es and hands out its weights."""

    @abc.abstractmethod
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step over the whole batch; returns scalar metrics."""

    @abc.abstractmethod
    def named_weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of the full (unpartitioned) weights under their HF names."""

    @abc.abstractmethod
    def save_checkpoint(self, directory: str | Path, extra_state: Mapping[str, object]) -> None:
        """Persist model, optimizer, scheduler, RNG and ``extra_state`` (e.g. the Kafka
        offsets consumed so far) so ``load_checkpoint`` resumes bit-exactly."""

    @abc.abstractmethod
    def load_checkpoint(self, directory: str | Path) -> dict[str, object]:
        """Restore the latest checkpoint in ``directory``; return its ``extra_state``."""

    @abc.abstractmethod
    def export_hf(self, directory: str | Path, weights: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Write the current weights (or ``weights``: full tensors the caller gathered) as a
        Hugging Face model directory, atomically (a reader never sees half of one)."""

    @property
    @abc.abstractmethod
    def step(self) -> int:
        """Optimizer steps taken so far (the version of ``named_weights``)."""

    def close(self) -> None:
        """Release resources. Idempotent."""


class AdapterEngine(RolloutEngine):
    """One adapter of a host engine serving several LoRA adapters of one base, as a rollout
    engine: what a policy's weight subscriber loads and its role calls (a shared pool holds one
    per policy). ``host`` and ``name`` let a caller batch rows of several adapters of one host
    into one call. ``host`` is any engine with the three calls (``generate`` with
    ``adapters``, ``load_adapter``, ``adapter_version``): the CPU engine, the SGLang engine, or
    an emulated device wrapping one."""

    def __init__(self, host: RolloutEngine, name: str) -> None:
        self.host, self.name = host, name

    @property
    def version(self) -> int:
        return self.host.adapter_version(self.name)

    @property
    def device(self):
        """The host's device (an emulated pool's: one clock and one account for every adapter's
        rows, which the node reports as its device's totals); None on the CPU itself."""
        return getattr(self.host, "device", None)

    def load_weights(self, named_tensors: NamedTensors, version: int) -> None:
        self.host.load_adapter(self.name, named_tensors, version)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        return self.host.generate(prompts, params, seeds, adapters=[self.name] * len(prompts))

    def close(self) -> None:
        """The host owns the model: closing one adapter's view closes nothing."""
