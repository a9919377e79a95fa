"""The cost model of an emulated device: how long a real accelerator takes for given work.

Owns the formulas; every number in them comes from a :class:`~.profile.Profile`:

* **prefill** of ``T`` prompt tokens: ``2·N·T / (peak · prefill_flops)`` (``N`` parameters);
* a **decode step** of a batch of ``b`` sequences holding ``C`` tokens of context in all:
  ``overhead + max((2·N + kv·C) / (HBM · decode_bandwidth), 2·N·b / (peak · prefill_flops))``
  — the weights and the KV cache read once per step (memory-bound), or the step's FLOPs when
  the batch is large enough to be compute-bound (``kv``: KV bytes per token of context);
* a **generate call** is continuous batching of its rows: every row is prefilled, then each
  step decodes the rows still running, so a call's decode steps run at the batch size and
  context length the rows had at that step;
* a **training step** over ``T`` tokens forward and backward (and ``F`` forward-only, the
  no-grad passes) on ``k`` devices: ``(6·N·T + 2·N·F) / (peak · train_flops · k · s(k))``
  with ``s(k) = train_scaling ** log2(k)`` (data parallel, ZeRO/FSDP);
* a **weight load**: the model's bf16 bytes at ``weight_sync_bytes_per_s``.

``token_scale`` lets one real token stand for several modelled ones (the tiny model writes
a few tokens where the emulated model would write hundreds): every length is multiplied by
it. It knows nothing about engines, sleeping or Kafka.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .profile import Profile

__all__ = ["CostModel"]


@dataclass(frozen=True)
class CostModel:
    profile: Profile
    token_scale: int = 1

    def __post_init__(self) -> None:
        if self.token_scale < 1:
            raise ValueError(f"token_scale must be >= 1, got {self.token_scale}")

    @property
    def params(self) -> int:
        return self.profile.model.params

    @property
    def weight_bytes(self) -> int:
        return 2 * self.params  # bf16

    def prefill_s(self, tokens: int) -> float:
        d, e = self.profile.device, self.profile.efficiency
        return 2.0 * self.params * tokens * self.token_scale / (d.bf16_dense_flops * e.prefill_flops)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` rows holding ``context_tokens`` of context in all (modelled tokens)."""
        if batch <= 0:
            return 0.0
        d, e, m = self.profile.device, self.profile.efficiency, self.profile.model
        memory = (self.weight_bytes + m.kv_bytes_per_token * context_tokens) / (d.hbm_bytes_per_s * e.decode_bandwidth)
        compute = 2.0 * self.params * batch / (d.bf16_dense_flops * e.prefill_flops)
        return e.decode_step_overhead_s + max(memory, compute)

    def generate_s(self, prompt_lens: Sequence[int], output_lens: Sequence[int]) -> float:
        """One call: its rows prefilled together, then decoded by continuous batching (real lengths in)."""
        if len(prompt_lens) != len(output_lens):
            raise ValueError("generate_s: one output length per prompt")
        if not prompt_lens:
            return 0.0
        k = self.token_scale
        total = self.prefill_s(sum(prompt_lens))
        for t in range(max(output_lens, default=0)):
            running = [p for p, n in zip(prompt_lens, output_lens) if n > t]
            # The k modelled steps this real step stands for: context grows by one token per
            # running row and step; a step's memory time is linear in it, so the mean is exact.
            context = sum(k * (p + t) for p in running) + len(running) * (k - 1) / 2
            total += k * self.decode_step_s(len(running), context)
        return total

    def train_step_s(self, tokens: int, forward_only_tokens: int = 0, devices: int = 1) -> float:
        """A step over ``tokens`` trained (forward + backward) and ``forward_only_tokens`` scored, on ``devices``."""
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        d, e = self.profile.device, self.profile.efficiency
        flops = self.params * self.token_scale * (e.train_flops_per_token_per_param * tokens + 2.0 * forward_only_tokens)
        scaling = e.train_scaling ** math.log2(devices)
        return flops / (d.bf16_dense_flops * e.train_flops * devices * scaling)

    def weight_load_s(self) -> float:
        return self.weight_bytes / self.profile.efficiency.weight_sync_bytes_per_s
