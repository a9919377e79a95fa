"""Publishing fp32 vs bf16 weights to the fp32 CPU engine, side by side in one run.

The trainer trains in fp32; ``trainer.publish_dtype`` says what the rollout engines get.
bf16 halves every element and, because most fp32 updates of one AdamW step do not move
the bf16 rounding, changes far fewer elements per version, so deltas stay sparse instead
of falling back to full tensors. The price is a train–inference mismatch: the engine
samples with rounded weights while the trainer scores the same tokens with its own. This
benchmark measures both sides on the demo job (async, the same seeds, prompts and steps for
both dtypes, the two run alternately in each repetition):

* per published version: payload bytes, changed fraction, publisher encode seconds;
* ``train_inference_logp_gap`` — the trainer's metric of the mismatch alone: mean
  |log p_trainer − log p_behaviour| over tokens generated at the version the trainer held
  (engines/trainer_logprobs.py ``logp_gaps``), per step, its median over a **sync** run
  of the same job (in async mode almost every token is a version or more stale, so the
  metric has nothing to compare on most steps);
* from an async run: steady-state s/step (after step 2) and the final held-out accuracy.

Every number is a median (min–max) over ``--repeats`` repetitions; ratios are paired
within a repetition. Prints one table; writes ``benchmarks/results/publish_dtype.json``.

    python -m astraflow.benchmarks.publish_dtype               # 40 steps, 3 repetitions
    python -m astraflow.benchmarks.publish_dtype --quick       # 6 steps, 1 repetition (smoke)
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from astraflow.benchmarks.async_vs_sync import analyse
from astraflow.benchmarks.job_bench import job_arguments, run_job_once, run_repetitions
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_header

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "publish_dtype.json"
DTYPES = ("float32", "bfloat16")


def weight_stats(run_dir: Path) -> dict:
    """Per-version weight payload numbers and the mismatch metric, medians over the run."""
    rows = read_rows(run_dir)

    def values(name: str) -> list[float]:
        return [float(r["value"]) for r in rows if r["name"] == name]

    delta_bytes, gap = values("weights.delta_bytes"), values("trainer.train_inference_logp_gap")
    if not delta_bytes:
        raise RuntimeError(f"{run_dir}: no weights.delta_bytes metric; was any version published?")
    return {
        "delta_bytes": statistics.median(delta_bytes),
        "delta_changed_frac": statistics.median(values("weights.delta_changed_frac")),
        "delta_encode_s": statistics.median(values("weights.delta_encode_s")),
        "snapshot_bytes": statistics.median(values("weights.snapshot_bytes") or [0.0]),
        "logp_gap": statistics.median(gap) if gap else None,
        "logp_gap_steps": len(gap),
    }


def _run(args, broker, rep: int, dtype: str, mode: str) -> tuple[Path, int]:
    overrides = {"mode": mode, "trainer.steps": args.steps, "eval.every": 0, "trainer.publish_dtype": dtype,
                 "job": f"bench-dtype-{mode}-{dtype}-{int(time.time())}-{rep}"}
    run_dir, cfg = run_job_once(args, broker, rep, overrides, f"publish {dtype}, {mode}")
    return run_dir, cfg.rollout.nodes


def one_repetition(args, broker, rep: int) -> dict:
    """Per dtype: an async run (speed, bytes, accuracy) and a sync run (the mismatch: in sync
    mode every token is generated at the version the trainer holds, so every step has one)."""
    out: dict = {}
    order = DTYPES if rep % 2 == 0 else DTYPES[::-1]  # neither dtype always runs on a warmer box
    for dtype in order:
        load = load_now()
        run_dir, nodes = _run(args, broker, rep, dtype, "async")
        stats = {**analyse(run_dir, nodes), **weight_stats(run_dir), "load_before": load["loadavg"]}
        gap = weight_stats(_run(args, broker, rep, dtype, "sync")[0])
        stats.update(logp_gap=gap["logp_gap"], logp_gap_steps=gap["logp_gap_steps"])
        out[dtype] = stats
    return out


def aggregate(reps: list[dict]) -> dict:
    keys = ("s_per_step", "delta_bytes", "delta_changed_frac", "delta_encode_s", "snapshot_bytes", "accuracy_final",
            "time_to_first_step_s")
    per = {d: {k: spread([r[d][k] for r in reps]) for k in keys} for d in DTYPES}
    for d in DTYPES:
        gaps = [r[d]["logp_gap"] for r in reps if r[d]["logp_gap"] is not None]
        per[d]["logp_gap"] = spread(gaps) if gaps else None
        per[d]["accuracy_initial"] = reps[0][d]["accuracy_initial"]
    f32, b16 = per["float32"], per["bfloat16"]
    return {
        "dtypes": per,
        "bf16_over_fp32_s_per_step": ratio_spread(b16["s_per_step"], f32["s_per_step"]),
        "bf16_over_fp32_delta_bytes": ratio_spread(b16["delta_bytes"], f32["delta_bytes"]),
        "bf16_over_fp32_logp_gap": (ratio_spread(b16["logp_gap"], f32["logp_gap"])
                                    if b16["logp_gap"] and f32["logp_gap"]
                                    and b16["logp_gap"]["n"] == f32["logp_gap"]["n"] else None),
        "load_1m_at_run_start": spread([r[d]["load_before"][0] for r in reps for d in DTYPES]),
    }


def print_table(agg: dict) -> None:
    hdr = (f"{'published':10} {'s/step':>18} {'delta bytes/version':>26} {'changed':>20} {'encode s':>20} "
           f"{'logp gap':>26} {'acc final':>20}")
    print_header(hdr)
    for d in DTYPES:
        r = agg["dtypes"][d]
        gap = fmt_spread(r["logp_gap"], ".2e") if r["logp_gap"] else "–"
        print(f"{d:10} {fmt_spread(r['s_per_step']):>18} {fmt_spread(r['delta_bytes'], ',.0f'):>26} "
              f"{fmt_spread(r['delta_changed_frac'], '.3f'):>20} {fmt_spread(r['delta_encode_s'], '.4f'):>20} "
              f"{gap:>26} {fmt_spread(r['accuracy_final'], '.3f'):>20}")
    for key in ("bf16_over_fp32_s_per_step", "bf16_over_fp32_delta_bytes", "bf16_over_fp32_logp_gap"):
        print(f"{key:30} {fmt_spread(agg[key], '.3f') if agg[key] else '–'}")


def main(argv: list[str] | None = None) -> int:
    args = job_arguments(__doc__.splitlines()[0], RESULTS, argv)
    return run_repetitions("publish_dtype", args, one_repetition, aggregate, print_table)


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Publishing fp32 vs bf16 to the fp32 CPU engine"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``publish_dtype.json``."""
    d = load("publish_dtype")
    if not d:
        return []
    out = [*heading(REPORT_TITLE),
           f"**Publishing fp32 vs bf16 to the fp32 CPU engine** — `python -m astraflow.benchmarks.publish_dtype` "
           f"(the demo job, {d['steps']} steps, the same seeds for both; s/step, bytes and accuracy from an async run, "
           "the train–inference log-prob gap — mean |logp_trainer − logp_behaviour| over tokens generated at the "
           "version the trainer held — from a sync run, where every step has such tokens; median (min–max) of "
           f"{d['repeats']} repetitions{load_note(d)})", "",
           "| published | s/step | delta bytes / version | elements changed | publisher encode s | "
           "train–inference logp gap | accuracy v0 → final |", "|---|---:|---:|---:|---:|---:|---|"]
    for dtype in ("float32", "bfloat16"):
        r = d["dtypes"][dtype]
        gap = _sp(r["logp_gap"], ".1e") if r.get("logp_gap") else "–"
        out.append(f"| {dtype} | {_sp(r['s_per_step'])} | {_sp(r['delta_bytes'], ',.0f')} | "
                   f"{_sp(r['delta_changed_frac'], '.3f')} | {_sp(r['delta_encode_s'], '.3f')} | {gap} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    ratio = d.get("bf16_over_fp32_logp_gap")
    out += ["", f"bf16 / fp32, paired by repetition: s/step {_sp(d['bf16_over_fp32_s_per_step'])}, bytes per "
                f"version {_sp(d['bf16_over_fp32_delta_bytes'])}"
                + (f", log-prob gap {_sp(ratio, ',.0f')}x" if ratio else "") + ".", ""]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
