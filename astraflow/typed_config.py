"""Typed config sections from YAML: the one loader job configs and topology files share.

A section is a frozen dataclass; :func:`from_dict` builds it from plain data strictly: an
unknown key, a missing required key or a value of the wrong type raises
:class:`ConfigError` naming the file and the dotted key. Two hooks let a section take part
without this module knowing it: a field type with a ``from_config(value, file, key)``
classmethod parses its own entries (a data algorithm and its parameters), and a section
with a ``normalize_config(data, file)`` classmethod reshapes its raw mapping first (a job's
per-policy defaults). It knows nothing about what the sections mean.

A section declares each key with :func:`setting`: its default, its help text (what ``astraflow
config keys`` prints) and, for a number, its :class:`Bounds` (``metadata["bounds"]``). A value
outside them, or any float that is not finite, is refused naming the key; a section's own
``__post_init__`` checks only what bounds cannot say (one key against another). A name that
becomes part of a path or a topic name is checked with :func:`check_name`.
:func:`load_yaml` reads a file into the mapping; a key given twice in one mapping is an
error naming the key, the file and both lines (PyYAML would keep the last silently). Input
that would hang a loader is refused naming the file: anything but a regular file of at most
:data:`MAX_YAML_BYTES`, and aliases that expand past :data:`MAX_ALIAS_NODES` extra nodes.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import functools
import math
import re
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from astraflow.errors import FatalError

__all__ = ["Bounds", "ConfigError", "MAX_ALIAS_NODES", "MAX_YAML_BYTES", "NAME_PATTERN", "check_name", "from_dict",
           "load_yaml", "setting"]


class ConfigError(FatalError, ValueError):
    """Invalid job configuration; names the file and the dotted key."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        self.file, self.key, self.problem = file, key, problem
        super().__init__(f"{file}: {key}: {problem}")


@dataclass(frozen=True)
class Bounds:
    """The range ``[lo, hi]`` a numeric key accepts; ``lo_open`` / ``hi_open`` exclude an end
    (a temperature above 0, an Adam beta below 1); ``why`` is added to the error where an end
    is not obvious. Applies to each number of a list or a mapping of numbers too."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""

    def admits(self, value: float) -> bool:
        return ((self.lo < value if self.lo_open else self.lo <= value)
                and (value < self.hi if self.hi_open else value <= self.hi))

    def __str__(self) -> str:
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def setting(default: Any = dataclasses.MISSING, help: str = "", bounds: Bounds | None = None,  # noqa: A002
            **kw: Any) -> Any:
    """A section's field: its ``default`` (none: a required key), its ``help`` and, for a number,
    the ``bounds`` :func:`from_dict` loads it within. A default of a mutable kind (a dict, a
    list) is copied for each instance. ``kw`` goes to :func:`dataclasses.field` as it is."""
    meta = {"help": help, **({"bounds": bounds} if bounds else {})}
    if default is not dataclasses.MISSING and type(default).__hash__ is None:
        return dataclasses.field(default_factory=functools.partial(copy.copy, default), metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


#: A name that becomes a path part or a topic-name part: starts with a letter or digit (so
#: never ``.``, ``..``, a hidden file or a flag), then letters, digits, ``.``, ``_``, ``-``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,119}")


def check_name(name: object) -> str | None:
    """Why ``name`` cannot be a path or topic-name part, or None when it can."""
    if isinstance(name, str) and NAME_PATTERN.fullmatch(name):
        return None
    return (f"{name!r} is part of Kafka topic names and file paths: use 1-120 ASCII letters, digits, "
            "'.', '_' and '-', starting with a letter or digit")


#: The largest config file read (a job config or topology file is a few KB).
MAX_YAML_BYTES = 4 << 20
#: How many nodes aliases may add to a document once expanded: repeating a block is fine; a
#: document of aliases of aliases (nine levels of nine: 387 million nodes from 31 lines) is not.
MAX_ALIAS_NODES = 100_000

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"))


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, minus its silent last-one-wins on a key given twice and its
    unbounded aliases: the node tree is checked before it is constructed, so the error names
    the dotted key and both lines, and a document whose aliases expand past
    :data:`MAX_ALIAS_NODES` is refused before anything walks it."""

    def __init__(self, text: str, file: str, error: type[Exception]) -> None:
        super().__init__(text)
        self.file, self.error = file, error

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}
        if _expanded_size(node, sizes) - len(sizes) > MAX_ALIAS_NODES:
            raise self.error(self.file, "<file>", f"YAML aliases expand to more than {MAX_ALIAS_NODES} nodes beyond "
                                                  "the file's own; write the repeated parts out")
        _refuse_duplicate_keys(node, self.file, self.error, seen=set())
        return self.construct_document(node)


_OPEN = -1  # a node whose size is being counted: met again below itself, it is an alias inside its anchor


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` stands for with every alias written out; each distinct node is
    counted once (``sizes``), so the count costs the file's size, not the expansion's. It stops
    growing past the alias budget."""
    known = sizes.get(id(node))
    if known == _OPEN:
        raise _Recursive
    if known is not None:
        return known
    sizes[id(node)] = _OPEN
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, sizes)
        if total > MAX_ALIAS_NODES + len(sizes):
            break
    sizes[id(node)] = total
    return total


class _Recursive(Exception):
    """An alias inside the node its anchor names (a structure that contains itself)."""


def _refuse_duplicate_keys(node: yaml.Node, file: str, error: type[Exception], prefix: str = "", *,
                           seen: set[int]) -> None:
    if id(node) in seen:  # an alias: its keys were checked where its anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, file, error, f"{prefix}[{i}]", seen=seen)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[str, int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key, line = key_node.value, key_node.start_mark.line + 1
        dotted = f"{prefix}.{key}" if prefix else key
        if key in first:
            raise error(file, dotted, f"given twice (lines {first[key]} and {line}); keep one")
        first[key] = line
        _refuse_duplicate_keys(value_node, file, error, dotted, seen=seen)


def _read_config_text(path: Path, error: type[Exception]) -> str:
    """The file's text: a regular file of at most :data:`MAX_YAML_BYTES` (``/dev/zero`` never
    ends, a named pipe waits for a writer), checked before it is opened and again while read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise error(str(path), "<file>", "no such file") from None
    except OSError as e:
        raise error(str(path), "<file>", f"cannot be read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise error(str(path), "<file>", "is a directory; give the YAML file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for is_kind, k in _KINDS if is_kind(st.st_mode)), "not a file")
        raise error(str(path), "<file>", f"is {kind}, not a regular file; give the YAML file")
    if st.st_size > MAX_YAML_BYTES:
        raise error(str(path), "<file>", f"is {st.st_size} bytes; a config file is at most {MAX_YAML_BYTES} bytes")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise error(str(path), "<file>", f"cannot be read: {e.strerror or e}") from None
    if len(raw) > MAX_YAML_BYTES:  # it grew since the stat
        raise error(str(path), "<file>", f"is over {MAX_YAML_BYTES} bytes; a config file is at most {MAX_YAML_BYTES} "
                                         "bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        raise error(str(path), "<file>", f"not a text file ({e.reason} at byte {e.start})") from None


def load_yaml(path: str | Path, root: str = "a mapping", error: type[Exception] = ConfigError) -> dict:
    """The mapping a YAML file holds; ``error`` (naming the file) when it is missing, not a
    regular file of at most :data:`MAX_YAML_BYTES`, not text, not YAML, has a key twice, has
    aliases that expand past :data:`MAX_ALIAS_NODES` nodes or inside their own anchor, or is not
    a mapping (``root`` says what the root should be)."""
    path = Path(path)
    text = _read_config_text(path, error)
    loader = _StrictLoader(text, str(path), error)
    try:
        data = loader.get_single_data()
    except (ConfigError, error):  # a key given twice, already naming it
        raise
    except _Recursive:
        raise error(str(path), "<file>", "an alias inside its own anchor (a structure that contains itself); "
                                         "a config is a tree") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(str(path), "<file>", f"not valid YAML{where}: "
                                         + "; ".join(filter(None, (e.problem, e.context)))) from None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: an int past Python's 4300-digit limit
        raise error(str(path), "<file>", f"not valid YAML: {' '.join(str(e).split())}") from None
    finally:
        loader.dispose()
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
        bounds = f.metadata.get("bounds")
        if bounds is not None:
            _check_bounds(bounds, kwargs[name], file, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(file, where, str(e)) from None


def _check_bounds(bounds: Bounds, value: Any, file: str, key: str) -> None:
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _check_bounds(bounds, v, file, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_bounds(bounds, v, file, f"{key}.{k}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and not bounds.admits(value):
        raise ConfigError(file, key, f"must be {bounds}, got {_short(value)}" + (f" ({bounds.why})" if bounds.why else ""))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


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
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:  # an optional section: its own error names the key inside it
            return _coerce(arms[0], value, file, key)
        errors = []
        for a in arms:
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
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(file, key, f"must be a finite number, got {_short(value)}")
        return number
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    if tp is Any:
        return value
    raise ConfigError(file, key, f"expected {getattr(tp, '__name__', tp)}, got {type(value).__name__} {value!r}")
