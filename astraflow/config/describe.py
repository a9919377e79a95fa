"""The config reference ``astraflow config keys`` prints: every key of a job, its default and help.

It reads the sections' declarations (:func:`astraflow.typed_config.setting`) and nothing else;
it knows no key by name but ``source`` (set by the loader, not by a user).
"""

from __future__ import annotations

import dataclasses
import typing

from .job import JobConfig


def describe(cls: type = JobConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every key: the config reference `astraflow config keys` prints. A number's
    help ends with the range it is loaded within."""
    rows = []
    for f in dataclasses.fields(cls):
        if cls is JobConfig and f.name == "source":
            continue
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows += describe(hint, prefix + f.name + ".")
        else:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = "(required)"
            bounds = f.metadata.get("bounds")
            rows.append((prefix + f.name, repr(default), f.metadata.get("help", "") + (f" ({bounds})" if bounds else "")))
    return rows
