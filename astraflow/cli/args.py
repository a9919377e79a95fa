"""The command line's shared pieces: the one usage error, the parser, and flags several groups take.

A bad command line (an unknown flag, a bad value, a missing or incompatible flag) is a
:class:`UsageError`; :func:`astraflow.cli.main` prints it as one line, the way argparse prints
its own (``astraflow CMD: error: ... (see astraflow CMD --help)``), and exits
:data:`EXIT_USAGE`. This module knows no command.
"""

from __future__ import annotations

import argparse
import re
import sys

import yaml

from astraflow.errors import FatalError
from astraflow.typed_config import check_name

__all__ = ["EXIT_USAGE", "OverrideError", "Parser", "UsageError", "name", "overrides", "reachable", "source_flags",
           "usage_line"]

#: Exit status of a bad command line (argparse's own).
EXIT_USAGE = 2


class UsageError(FatalError, ValueError):
    """The command line is unusable: the message names the flag and what it needs."""


class OverrideError(FatalError, ValueError):
    """A ``--set KEY=VALUE`` pair (or ``env --param``) that is not KEY=VALUE or not YAML.

    An override is config input, so it fails as a bad key of the config file does: a fatal
    error (exit 3), not a usage error.
    """


def usage_line(prog: str, message: str) -> str:
    return f"{prog}: error: {message} (see {prog} --help)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the argument (the usage is one --help away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(usage_line(self.prog, message), file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def name(value: str) -> str:
    """A job, policy or node name from the command line: a safe topic- and path-part."""
    problem = check_name(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def reachable(servers: str, source: str) -> None:
    """A clear error within the bound instead of a client's 30 s timeout and traceback."""
    from astraflow.topics.bootstrap import wait_reachable  # lazy: astraflow.topics loads kafka-python (~1 s)
    wait_reachable(servers, source)


_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def overrides(pairs: list[str] | None) -> dict:
    """``--set KEY=VALUE`` pairs as a mapping of dotted keys to YAML values."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OverrideError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise OverrideError(f"--set {pair}: the value is not YAML ({getattr(e, 'problem', None) or e})") from None
        # YAML 1.1 reads 1e-3 (no dot) as a string; on the command line it means a number.
        out[key] = float(parsed) if isinstance(parsed, str) and _SCIENTIFIC.fullmatch(parsed) else parsed
    return out


def source_flags(parser: argparse.ArgumentParser, run_flag: str = "--run-dir") -> None:
    """Where a reading command finds the job: a live cluster, or a finished run's directory."""
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--bootstrap-servers", help="a live Kafka cluster (or the path of a run dir, as " + run_flag + ")")
    g.add_argument(run_flag, dest="run_dir_log", metavar="RUN", help="a finished run's directory: its Kafka log is "
                   "opened by a broker started (and stopped) for this command, on a free port (docs/run-dir.md)")
