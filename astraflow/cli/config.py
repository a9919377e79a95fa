"""``astraflow config keys | check``: the job config's reference, and a config checked before a run.

``keys`` prints every key of a job config with its default and help (:func:`describe`, read
from the section dataclasses' fields); ``check`` loads a config with its ``--set`` overrides,
then its data rows and model config, so that a bad row or a wrong model path shows now, not
after the job has started. It knows the config only through its dataclasses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing

from .args import UsageError, overrides

__all__ = ["add_parsers", "describe"]


def describe(cls: type | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every key of ``cls`` (default: the job config): the reference
    ``astraflow config keys`` prints. A number's help ends with the range it is loaded within."""
    from astraflow.config import JobConfig  # lazy: the config loads the engines' and topics' names (~2 s)
    cls = cls or JobConfig
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
            help_ = f.metadata.get("help", "") + (f" ({bounds})" if bounds else "")
            rows.append((prefix + f.name, repr(default), help_))
            # an optional section (null by default, e.g. trainer.engine.lora): its keys too
            optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
            section = [a for a in typing.get_args(hint) if optional and dataclasses.is_dataclass(a)]
            if section:
                rows += describe(section[0], prefix + f.name + ".")
    return rows


def _cmd_config(args: argparse.Namespace) -> int:
    if args.action == "keys":
        for key, default, help_ in describe():
            print(f"{key:44} {default:14} {help_}")
        return 0
    if not args.config:
        raise UsageError("check: give the config file")
    from astraflow.checks import check_data, check_model
    from astraflow.config import load_config
    cfg = load_config(args.config, overrides(args.set))
    data, model = check_data(cfg), check_model(cfg)
    print(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    print(f"data: {data}\nmodel: {model}\n{args.config}: valid", file=sys.stderr)
    return 0


def add_parsers(sub) -> None:
    """Add ``config`` to the CLI's subcommands."""
    cf = sub.add_parser("config", help="list every job-config key (keys) or validate a config (check CONFIG)")
    cf.add_argument("action", choices=["keys", "check"])
    cf.add_argument("config", nargs="?")
    cf.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    cf.set_defaults(func=_cmd_config)
