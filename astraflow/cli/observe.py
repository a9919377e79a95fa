"""``astraflow status | runs | track | dashboard``: looking at jobs, live or finished.

``status`` prints a job's state from its topics (:mod:`astraflow.status`); ``runs prune``
bounds the disk finished run dirs take (:mod:`astraflow.runs`); ``track`` feeds a job's
metrics into TensorBoard and MLflow (:mod:`astraflow.tracking`); ``dashboard`` serves its
live page (:mod:`astraflow.dashboard`). This module reads the flags, picks the job and its
sinks, and stops on a signal. Handlers import those modules when they run: each loads
kafka-python and the config (one to two seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import threading
from pathlib import Path

from .args import UsageError, name, source_flags

__all__ = ["add_parsers"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _cmd_status(args: argparse.Namespace) -> int:
    from astraflow.status import format_status, job_status  # lazy: see the module docstring
    s = job_status(args.bootstrap_servers, args.job, tuple(args.policy) if args.policy else None)
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 1 if s["state"] == "unknown" else 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from astraflow.runs import PruneError, parse_age, prune
    try:
        older_than_s = parse_age(args.older_than) if args.older_than else None
    except PruneError as e:
        raise UsageError(str(e)) from None
    if args.keep is not None and args.keep < 0:
        raise UsageError(f"--keep {args.keep}: must be >= 0")
    root = Path(args.root)
    removed = prune(root, keep=args.keep, older_than_s=older_than_s, kafka_only=args.kafka_only, dry_run=args.dry_run)
    for path, n in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {path} ({n / 2**20:.1f} MiB)")
    total = sum(n for _, n in removed) / 2**20
    print(f"{'would free' if args.dry_run else 'freed'} {total:.1f} MiB in {len(removed)} director"
          f"{'y' if len(removed) == 1 else 'ies'} under {root}")
    return 0


def _job(args: argparse.Namespace, cfg) -> str:
    job = args.job or (cfg.job if cfg is not None else None)
    if job is None:
        raise UsageError("give --job (or --config, whose job it is)")
    return job


def _cmd_track(args: argparse.Namespace) -> int:
    """The sinks from the flags (else ``--config``'s ``tracking``, else TensorBoard and a local
    MLflow store), into ``--run-dir`` (else the run dir a run-dir source names, else
    ``<run_dir>/<job>``, where ``astraflow node`` keeps the job's files), fed until the job is
    done, ``--until-idle`` or a signal (SIGINT, SIGTERM, SIGHUP)."""
    from astraflow.config import TrackingConfig, install_security, load_config
    from astraflow.tracking import job_policies_at, open_sinks, track
    cfg = load_config(args.config) if args.config else None
    if cfg is not None:
        install_security(cfg, "admin")
    job = _job(args, cfg)
    tracking = cfg.tracking if cfg is not None and cfg.tracking.enabled else TrackingConfig(tensorboard=True,
                                                                                            mlflow=True)
    if args.tensorboard or args.mlflow:
        tracking = TrackingConfig(tensorboard=args.tensorboard, mlflow=args.mlflow or False)
    tracking = dataclasses.replace(tracking, experiment=args.experiment or tracking.experiment,
                                   run_name=args.run_name or tracking.run_name)
    source = getattr(args, "run_dir_log", None)  # a run dir given as --bootstrap-servers, opened by main
    out = Path(args.run_dir or source or Path(cfg.run_dir if cfg is not None else "runs") / job)
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if bootstrap is None and not args.run_dir:
            raise UsageError("give --bootstrap-servers (the job's cluster) or --run-dir (a finished run's "
                             "directory, whose Kafka log is read)")
        if bootstrap is None:  # the run dir's own Kafka log, read by a broker of our own
            from astraflow.offline import OfflineBroker
            bootstrap = stack.enter_context(OfflineBroker(out))
        policies = job_policies_at(bootstrap, job)  # before anything is written
        out.mkdir(parents=True, exist_ok=True)
        sinks = stack.enter_context(open_sinks(tracking, out, job, source="astraflow track"))
        print(f"tracking job {job} from {args.bootstrap_servers or out} into:", flush=True)
        for line in sinks.where():
            print(f"  {line}", flush=True)
        _stop_on_signals(stack, stop)
        result = track(bootstrap, job, sinks, policies=policies, from_now=args.from_now, until_idle=args.until_idle,
                       settle_s=args.settle, stop=stop.is_set)
    done = ", ".join(f"{p} at version {v}" for p, v in sorted(result.done.items()))
    print(f"track: {result.written} metrics written ({result.reason}"
          + (f"; trainers done: {done}" if done else "")
          + (f"; {result.skipped} undecodable records passed over" if result.skipped else "") + ")", flush=True)
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the page until SIGINT, SIGTERM or SIGHUP."""
    from astraflow.config import load_config
    from astraflow.dashboard import Dashboard, alive_window, topology_regions
    cfg = load_config(args.config) if args.config else None
    job = _job(args, cfg)
    alive_s = args.alive_s or (alive_window(cfg.rollout.heartbeat_s) if cfg is not None else 15.0)
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        regions = topology_regions(args.topology) if args.topology else None
        # (a run dir given as --run-dir is opened by main: args.bootstrap_servers is its broker)
        dash = stack.enter_context(Dashboard(args.bootstrap_servers, job, host=args.host, port=args.port,
                                             alive_s=alive_s, regions=regions, wait_for_job_s=args.wait))
        print(f"dashboard of job {job}: {dash.url}  (Ctrl-C stops it)", flush=True)
        _stop_on_signals(stack, stop)
        stop.wait()
    return 0


def _stop_on_signals(stack: contextlib.ExitStack, stop: threading.Event) -> None:
    """``stop`` is set on SIGINT, SIGTERM or SIGHUP until ``stack`` closes (then the previous handlers)."""
    for sig in _STOP_SIGNALS:
        previous = signal.signal(sig, lambda *_: stop.set())
        stack.callback(signal.signal, sig, previous)


def add_parsers(sub) -> None:
    """Add ``status``, ``runs``, ``track`` and ``dashboard`` to the CLI's subcommands."""
    st = sub.add_parser("status", help="a job's state (running, done, failed, ...), versions per policy, "
                                       "components, task lag and trainer time")
    source_flags(st)
    st.add_argument("--job", required=True, type=name)
    st.add_argument("--policy", action="append", type=name, help="only this policy (repeatable; default: every "
                                                                   "policy of the job)")
    st.add_argument("--json", action="store_true", help="the status as JSON, for scripts")
    st.set_defaults(func=_cmd_status)

    ru = sub.add_parser("runs", help="finished run directories: prune (bound the disk they take)")
    ru.add_argument("action", choices=["prune"])
    ru.add_argument("--root", default="runs", help="the directory holding the run dirs (the config's run_dir; "
                                                   "default: runs)")
    which = ru.add_mutually_exclusive_group(required=True)
    which.add_argument("--keep", type=int, metavar="N", help="keep the newest N runs, prune the others")
    which.add_argument("--older-than", metavar="D", help="prune runs older than D (30m, 12h, 7d, 2w)")
    ru.add_argument("--kafka-only", action="store_true", help="remove only their Kafka logs and checkpoints (the "
                                                              "HF model, summary, metrics and plot stay)")
    ru.add_argument("--dry-run", action="store_true", help="print what would be removed")
    ru.set_defaults(func=_cmd_runs)

    tk = sub.add_parser("track", help="a job's metrics into TensorBoard event files and an MLflow run, read from "
                                      "its metrics topic (for jobs no launcher follows: node --topology)")
    tk.add_argument("--job", type=name, help="the job (default: --config's)")
    tk.add_argument("--bootstrap-servers", help="the job's Kafka cluster (default: the Kafka log of --run-dir, "
                                                "a finished run's directory)")
    tk.add_argument("--run-dir", metavar="RUN", help="where tensorboard/ and mlruns/ go (default: <run_dir>/<job>, "
                                                     "as astraflow node's)")
    tk.add_argument("--config", help="the job's config: its tracking section and run_dir")
    tk.add_argument("--tensorboard", action="store_true", help="TensorBoard event files (RUN/tensorboard)")
    tk.add_argument("--mlflow", nargs="?", const=True, metavar="URI", help="an MLflow run: a local file store "
                                                                           "RUN/mlruns, or at the tracking URI")
    tk.add_argument("--experiment", help="the MLflow experiment (default: the job name)")
    tk.add_argument("--run-name", help="the MLflow run's name (default: RUN's name)")
    tk.add_argument("--from-now", action="store_true", help="only metrics written from now on (default: the "
                                                            "topic from its beginning)")
    tk.add_argument("--until-idle", type=float, metavar="S", help="also stop after S seconds without a metric")
    tk.add_argument("--settle", type=float, default=60.0, metavar="S",
                    help="once every trainer is done, wait at most S seconds for the final evaluation (default 60)")
    tk.set_defaults(func=_cmd_track)

    db = sub.add_parser("dashboard", help="a live page of a job: reward, held-out accuracy, versions, staleness, "
                                          "trainer wait, the RaaS pool, weights, dead letters (from its topics)")
    db.add_argument("--job", type=name, help="the job (default: --config's)")
    db.add_argument("--config", help="the job's config (its job name and heartbeat interval)")
    source_flags(db)
    db.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1; 0.0.0.0 "
                                                        "for every interface)")
    db.add_argument("--port", type=int, default=8050, help="the port to serve on (default 8050; 0: a free one)")
    db.add_argument("--topology", help="the job's topology file: nodes grouped by region, each region's lag")
    db.add_argument("--alive-s", type=float, metavar="S", help="a node whose newest heartbeat is older than S "
                    "seconds shows as gone (default: 3 heartbeat intervals of --config plus 1 s, else 15)")
    db.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the job's "
                                                                         "topics to exist (default: none)")
    db.set_defaults(func=_cmd_dashboard)
