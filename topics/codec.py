"""Record encoding: typed messages <-> (JSON bytes, headers).

Values are orjson JSON, readable by any Kafka tool; the type and schema travel in the
``af-type`` / ``af-schema`` headers, so a plain consumer still sees plain JSON.
Decoding is strict: an unknown type, a newer schema, unknown or missing fields, a field
that should hold a record (or a list of them) but does not, a value of the wrong scalar
type (:mod:`.fieldcheck`) and a record its class's ``validate`` refuses (a bound: lengths
that must agree, a step below 0) raise a :class:`~.exceptions.DecodeError` subclass
(consumers turn those into dead letters, so no component meets such a record).

Decoding is on every consumer's hot path, so each message class gets a :class:`_Builder`
once: a record written by this code (every field, in field order) becomes its message
with no copy, the dict orjson made becoming the instance's ``__dict__``, through a
function compiled for its class (its field checks fused into one expression,
:func:`_fast_path`); anything else takes the general checked path, which also puts fields in class order (orjson encodes a
dataclass in ``__dict__`` order, so a message decoded and sent on keeps its bytes).
"""

from __future__ import annotations

import array
import binascii
import dataclasses
import functools
import sys
import types
import typing
from typing import Any, Callable, Union

import orjson

from .exceptions import DecodeError, InvalidRecord, UnknownMessageType, UnsupportedSchema
from .fieldcheck import Check, all_of, all_of_source, checker, describe
from .messages import MESSAGE_TYPES, Message
from .packed import pack_fields, packed_fields, packer, wire_default

H_TYPE = "af-type"
H_SCHEMA = "af-schema"
H_TRACE = "traceparent"
H_PRODUCER = "af-producer"

Headers = list[tuple[str, bytes]]


def dumps(obj: Any) -> bytes:
    """JSON bytes; a packed number array (:mod:`.packed`) becomes its hex string."""
    return orjson.dumps(obj, default=wire_default, option=orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | memoryview | str) -> Any:
    return orjson.loads(data)


def encode(msg: Message, producer: str = "") -> tuple[bytes, Headers]:
    """The value bytes and the type headers of ``msg``."""
    if type(msg).TYPE not in MESSAGE_TYPES:
        raise TypeError(f"{type(msg).__name__} is not a registered message type")
    headers: Headers = [(H_TYPE, msg.TYPE.encode()), (H_SCHEMA, str(msg.SCHEMA).encode())]
    if producer:
        headers.append((H_PRODUCER, producer.encode()))
    return dumps(msg), headers


def header(headers: typing.Iterable[tuple[str, bytes]] | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


#: (af-type, af-schema) header values already checked -> the builder of their class. Bounded:
#: forged records could name endless spellings of an accepted schema (``b"01"``, ``b"-7"``).
_checked: dict[tuple[Any, Any], "_Builder"] = {}
_CHECKED_MAX = 256
_ABSENT = object()  #: a header the record does not have (a header's value may be null)


def decode(value: bytes | None, headers: typing.Iterable[tuple[str, bytes]] | None) -> Message:
    """The typed message a record carries, or a :class:`DecodeError`."""
    raw_type = raw_schema = _ABSENT  # the first of each counts, as with :func:`header`
    for k, v in headers or ():
        if k == H_TYPE:
            if raw_type is _ABSENT:
                raw_type = v
        elif k == H_SCHEMA and raw_schema is _ABSENT:
            raw_schema = v
    builder = _checked.get((raw_type, raw_schema)) or _check(raw_type, raw_schema)
    if value is None:
        raise DecodeError(f"{builder.cls.TYPE} record has no value")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"value is not JSON: {e}") from None
    return builder.fast(data)


def _check(raw_type: Any, raw_schema: Any) -> "_Builder":
    """The builder for records with these header values, or the :class:`DecodeError` they deserve."""
    if raw_type is _ABSENT:
        raise DecodeError("record has no af-type header")
    if raw_type is None:
        raise DecodeError("record's af-type header has no value")
    af_type = raw_type.decode("utf-8", "replace")
    cls = MESSAGE_TYPES.get(af_type)
    if cls is None:
        raise UnknownMessageType(f"unknown af-type {af_type!r} (known: {sorted(MESSAGE_TYPES)})")
    try:
        schema = 1 if raw_schema is _ABSENT else int(raw_schema)
    except (TypeError, ValueError):
        raise DecodeError(f"af-schema header {raw_schema!r} is not an integer") from None
    if schema > cls.SCHEMA:
        raise UnsupportedSchema(
            f"{af_type} schema {schema} is newer than this code supports ({cls.SCHEMA}); upgrade astraflow"
        )
    builder = _builder(cls)
    if len(_checked) < _CHECKED_MAX:
        _checked[(raw_type, raw_schema)] = builder
    return builder


def build(cls: type, data: Any) -> Any:
    """Construct dataclass ``cls`` (recursively) from decoded JSON, strictly.

    ``data`` is taken over, not copied: its dicts may become the new objects' attributes.
    """
    return _builder(cls).fast(data)


_new = object.__new__
_set = object.__setattr__


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _Builder:
    """How to turn a decoded JSON object into dataclass ``cls``, worked out once per class."""

    cls: type
    names: tuple[str, ...]  #: every field, in class order
    known: frozenset[str]  #: the same, as a set
    required: frozenset[str]  #: fields without a default
    defaults: dict[str, Callable[[], Any]]  #: field -> its default (a factory, or a constant's getter)
    retired: frozenset[str]  #: accepted and dropped (:attr:`Message.RETIRED`)
    #: fields holding records: (field, builder, whether a list of them)
    nested: tuple[tuple[str, "_Builder", bool, bool], ...]  #: ... and whether it may be null
    #: whether an instance is just its fields in ``__dict__`` (the generated ``__init__``,
    #: no ``__post_init__``, no slots): then it is made without calling ``__init__``
    direct: bool
    #: packed number arrays (:mod:`.packed`): (field, ``convert(value)`` from its wire form)
    packed: tuple[tuple[str, Callable[[Any], Any]], ...]
    checks: tuple[tuple[str, Check], ...]  #: (field, its scalar type check), for fields that have one
    all_checks: Callable[[dict], bool]  #: all of ``checks`` in one call (:func:`.fieldcheck.all_of`)
    validate: bool  #: whether the class has a ``validate`` method (its bounds) to call on each instance
    #: ``__call__`` for records as this code writes them, compiled for the class (:func:`_fast_path`);
    #: it hands any other record to ``__call__``
    fast: Callable[[Any], Any] = dataclasses.field(init=False)

    def __call__(self, data: Any) -> Any:
        if type(data) is not dict:
            raise DecodeError(f"{self.cls.__name__}: expected a JSON object, got {type(data).__name__}")
        if tuple(data) != self.names:  # not as this code writes it: check and order the fields
            data = self._complete(data)
        try:
            ok = self.all_checks(data)
        except TypeError:
            ok = False
        if not ok:
            self._refuse(data)
        for name, convert in self.packed:
            data[name] = convert(data[name])
        for name, builder, many, optional in self.nested:
            value = data[name]
            if value is None:
                if optional:
                    continue
                raise InvalidRecord(f"{self.cls.__name__}.{name}: expected "
                                    f"{'a JSON array' if many else 'a JSON object'}, got null")
            if not many:
                data[name] = builder(value)
            elif type(value) is list:
                data[name] = [builder(x) for x in value]
            else:
                raise DecodeError(f"{self.cls.__name__}.{name}: expected a JSON array, got {type(value).__name__}")
        if self.direct:
            obj = _new(self.cls)
            _set(obj, "__dict__", data)
        else:
            try:
                obj = self.cls(**data)
            except TypeError as e:
                raise DecodeError(f"{self.cls.__name__}: {e}") from None
        if self.validate:
            try:
                obj.validate()
            except ValueError as e:
                raise InvalidRecord(f"{self.cls.__name__}: {e}") from None
        return obj

    def _refuse(self, data: dict) -> None:
        """Raise the :class:`InvalidRecord` of the first field whose check fails."""
        for name, check in self.checks:
            if not check(data[name]):
                raise InvalidRecord(f"{self.cls.__name__}.{name}: expected {self.hints[name]}, got "
                                    f"{describe(data[name])}")
        # unreachable while the fused checks say what the checks say (a test holds them to it); if
        # they ever did not, the record is still refused, as a record, not as a crash of its reader
        raise InvalidRecord(f"{self.cls.__name__}: a field failed its type check")

    @property
    def hints(self) -> dict[str, str]:
        """Field -> its type as the error names it (only worked out for an error)."""
        return {f.name: str(f.type) for f in dataclasses.fields(self.cls)}

    def _complete(self, data: dict) -> dict:
        """``data``'s fields in class order with the defaults of those it lacks; unknown or
        missing required fields raise :class:`DecodeError`."""
        keys = data.keys()
        unknown = keys - self.known - self.retired
        if unknown:
            raise DecodeError(f"{self.cls.__name__}: unknown field(s) {sorted(unknown)}")
        missing = self.required - keys
        if missing:
            raise DecodeError(f"{self.cls.__name__}: missing field(s) {sorted(missing)}")
        return {name: data[name] if name in data else self.defaults[name]() for name in self.names}


@functools.cache
def _builder(cls: type) -> _Builder:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    defaults: dict[str, Callable[[], Any]] = {}
    for f in fields:
        if f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory
        elif f.default is not dataclasses.MISSING:
            defaults[f.name] = functools.partial(_same, f.default)
    nested = tuple((f.name, *n) for f in fields if (n := _nested(hints[f.name])) is not None)
    # a ``__post_init__`` that only packs number arrays does what the builder does itself
    direct = (all(f.init for f in fields) and getattr(cls, "__post_init__", pack_fields) is pack_fields
              and not hasattr(cls, "__slots__") and cls.__dataclass_params__.init)
    packed = tuple((name, packer(p, f"{cls.__name__}.{name}", InvalidRecord)) for name, p in packed_fields(cls))
    names = tuple(f.name for f in fields)
    checks = tuple((f.name, c) for f in fields if (c := checker(hints[f.name])) is not None)
    builder = _Builder(cls, names, frozenset(names), frozenset(names) - defaults.keys(),
                       defaults, frozenset(getattr(cls, "RETIRED", frozenset())), nested, direct,
                       packed, checks, all_of(checks), callable(getattr(cls, "validate", None)))
    _set(builder, "fast", _fast_path(builder))
    return builder


def _fast_path(b: _Builder) -> Callable[[Any], Any]:
    """``b.__call__`` as one function compiled for its class, for the record this code writes
    (every field, in class order, each of its type): the same checks and the same message,
    without a call per field or per check. Any other record, or one that fails a check, is
    handed to ``b.__call__`` untouched, which orders it or says what is wrong with it; a
    class that must be made through its ``__init__`` always is."""
    if not b.direct:
        return b
    env: dict[str, Any] = {"NAMES": b.names, "CLS": b.cls, "slow": b, "new": _new, "set_": _set,
                           "InvalidRecord": InvalidRecord}
    test = all_of_source(b.checks, env, "data")
    lines = ["def fast(data):",
             "    if type(data) is not dict or tuple(data) != NAMES:",
             "        return slow(data)",
             "    try:",
             f"        ok = {test}",
             "    except TypeError:",
             "        ok = False"]
    shapes, builds = [], []  # every nested field's shape is checked before any is built
    for i, (name, nested, many, optional) in enumerate(b.nested):
        env[f"build{i}"] = nested.fast
        value = f"data[{name!r}]"
        shape = f"type({value}) is {'list' if many else 'dict'}"
        shapes.append(f"({value} is None or {shape})" if optional else shape)
        build = f"[build{i}(x) for x in {value}]" if many else f"build{i}({value})"
        builds.append(f"    if {value} is not None:\n        data[{name!r}] = {build}" if optional
                      else f"    data[{name!r}] = {build}")
    lines += [f"    if not (ok and {' and '.join(shapes) or 'True'}):",
              "        return slow(data)"]
    # packed arrays: a hex string of a little-endian host in one C call (an empty one: none);
    # any other value, or a bad one, by the slow path
    if b.packed:
        env.update(new_array=array.array.__new__, fromhex=binascii.a2b_hex)
        lines.append("    try:")
        for i, (name, convert) in enumerate(b.packed):
            env[f"P{i}"], env[f"pack{i}"] = convert.cls, convert
            value = f"data[{name!r}]"
            if sys.byteorder == "little":
                tc = convert.cls.TYPECODE
                made = f"(new_array(P{i}, {tc!r}, fromhex(_p)) if _p else new_array(P{i}, {tc!r}))"
                lines.append(f"        {value} = {made} if type(_p := {value}) is str else pack{i}(_p)")
            else:
                lines.append(f"        {value} = pack{i}({value})")
        lines += ["    except (ValueError, InvalidRecord):", "        return slow(data)"]
    lines += [*builds,
              "    obj = new(CLS)",
              "    set_(obj, '__dict__', data)"]
    if b.validate:
        lines += ["    try:",
                  "        obj.validate()",
                  "    except ValueError as e:",
                  f"        raise InvalidRecord({b.cls.__name__ + ': '!r} + str(e)) from None"]
    lines.append("    return obj")
    exec(compile("\n".join(lines) + "\n", f"<codec fast path of {b.cls.__qualname__}>", "exec"), env)
    return env["fast"]


def _same(value: Any) -> Any:
    return value


def _nested(tp: Any, optional: bool = False) -> tuple[_Builder, bool, bool] | None:
    """The builder for a field of type ``tp`` that holds records (or a list of them), whether
    it is a list, and whether the field may be null (``X | None``)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _nested(inner[0], type(None) in typing.get_args(tp)) if len(inner) == 1 else None
    if dataclasses.is_dataclass(tp):
        return _builder(tp), False, optional
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if dataclasses.is_dataclass(item):
            return _builder(item), True, optional
    return None
