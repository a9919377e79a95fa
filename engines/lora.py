"""LoRA adapters of a policy: wrapping the trainer's model, the adapter's tensor names, and
applying an adapter to a rollout engine's base model.

Owns four things:

* :func:`wrap` turns the trainer's HF model into a peft model with one adapter
  (``trainer.engine.lora``): only the adapter's ``lora_A`` / ``lora_B`` matrices train.
* The adapter's names on the wire: peft's saved-adapter names
  (``base_model.model.<module>.lora_A.weight``, what ``adapter_model.safetensors`` holds),
  without the in-memory adapter name (:func:`published_name`, :func:`peft_name`).
* :class:`AdapterSlots`: how the CPU engine serves adapters of its base, one slot per
  adapter (a policy), each with its own version. A call whose rows all use one adapter
  *merges* it: the base weight of every targeted module is kept aside untouched and
  ``base + (alpha / rank) * B @ A`` is written into the model's working weight, so each
  version applies to the base, never on top of the previous one, and the forward costs what
  the base's costs. A call mixing adapters runs on the base weights with a hook on every
  targeted module that adds each row's own update, ``scale * B(A(x))``, to that row's output
  (what peft computes for a lone adapter), so each row gets exactly its adapter's output.
* :func:`share_base`: several LoRA trainers in one process (``trainer.process``) hold the
  frozen base once, each later one's base parameters being the first one's tensors.

It knows nothing about Kafka, weight streams or which base an adapter belongs to: the
weights layer names the base by its digest (``weights.adapters``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import LoraConfig

__all__ = ["ADAPTER", "AdapterSlots", "is_adapter_name", "peft_name", "published_name", "share_base", "wrap"]

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


def _adapter_pairs(named: Iterable[tuple[str, torch.Tensor]], params: dict[str, torch.Tensor],
                   cfg: LoraConfig) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Target module -> its ``(A, B)`` in the weight's dtype; KeyError/ValueError when the
    tensors are not a whole rank-``cfg.rank`` adapter of this model."""
    found: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in named:
        module, which = _module_of(name)
        found.setdefault(module, {})[which] = t
    pairs = {}
    for module, ab in sorted(found.items()):
        weight = params.get(f"{module}.weight")
        if weight is None:
            raise KeyError(f"load_weights: the adapter names module {module!r}, which the model has no weight for")
        if set(ab) != {"A", "B"}:
            raise ValueError(f"load_weights: module {module!r} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != cfg.rank or b.shape[1] != cfg.rank \
                or (b.shape[0], a.shape[1]) != tuple(weight.shape):
            raise ValueError(f"load_weights: {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do "
                             f"not make a rank-{cfg.rank} adapter of its {tuple(weight.shape)} weight "
                             "(trainer.engine.lora.rank must be the trainer's)")
        pairs[module] = (a.detach().to(weight.dtype).clone(), b.detach().to(weight.dtype).clone())
    return pairs


class _Slot:
    """One adapter the engine serves: its settings, its matrices and its version."""

    __slots__ = ("cfg", "scaling", "pairs", "version", "loads")

    def __init__(self, cfg: LoraConfig, version: int) -> None:
        self.cfg, self.scaling, self.version = cfg, cfg.alpha / cfg.rank, version
        self.pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  #: empty: B = 0, the base itself
        self.loads = 0  #: adapters loaded into it so far (which matrices a merge holds)


class AdapterSlots:
    """Adapters of one base model, by name, and which one the model's weights hold merged
    (see the module docstring).

    Args:
        model: the engine's HF model (its targeted weights are changed in place).
        configs: adapter name (a policy) -> its LoRA settings (rank and alpha give its scale).
        version: every slot's version before its first load.
    """

    def __init__(self, model, configs: dict[str, LoraConfig], version: int = 0) -> None:
        if not configs:
            raise ValueError("AdapterSlots: name at least one adapter")
        self.model = model
        self.slots = {name: _Slot(cfg, version) for name, cfg in configs.items()}
        self._params = dict(model.named_parameters())
        self._base: dict[str, torch.Tensor] = {}  #: module weight name -> its base value (first touch)
        self._merged: str | None = None  #: the slot the working weights hold (None: the base)
        self._merged_key: tuple | None = (None, None)  #: ... and which of its versions' matrices

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.slots)

    def version(self, name: str) -> int:
        return self._slot(name).version

    def load(self, name: str, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Make slot ``name`` hold this adapter at ``version``. Raises KeyError/ValueError
        (nothing changed) when the tensors are not a whole adapter of this model."""
        slot = self._slot(name)
        slot.pairs = _adapter_pairs(named, self._params, slot.cfg)
        slot.version, slot.loads = version, slot.loads + 1
        if self._merged == name or (self._merged is None and len(self.slots) == 1):
            self._merge(name)  # the working weights follow the adapter they hold

    @contextmanager
    def serving(self, names: Sequence[str]):
        """While a call runs on rows of adapters ``names`` (one per row). Rows of one adapter:
        it is merged and this yields None. Rows of several: the base weights and a per-row
        hook on every targeted module; this yields a :class:`_RowUpdates` the caller tells which
        rows are live before each forward (``select``)."""
        wanted = set(names)
        for name in wanted:
            self._slot(name)
        if len(wanted) == 1:
            self._merge(next(iter(wanted)))
            yield None
            return
        self._merge(None)
        rows = _RowUpdates(self.model, [self.slots[n] for n in names])
        try:
            yield rows
        finally:
            rows.remove()

    def _slot(self, name: str) -> _Slot:
        slot = self.slots.get(name)
        if slot is None:
            raise KeyError(f"no adapter {name!r} on this engine (it serves {', '.join(self.slots)})")
        return slot

    def _merge(self, name: str | None) -> None:
        """Working weights = base + slot ``name``'s update (None: the base) for every module
        an adapter touched so far."""
        key = (name, self.slots[name].loads if name is not None else None)
        if key == self._merged_key:
            return  # (a merge copies every targeted weight: once per adapter version, not per call)
        merged: dict[str, torch.Tensor] = {}
        if name is not None:
            slot = self.slots[name]
            merged = {f"{m}.weight": (b.to(torch.float32) @ a.to(torch.float32)) * slot.scaling
                      for m, (a, b) in slot.pairs.items()}
        with torch.no_grad():
            for target in set(self._base) - set(merged):  # another adapter's module: back to the base
                self._params[target].copy_(self._base[target])
            for target, delta in merged.items():
                weight = self._params[target]
                base = self._base.setdefault(target, weight.detach().clone())
                weight.copy_(base + delta.to(weight.dtype))
        self._merged, self._merged_key = name, key


class _RowUpdates:
    """Forward hooks adding each live row's own adapter update to a targeted module's output:
    ``out[i] += scale_i * B_i(A_i(x[i]))``, computed once per adapter over its rows."""

    def __init__(self, model, slots: Sequence[_Slot]) -> None:
        self.slots = list(slots)  #: per original row
        self._groups: list[tuple[_Slot, torch.Tensor]] = []
        modules = sorted({m for s in self.slots for m in s.pairs})
        self._hooks = [model.get_submodule(m).register_forward_hook(self._hook(m)) for m in modules]
        self.select(torch.arange(len(self.slots)))

    def select(self, rows: torch.Tensor) -> None:
        """The original row of each live batch entry, in batch order."""
        by_slot: dict[int, tuple[_Slot, list[int]]] = {}
        for i, r in enumerate(rows.tolist()):
            slot = self.slots[r]
            by_slot.setdefault(id(slot), (slot, []))[1].append(i)
        self._groups = [(slot, torch.tensor(idx)) for slot, idx in by_slot.values() if slot.pairs]

    def _hook(self, module: str):
        def add_updates(_mod, inputs, out):
            x = inputs[0]
            for slot, idx in self._groups:
                pair = slot.pairs.get(module)
                if pair is not None:
                    a, b = pair
                    out.index_add_(0, idx, F.linear(F.linear(x.index_select(0, idx), a), b) * slot.scaling)
            return out
        return add_updates

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


#: model directory -> the frozen base parameters of the first LoRA trainer of this process on
#: it (weak: they go with the last engine holding them)
_BASES: dict[str, dict[str, weakref.ref]] = {}
_BASES_LOCK = threading.Lock()


def share_base(model: torch.nn.Module, model_path: str | Path) -> int:
    """Make the frozen parameters of ``model`` (a LoRA trainer's peft model, once DeepSpeed
    placed it: its base, which never trains) the tensors another LoRA trainer of this process
    already holds for the same model directory, so N adapters of one base in one process hold
    it once; the first one's are registered. Parameters are matched by their base model's
    name (peft's ``base_layer`` step removed: adapters on other modules name them differently).
    Returns how many parameters now share another's storage (0 for the first); parameters of
    another shape, dtype or device are left alone."""
    key = str(Path(model_path).resolve())
    params = {n.replace(".base_layer.", "."): p for n, p in model.named_parameters() if not p.requires_grad}
    with _BASES_LOCK:
        held = {n: r() for n, r in _BASES.get(key, {}).items()}
        if not held or any(t is None for t in held.values()):
            _BASES[key] = {n: weakref.ref(p) for n, p in params.items()}  # the parameters: peft keeps them
            return 0
        shared = 0
        for n, p in params.items():
            src = held.get(n)
            if src is not None and (src.shape, src.dtype, src.device) == (p.shape, p.dtype, p.device):
                p.data = src.data
                shared += 1
        return shared
