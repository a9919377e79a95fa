"""Data algorithms by name, and how a config entry becomes one.

``dataflow.algorithms`` is a list; each entry is a name (``- edf``) or a mapping with a
``name`` and that algorithm's parameters (``- {name: replay, ratio: 0.3}``). Parameters
are parsed as strictly as the rest of the job config: an unknown algorithm, an unknown
key or a bad value is a :class:`~astraflow.typed_config.ConfigError` naming the file and the
dotted key (``dataflow.algorithms[2].ratio``). A new algorithm subclasses one of the
three interfaces in :mod:`.base`, gives itself a ``name`` and a ``Params`` dataclass, and
is added with :func:`register`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from astraflow.typed_config import ConfigError, from_dict
from astraflow.topics.messages import DROP_REASONS

from .base import Algorithm, BatchComposer, GroupFilter, PromptCurator
from .curriculum import Curriculum
from .dynamic_sampling import DynamicSampling
from .filter_solved import FilterSolved
from .greso import Greso
from .mixing import Mixing
from .ordering import EarliestDeadlineFirst, Fifo
from .experience_replay import ExperienceReplay

ALGORITHMS: dict[str, type[Algorithm]] = {}


@dataclass(frozen=True)
class AlgorithmSpec:
    """One ``dataflow.algorithms`` entry of a job config: a registered data algorithm and its
    parsed parameters (:func:`parse_spec` builds it, strictly)."""

    name: str
    params: Any

    @classmethod
    def from_config(cls, value: Any, file: str, key: str) -> "AlgorithmSpec":
        return parse_spec(value, file, key)


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Make ``cls`` selectable by its ``name`` in ``dataflow.algorithms``."""
    if not cls.name or cls.name in ALGORITHMS:
        raise ValueError(f"algorithm name {cls.name!r} is empty or registered twice")
    if not issubclass(cls, (PromptCurator, GroupFilter, BatchComposer)):
        raise TypeError(f"{cls.__name__} implements none of PromptCurator, GroupFilter, BatchComposer")
    if issubclass(cls, GroupFilter) and cls.reason not in DROP_REASONS:
        raise ValueError(f"{cls.__name__}.reason {cls.reason!r} is not a drop reason the audit knows "
                         f"({sorted(DROP_REASONS)})")
    if not dataclasses.is_dataclass(cls.Params):
        raise TypeError(f"{cls.__name__}.Params must be a dataclass of its config keys")
    ALGORITHMS[cls.name] = cls
    return cls


for _cls in (Greso, FilterSolved, Curriculum, Mixing, DynamicSampling, ExperienceReplay, EarliestDeadlineFirst, Fifo):
    register(_cls)


def parse_spec(value: Any, file: str, key: str) -> AlgorithmSpec:
    """One ``dataflow.algorithms`` entry, validated (see the module docstring)."""
    if isinstance(value, str):
        name, raw = value, {}
    elif isinstance(value, dict):
        if not isinstance(value.get("name"), str):
            raise ConfigError(file, f"{key}.name", f"each algorithm needs a name (one of {sorted(ALGORITHMS)})")
        name, raw = value["name"], {k: v for k, v in value.items() if k != "name"}
    else:
        raise ConfigError(file, key, f"expected an algorithm name or a mapping with 'name', got {value!r}")
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise ConfigError(file, f"{key}.name", f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return AlgorithmSpec(name, from_dict(cls.Params, raw, file, key + "."))


def algorithm_class(name: str) -> type[Algorithm]:
    return ALGORITHMS[name]
