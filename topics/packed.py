"""Packed number arrays: a trajectory's token ids, log-probs and versions without a Python
object per number.

A ~4 KiB trajectory record holds ~430 numbers. Decoded into lists, each one is a Python
object that is made, type-checked and later freed, and that is most of what consuming a
record costs (plain kafka-python makes none). :class:`Ints`, :class:`Floats` and
:class:`Flags` are ``array.array`` subclasses of one fixed item type each: made from a
record's hex string in one C call, handed to torch and numpy through the buffer
protocol, and list-like where the code reads them (indexing, slicing, iteration, ``len``,
``sum``, ``==`` and ``+`` with lists).

On the wire (:mod:`.codec`) a packed field is a JSON string: the hex of its items'
little-endian bytes (int32, float64, int8). Hex, not base64: ``binascii.a2b_hex`` decodes
about six times as fast per character as ``binascii.a2b_base64`` (~0.35 against ~2.2 ns),
which outweighs its longer strings. A record written before the arrays were packed holds
JSON arrays there; those decode to the same types. This module knows nothing about
messages or Kafka.
"""

from __future__ import annotations

import array
import binascii
import sys
from typing import Any, Iterable

_LITTLE = sys.byteorder == "little"
_new = array.array.__new__
_fromhex = binascii.a2b_hex
_getitem = array.array.__getitem__
_eq = array.array.__eq__
_ne = array.array.__ne__


class Packed(array.array):
    """An ``array.array`` of the subclass's ``TYPECODE`` that compares and concatenates with
    lists as a list of its items would."""

    __slots__ = ()
    TYPECODE = ""
    #: what a failed conversion says the items must be
    ITEMS = ""
    __hash__ = None  # type: ignore[assignment]  # mutable, as the lists it replaces

    def __new__(cls, values: Iterable[Any] = (), *rest: Any) -> "Packed":
        if rest:  # array's own reconstruction (pickle, copy) passes (typecode, items)
            if values != cls.TYPECODE:
                raise TypeError(f"{cls.__name__} has typecode {cls.TYPECODE!r}, not {values!r}")
            return super().__new__(cls, values, *rest)
        if type(values) is str:  # array.array would read a str as unicode items
            raise TypeError(f"{cls.__name__} holds {cls.ITEMS}, not a string")
        return super().__new__(cls, cls.TYPECODE, values)

    @classmethod
    def from_wire(cls, text: str) -> "Packed":
        """The array a record's hex string holds; ``ValueError`` when it is not one."""
        out = _new(cls, cls.TYPECODE, _fromhex(text))
        if not _LITTLE:
            out.byteswap()
        return out

    def to_wire(self) -> str:
        """The hex string of the items' little-endian bytes (what :meth:`from_wire` reads)."""
        if _LITTLE:
            return self.tobytes().hex()
        swapped = array.array(self.typecode, self)
        swapped.byteswap()
        return swapped.tobytes().hex()

    def __getitem__(self, index: Any) -> Any:
        item = _getitem(self, index)
        return type(self)(item) if type(item) is array.array else item  # a slice stays packed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return _eq(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return not self.__eq__(other)
        return _ne(self, other)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, array.array) and other.typecode == self.typecode:
            return type(self)(array.array.__add__(self, other))
        return self.tolist() + list(other)

    def __radd__(self, other: Any) -> Any:
        return list(other) + self.tolist()

    def __iadd__(self, other: Any) -> "Packed":
        self.extend(other)  # any iterable of items, as a list's ``+=`` takes
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"

    def __copy__(self) -> "Packed":
        return type(self)(self)

    def __deepcopy__(self, memo: dict) -> "Packed":
        return type(self)(self)


class Ints(Packed):
    """Token ids, versions: int32."""

    __slots__ = ()
    TYPECODE = "i"
    ITEMS = "integers in int32"


class Floats(Packed):
    """Log-probs: float64 (a Python float, exactly)."""

    __slots__ = ()
    TYPECODE = "d"
    ITEMS = "numbers"


class Flags(Packed):
    """Loss masks, writer indices: int8."""

    __slots__ = ()
    TYPECODE = "b"
    ITEMS = "integers in -128..127"


assert array.array("i").itemsize == 4 and array.array("b").itemsize == 1, "packed arrays need a 4-byte C int"


def packer(cls: type[Packed], where: str, error: type[Exception]):
    """``convert(value) -> cls``: a record's value of a packed field (its hex string, or the
    JSON array of a record written before packing) as ``cls``; anything else raises
    ``error`` naming ``where`` (``Class.field``)."""
    from_wire = cls.from_wire

    def convert(value: Any) -> Packed:
        try:
            if type(value) is str:
                return from_wire(value)
            if type(value) is list:
                return cls(value)
            if type(value) is cls:
                return value
        except (ValueError, TypeError, OverflowError) as e:
            raise error(f"{where}: expected {cls.ITEMS} (a hex string or a JSON array), "
                        f"got {_describe(value)}: {e}") from None
        raise error(f"{where}: expected {cls.ITEMS} (a hex string or a JSON array), got {_describe(value)}")

    convert.cls = cls  # type: ignore[attr-defined]
    return convert


def _describe(value: Any) -> str:
    if type(value) is list:
        return f"a list of {len(value)} ({', '.join(sorted({type(x).__name__ for x in value[:1000]})) or 'nothing'})"
    if type(value) is str:
        return f"a string of {len(value)} characters"
    return type(value).__name__


def wire_default(obj: Any) -> Any:
    """orjson's ``default``: a packed array as its wire string."""
    if isinstance(obj, Packed):
        return obj.to_wire()
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def pack_fields(self: Any) -> None:
    """A dataclass's ``__post_init__`` that converts its packed fields (a list, a tuple) to their
    types; the codec builds such records with the fields already converted."""
    for name, cls in packed_fields(type(self)):
        value = self.__dict__[name]
        if type(value) is not cls:
            object.__setattr__(self, name, cls(value))


_PACKED: dict[type, tuple[tuple[str, type[Packed]], ...]] = {}


def packed_fields(cls: type) -> tuple[tuple[str, type[Packed]], ...]:
    """(field, its packed type) for each of dataclass ``cls``'s packed fields."""
    found = _PACKED.get(cls)
    if found is None:
        import dataclasses
        import typing
        hints = typing.get_type_hints(cls)
        found = _PACKED[cls] = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls)
                                     if isinstance(hints[f.name], type) and issubclass(hints[f.name], Packed))
    return found
