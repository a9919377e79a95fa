"""``astraflow chaos SCENARIO.yaml``: a job run under a fault schedule, then audited.

The runner is :mod:`astraflow.chaos.runner`; this module reads the flags and turns the
report into the exit status: 0 iff the job completed, the conservation audit passed and
every node ended on the trainer's weights; 1 otherwise (the table and the report JSON say
why). ``--check`` only validates the scenario file. The chaos package is imported when the
command runs.
"""

from __future__ import annotations

import argparse

__all__ = ["add_parsers"]


def _cmd_chaos(args: argparse.Namespace) -> int:
    if args.check:
        from astraflow.chaos.scenario import load_scenario  # lazy: see the module docstring
        sc = load_scenario(args.scenario)
        kinds = [f.kind for f in sc.faults] + ([f"random({', '.join(sc.random.kinds)})"] if sc.random else [])
        print(f"{args.scenario}: valid ({sc.brokers} broker(s), job {sc.job_config}, faults: {', '.join(kinds)})")
        return 0
    from astraflow.chaos.runner import run_scenario
    report = run_scenario(args.scenario, run_dir=args.run_dir, bootstrap=args.bootstrap_servers,
                          progress=not args.quiet, report_path=args.report)
    return 0 if report["ok"] else 1


def add_parsers(sub) -> None:
    """Add ``chaos`` to the CLI's subcommands."""
    ch = sub.add_parser("chaos", help="run a job under a fault schedule (kills, stops, broker restarts, "
                                      "partitions, ...), then audit that nothing was lost or duplicated")
    ch.add_argument("scenario", help="a scenario YAML (see chaos/scenarios/)")
    ch.add_argument("--report", help="also write the report JSON here (it is always in the run dir)")
    ch.add_argument("--run-dir", help="run directory (default: <run_dir>/chaos-<scenario>-<time>)")
    ch.add_argument("--bootstrap-servers", help="use an existing cluster (no broker, partition or disk faults)")
    ch.add_argument("--check", action="store_true", help="only validate the scenario file")
    ch.add_argument("--quiet", action="store_true", help="print nothing but errors")
    ch.set_defaults(func=_cmd_chaos)
