"""``astraflow run | node | launch``: running a job, one component of it, or a topology's deployment.

``run`` starts a whole job on this machine (:mod:`astraflow.launcher`), ``launch`` one
deployment of a topology file, ``node`` one component process (or a host's share of a
topology) against any cluster. This module reads the flags, checks the ones that must go
together, and prints a run's last word (:func:`done_line`). Handlers import the launcher and
the config when they run: together about two seconds, which ``--help`` should not pay.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .args import UsageError, name, overrides, reachable

__all__ = ["add_parsers", "done_line"]


def done_line(summary: dict, lead: str) -> str:
    """The run's last word on what it learnt: held-out accuracy from -> to. For a team: the
    team's first (the job's result), the lead policy's alone beside it, then every policy's
    mean role reward in the held-out team evaluation (what each policy contributes, the
    lead's included), each from its first to its last measured version; then each
    ``eval.dataset`` set's greedy pass@1 (GSM8K-100, HumanEval) at the versions it was measured
    at; then the conservation audit's verdict, when the run audited."""
    fmt = lambda curve: " -> ".join(f"v{v}:{a:.3f}" for v, a in curve.items()) or "not measured"  # noqa: E731
    head = f"done: {summary['steps_trained']} versions in {summary['wall_s']:.0f}s; held-out accuracy"
    team = summary.get("team_accuracy_by_version")
    if team is None:
        line = f"{head} {fmt(summary['accuracy_by_version'])}"
    else:
        line = (f"{head} of the team {fmt(_ends(team))}; of {lead} alone "
                f"{fmt(_ends(summary['accuracy_by_version']))}")
        roles = summary.get("policy_reward_by_version") or {}
        if roles:
            line += "; held-out role reward " + ", ".join(f"of {p} {fmt(_ends(curve))}" for p, curve in roles.items())
    for name, curve in (summary.get("dataset_accuracy_by_version") or {}).items():  # eval.dataset's sets
        line += f"; {name} {fmt({v: at['accuracy'] for v, at in curve.items() if 'accuracy' in at})}"
    return _with_audit(line, summary)


def _ends(curve: dict) -> dict:
    """The first and the last point of a curve keyed by version (as ints or their strings)."""
    if len(curve) <= 2:
        return dict(curve)
    keys = sorted(curve, key=int)
    return {keys[0]: curve[keys[0]], keys[-1]: curve[keys[-1]]}


def _with_audit(line: str, summary: dict) -> str:
    from astraflow.job_audit import audit_line
    verdict = audit_line(summary)
    return f"{line}; {verdict}" if verdict else line


def _audit_exit(summary: dict) -> int:
    """A finished run whose audit failed exits non-zero, the cause as its last line."""
    if summary.get("audit", {}).get("ok") is False:
        from astraflow.job_audit import AuditFailed, Verdict
        a = summary["audit"]
        failed = [d for d in a.get("during", []) if not d["ok"]] or [a["final"]]
        raise AuditFailed(Verdict.from_dict(failed[0]))
    return 0


def _interrupted(summary: dict) -> bool:
    if summary["interrupted"]:
        print(f"interrupted after {summary['steps_trained']} versions; everything stopped. "
              f"run dir: {summary['run_dir']}")
    return summary["interrupted"]


def _cmd_run(args: argparse.Namespace) -> int:
    from astraflow.config import load_config  # lazy: see the module docstring
    from astraflow.launcher import run_job
    cfg = load_config(args.config, overrides(args.set))
    if not args.bootstrap_servers and cfg.kafka.bootstrap_servers:
        reachable(cfg.kafka.bootstrap_servers, f"kafka.bootstrap_servers of {args.config}")
    summary = run_job(cfg, bootstrap=args.bootstrap_servers or cfg.kafka.bootstrap_servers,
                      overrides=args.set or [], run_dir=args.run_dir, progress=not args.quiet,
                      dashboard=args.dashboard)
    if _interrupted(summary):
        return 130
    print(done_line(summary, cfg.lead_policy))
    for component, d in summary.get("emulated", {}).items():
        calls = ", ".join(f"{call} {s.get('modelled_s', 0):.1f} s (CPU {100 * s.get('cpu_fraction', 0):.0f}% of holds)"
                          for call, s in d.items() if isinstance(s, dict))
        print(f"EMULATED {component} on {d['profile']} x{d['devices']:g}: modelled {calls}")
    for policy, path in summary.get("models", {}).items():
        print(f"trained model ({policy}, Hugging Face): {path}")
    print(f"run dir: {summary['run_dir']}")
    return _audit_exit(summary)


def _cmd_launch(args: argparse.Namespace) -> int:
    from astraflow.config import load_config
    from astraflow.launcher import launch
    summary = launch(args.topology, load_config(args.job, overrides(args.set)), overrides=args.set or [],
                     run_dir=args.run_dir, bootstrap=args.bootstrap_servers, progress=not args.quiet,
                     dashboard=args.dashboard, backend=args.backend)
    if _interrupted(summary):
        return 130
    d = summary["device_hours"]
    print(_with_audit(f"done: {summary['steps_trained']} versions in {summary['wall_s']:.0f}s; device-hours "
                      f"{d['total']:.4f} (rollout {d['rollout']:.4f}, trainer {d['trainer']:.4f}), "
                      f"cost {d['cost']:.4f}", summary))
    slurm = summary.get("slurm")
    if slurm is not None:
        jobs = ", ".join(f"{n} {'/'.join(ids)}" for n, ids in slurm["jobs"].items())
        hours = slurm["device_hours"]
        print(f"slurm jobs: {jobs}" + (f"; device-hours by Slurm's accounting {hours['total']:.4f}" if hours else ""))
    print(f"run dir: {summary['run_dir']}")
    return _audit_exit(summary)


def _cmd_node(args: argparse.Namespace) -> int:
    from astraflow.topology.processes import watch_launcher
    from astraflow.trainer_group import FlagError, is_rank_process
    if not is_rank_process():  # first thing: a launcher may die while this one still imports (a rank watches its agent)
        watch_launcher(args.node_id or f"node-{os.getpid()}")
    from astraflow.config import install_security, load_config
    from astraflow.node import run_node
    cfg = load_config(args.config, overrides(args.set))
    # (run_node installs its role's again; a trainer group's agent and a host's launcher need one first)
    install_security(cfg, args.role if args.role in ("raas", "trainer", "dataflow") else "admin", args.policy)
    if args.topology or args.host:
        if not (args.topology and args.host):
            raise UsageError("--topology and --host go together: the file, and which of its hosts this is")
        placed = [f for f in ("role", "node_id", "nnodes", "node_rank", "master_addr", "master_port")
                  if getattr(args, f) is not None]
        if placed:
            raise UsageError(f"--{placed[0].replace('_', '-')} places one node; with --topology the file places "
                            f"every node of --host {args.host}")
        from astraflow.topology.launch import run_host
        return run_host(args.topology, cfg, args.host, bootstrap=args.bootstrap_servers,
                        run_dir=args.run_dir or str(Path(cfg.run_dir) / cfg.job), overrides=args.set or [])
    if args.role is None:
        raise UsageError("--role is required (or --topology FILE --host NAME to start a host's share of a topology)")
    if args.policy is not None:
        if args.policy not in cfg.policy_names:
            raise UsageError(f"--policy {args.policy}: no such policy in {args.config} "
                            f"(policies: {', '.join(cfg.policy_names)})")
        if args.role == "trainer" and cfg.trainer_process_of(args.policy) != args.policy:
            host = cfg.trainer_process_of(args.policy)
            raise UsageError(f"--policy {args.policy}: {args.config} trains it in {host!r}'s trainer process "
                             f"(policies.{args.policy}.trainer.process): start --role trainer --policy {host}")
        cfg = cfg.view(args.policy)
    elif len(cfg.policy_names) > 1 and args.role != "dataflow":
        raise UsageError(f"--role {args.role} serves one policy: give --policy (one of {', '.join(cfg.policy_names)})")
    bootstrap = args.bootstrap_servers or cfg.kafka.bootstrap_servers
    if not bootstrap:
        raise UsageError("--bootstrap-servers is required (or kafka.bootstrap_servers in the config)")
    run_dir = args.run_dir or str(Path(cfg.run_dir) / cfg.job)
    group = {"nnodes": args.nnodes, "node_rank": args.node_rank, "master_addr": args.master_addr,
             "master_port": args.master_port}
    given = {k: v for k, v in group.items() if v is not None}
    reach = lambda: reachable(bootstrap, "--bootstrap-servers" if args.bootstrap_servers  # noqa: E731
                              else f"kafka.bootstrap_servers of {args.config}")  # the flags first, then the cluster
    if args.role != "trainer":
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise UsageError(f"{flags} place trainer ranks; --role {args.role} takes none")
        reach()
        return run_node(args.role, cfg, bootstrap, run_dir, args.node_id)
    from astraflow import trainer_group
    try:
        topo = trainer_group.Topology(cfg.trainer.ranks, **given)
    except FlagError as e:  # the placing flags' values: a bad command line
        raise UsageError(str(e)) from None
    reach()
    if topo.world_size > 1 and not trainer_group.is_rank_process():
        return trainer_group.run_trainer_group(cfg, topo, bootstrap=bootstrap, run_dir=run_dir,
                                               node_id=args.node_id or f"trainer-{os.getpid()}",
                                               overrides=args.set or [])
    return run_node(args.role, cfg, bootstrap, run_dir, args.node_id)


def add_parsers(sub) -> None:
    """Add ``run``, ``node`` and ``launch`` to the CLI's subcommands."""
    rn = sub.add_parser("run", help="run a job: broker, dataflow, trainer and RaaS node processes, progress, run dir")
    rn.add_argument("config")
    rn.add_argument("--bootstrap-servers", help="use an existing Kafka cluster (starts no broker)")
    rn.add_argument("--run-dir", help="run directory (default: <run_dir>/<job>-<time>)")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    rn.add_argument("--quiet", action="store_true", help="no progress bar")
    rn.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                    help="serve the job's live dashboard while it runs (on PORT; default: a free port; the URL "
                         "is printed at start)")
    rn.set_defaults(func=_cmd_run)

    nd = sub.add_parser("node", help="run one component against any Kafka cluster (multi-host deployments)")
    nd.add_argument("--role", choices=["dataflow", "raas", "trainer"])
    nd.add_argument("--topology", help="a topology file: start every node it places on --host (and the "
                                       "autoscaler, if it lives there) instead of one --role")
    nd.add_argument("--host", help="with --topology: which of its hosts this is")
    nd.add_argument("--config", required=True)
    nd.add_argument("--bootstrap-servers")
    nd.add_argument("--run-dir", help="checkpoints and traces (default: <run_dir>/<job>)")
    nd.add_argument("--node-id", type=name, help="stable id (RaaS: its transactional id; default: role-pid)")
    nd.add_argument("--policy", type=name, help="multi-policy jobs: which policy this trainer / RaaS node serves")
    nd.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    tr = nd.add_argument_group(
        "trainer ranks", "a trainer world of trainer.ranks x --nnodes > 1 makes this process its host's group "
                         "agent: it starts the host's ranks with torch's launcher (node ids <node-id>.rank<R>) "
                         "and exits when any of them fails; restart every host's agent to resume the group "
                         "from its checkpoint, which needs a --run-dir shared by all hosts")
    tr.add_argument("--nnodes", type=int, help="hosts running trainer ranks, one agent each (default 1)")
    tr.add_argument("--node-rank", type=int,
                    help="this host's index, 0..nnodes-1; its ranks are node-rank x trainer.ranks + 0.. (default 0)")
    tr.add_argument("--master-addr", help="host 0's address, reachable from every host (default 127.0.0.1)")
    tr.add_argument("--master-port", type=int,
                    help="host 0's rendezvous port, the same on every host; required with --nnodes > 1 "
                         "(default 0: a free port, one host only)")
    # (its flags are checked before the cluster is probed: main leaves --bootstrap-servers to it)
    nd.set_defaults(func=_cmd_node, probe_bootstrap=False)

    la = sub.add_parser("launch", help="run a job on the deployment a topology file describes, every node as a "
                                       "process of this machine (the autoscaler acts when the topology enables it)")
    la.add_argument("topology")
    la.add_argument("job")
    la.add_argument("--bootstrap-servers", help="use an existing Kafka cluster (starts no broker)")
    la.add_argument("--run-dir", help="run directory (default: <run_dir>/<job>-<time>)")
    la.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    la.add_argument("--backend", choices=["local", "slurm"], default="local",
                    help="local: every node a process of this machine; slurm: every node a Slurm batch job (sbatch, "
                         "the topology's slurm section and each pool's slurm resources), resubmitted when it dies, the "
                         "autoscaler's nodes too (docs/clusters.md)")
    la.add_argument("--quiet", action="store_true", help="no progress bar")
    la.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                    help="serve the job's live dashboard while it runs, nodes grouped by region (on PORT; default: "
                         "a free port; the URL is printed at start)")
    la.set_defaults(func=_cmd_launch)
