"""Sparse-delta bytes per version against the learning rate, side by side in one run.

A bf16 sparse delta carries only the elements whose bf16 value changed since the last
published version. How many change per version is set by the optimizer's step against the
bf16 spacing of each weight: AdamW moves every element by about ``lr`` per step, and a bf16
value changes only when its fp32 master has moved half a bf16 step (a relative 2^-9). The
seed's ~1/20 of a full snapshot per update comes from an 8B model at lr ~1e-6; the demo's
tiny model learns at ``trainer.engine.lr`` 2e-4, where about half its elements change per
step. This benchmark measures that trade on the demo job (async, ``examples/arithmetic_grpo.yaml``):
for each learning rate in ``--lrs`` (the same seeds, prompts and steps; the order rotates per
repetition), with bf16 deltas:

* ``delta_bytes`` (the median compressed delta per version), ``delta_changed_frac`` (the
  median fraction of elements a delta carries) and ``snapshot_bytes`` (a full compressed bf16
  snapshot), all from the trainer's own metrics;
* ``delta_over_snapshot`` = delta_bytes / snapshot_bytes, paired within a repetition: the
  issue's goal is <= 1/20;
* ``accuracy_final`` (held-out, the last version) against ``accuracy_initial``: what the
  learning rate buys in ``--steps`` steps.

Bytes are what the trainer publishes per version, the same in a region's own cluster (a
mirrored delta crosses once) and at home, so the run needs no link. Every number is a median
(min-max) over ``--repeats`` repetitions. Prints one table; writes
``benchmarks/results/delta_sparsity.json``.

    python -m astraflow.benchmarks.delta_sparsity              # 40 steps x 4 lrs x 3 repetitions
    python -m astraflow.benchmarks.delta_sparsity --quick      # 6 steps, 1 repetition (smoke)
"""

from __future__ import annotations

import time
from pathlib import Path

from astraflow.benchmarks.async_vs_sync import analyse
from astraflow.benchmarks.job_bench import job_arguments, run_job_once, run_repetitions
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.lib.table import print_header
from astraflow.benchmarks.publish_dtype import weight_stats

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "delta_sparsity.json"
#: the issue's goal: a delta per version at most this share of a full bf16 snapshot
GOAL = 1 / 20


def _lrs(args) -> list[str]:
    return [x.strip() for x in args.lrs.split(",") if x.strip()]


def _run(args, broker, rep: int, lr: str) -> dict:
    overrides = {"mode": "async", "trainer.steps": args.steps, "eval.every": 0, "trainer.publish_dtype": "bfloat16",
                 "trainer.engine.lr": float(lr), "job": f"bench-sparsity-{lr}-{int(time.time())}-{rep}"}
    load = load_now()
    run_dir, cfg = run_job_once(args, broker, rep, overrides, f"lr {lr}")
    stats = {**analyse(run_dir, cfg.rollout.nodes), **weight_stats(run_dir), "load_before": load["loadavg"]}
    stats["delta_over_snapshot"] = stats["delta_bytes"] / stats["snapshot_bytes"] if stats["snapshot_bytes"] else None
    return stats


def one_repetition(args, broker, rep: int) -> dict:
    lrs = _lrs(args)
    k = rep % len(lrs)
    order = lrs[k:] + lrs[:k]  # no learning rate always runs first on a cold box
    return {lr: _run(args, broker, rep, lr) for lr in order}


KEYS = ("delta_bytes", "delta_changed_frac", "snapshot_bytes", "delta_over_snapshot", "accuracy_final", "s_per_step")


def aggregate(reps: list[dict]) -> dict:
    lrs = list(reps[0])
    per = {}
    for lr in lrs:
        per[lr] = {k: spread([r[lr][k] for r in reps if r[lr][k] is not None]) for k in KEYS}
        per[lr]["accuracy_initial"] = reps[0][lr]["accuracy_initial"]
        per[lr]["meets_goal"] = per[lr]["delta_over_snapshot"]["median"] <= GOAL
    return {"goal_delta_over_snapshot": GOAL, "by_lr": per,
            "load_1m_at_run_start": spread([r[lr]["load_before"][0] for r in reps for lr in lrs])}


def print_table(agg: dict) -> None:
    hdr = (f"{'lr':>8} {'delta bytes/version':>28} {'changed':>22} {'delta/snapshot':>22} {'goal':>5} "
           f"{'acc initial':>11} {'acc final':>22} {'s/step':>18}")
    print_header(hdr)
    for lr, r in sorted(agg["by_lr"].items(), key=lambda kv: -float(kv[0])):
        print(f"{lr:>8} {fmt_spread(r['delta_bytes'], ',.0f'):>28} {fmt_spread(r['delta_changed_frac'], '.3f'):>22} "
              f"{fmt_spread(r['delta_over_snapshot'], '.3f'):>22} {'yes' if r['meets_goal'] else 'no':>5} "
              f"{r['accuracy_initial']:>11.3f} {fmt_spread(r['accuracy_final'], '.3f'):>22} "
              f"{fmt_spread(r['s_per_step']):>18}")
    print(f"goal: a delta per version <= {agg['goal_delta_over_snapshot']:.3f} of a full bf16 snapshot")


def main(argv: list[str] | None = None) -> int:
    args = job_arguments(__doc__.splitlines()[0], RESULTS, argv, extra=lambda ap: ap.add_argument(
        "--lrs", default="2e-4,5e-5,1e-5,5e-6", help="trainer learning rates, comma-separated"))
    return run_repetitions("delta_sparsity", args, one_repetition, aggregate, print_table)


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Sparse-delta bytes against the learning rate"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``delta_sparsity.json`` (none for a quick run)."""
    d = load("delta_sparsity")
    if not d or d.get("quick"):
        return []
    out = [*heading(REPORT_TITLE),
           f"**Sparse-delta bytes against the learning rate** — `python -m astraflow.benchmarks.delta_sparsity` "
           f"(the demo job, async, bf16 deltas, {d['steps']} steps, the same seeds at every learning rate; median "
           f"(min–max) of {d['repeats']} repetitions{load_note(d)})", "",
           "| lr | delta bytes / version | elements changed | delta / full snapshot | ≤ 1/20 | accuracy v0 → final |",
           "|---:|---:|---:|---:|---|---|"]
    for lr, r in sorted(d["by_lr"].items(), key=lambda kv: -float(kv[0])):
        out.append(f"| {lr} | {_sp(r['delta_bytes'], ',.0f')} | {_sp(r['delta_changed_frac'], '.3f')} | "
                   f"{_sp(r['delta_over_snapshot'], '.3f')} | {'yes' if r['meets_goal'] else 'no'} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
