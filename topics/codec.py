"""Record encoding: typed messages <-> (JSON bytes, headers).

Values are orjson JSON, readable by any Kafka tool; the type and schema travel in the
``af-type`` / ``af-schema`` headers, so a plain consumer still sees plain JSON.
Decoding is strict: an unknown type, a newer schema, unknown or missing fields raise a
:class:`~.exceptions.DecodeError` subclass (consumers turn those into dead letters).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Union

import orjson

from .exceptions import DecodeError, UnknownMessageType, UnsupportedSchema
from .messages import MESSAGE_TYPES, Message

H_TYPE = "af-type"
H_SCHEMA = "af-schema"
H_TRACE = "traceparent"
H_PRODUCER = "af-producer"

Headers = list[tuple[str, bytes]]


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


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


def decode(value: bytes | None, headers: typing.Iterable[tuple[str, bytes]] | None) -> Message:
    """The typed message a record carries, or a :class:`DecodeError`."""
    raw_type = header(headers, H_TYPE)
    if raw_type is None:
        raise DecodeError("record has no af-type header")
    af_type = raw_type.decode("utf-8", "replace")
    cls = MESSAGE_TYPES.get(af_type)
    if cls is None:
        raise UnknownMessageType(f"unknown af-type {af_type!r} (known: {sorted(MESSAGE_TYPES)})")
    raw_schema = header(headers, H_SCHEMA)
    try:
        schema = int(raw_schema) if raw_schema is not None else 1
    except ValueError:
        raise DecodeError(f"af-schema header {raw_schema!r} is not an integer") from None
    if schema > cls.SCHEMA:
        raise UnsupportedSchema(
            f"{af_type} schema {schema} is newer than this code supports ({cls.SCHEMA}); upgrade astraflow"
        )
    if value is None:
        raise DecodeError(f"{af_type} record has no value")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"value is not JSON: {e}") from None
    return build(cls, data)


def build(cls: type, data: Any) -> Any:
    """Construct dataclass ``cls`` (recursively) from decoded JSON, strictly."""
    if not isinstance(data, dict):
        raise DecodeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    plan = _plan(cls)
    retired = getattr(cls, "RETIRED", frozenset())
    unknown = data.keys() - plan.keys() - retired
    if unknown:
        raise DecodeError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        if name in retired:
            continue
        conv = plan[name]
        kwargs[name] = conv(value) if conv is not None and value is not None else value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise DecodeError(f"{cls.__name__}: {e}") from None


@functools.cache
def _plan(cls: type) -> dict[str, Callable[[Any], Any] | None]:
    hints = typing.get_type_hints(cls)
    return {f.name: _converter(hints[f.name]) for f in dataclasses.fields(cls)}


def _converter(tp: Any) -> Callable[[Any], Any] | None:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _converter(inner[0]) if len(inner) == 1 else None
    if dataclasses.is_dataclass(tp):
        return functools.partial(build, tp)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if dataclasses.is_dataclass(item):
            return lambda seq: [build(item, x) for x in seq]
    return None
