"""Preallocated KV cache for the CPU engine's decode loop.

Owns one thing: a ``transformers`` cache layer that writes each step's keys/values into a
buffer sized for the whole generation, instead of ``DynamicCache``'s ``torch.cat`` per
layer per step (which copies the entire cache every token: quadratic memory traffic).
Rows can still be dropped (``batch_select_indices``) when they finish.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["PreallocatedLayer", "preallocated_cache"]


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose storage is a fixed-capacity buffer; ``keys``/``values``
    are views of the filled prefix, so the model sees exactly what DynamicCache gives."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self._k = torch.empty((b, h, self.capacity, d), dtype=key_states.dtype, device=key_states.device)
        self._v = torch.empty((b, h, self.capacity, value_states.shape[-1]), dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded (need {self.length + n})")
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys = self._k[:, :, : self.length]
            self.values = self._v[:, :, : self.length]


def preallocated_cache(num_layers: int, capacity: int) -> Cache:
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])
