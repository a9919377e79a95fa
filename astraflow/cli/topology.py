"""``astraflow topology check | mirror``: a deployment's topology file, and a region's mirror.

``topology check`` validates a topology file and prints its resolved plan; ``mirror`` runs a
region's MirrorMaker 2 on a multi-host deployment (:mod:`astraflow.topology.mirror_run`).
Handlers import the topology package when they run (about two seconds, with the config).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import overrides

__all__ = ["add_parsers"]


def _cmd_mirror(args: argparse.Namespace) -> int:
    from astraflow.config import install_security, load_config  # lazy: see the module docstring
    from astraflow.topology.mirror_run import run_mirror
    cfg = load_config(args.config, overrides(args.set))
    install_security(cfg, "admin", None)
    return run_mirror(args.topology, cfg, args.region, bootstrap=args.bootstrap_servers,
                      run_dir=args.run_dir or str(Path(cfg.run_dir) / cfg.job))


def _cmd_topology(args: argparse.Namespace) -> int:
    from astraflow.topology.launch import check_topology
    return check_topology(args.file, job=args.job, overrides=overrides(args.set), as_json=args.json)


def add_parsers(sub) -> None:
    """Add ``mirror`` and ``topology`` to the CLI's subcommands."""
    mr = sub.add_parser("mirror", help="a region's MirrorMaker 2 on a multi-host deployment: the job's weights and "
                                       "versions from the home cluster into the region's own (existing) cluster, "
                                       "restarted when it dies, until the trainer is done")
    mr.add_argument("--topology", required=True, help="the topology file (the region's kafka: its bootstrap servers)")
    mr.add_argument("--region", required=True, help="the region with a cluster of its own to mirror into")
    mr.add_argument("--config", required=True, help="the job config (its topics)")
    mr.add_argument("--bootstrap-servers", help="the home cluster as this machine reaches it (default: the job's "
                                                "kafka.bootstrap_servers, else the home region's kafka)")
    mr.add_argument("--run-dir", help="MirrorMaker's config and logs under RUN/regions/REGION/mirror "
                                      "(default: <run_dir>/<job>)")
    mr.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    mr.set_defaults(func=_cmd_mirror)

    tg = sub.add_parser("topology", help="validate a topology file and print its resolved plan (check FILE)")
    tg.add_argument("action", choices=["check"])
    tg.add_argument("file")
    tg.add_argument("--job", help="also check it against this job config (policy, task partitions)")
    tg.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    tg.add_argument("--json", action="store_true", help="the plan as JSON")
    tg.set_defaults(func=_cmd_topology)
