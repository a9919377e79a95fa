"""Emulation profiles: a device kind and a model shape, every number with its source.

Owns reading ``profiles.yaml`` (beside this module, or a file given by name): the device
peaks (dense BF16 FLOP/s, HBM bandwidth, memory), the model shapes (layers, widths, heads,
vocabulary) and the efficiencies the cost model applies to the peaks. Every value is
``{value, source}``; a missing field, a missing source or a value of the wrong type is a
:class:`ProfileError` naming the file and the dotted key. It knows nothing about engines or
time: :mod:`.cost` turns a profile into seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.typed_config import ConfigError, load_yaml

__all__ = ["ProfileError", "DeviceSpec", "ModelSpec", "Efficiency", "Profile", "Workload", "PROFILES_FILE",
           "load_profile", "load_workload", "profile_names", "workload_names"]

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
#: What ``benchmarks/gpu_profile.py`` measured on a real GPU: preferred to the estimates for its device kind.
MEASURED_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu_profile.json"
_MEASURED_KEYS = ("decode_bandwidth", "prefill_flops", "train_flops", "weight_sync_bytes_per_s", "offload_bandwidth")


class ProfileError(ConfigError):
    """An emulation profile that is missing, unknown or incomplete; names the file and the key."""


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_dense_flops: float  #: FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    interconnect_bytes_per_s: float
    host_link_bytes_per_s: float  #: device <-> host memory, each way (PCIe)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool

    @property
    def params(self) -> int:
        """Parameters of the shape (attention and MLP weights, embeddings; norms are negligible)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * layer + embed

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """Each projection module of a layer, ``(in_features, out_features)``, by its HF name."""
        h, q, kv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def adapter_params(self, rank: int, targets: tuple[str, ...] | list[str]) -> int:
        """Parameters of a rank-``rank`` LoRA adapter on ``targets`` in every layer: ``A`` (rank x
        in) and ``B`` (out x rank) per module. ValueError naming a target the shape has not."""
        shapes = self.module_shapes()
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"LoRA target module(s) {', '.join(unknown)} not in {self.name} "
                             f"(its projections: {', '.join(shapes)})")
        return self.num_layers * sum(rank * sum(shapes[t]) for t in dict.fromkeys(targets))

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of context holds (bf16 keys and values, every layer)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class Efficiency:
    decode_bandwidth: float  #: share of HBM bandwidth a decode step reaches
    prefill_flops: float  #: share of dense peak a prefill reaches
    decode_step_overhead_s: float  #: fixed cost of one decode step (scheduler, sampling, launches)
    train_flops: float  #: model FLOPs utilisation of training
    train_flops_per_token_per_param: float  #: forward + backward
    train_scaling: float  #: data-parallel efficiency per doubling of devices
    weight_sync_bytes_per_s: float  #: trainer -> rollout weight transfer, engine update included
    offload_bandwidth: float  #: share of the host link a device <-> host copy of model states reaches
    usable_memory_fraction: float  #: share of device memory for weights, KV cache and training states


@dataclass(frozen=True)
class Workload:
    """What the emulated model writes, beyond its shape: the spread of its response lengths."""

    name: str
    length_sigma: float  #: log-space deviation of a row's length factor (log-normal, mean 1)
    sources: dict[str, str]
    file: str


@dataclass(frozen=True)
class Profile:
    name: str
    device: DeviceSpec
    model: ModelSpec
    efficiency: Efficiency
    sources: dict[str, str]  #: dotted key -> where its number comes from
    file: str


def _values(cls: type, section: Any, file: str, key: str, sources: dict[str, str], name: str | None = None):
    """``cls`` from a mapping of ``{value, source}`` entries, strictly."""
    if not isinstance(section, dict):
        raise ProfileError(file, key, f"expected a mapping, got {section!r}")
    kwargs: dict[str, Any] = {} if name is None else {"name": name}
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        entry_key = f"{key}.{f.name}"
        entry = section.get(f.name)
        if entry is None:
            raise ProfileError(file, entry_key, "required field is missing")
        if not isinstance(entry, dict) or "value" not in entry:
            raise ProfileError(file, entry_key, f"expected {{value: ..., source: ...}}, got {entry!r}")
        if not isinstance(entry.get("source"), str) or not entry["source"].strip():
            raise ProfileError(file, f"{entry_key}.source", "every number needs its source")
        value, tp = entry["value"], f.type
        try:
            if tp == "bool":
                if not isinstance(value, bool):
                    raise TypeError
            elif tp == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError
            else:
                value = float(value)
                if not value > 0 and f.name != "decode_step_overhead_s":
                    raise ValueError
        except (TypeError, ValueError):
            raise ProfileError(file, f"{entry_key}.value", f"expected a positive {tp}, got {entry['value']!r}") from None
        kwargs[f.name] = value
        sources[entry_key] = entry["source"]
    unknown = set(section) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ProfileError(file, key, f"unknown field(s) {sorted(unknown)}")
    return cls(**kwargs)


def _file(path: str | Path | None) -> tuple[dict, str]:
    path = Path(path) if path else PROFILES_FILE
    return load_yaml(path, "a mapping with devices, models, profiles and efficiency", ProfileError), str(path)


def profile_names(path: str | Path | None = None) -> list[str]:
    data, _ = _file(path)
    return sorted(data.get("profiles") or {})


def workload_names(path: str | Path | None = None) -> list[str]:
    data, _ = _file(path)
    return sorted(data.get("workloads") or {})


@dataclass(frozen=True)
class _WorkloadValues:
    length_sigma: float


def load_workload(name: str, path: str | Path | None = None) -> Workload:
    """The workload ``name`` of the profiles file (``workloads.<name>``), every number with its source."""
    data, file = _file(path)
    table = data.get("workloads") or {}
    if name not in table:
        raise ProfileError(file, "workloads", f"unknown workload {name!r}; workloads: {', '.join(sorted(table)) or 'none'}")
    sources: dict[str, str] = {}
    v = _values(_WorkloadValues, table[name], file, f"workloads.{name}", sources)
    return Workload(name, v.length_sigma, sources, file)


def load_profile(name: str, path: str | Path | None = None, measured: str | Path | None = MEASURED_FILE) -> Profile:
    """The profile ``name`` of the profiles file (the shipped one by default); efficiencies a
    real GPU of its device kind measured (``measured``, when that file exists and is not a
    smoke run) replace the file's estimates, and their sources say so."""
    data, file = _file(path)
    profiles = data.get("profiles") or {}
    if name not in profiles:
        raise ProfileError(file, "profiles", f"unknown profile {name!r}; profiles: {', '.join(sorted(profiles))}")
    entry = profiles[name]
    if not isinstance(entry, dict) or not {"device", "model"} <= set(entry):
        raise ProfileError(file, f"profiles.{name}", "expected {device: NAME, model: NAME}")
    sources: dict[str, str] = {}
    picked = []
    for section, cls in (("devices", DeviceSpec), ("models", ModelSpec)):
        ref = entry["device" if section == "devices" else "model"]
        table = data.get(section) or {}
        if ref not in table:
            raise ProfileError(file, f"profiles.{name}", f"names {section[:-1]} {ref!r}, which {section} does not have "
                                                         f"({', '.join(sorted(table)) or 'none'})")
        picked.append(_values(cls, table[ref], file, f"{section}.{ref}", sources, name=ref))
    eff = _values(Efficiency, data.get("efficiency"), file, "efficiency", sources)
    eff = _with_measured(eff, picked[0].name, measured, sources)
    return Profile(name, picked[0], picked[1], eff, sources, file)


def _with_measured(eff: Efficiency, device: str, measured: str | Path | None, sources: dict[str, str]) -> Efficiency:
    import json
    if measured is None or not Path(measured).is_file():
        return eff
    try:
        m = json.loads(Path(measured).read_text())
    except (OSError, ValueError) as e:
        raise ProfileError(str(measured), "<file>", f"not readable JSON: {e}") from None
    if m.get("smoke") or m.get("device_kind") != device:
        return eff
    got = {k: float(v) for k, v in (m.get("efficiency") or {}).items() if k in _MEASURED_KEYS and float(v) > 0}
    for k in got:
        sources[f"efficiency.{k}"] = f"measured on {m.get('gpu')} on {m.get('measured_at')} ({Path(measured).name})"
    return dataclasses.replace(eff, **got)
