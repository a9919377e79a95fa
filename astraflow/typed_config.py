"""Typed config sections from YAML: the one loader job configs and topology files share.

A section is a frozen dataclass; :func:`from_dict` builds it from plain data strictly: an
unknown key, a missing required key or a value of the wrong type raises
:class:`ConfigError` naming the file and the dotted key. Two hooks let a section take part
without this module knowing it: a field type with a ``from_config(value, file, key)``
classmethod parses its own entries (a data algorithm and its parameters), and a section
with a ``normalize_config(data, file)`` classmethod reshapes its raw mapping first (a job's
per-policy defaults). :func:`load_yaml` reads a file into the mapping. It knows nothing
about what the sections mean.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from astraflow.errors import FatalError

__all__ = ["ConfigError", "from_dict", "load_yaml"]


class ConfigError(FatalError, ValueError):
    """Invalid job configuration; names the file and the dotted key."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        self.file, self.key, self.problem = file, key, problem
        super().__init__(f"{file}: {key}: {problem}")


def load_yaml(path: str | Path, root: str = "a mapping", error: type[ConfigError] = ConfigError) -> dict:
    """The mapping a YAML file holds; ``error`` (naming the file) when it is missing, not YAML,
    or not a mapping (``root`` says what the root should be)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise error(str(path), "<file>", "no such file") from None
    except yaml.YAMLError as e:
        raise error(str(path), "<file>", f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise error(str(path), "<root>", f"expected {root}")
    return data


def from_dict(cls: type, data: Any, file: str = "<dict>", prefix: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, strictly (see :class:`ConfigError`)."""
    where = prefix.rstrip(".") or "<root>"
    if not isinstance(data, dict):
        raise ConfigError(file, where, f"expected a mapping, got {type(data).__name__}")
    normalize = getattr(cls, "normalize_config", None)
    if normalize is not None:  # a section that reshapes its raw mapping first (a job's policy defaults)
        data = normalize(data, file)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(file, prefix + str(key),
                              f"unknown key (allowed in {where}: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        key = prefix + name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(file, key, "required key is missing")
            continue
        kwargs[name] = _coerce(hints[name], data[name], file, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(file, where, str(e)) from None


def _coerce(tp: Any, value: Any, file: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    if hasattr(tp, "from_config"):  # an entry that parses itself (a data algorithm and its parameters)
        return tp.from_config(value, file, key)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, file, key + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, file, key)
            except ConfigError as e:
                errors.append(e.problem)
        raise ConfigError(file, key, "; ".join(errors))
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(file, key, f"expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            raise ConfigError(file, key, f"expected {len(items)} items, got {len(value)}")
        return tuple(_coerce(a, v, file, f"{key}[{i}]") for i, (a, v) in enumerate(zip(items, value)))
    if origin in (dict, collections.abc.Mapping) or tp in (dict,):
        if not isinstance(value, dict):
            raise ConfigError(file, key, f"expected a mapping, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(vt, v, file, f"{key}.{k}") for k, v in value.items()}
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(file, key, f"must be one of {list(allowed)}, got {value!r}")
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    if tp is Any:
        return value
    raise ConfigError(file, key, f"expected {getattr(tp, '__name__', tp)}, got {type(value).__name__} {value!r}")
