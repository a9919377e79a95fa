"""Scalar type checks for message fields, compiled once per field from its type hint.

The codec builds records straight from JSON, so without these a field declared ``float``
could hold a string (a forged reward ``"x"`` reached the dataflow's arithmetic and failed
there, six times, then the process). :func:`checker` turns a hint into a predicate the
codec runs on every decoded value: ``str``, ``int`` (not ``bool``, not ``1.0``), ``float``
(an ``int`` or a ``float``; JSON has no NaN and orjson refuses numbers that overflow to
infinity, so a decoded float is always finite), ``bool``, optional, lists and string-keyed
dicts of those. Lists of numbers, the bulk of a trajectory, are checked by summing them
(a C loop: a string or a null raises, one float in a list of ints makes the total a float;
``true``/``false`` count as the 1 and 0 Python says they are, which no bound is fooled
by). Fields holding records are the codec's own business (it builds them, and refuses a
null where the field is not optional); ``Any`` is not checked.

It knows nothing about Kafka or about what a field means: bounds that depend on meaning
are the message classes' ``validate`` methods (:mod:`.messages`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Callable, Union

#: ``check(value) -> bool``: whether ``value`` has the field's type
Check = Callable[[Any], bool]


def checker(tp: Any) -> Check | None:
    """The predicate for values of type hint ``tp``, or None when anything goes (``Any``,
    a record or a list of records: the codec builds and checks those itself)."""
    if tp is Any or dataclasses.is_dataclass(tp):
        return None
    if tp is str:
        return _is_str
    if tp is bool:
        return _is_bool
    if tp is int:
        return _is_int
    if tp is float:
        return _is_number
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            return None
        item = checker(inner[0])
        if item is None:
            return None
        return lambda v: v is None or item(v)
    if origin is list:
        (item_tp,) = args or (Any,)
        if dataclasses.is_dataclass(item_tp):
            return None
        if item_tp is int:
            return _int_list
        if item_tp is float:
            return _number_list
        item = checker(item_tp)
        if item is None:
            return _is_list
        if item is _is_str:
            return _str_list
        return lambda v: type(v) is list and all(item(x) for x in v)
    if origin is dict:
        value_tp = args[1] if len(args) == 2 else Any
        item = checker(value_tp)
        if item is None:
            return _is_dict
        if item is _is_str:
            return _str_dict
        return lambda v: type(v) is dict and all(item(x) for x in v.values())
    return None


#: The checks whose test :func:`expression` can write inline, as source with ``{v}`` for the value
#: (a ``TypeError`` it raises means "no", as in the functions themselves).
_INLINE = {
    "_is_str": "type({v}) is str", "_is_bool": "type({v}) is bool", "_is_int": "type({v}) is int",
    "_is_number": "type({v}) in _NUMBER", "_is_list": "type({v}) is list", "_is_dict": "type({v}) is dict",
    "_int_list": "type({v}) is list and type(sum({v})) is int",
    "_number_list": "type({v}) is list and type(sum({v})) in _NUMBER",
    # an empty one (the common case: a one-role group's roles) without a generator
    "_str_list": "type({v}) is list and (not {v} or all(type(x) is str for x in {v}))",
    "_str_dict": "type({v}) is dict and (not {v} or all(type(x) is str for x in {v}.values()))",
}


def all_of(fields: tuple[tuple[str, Check], ...]) -> Callable[[dict], bool]:
    """One predicate over a decoded record's dict: whether every ``(field, check)`` holds.

    The same tests as calling each check in turn, compiled into one function so a record
    costs one call instead of one per field; it may raise ``TypeError`` where a check would
    answer no (the caller then asks the checks one by one which field failed)."""
    env: dict[str, Any] = {}
    source = f"def all_of(d):\n    return {all_of_source(fields, env, 'd')}\n"
    exec(compile(source, f"<fieldcheck.all_of {', '.join(n for n, _ in fields)}>", "exec"), env)
    return env["all_of"]


def all_of_source(fields: tuple[tuple[str, Check], ...], env: dict[str, Any], record: str) -> str:
    """:func:`all_of`'s test as a Python expression over the dict named ``record``; the names
    it needs are added to ``env`` (the namespace it is compiled in)."""
    env["_NUMBER"] = (int, float)
    terms = []
    for i, (name, check) in enumerate(fields):
        value = f"{record}[{name!r}]"
        inline = _INLINE.get(getattr(check, "__name__", ""))
        if inline is not None and globals().get(check.__name__) is check:
            terms.append(f"({_inline(inline, f'_v{i}', value)})")
        else:  # a compound check (optional, list or dict of something): called as it is
            env[f"_check{i}"] = check
            terms.append(f"_check{i}({value})")
    return " and ".join(terms) or "True"


def _inline(template: str, var: str, value: str) -> str:
    """``template`` with its first ``{v}`` binding ``var`` to ``value`` and the rest reading ``var``."""
    first = template.index("{v}")
    return template[:first] + f"({var} := {value})" + template[first + 3:].replace("{v}", var)


def describe(value: Any) -> str:
    """A short account of a value that failed its check (never the whole of a huge value)."""
    if type(value) is list:
        kinds = sorted({type(x).__name__ for x in value[:1000]})
        return f"a list of {len(value)} ({', '.join(kinds) or 'nothing'})"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) is float or type(v) is int


def _is_list(v: Any) -> bool:
    return type(v) is list


def _is_dict(v: Any) -> bool:
    return type(v) is dict


def _str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _str_dict(v: Any) -> bool:
    return type(v) is dict and all(type(x) is str for x in v.values())


def _int_list(v: Any) -> bool:
    # sum's C loop: a string or a null raises, a float makes the total a float
    try:
        return type(v) is list and type(sum(v)) is int
    except TypeError:
        return False


def _number_list(v: Any) -> bool:
    try:
        return type(v) is list and type(sum(v)) in (int, float)
    except TypeError:
        return False
