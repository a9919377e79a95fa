"""LoRA adapters of a policy: wrapping the trainer's model, the adapter's tensor names, and
applying an adapter to a rollout engine's base model.

Owns three things:

* :func:`wrap` turns the trainer's HF model into a peft model with one adapter
  (``trainer.engine.lora``): only the adapter's ``lora_A`` / ``lora_B`` matrices train.
* The adapter's names on the wire: peft's saved-adapter names
  (``base_model.model.<module>.lora_A.weight``, what ``adapter_model.safetensors`` holds),
  without the in-memory adapter name (:func:`published_name`, :func:`peft_name`).
* :class:`MergedAdapter`: how the CPU engine serves one adapter. It keeps the base weight of
  every targeted module untouched aside and writes ``base + (alpha / rank) * B @ A`` into the
  model's working weight, so each version applies to the base, never on top of the previous
  version, and the forward costs what the base's costs. (One adapter per engine; rows of
  several adapters in one batch need the unmerged per-row path, not built yet.)

It knows nothing about Kafka, weight streams or which base an adapter belongs to: the
weights layer names the base by its digest (``weights.adapters``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .config import LoraConfig

__all__ = ["ADAPTER", "MergedAdapter", "is_adapter_name", "peft_name", "published_name", "wrap"]

#: peft's name of the one adapter a trainer holds (inside its parameter names, never on the wire).
ADAPTER = "default"
_PARTS = (".lora_A.", ".lora_B.")


def wrap(model, cfg: LoraConfig):
    """``model`` (an HF causal LM) as a peft model with one fresh adapter: ``B`` starts at zero,
    so the wrapped model computes exactly what ``model`` did; only the adapter trains."""
    # peft imports transformers' trainer stack (~1 s): only a LoRA trainer pays it.
    import peft

    spec = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        return peft.get_peft_model(model, spec, adapter_name=ADAPTER)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"trainer.engine.lora.target_modules {list(cfg.target_modules)}: {e}") from None


def is_adapter_name(name: str) -> bool:
    """Whether ``name`` is one of an adapter's matrices (in-memory or published name)."""
    return any(part in name for part in _PARTS)


def published_name(key: str) -> str:
    """A peft parameter name as an adapter version carries it: the adapter name dropped
    (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``)."""
    for part in _PARTS:
        key = key.replace(f"{part}{ADAPTER}.", part)
    return key


def peft_name(name: str) -> str:
    """The inverse of :func:`published_name` (what peft's ``state_dict`` arguments expect)."""
    for part in _PARTS:
        if part in name and f"{part}{ADAPTER}." not in name:
            return name.replace(part, f"{part}{ADAPTER}.")
    return name


def _module_of(name: str) -> tuple[str, str]:
    """``base_model.model.<module>.lora_A.weight`` -> (``<module>``, ``"A"`` or ``"B"``)."""
    for part in _PARTS:
        head, sep, _ = name.partition(part)
        if sep:
            return head.removeprefix("base_model.model."), part[-2]
    raise KeyError(f"{name!r} is not an adapter matrix (no .lora_A. or .lora_B. in its name)")


class MergedAdapter:
    """One adapter merged into a model's working weights, the base kept aside (see the module docstring).

    Args:
        model: the engine's HF model (its weights are changed in place).
        cfg: the policy's LoRA settings (rank and alpha give the scale).
    """

    def __init__(self, model, cfg: LoraConfig) -> None:
        self.model, self.cfg = model, cfg
        self.scaling = cfg.alpha / cfg.rank
        self._params = dict(model.named_parameters())
        self._base: dict[str, torch.Tensor] = {}  #: module weight name -> its base value (first touch)

    def apply(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make the model compute ``base + scaling * B @ A`` for every module the adapter
        names, and the base for every module an earlier adapter touched and this one does not.
        Raises KeyError/ValueError (nothing changed) when the tensors are not a whole adapter
        of this model."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in named:
            module, which = _module_of(name)
            pairs.setdefault(module, {})[which] = t
        merged: dict[str, torch.Tensor] = {}
        for module, ab in sorted(pairs.items()):
            target = f"{module}.weight"
            weight = self._params.get(target)
            if weight is None:
                raise KeyError(f"load_weights: the adapter names module {module!r}, which the model has no weight for")
            if set(ab) != {"A", "B"}:
                raise ValueError(f"load_weights: module {module!r} has lora_{''.join(ab)} but not both lora_A and lora_B")
            a, b = ab["A"], ab["B"]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != self.cfg.rank or b.shape[1] != self.cfg.rank \
                    or (b.shape[0], a.shape[1]) != tuple(weight.shape):
                raise ValueError(f"load_weights: {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do "
                                 f"not make a rank-{self.cfg.rank} adapter of its {tuple(weight.shape)} weight "
                                 "(trainer.engine.lora.rank must be the trainer's)")
            merged[target] = (b.to(torch.float32) @ a.to(torch.float32)) * self.scaling
        with torch.no_grad():
            for target in set(self._base) - set(merged):  # an earlier adapter's module: back to the base
                self._params[target].copy_(self._base[target])
            for target, delta in merged.items():
                weight = self._params[target]
                base = self._base.setdefault(target, weight.detach().clone())
                weight.copy_(base + delta.to(weight.dtype))
