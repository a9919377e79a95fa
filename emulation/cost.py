"""The cost model of an emulated device: how long a real accelerator takes for given work.

Owns the formulas; every number in them comes from a :class:`~.profile.Profile`:

* **prefill** of ``T`` prompt tokens: ``2·N·T / (peak · prefill_flops)`` (``N`` parameters);
* a **decode step** of a batch of ``b`` sequences holding ``C`` tokens of context in all:
  ``overhead + max((2·N + kv·C) / (HBM · decode_bandwidth), 2·N·b / (peak · prefill_flops))``
  — the weights and the KV cache read once per step (memory-bound), or the step's FLOPs when
  the batch is large enough to be compute-bound (``kv``: KV bytes per token of context);
* a **generate call** is continuous batching of its rows: rows are admitted while the KV
  cache (the device's usable memory less the weights) holds their context, each admitted
  row is prefilled, then each step decodes the rows still running, so a call's decode steps
  run at the batch size and context length the rows had at that step;
* a **training step** over ``T`` tokens forward and backward (and ``F`` forward-only, the
  no-grad passes) on ``k`` devices: ``(6·N·T + 2·N·F) / (peak · train_flops · k · s(k))``
  with ``s(k) = train_scaling ** log2(k)`` (data parallel, ZeRO/FSDP);
* a **weight load**: the model's bf16 bytes at ``weight_sync_bytes_per_s``;
* a **LoRA policy** (``lora_rank``, ``lora_targets``: the job's ``trainer.engine.lora`` on the
  modelled shape, :meth:`~.profile.ModelSpec.adapter_params` ``P``): a training step's backward
  computes the frozen base's activation gradients but not its weight gradients
  (``(f - 2)·N + f·P`` FLOPs per trained token, ``f`` the profile's
  ``train_flops_per_token_per_param``), a version's load moves the adapter's bf16 bytes
  (``2·P``), and the training states are the base's bf16 weights and the adapter's states
  (``2·N + 16·P`` bytes);
* a **swap** of a colocated policy (what a trainer-centred system pays to keep several
  policies on the same devices): its training states (bf16 weights and gradients, fp32
  master weights and Adam moments: 16 bytes per parameter, sharded over ``k`` devices) and
  its rollout engine's bf16 weights (a replica per device) copied to host memory and back
  once, each device over its own host link at ``host_link x offload_bandwidth``.

``token_scale`` lets one real token stand for several modelled ones (the tiny model writes
a few tokens where the emulated model would write hundreds): every generated length is
multiplied by it, and every prompt length by ``prompt_token_scale`` (by default the same).
Context a model generated stays generated: the earlier turns a prompt carries (an answer in
a verifier's prompt, answer and verdict in a retry; the count a
:class:`~astraflow.engines.base.PromptRow` or a trained sample holds) count ``token_scale``
each, as when they were generated, at the workload's mean length factor (1), not the
prompt's scale (:meth:`CostModel.prompt_units`, :meth:`CostModel.modelled_tokens`).

``length_sigma`` (a workload of the profiles file) gives the emulated model's response
lengths the spread the tiny model's lack: a row's modelled length is ``token_scale x`` its
real length ``x`` a factor drawn from a log-normal of mean 1 and log-space deviation
``length_sigma``, keyed by the row's sampling seed (the same sample gets the same factor in
every arm of a benchmark), and capped at ``token_scale x max_new_tokens`` (the emulated
model's own length cap). Reasoning models' lengths are long-tailed; a schedule that waits
for a batch's longest row pays that tail, one that streams rows does not. It knows nothing
about engines, sleeping or Kafka.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from .profile import Profile

__all__ = ["ContinuousBatch", "CostModel"]


@dataclass(frozen=True)
class CostModel:
    profile: Profile
    token_scale: int = 1
    prompt_token_scale: int = 0  #: 0: token_scale
    length_sigma: float = 0.0  #: log-space spread of a row's modelled length around token_scale x its real one
    lora_rank: int = 0  #: a LoRA policy's adapter rank on the modelled shape (0: full fine-tuning)
    lora_targets: tuple[str, ...] = ()  #: ... and the projection modules it adapts

    def __post_init__(self) -> None:
        if self.token_scale < 1:
            raise ValueError(f"token_scale must be >= 1, got {self.token_scale}")
        if not 0.0 <= self.length_sigma <= 3.0:
            raise ValueError(f"length_sigma must be in [0, 3], got {self.length_sigma}")
        if self.prompt_token_scale < 0:
            raise ValueError(f"prompt_token_scale must be >= 0, got {self.prompt_token_scale}")
        if not self.prompt_token_scale:
            object.__setattr__(self, "prompt_token_scale", self.token_scale)
        if self.lora_rank < 0 or bool(self.lora_rank) != bool(self.lora_targets):
            raise ValueError(f"a LoRA policy needs a rank >= 1 and its target modules, got rank {self.lora_rank} "
                             f"on {list(self.lora_targets)}")
        self.adapter_params  # noqa: B018 - an unknown target fails here, not at the first price

    @property
    def params(self) -> int:
        return self.profile.model.params

    @property
    def weight_bytes(self) -> int:
        return 2 * self.params  # bf16

    def with_adapter(self, lora) -> "CostModel":
        """This model priced for a LoRA policy of ``lora`` (its rank and target modules, a job's
        ``trainer.engine.lora``); None: as it is."""
        if lora is None:
            return self
        return dataclasses.replace(self, lora_rank=lora.rank, lora_targets=tuple(lora.target_modules))

    @property
    def adapter_params(self) -> int:
        """The LoRA adapter's parameters on the modelled shape (0: full fine-tuning)."""
        return self.profile.model.adapter_params(self.lora_rank, self.lora_targets) if self.lora_rank else 0

    @property
    def version_bytes(self) -> int:
        """What one version's load moves: the adapter's bf16 matrices, or the model's bf16 weights."""
        return 2 * self.adapter_params if self.lora_rank else self.weight_bytes

    @property
    def train_state_bytes(self) -> float:
        """Training states: bf16 weights and gradients, fp32 master weights and Adam's moments of
        every parameter; a LoRA policy's, of its adapter, beside the frozen base's bf16 weights."""
        if self.lora_rank:
            return self.weight_bytes + self.TRAIN_STATE_BYTES_PER_PARAM * self.adapter_params
        return self.TRAIN_STATE_BYTES_PER_PARAM * self.params

    def prefill_s(self, tokens: int) -> float:
        """Prefill of ``tokens`` real prompt tokens."""
        d, e = self.profile.device, self.profile.efficiency
        return 2.0 * self.params * tokens * self.prompt_token_scale / (d.bf16_dense_flops * e.prefill_flops)

    def prefill_modelled_s(self, tokens: float) -> float:
        """Prefill of ``tokens`` modelled tokens of context (a paused batch's KV cache built again)."""
        d, e = self.profile.device, self.profile.efficiency
        return 2.0 * self.params * tokens / (d.bf16_dense_flops * e.prefill_flops)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` rows holding ``context_tokens`` of context in all (modelled tokens)."""
        if batch <= 0:
            return 0.0
        d, e, m = self.profile.device, self.profile.efficiency, self.profile.model
        memory = (self.weight_bytes + m.kv_bytes_per_token * context_tokens) / (d.hbm_bytes_per_s * e.decode_bandwidth)
        compute = 2.0 * self.params * batch / (d.bf16_dense_flops * e.prefill_flops)
        return e.decode_step_overhead_s + max(memory, compute)

    def kv_capacity_tokens(self) -> float:
        """Modelled tokens of context one device's KV cache holds: its usable memory less the weights."""
        d, e, m = self.profile.device, self.profile.efficiency, self.profile.model
        return max(0.0, d.memory_bytes * e.usable_memory_fraction - self.weight_bytes) / m.kv_bytes_per_token

    def min_train_devices(self) -> int:
        """The fewest devices whose usable memory holds the training states (ZeRO-3 shards them)."""
        d, e = self.profile.device, self.profile.efficiency
        return max(1, math.ceil(self.train_state_bytes / (d.memory_bytes * e.usable_memory_fraction)))

    def generate_s(self, prompt_lens: Sequence[int], output_lens: Sequence[int],
                   factors: Sequence[float] | None = None, caps: Sequence[int] | None = None) -> float:
        """One call on one device: continuous batching of its rows (real lengths in, each
        with its length factor and real cap; by default 1 and its own length), run to the end
        by :class:`ContinuousBatch`."""
        if len(prompt_lens) != len(output_lens):
            raise ValueError("generate_s: one output length per prompt")
        factors = factors or [1.0] * len(output_lens)
        caps = caps or output_lens
        batch = ContinuousBatch(self)
        for p, n, f, cap in zip(prompt_lens, output_lens, factors, caps):
            batch.settle(batch.add(None, p, cap, f), n)
        total = 0.0
        while not batch.idle:
            total += batch.step()[0]
        return total

    def length_factor(self, key: int | str) -> float:
        """The factor of a row's modelled length (mean 1): log-normal with deviation
        ``length_sigma``, drawn from ``key`` (the row's sampling seed), so it is the same
        wherever the same sample is generated."""
        if not self.length_sigma:
            return 1.0
        h = int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")
        z = NormalDist().inv_cdf((h + 0.5) / 2.0**64)
        return math.exp(self.length_sigma * z - self.length_sigma**2 / 2.0)

    def modelled_length(self, real: int, cap: int, factor: float = 1.0) -> int:
        """Modelled tokens of a row that generated ``real`` tokens of at most ``cap`` (real):
        ``token_scale x real x factor``, at least one token when it generated any, at most
        ``token_scale x cap``."""
        k = self.token_scale
        if factor == 1.0 or real <= 0:
            return k * max(0, real)
        return max(1, min(k * cap, round(k * real * factor)))

    def modelled_tokens(self, written_tokens: int, generated_tokens: int) -> int:
        """Modelled tokens of rows holding these real tokens: ``written_tokens`` no model
        generated (prompts, the environment's text) and ``generated_tokens`` a model did
        (completions, and earlier turns carried as context)."""
        return self.prompt_token_scale * written_tokens + self.token_scale * generated_tokens

    def prompt_units(self, length: int, generated: int = 0) -> float:
        """A prompt of ``length`` real tokens, ``generated`` of them a model's (earlier turns
        carried as context), in the units ``prompt_token_scale`` multiplies: each generated
        token counts ``token_scale / prompt_token_scale``, so it is priced as the generated
        token it stood for (at the workload's mean length factor, 1)."""
        if not 0 <= generated <= length:
            raise ValueError(f"a prompt of {length} tokens cannot hold {generated} generated ones")
        return length - generated + generated * self.token_scale / self.prompt_token_scale

    def train_step_s(self, tokens: float, forward_only_tokens: float = 0, devices: int = 1) -> float:
        """A step over ``tokens`` trained (forward + backward) and ``forward_only_tokens`` scored, on
        ``devices``; both in modelled tokens (:meth:`modelled_tokens`)."""
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        d, e = self.profile.device, self.profile.efficiency
        f = e.train_flops_per_token_per_param
        if self.lora_rank:  # the frozen base: activation gradients only; the adapter: all of it
            per_token = (f - 2.0) * self.params + f * self.adapter_params
            flops = per_token * tokens + 2.0 * (self.params + self.adapter_params) * forward_only_tokens
        else:
            flops = self.params * (f * tokens + 2.0 * forward_only_tokens)
        scaling = e.train_scaling ** math.log2(devices)
        return flops / (d.bf16_dense_flops * e.train_flops * devices * scaling)

    def weight_load_s(self) -> float:
        return self.version_bytes / self.profile.efficiency.weight_sync_bytes_per_s

    #: bytes of training state per parameter: bf16 weights + bf16 gradients + fp32 master + Adam m and v
    TRAIN_STATE_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4

    def swap_s(self, devices: int = 1) -> float:
        """One colocated policy off its ``devices`` to host memory and back (training states
        sharded over them, the rollout weights a replica on each); the devices copy at once."""
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        per_device = self.train_state_bytes / devices + self.weight_bytes
        link = self.profile.device.host_link_bytes_per_s * self.profile.efficiency.offload_bandwidth
        return 2.0 * per_device / link


class ContinuousBatch:
    """One device's continuous batching, one real decode step at a time (bookkeeping only).

    Rows wait in arrival order and are admitted while the KV cache holds their final context
    (a row alone always runs); an admitted row is prefilled in the step it is admitted, then
    every step decodes the rows still running at the batch and context they hold; a finished
    row frees its room for the next. Lengths are kept in modelled tokens (a row's
    :meth:`CostModel.modelled_length`); one :meth:`step` decodes ``token_scale`` modelled
    tokens (one real token's worth), or fewer when a row finishes before that, so rows that
    arrive while a step runs join at the next step. :meth:`CostModel.generate_s` is
    one call run to the end; an emulated engine that takes several calls at once keeps one
    per device and adds each call's rows as they come (``emulation/batching.py``).
    """

    __slots__ = ("cost", "capacity", "waiting", "running", "reserved")

    def __init__(self, cost: CostModel) -> None:
        self.cost, self.capacity = cost, cost.kv_capacity_tokens()
        #: [tag, prompt (real, in :meth:`CostModel.prompt_units`), length, generated (modelled), factor,
        #: cap (real)], oldest first
        self.waiting: list[list] = []
        self.running: list[list] = []
        self.reserved = 0.0  #: modelled tokens of context the running rows will hold

    def add(self, tag, prompt: int, length: int, factor: float = 1.0) -> list:
        """A row of ``prompt`` real prompt tokens that will generate ``length`` real tokens (or
        at most that many, :meth:`settle`), its modelled length scaled by ``factor``; returns
        the row."""
        row = [tag, prompt, self.cost.token_scale * length, 0, factor, length]
        self.waiting.append(row)
        return row

    def settle(self, row: list, length: int) -> None:
        """The row generates ``length`` real tokens (not more than it was added with): a running
        row gives back the room it no longer needs, and one already that long finishes at the
        next step."""
        if length > row[5]:
            raise ValueError(f"settle: a row added for at most {row[5]} tokens cannot generate {length}")
        target = self.cost.modelled_length(length, row[5], row[4])
        if any(r is row for r in self.running):
            self.reserved -= row[2] - target
        row[2] = target

    def holds(self, row: list) -> bool:
        """``row`` still waits or runs here (not finished)."""
        return any(r is row for r in self.running) or any(r is row for r in self.waiting)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def load(self) -> float:
        """Modelled tokens of context held or waiting (where a router sends the next row)."""
        c = self.cost
        return self.reserved + sum(c.prompt_token_scale * r[1] + r[2] for r in self.waiting)

    def held_context(self) -> float:
        """Modelled tokens of context the running rows hold now (prompt and generated so far)."""
        return sum(self.cost.prompt_token_scale * r[1] + r[3] for r in self.running)

    def footprint(self, row: list) -> float:
        return self.cost.prompt_token_scale * row[1] + row[2]

    def step(self) -> tuple[float, list]:
        """Admit what fits, prefill it, decode the running rows for ``token_scale`` modelled
        steps or until the first of them finishes: the step's modelled seconds and the tags of
        the rows it finished."""
        c, k, kp = self.cost, self.cost.token_scale, self.cost.prompt_token_scale
        admitted = 0
        while self.waiting and (not self.running or self.reserved + self.footprint(self.waiting[0]) <= self.capacity):
            row = self.waiting.pop(0)
            self.reserved += self.footprint(row)
            admitted += row[1]
            self.running.append(row)
        took = c.prefill_s(admitted)
        live = [r for r in self.running if r[3] < r[2]]
        if live:
            # The n modelled steps this step stands for: context grows by one token per running
            # row and step; a step's memory time is linear in it, so the mean is exact.
            n = min(k, min(r[2] - r[3] for r in live))
            context = sum(kp * r[1] + r[3] for r in live) + len(live) * (n - 1) / 2
            took += n * c.decode_step_s(len(live), context)
            for r in live:
                r[3] += n
        done = [r for r in self.running if r[3] >= r[2]]
        if done:
            self.running = [r for r in self.running if r[3] < r[2]]
            self.reserved -= sum(self.footprint(r) for r in done)
        return took, [r[0] for r in done]

    def copy(self) -> ContinuousBatch:
        other = ContinuousBatch.__new__(ContinuousBatch)
        other.cost, other.capacity, other.reserved = self.cost, self.capacity, self.reserved
        other.waiting = [list(r) for r in self.waiting]
        other.running = [list(r) for r in self.running]
        return other
