"""What a topic payload is: the :class:`Message` base, the ``af-type`` registry, shared field checks.

Every message is a frozen dataclass with a class-level ``TYPE`` (the ``af-type`` header)
and ``SCHEMA`` (the ``af-schema`` header, bumped on any incompatible change);
:func:`register` adds a class to :data:`MESSAGE_TYPES`, which maps ``af-type`` to class.
The codec checks every field's scalar type against its annotation; a class's
``validate()`` adds the bounds only its meaning gives, with the checks here (lists that must
be as long as each other, ids and steps that cannot be negative, sampling settings), and
raises ``ValueError`` naming the field: decoding turns that into a dead letter. Bounds that
need a component's knowledge (the model's vocabulary, the trainer's last step) are checked by
that component. The message shapes themselves live in :mod:`.messages` and
:mod:`.control_messages`; encoding in :mod:`.codec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

__all__ = ["MESSAGE_TYPES", "Message", "check_sampling", "non_negative", "register", "same_length"]

MESSAGE_TYPES: dict[str, type["Message"]] = {}


def non_negative(name: str, values: Sequence[int]) -> None:
    if values and min(values) < 0:
        raise ValueError(f"{name} holds {min(values)}; ids, versions and steps are >= 0")


def check_sampling(sampling: dict[str, Any]) -> None:
    """The sampling keys engines read, when present: numbers in their ranges."""
    for key, lo, hi, whole in (("temperature", 0.0, None, False), ("top_p", 0.0, 1.0, False),
                               ("top_k", 0, None, True), ("max_new_tokens", 1, None, True)):
        if key not in sampling:
            continue
        v = sampling[key]
        if type(v) not in ((int,) if whole else (int, float)) or v < lo or (hi is not None and v > hi) \
                or (key == "top_p" and v == 0):
            raise ValueError(f"sampling[{key!r}] is {v!r:.40}; it is {'an int' if whole else 'a number'} "
                             f">= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    # a role call's stop sequences (GenerationRequest): stop strings and stop token ids
    stop = sampling.get("stop")
    if stop is not None and (type(stop) is not list or not all(type(x) is str and x for x in stop)):
        raise ValueError(f"sampling['stop'] is {stop!r:.60}; it is a list of non-empty strings")
    ids = sampling.get("stop_token_ids")
    if ids is not None and (type(ids) is not list or not all(type(x) is int and x >= 0 for x in ids)):
        raise ValueError(f"sampling['stop_token_ids'] is {ids!r:.60}; it is a list of token ids (ints >= 0)")


def same_length(name: str, values: Sequence, other: str, n: int, may_be_empty: bool = False) -> None:
    if len(values) != n and not (may_be_empty and not values):
        raise ValueError(f"{name} has {len(values)} entries but {other} has {n}"
                         + ("; leave it empty or give one per entry" if may_be_empty else ""))


def register(cls: type["Message"]) -> type["Message"]:
    """Class decorator: add a message class to :data:`MESSAGE_TYPES` under its ``TYPE``."""
    if cls.TYPE in MESSAGE_TYPES:
        raise ValueError(f"af-type {cls.TYPE!r} registered twice")
    MESSAGE_TYPES[cls.TYPE] = cls
    return cls


@dataclass(frozen=True)
class Message:
    """Base of all topic payloads."""

    TYPE: ClassVar[str] = ""
    SCHEMA: ClassVar[int] = 1
    #: Fields this type no longer has that records written before may still carry: accepted
    #: and ignored on decode, never written (removing a field breaks no reader either way).
    RETIRED: ClassVar[frozenset[str]] = frozenset()
