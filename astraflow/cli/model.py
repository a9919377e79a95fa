"""``astraflow model | replay | export``: the tiny model, and what a job's topics recorded.

``model`` is the tiny-model bootstrap (:mod:`astraflow.models.bootstrap`, its own flags);
``replay`` re-trains a job from its recorded batches (:mod:`astraflow.replay`): bit for bit,
or a what-if lineage with ``--set``; ``export`` writes its trajectories as Parquet or, with
``--model``, a trained version as a Hugging Face model directory. Handlers import those
packages when they run (torch among them: seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from .args import UsageError, name, overrides, source_flags

__all__ = ["add_parsers"]


def _cmd_model(args: argparse.Namespace) -> int:
    from astraflow.models.bootstrap import main as model_main  # lazy: see the module docstring
    return model_main(args.args)


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
    md = sub.add_parser("model", help="tiny-model bootstrap (`astraflow model init --help`)")
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
    ex.add_argument("--version", type=int, help="with --model: the version (default: the newest announced)")
    ex.add_argument("--base-model", help="with --model: the HF dir whose config and tokenizer go with the weights "
                                         "(default: the job's model from --config, else the run dir's own exports)")
    ex.add_argument("--config", help="with --model: the job's config file (names its model)")
    ex.add_argument("--policy", action="append", type=name, help="policy to export (repeatable; default: all)")
    ex.add_argument("--tokenizer", help="HF tokenizer dir to decode token ids where the record holds no text")
    ex.set_defaults(func=_cmd_export)
