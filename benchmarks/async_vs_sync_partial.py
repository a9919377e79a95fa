"""Partial rollouts on CPU: the demo with a long-tailed length spread, with and without (``async_vs_sync --partial-rollouts``).

The job is ``examples/arithmetic_long_tail.yaml``: the demo's problems, batch and loss, whose
tiny solver writes a run of dots after its answer of a length it learnt from a log-normal
spread (median 5, one in 20 over 30, capped at 60), so the rows of one engine call end at very
different steps and a call lasts as long as its longest row. Per repetition, ``mode: async``
through ``astraflow run``'s machinery on one embedded broker, twice with the same seeds:

* **without** (``rollout.partial: false``): a version the trainer publishes waits on the RaaS
  node until the call in flight ends;
* **with** (``rollout.partial: true``): the rows in flight stop at their next token, the engine
  loads the version and the same rows go on under it (their KV recomputed, ``engines/cpu.py``).

The arms alternate which goes first from one repetition to the next, so a drift of this shared
machine does not favour one. Per arm, from each run's own metrics: steady s/step (end of step 2
to the last step), the seconds a loaded version waited for the engine per load
(``raas.weights_wait_s`` / ``raas.weights_loads``), rows continued under a newer version and
tokens recomputed (``raas.partial_rows``, ``raas.partial_recomputed_tokens``), the trained tokens'
mean lag behind the step that trains them (``trainer.token_lag_mean``: what partial rollouts
shorten) and the oldest token's (``trainer.staleness_max``: what they leave as it was), the
generated tokens per row, and held-out accuracy at the end. Median (min–max) over
``--repeats``; the with/without ratios paired within a repetition.

Real CPU measurements (the CPU engine and DeepSpeed on this machine's cores), not emulated.
Writes the ``partial_rollouts`` section of ``benchmarks/results/async_vs_sync.json`` (the other
sections stay as measured).
"""

from __future__ import annotations

import time
from pathlib import Path

from astraflow.benchmarks.job_bench import run_job_once, run_repetitions
from astraflow.benchmarks.lib.emulated import last_per_node
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.run_metrics import read_summary, total
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.steady import in_steps, in_time, steady_steps
from astraflow.benchmarks.lib.table import print_header

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "arithmetic_long_tail.yaml"
ARMS = {"without": False, "with": True}  #: arm -> rollout.partial
KEYS = ("s_per_step", "weights_wait_s_per_load", "weights_loads", "partial_rows", "partial_recomputed_tokens",
        "token_lag_mean", "staleness_max_mean", "tokens_per_row", "accuracy_final", "train_s", "trainer_wait_s",
        "rollout_busy_s")


def analyse(run_dir: Path, n_samples: int) -> dict:
    """One run's figures, from its metrics and summary (``n_samples``: rows per task)."""
    rows, step_ts, first, last = steady_steps(run_dir)
    steps = [r for r in rows if r["name"] == "trainer.token_lag_mean"]
    stale = [r["value"] for r in rows if r["name"] == "trainer.staleness_max"]
    loads = last_per_node(rows, "raas.weights_loads")
    generated, trajectories = total(rows, "raas.generated_tokens"), total(rows, "raas.tasks") * n_samples
    summary = read_summary(run_dir)
    n = last - first

    busy = in_time(rows, "raas.busy_s", step_ts[first], step_ts[last])
    return {"s_per_step": (step_ts[last] - step_ts[first]) / n,
            # which side binds: the trainer's busy and waiting seconds and the node's busy ones, per step
            "train_s": in_steps(rows, "trainer.train_s", first, last) / n,
            "trainer_wait_s": in_steps(rows, "trainer.wait_s", first, last) / n,
            "rollout_busy_s": busy / n,
            "weights_loads": loads,
            "weights_wait_s_per_load": last_per_node(rows, "raas.weights_wait_s") / loads if loads else 0.0,
            "partial_rows": last_per_node(rows, "raas.partial_rows"),
            "partial_recomputed_tokens": last_per_node(rows, "raas.partial_recomputed_tokens"),
            "token_lag_mean": sum(r["value"] for r in steps) / len(steps) if steps else 0.0,
            "staleness_max_mean": sum(stale) / len(stale) if stale else 0.0,
            "tokens_per_row": generated / trajectories if trajectories else 0.0,
            "accuracy_initial": summary.get("accuracy_initial"), "accuracy_final": summary.get("accuracy_final"),
            "run_dir": str(run_dir)}


def one_repetition(args, broker, rep: int) -> dict:
    out = {}
    order = list(ARMS) if rep % 2 == 0 else list(reversed(ARMS))
    for arm in order:
        overrides = {"mode": "async", "trainer.steps": args.steps, "eval.every": 0, "rollout.partial": ARMS[arm],
                     "job": f"bench-partial-{arm}-{int(time.time())}-{rep}"}
        load = load_now()
        run_dir, cfg = run_job_once(args, broker, rep, overrides, f"partial rollouts {arm}")
        out[arm] = {**analyse(run_dir, cfg.rollout.n_samples), "load_before": load["loadavg"]}
    out["order"] = order
    return out


def aggregate(reps: list[dict]) -> dict:
    arms = {arm: {k: spread([r[arm][k] for r in reps]) for k in KEYS} for arm in ARMS}
    for arm in ARMS:
        arms[arm]["accuracy_initial"] = reps[0][arm]["accuracy_initial"]
    pair = lambda k: [(r["without"][k], r["with"][k]) for r in reps]  # noqa: E731
    return {"arms": arms,
            "speedup_with_over_without": ratio_spread(arms["without"]["s_per_step"], arms["with"]["s_per_step"]),
            "token_lag_with_over_without": spread([w / wo for wo, w in pair("token_lag_mean") if wo]),
            "weights_wait_with_over_without": spread([w / wo for wo, w in pair("weights_wait_s_per_load") if wo])}


def print_table(agg: dict) -> None:
    print("partial rollouts on CPU (real, not emulated): the demo with a long-tailed length spread")
    hdr = (f"{'arm':8} {'s/step':>20} {'wait s/load':>22} {'token lag':>20} {'oldest lag':>20} "
           f"{'tokens/row':>20} {'acc final':>22}")
    print_header(hdr)
    for arm in ARMS:
        r = agg["arms"][arm]
        print(f"{arm:8} {fmt_spread(r['s_per_step']):>20} {fmt_spread(r['weights_wait_s_per_load'], '.3f'):>22} "
              f"{fmt_spread(r['token_lag_mean']):>20} {fmt_spread(r['staleness_max_mean']):>20} "
              f"{fmt_spread(r['tokens_per_row'], '.1f'):>20} {fmt_spread(r['accuracy_final'], '.3f'):>22}")
    for arm in ARMS:
        r = agg["arms"][arm]
        print(f"{arm}: per step, trainer busy {fmt_spread(r['train_s'])} s and waiting {fmt_spread(r['trainer_wait_s'])}"
              f" s, the node busy {fmt_spread(r['rollout_busy_s'])} s; rows continued under a newer version "
              f"{fmt_spread(r['partial_rows'], '.0f')}")
    for k in ("speedup_with_over_without", "token_lag_with_over_without", "weights_wait_with_over_without"):
        print(f"{k:34} {fmt_spread(agg[k])}")


def main(args) -> int:
    return run_repetitions("async_vs_sync", args, one_repetition, aggregate, print_table, section="partial_rollouts",
                           extra={"emulated": False, "method": __doc__})


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import Loader, heading, fmt_spread as _sp  # noqa: E402


REPORT_TITLE = "Partial rollouts on CPU, long-tailed lengths"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: ``partial_rollouts`` of ``async_vs_sync.json``."""
    d = (load("async_vs_sync") or {}).get("partial_rollouts")
    if not d:
        return []
    out = [*heading(REPORT_TITLE),
           f"**Partial rollouts on CPU** — `python -m astraflow.benchmarks.async_vs_sync --partial-rollouts` "
           f"(`examples/arithmetic_long_tail.yaml`: the demo whose solver writes a long-tailed run of dots after its "
           f"answer, so a call lasts as long as its longest row; async, {d['steps']} steps, `rollout.partial` off and "
           f"on with the same seeds; real CPU runs, not emulated; median (min–max) of {d['repeats']} repetitions)", "",
           "| rollout.partial | s/step | s a version waits per load | trained tokens' mean lag | oldest token's lag "
           "| tokens per row | accuracy v0 → final |", "|---|---:|---:|---:|---:|---:|---|"]
    for arm in ARMS:
        r = d["arms"][arm]
        out.append(f"| {'on' if ARMS[arm] else 'off'} | {_sp(r['s_per_step'])} | "
                   f"{_sp(r['weights_wait_s_per_load'], '.3f')} | {_sp(r['token_lag_mean'])} | "
                   f"{_sp(r['staleness_max_mean'])} | {_sp(r['tokens_per_row'], '.1f')} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    busy = "; ".join(f"{'on' if ARMS[a] else 'off'}: trainer busy {_sp(d['arms'][a]['train_s'])} s and waiting "
                     f"{_sp(d['arms'][a]['trainer_wait_s'])} s per step, the RaaS node busy "
                     f"{_sp(d['arms'][a]['rollout_busy_s'])} s, rows continued under a newer version "
                     f"{_sp(d['arms'][a]['partial_rows'], '.0f')}" for a in ARMS if "train_s" in d["arms"][a])
    out += ["", f"{busy}." if busy else ""]
    out += ["", f"With over without: s/step speed-up {_sp(d['speedup_with_over_without'])}x; trained tokens' mean "
                f"lag x{_sp(d['token_lag_with_over_without'])}; wait per load x"
                f"{_sp(d['weights_wait_with_over_without'])}.", ""]
    return out
