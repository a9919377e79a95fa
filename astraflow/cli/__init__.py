"""astraflow: RL post-training of LLMs as autonomous components that share only Kafka topics.

The command line: :func:`main` assembles the parser from one module per command group
(:mod:`.broker`, :mod:`.acl`, :mod:`.run`, :mod:`.topology`, :mod:`.observe`, :mod:`.config`,
:mod:`.model`, :mod:`.env`, :mod:`.chaos`), each adding its subcommands and owning their
handlers, and is the one place that turns an error into an exit status:

- 0: done; 130: interrupted (Ctrl-C);
- 2 (:data:`~.args.EXIT_USAGE`): a bad command line, argparse's or a handler's
  :class:`~.args.UsageError`, one line naming the flag;
- 1: a retriable failure (a broker unreachable, Kafka's answer, a run that crashed) or a
  check that did not pass (``status`` of an unknown job, a diverged replay, a failed chaos run);
- 3 (:data:`~astraflow.errors.EXIT_FATAL`): a fatal error of the input or the run (a bad
  config or ``--set``, bad data, a missing model, a failed audit): retrying fails the same way.

Handlers import the machinery they run (torch, Kafka, the config) when they run, so that
``--help`` and ``astraflow broker status`` stay instant.
"""

from __future__ import annotations

import argparse
import sys

from astraflow import __version__

from . import acl, broker, chaos, config, env, k8s, model, observe, run, topology
from .args import EXIT_USAGE, Parser, UsageError, reachable, usage_line
from .args import overrides as _overrides  # noqa: F401 - the name benchmarks/replay_whatif.py and tests import
from .run import done_line

__all__ = ["build_parser", "done_line", "main"]

_GROUPS = (broker, acl, run, topology, k8s, observe, config, model, env, chaos)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="astraflow", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"astraflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in _GROUPS:
        group.add_parsers(sub)
    for command in sub.choices.values():  # where main reports a handler's UsageError
        command.set_defaults(usage_prog=command.prog)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from astraflow.offline import offline  # lazy: kafka-python (about a second)
        with offline(args):  # a run dir's log instead of a live cluster
            if getattr(args, "bootstrap_servers", None) and getattr(args, "probe_bootstrap", True):
                reachable(args.bootstrap_servers, "--bootstrap-servers")
            return args.func(args)
    except KeyboardInterrupt:
        return 130
    except UsageError as e:
        print(usage_line(args.usage_prog, str(e)), file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - a CLI reports errors as one clear line
        from astraflow.errors import EXIT_FATAL, AstraflowError, one_line
        if type(e).__module__.split(".")[0] == "kafka":  # the cluster's answer, not a bug here
            print(f"astraflow: error: Kafka at {getattr(args, 'bootstrap_servers', None) or 'the cluster'}: "
                  f"{type(e).__name__}: {one_line(e)}", file=sys.stderr, flush=True)
            return 1
        if not isinstance(e, AstraflowError):
            raise
        log_path = getattr(e, "log_path", None)
        if log_path:
            print(f"astraflow: {getattr(e, 'node_id', None) or 'job'} stopped; its log: {log_path}", file=sys.stderr)
        detail = str(e).strip().splitlines()[1:]
        if detail:  # what the error carries below its first line (a broker's log tail), before the cause
            print("\n".join(detail), file=sys.stderr)
        # The cause is the last line: that is where a user (and a launcher) looks.
        print(f"astraflow: error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1 if e.retriable else EXIT_FATAL
