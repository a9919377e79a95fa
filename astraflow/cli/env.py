"""``astraflow env serve``: a registered environment served over HTTP for agent episodes elsewhere.

The server is :class:`astraflow.workflows.http_env.EnvServer` (the protocol:
docs/agentic.md); this module picks the environment from the flags, serves it until SIGINT
or SIGTERM and says what it served. The workflows package is imported when the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import threading

from .args import UsageError, overrides

__all__ = ["add_parsers"]


def _cmd_env(args: argparse.Namespace) -> int:
    from astraflow.workflows.api import get_environment  # lazy: the workflows and their libraries
    from astraflow.workflows.http_env import EnvServer
    params = overrides(args.param)
    if args.module:
        importlib.import_module(args.module)
    try:
        get_environment(args.env)
    except KeyError as e:
        raise UsageError(f"--env: {e.args[0]}") from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the address is printed: a caller may signal at once
        signal.signal(sig, lambda *_: stop.set())
    server = EnvServer(args.env, params, host=args.host, port=args.port, idle_s=args.idle_s).start()
    print(f"environment {args.env!r} served at {server.address}", flush=True)
    stop.wait()
    stats = server.stats()
    server.close()
    print(f"stopped: {stats['started']} sessions started, {stats['finished']} finished, "
          f"cancelled {stats['cancelled'] or 0}", flush=True)
    return 0


def add_parsers(sub) -> None:
    """Add ``env`` to the CLI's subcommands."""
    ev = sub.add_parser("env", help="serve a registered environment over HTTP for agent episodes elsewhere "
                                    "(`env serve --env NAME`; the protocol: docs/agentic.md)")
    ev.add_argument("action", choices=["serve"])
    ev.add_argument("--env", required=True, help="the registered environment (e.g. text_game)")
    ev.add_argument("--module", help="a module to import first (one that registers --env)")
    ev.add_argument("--param", action="append", metavar="KEY=VALUE", help="a keyword of the environment's factory "
                                                                          "(YAML value; repeatable)")
    ev.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    ev.add_argument("--port", type=int, default=0, help="the port (default 0: a free one, printed at start)")
    ev.add_argument("--idle-s", type=float, default=300.0, metavar="S", help="cancel a session idle for S "
                                                                             "seconds (default 300)")
    ev.set_defaults(func=_cmd_env)
