"""What each rollout–trainer correction does, on a real model with a real mismatch.

SmolLM2-135M-Instruct learns chat-formatted sums (``examples/smollm2_chat_arithmetic.yaml``)
with its rollout engine in **bf16** (``rollout.engine.dtype: bf16``: weights and forward in
bfloat16, as a GPU engine runs) against the fp32 trainer — a gap of ~0.04 nats a token on
this model, where an fp32 engine agrees to 1e-5. One arm per correction
(``trainer.engine.correction``: none, tis, mis_token, mis_seq, icepop; ``--arms`` adds
geo_seq), each trained from the same seeds (the same prompts, held-out problems and
sampling draws: paired), in one process per run (``inprocess_loop.run``: the job's own
episode runner, trainer and evaluator, weights copied straight into the engine; synchronous,
so every token's gap is the engine's mismatch, no staleness). The arms of a seed run in a
rotated order, so slow drift of this shared box spreads over all of them.

Per arm and seed: the gap metrics the trainer reports each step (``behav_logp_gap`` mean
and p99, the ratio's p1/p50/p99: medians over steps; the masked and capped token shares:
means over steps) and held-out greedy accuracy at v0 and at the last version, with the
rise's standard error paired over problems. Per arm: the final accuracy's and the rise's
mean over seeds with their standard error over seeds. Prints one table; writes
``benchmarks/results/off_policy.json`` (``arms``: one entry per correction).

    python -m astraflow.benchmarks.off_policy [--steps 10] [--seeds 0 1 2] [--arms ...] [--out J]
    python -m astraflow.benchmarks.off_policy --quick     # the tiny model, 2 steps, 1 seed (smoke)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.lib.table import print_header
from astraflow.benchmarks.report_format import Loader, heading, load_note

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "off_policy.json"
CONFIG = ROOT / "examples" / "smollm2_chat_arithmetic.yaml"
QUICK_CONFIG = ROOT / "examples" / "arithmetic_grpo.yaml"

#: arm -> ``trainer.engine.correction`` (None: off); the published defaults of each method
ARMS: dict[str, dict | None] = {
    "none": None,
    "tis": {"method": "tis", "cap": 2.0},
    "mis_token": {"method": "mis_token", "lo": 0.5, "hi": 2.0},
    "mis_seq": {"method": "mis_seq", "lo": 0.5, "hi": 2.0},
    "icepop": {"method": "icepop", "lo": 0.5, "hi": 5.0},
    "geo_seq": {"method": "geo_seq", "lo": 0.9, "hi": 1.1},
}
DEFAULT_ARMS = ("none", "tis", "mis_token", "mis_seq", "icepop")
#: per-step trainer metrics summarised by their median over steps
GAP_KEYS = ("behav_logp_gap", "behav_logp_gap_p99", "rollout_ratio_p01", "rollout_ratio_p50", "rollout_ratio_p99")
#: per-step token shares summarised by their mean over steps
SHARE_KEYS = ("correction_masked_frac", "correction_capped_frac")


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def one_run(config: Path, arm: str, seed: int, steps: int, threads: int, dtype: str,
            overrides: dict[str, Any]) -> dict[str, Any]:
    """One arm at one seed, in this process: the figures of ``ARMS[arm]``'s run."""
    from astraflow.benchmarks.inprocess_loop import run
    from astraflow.config import load_config

    sets = {"mode": "sync", "trainer.steps": steps, "seed": seed, "data.seed": seed,
            "rollout.engine.dtype": dtype, "trainer.engine.correction": ARMS[arm], **overrides}
    cfg = load_config(str(config), sets)
    t0 = time.perf_counter()
    result = run(cfg, steps, threads)
    wall = time.perf_counter() - t0
    per_step = [r["train"] for r in result["per_step"]]
    first, last = result["accuracy_curve"][0], result["accuracy_curve"][-1]
    n = len(first["per_problem"]) or cfg.eval.problems
    changes = [b - a for a, b in zip(first["per_problem"], last["per_problem"])]
    out: dict[str, Any] = {
        "seed": seed, "steps": steps, "problems": n, "wall_s": round(wall, 1), "s_per_step": result["s_per_step"],
        "accuracy_v0": first["accuracy"], "accuracy_final": last["accuracy"],
        "se_final": math.sqrt(last["accuracy"] * (1 - last["accuracy"]) / n) if n else 0.0,
        "rise": last["accuracy"] - first["accuracy"],
        "se_rise_paired": _se(changes) if changes else None,
        "reward_first": result["per_step"][0]["reward"], "reward_last": result["per_step"][-1]["reward"],
    }
    for key in GAP_KEYS:
        values = [m[key] for m in per_step if key in m]
        out[key] = statistics.median(values) if values else None
    for key in SHARE_KEYS:
        values = [m[key] for m in per_step if key in m]
        out[key] = statistics.fmean(values) if values else None
    return out


def summarise_arm(runs: list[dict]) -> dict[str, Any]:
    """Mean and standard error over seeds of the final accuracy and the rise; spreads of the gaps."""
    finals, rises = [r["accuracy_final"] for r in runs], [r["rise"] for r in runs]
    out: dict[str, Any] = {
        "seeds": len(runs),
        "accuracy_v0_mean": statistics.fmean(r["accuracy_v0"] for r in runs),
        "accuracy_final_mean": statistics.fmean(finals), "accuracy_final_se": _se(finals),
        "rise_mean": statistics.fmean(rises), "rise_se": _se(rises),
        "s_per_step": spread([r["s_per_step"] for r in runs]),
    }
    for key in (*GAP_KEYS, *SHARE_KEYS):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            out[key] = spread(values)
    return out


def print_table(data: dict) -> None:
    print_header(f"{'correction':<10} {'gap mean':>9} {'gap p99':>8} {'ratio p1–p99':>14} {'masked':>7} "
                 f"{'acc v0':>7} {'acc final ± SE':>15} {'rise ± SE':>14} {'s/step':>17}")
    for arm, a in data["arms"].items():
        s = a["summary"]
        masked = s.get("correction_masked_frac", s.get("correction_capped_frac"))
        masked_txt = f"{masked['median']:.4f}" if masked else "—"
        print(f"{arm:<10} {s['behav_logp_gap']['median']:>9.4f} {s['behav_logp_gap_p99']['median']:>8.3f} "
              f"{s['rollout_ratio_p01']['median']:>6.3f}–{s['rollout_ratio_p99']['median']:<6.3f} {masked_txt:>7} "
              f"{s['accuracy_v0_mean']:>7.3f} {s['accuracy_final_mean']:>7.3f} ± {s['accuracy_final_se']:.3f} "
              f"{s['rise_mean']:>+6.3f} ± {s['rise_se']:.3f} {fmt_spread(s['s_per_step'], '.1f'):>17}")
    print(f"({data['seeds_run']} seed(s) per arm, {data['steps']} steps, rollout {data['rollout_dtype']} vs fp32 "
          f"trainer; 'masked' is tis's capped share; SE over seeds)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=sorted(ARMS))
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the run (rollout and training in turn)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="the rollout engine's dtype")
    ap.add_argument("--eval-problems", type=int, default=0, help="held-out problems (0: the config's)")
    ap.add_argument("--quick", action="store_true", help="the tiny model, 2 steps, 1 seed, 2 arms (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.quick:
        args.config, args.steps, args.seeds = QUICK_CONFIG, 2, args.seeds[:1]
        args.arms = args.arms[:2]
        overrides.update({"eval.problems": 16})
    if args.eval_problems:
        overrides["eval.problems"] = args.eval_problems
    load_before = load_now()
    per_arm: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for i, seed in enumerate(args.seeds):
        order = args.arms[i % len(args.arms):] + args.arms[:i % len(args.arms)]
        for arm in order:
            r = one_run(args.config, arm, seed, args.steps, args.threads, args.dtype, overrides)
            per_arm[arm].append(r)
            print(f"  seed {seed} {arm:<10} acc {r['accuracy_v0']:.3f} -> {r['accuracy_final']:.3f}, gap "
                  f"{r['behav_logp_gap']:.4f}, masked {r['correction_masked_frac']}, {r['wall_s']:.0f} s",
                  file=sys.stderr, flush=True)
    data = {
        "benchmark": "off_policy",
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "rollout_dtype": args.dtype, "trainer_dtype": "fp32", "steps": args.steps, "seeds_run": len(args.seeds),
        "threads": args.threads, "mode": "sync (in-process: inprocess_loop.run)",
        "arms": {arm: {"correction": ARMS[arm], "runs": runs, "summary": summarise_arm(runs)}
                 for arm, runs in per_arm.items()},
    }
    print_table(data)
    write_results(args.out, data, load_before)
    return 0


REPORT_TITLE = "Rollout-trainer corrections on a real mismatch"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``off_policy.json`` (none for a smoke run)."""
    d = load("off_policy")
    if not d or not d.get("config", "").endswith("smollm2_chat_arithmetic.yaml"):
        return []
    out = [*heading(REPORT_TITLE),
           f"**{REPORT_TITLE}** — `python -m astraflow.benchmarks.off_policy` (SmolLM2-135M-Instruct on chat "
           f"sums, rollout engine in {d['rollout_dtype']} against the {d['trainer_dtype']} trainer, {d['steps']} "
           f"synchronous steps in one process, {d['seeds_run']} seeds paired across arms; gap and ratio: medians "
           f"over steps, then median (min–max) over seeds; masked/capped: mean share of tokens; accuracy: held-out "
           f"greedy, mean ± SE over seeds{load_note(d)})", "",
           "| correction | gap mean | gap p99 | ratio p1 – p99 | tokens masked (tis: capped) | accuracy v0 | "
           "final ± SE | rise ± SE |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm, a in d["arms"].items():
        s = a["summary"]
        share = s.get("correction_masked_frac") or s.get("correction_capped_frac")
        out.append(f"| {arm} | {fmt_spread(s['behav_logp_gap'], '.4f')} | {fmt_spread(s['behav_logp_gap_p99'], '.3f')} "
                   f"| {s['rollout_ratio_p01']['median']:.3f} – {s['rollout_ratio_p99']['median']:.3f} "
                   f"| {format(share['median'], '.4f') if share else '–'} | {s['accuracy_v0_mean']:.3f} "
                   f"| {s['accuracy_final_mean']:.3f} ± {s['accuracy_final_se']:.3f} "
                   f"| {s['rise_mean']:+.3f} ± {s['rise_se']:.3f} |")
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
