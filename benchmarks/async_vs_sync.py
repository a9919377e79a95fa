"""Asynchronous vs synchronous RL vs the same job in one plain process, in one run.

Each repetition runs the demo job (shortened to ``--steps``) three ways on one machine:
``mode: async`` and ``mode: sync`` through ``astraflow run``'s machinery on one embedded
broker (separate processes sharing only Kafka), and the in-process baseline
(``inprocess_loop.py``: the same prompts, seeds, model, batch and LR; the CPU engine and
the project's ``DeepSpeedTrainer``; no broker) as a fresh Python process, once with the
components' thread budget (1 thread) and once with every core; and that loop with async's
schedule (``--staleness 1 --overlap``: batch k + 1 rolls out on a second thread, with
version k, while batch k trains; 1 thread per side, as the trainer and the RaaS node have).

One reference for every mode: R (rollout of one batch) and T (one ``train_step``) are
measured **alone** by the 1-thread in-process run of the same repetition. Then

* ``overlap_efficiency`` = max(R, T) / async s per step (1.0: rollout and training
  overlap perfectly and the plumbing costs nothing);
* ``sync_efficiency`` = (R + T) / sync s per step;
* ``ratio_to_inprocess`` = async s per step / in-process s per step;
* ``inprocess_overlap_efficiency`` = max(R, T) / the overlapped loop's s per step: what
  overlapping costs on this machine's shared cores with no plumbing at all, so
  ``overlap_efficiency`` / ``inprocess_overlap_efficiency`` is the share the plumbing leaves;
* ``ratio_to_inprocess_overlapped`` = async s per step / the overlapped loop's;
* time to the last step (launch → final trained step, start-up included) and the final
  held-out accuracy of each, and the in-process loop's time to reach the async run's
  final accuracy (it is evaluated every ``--eval-every`` versions, outside its timing).

Seconds per step are steady state: from the end of step 2 to the end of the last step.
Every number is a median (min–max) over ``--repeats`` repetitions; ratios are paired
within a repetition. Prints one table; writes ``benchmarks/results/async_vs_sync.json``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from astraflow.benchmarks import async_vs_sync_emulated, async_vs_sync_partial
from astraflow.benchmarks.critical_path import STAGES, batch_paths, summarize
from astraflow.benchmarks.inprocess_loop import time_to_accuracy
from astraflow.benchmarks.job_bench import job_arguments, run_job_once, run_repetitions
from astraflow.benchmarks.lib.child import run_child
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.run_metrics import read_summary
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.steady import in_steps, in_time, steady_steps
from astraflow.benchmarks.lib.table import print_header

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "async_vs_sync.json"
SYSTEM_MODES = ("async", "sync")


def analyse(run_dir: Path, nodes: int) -> dict:
    """Steady-state s/step, busy fractions and the run's own R and T, from its metrics."""
    rows, step_ts, first, last = steady_steps(run_dir)
    window = step_ts[last] - step_ts[first]
    n = last - first
    train = in_steps(rows, "trainer.train_s", first, last)  # the window's steps, by step
    busy = in_time(rows, "raas.busy_s", step_ts[first], step_ts[last])
    summary = read_summary(run_dir)
    return {
        "s_per_step": window / n, "steps_measured": n,
        "rollout_busy_frac": busy / (window * nodes), "trainer_busy_frac": train / window,
        # R and T as this run saw them (contended in async: both share the cores)
        "R_in_run_s": busy / n, "T_in_run_s": train / n,
        "time_to_first_step_s": summary["time_to_first_step_s"],
        "time_to_last_step_s": summary["time_to_first_step_s"] + step_ts[last] - step_ts[min(step_ts)],
        "accuracy_initial": summary["accuracy_initial"], "accuracy_final": summary["accuracy_final"],
        "wall_s": summary["wall_s"], "run_dir": str(run_dir),
    }


# label -> (threads, extra arguments) of the in-process runs; threads=None: every core
INPROCESS = {"inprocess": (1, ()), "inprocess_all_cores": (None, ()),
             "inprocess_overlapped": (1, ("--staleness", "1", "--overlap"))}


def run_inprocess(config: str, steps: int, threads: int, eval_every: int, extra: tuple[str, ...] = ()) -> dict:
    """The in-process loop as its own Python process (nothing shared with this one)."""
    r = run_child("astraflow.benchmarks.inprocess_loop", ["--config", config, "--steps", str(steps), "--threads",
                                                          str(threads), "--eval-every", str(eval_every), *extra],
                  "in-process loop")
    r.pop("per_step", None)
    r["time_to_last_step_s"] = r["setup_s"] + r["loop_s"]
    return r


def system_run(args, broker, rep: int, mode: str, job: str, what: str, paths: bool = True) -> dict:
    """One ``astraflow run`` of the job in ``mode`` (no evaluation during it): its figures
    (:func:`analyse`), the load before it and, with ``paths``, its batches' critical paths."""
    overrides = {"mode": mode, "trainer.steps": args.steps, "eval.every": 0, "job": f"{job}-{int(time.time())}-{rep}"}
    load = load_now()
    run_dir, cfg = run_job_once(args, broker, rep, overrides, what)
    out = {**analyse(run_dir, cfg.rollout.nodes), "load_before": load["loadavg"],
           "trainer_threads": cfg.trainer.engine.threads, "rollout_threads": cfg.rollout.engine.threads}
    if paths:
        out["critical_path"] = summarize(batch_paths(broker.bootstrap_servers, cfg, run_dir))
    return out


def inprocess_run(args, rep: int, label: str, what: str = "") -> dict:
    """The in-process loop of :data:`INPROCESS` ``label`` and the load before it."""
    threads, extra = INPROCESS[label]
    threads = threads or os.cpu_count() or 1
    print(f"--- repetition {rep + 1}: {label}{what} ({threads} thread(s){' per side' if extra else ''})", flush=True)
    load = load_now()
    return {**run_inprocess(args.config, args.steps, threads, args.eval_every, extra), "load_before": load["loadavg"]}


def one_repetition(args, broker, rep: int) -> dict:
    out: dict = {mode: system_run(args, broker, rep, mode, f"bench-{mode}", mode) for mode in SYSTEM_MODES}
    for label in INPROCESS:
        out[label] = inprocess_run(args, rep, label)
    ref = out["inprocess"]
    # Start-up included, as in the system's time to its last step.
    loop_s = time_to_accuracy(ref["accuracy_curve"], out["async"]["accuracy_final"])
    out["inprocess_time_to_async_accuracy_s"] = None if loop_s is None else ref["setup_s"] + loop_s
    return out


def aggregate(reps: list[dict]) -> dict:
    """Spreads over repetitions; every ratio paired within its repetition."""
    def s(mode: str, key: str) -> dict:
        return spread([r[mode][key] for r in reps])

    R, T = s("inprocess", "R_s"), s("inprocess", "T_s")
    modes = {}
    for mode in SYSTEM_MODES:
        modes[mode] = {k: s(mode, k) for k in ("s_per_step", "rollout_busy_frac", "trainer_busy_frac", "R_in_run_s",
                                               "T_in_run_s", "time_to_first_step_s", "time_to_last_step_s",
                                               "accuracy_final")}
        modes[mode]["accuracy_initial"] = reps[0][mode]["accuracy_initial"]
        modes[mode]["critical_path"] = {k: spread([r[mode]["critical_path"][k] for r in reps])
                                        for k in (*STAGES, "path_s") if all(k in r[mode]["critical_path"] for r in reps)}
    for label in INPROCESS:
        modes[label] = {k: s(label, k) for k in ("s_per_step", "R_s", "T_s", "W_s", "setup_s", "time_to_last_step_s",
                                                 "accuracy_final")}
        modes[label]["threads"] = reps[0][label]["threads"]
        modes[label]["accuracy_initial"] = reps[0][label]["accuracy_initial"]
    a, sy, ip = modes["async"]["s_per_step"], modes["sync"]["s_per_step"], modes["inprocess"]["s_per_step"]
    ov = modes["inprocess_overlapped"]["s_per_step"]
    best_alone = spread([max(r["inprocess"]["R_s"], r["inprocess"]["T_s"]) for r in reps])
    sum_alone = spread([r["inprocess"]["R_s"] + r["inprocess"]["T_s"] for r in reps])
    reached = [r["inprocess_time_to_async_accuracy_s"] for r in reps]
    return {
        "R_alone_s": R, "T_alone_s": T,
        "overlap_efficiency": ratio_spread(best_alone, a),
        # the same overlap with no plumbing: what this machine's shared cores allow
        "inprocess_overlap_efficiency": ratio_spread(best_alone, ov),
        "inprocess_overlapped_s_per_step": ov,
        "ratio_to_inprocess_overlapped": ratio_spread(a, ov),
        "sync_efficiency": ratio_spread(sum_alone, sy),
        "inprocess_s_per_step": ip,
        "ratio_to_inprocess": ratio_spread(a, ip),
        "sync_ratio_to_inprocess": ratio_spread(sy, ip),
        "ratio_to_inprocess_all_cores": ratio_spread(a, modes["inprocess_all_cores"]["s_per_step"]),
        # what every core bought the one-process loop in each run: the all-cores ratio moves with it
        "inprocess_thread_scaling": thread_scaling(modes),
        "speedup_async_over_sync": ratio_spread(sy, a),
        "ideal_async_speedup_over_inprocess": ratio_spread(sum_alone, best_alone),
        "inprocess_time_to_async_accuracy_s": reached,
        # the load each run started under: the JSON-wide before/after misses what happened between
        "load_1m_at_run_start": spread([r[m]["load_before"][0] for r in reps for m in (*SYSTEM_MODES, *INPROCESS)]),
        "modes": modes,
    }


TINY_GOAL = 1.3  #: the demo's async s/step over one process's on every core, at most (issue 58)


def thread_scaling(modes: dict) -> dict:
    """The in-process loop's s/step with 1 thread over its s/step on every core, paired by
    repetition: how much the machine's other cores bought a plain process that day."""
    return ratio_spread(modes["inprocess"]["s_per_step"], modes["inprocess_all_cores"]["s_per_step"])


def print_table(agg: dict) -> None:
    m = agg["modes"]
    hdr = (f"{'mode':22} {'s/step':>20} {'time to last step s':>22} {'acc final':>22}")
    print_header(hdr)
    for mode in (*SYSTEM_MODES, *INPROCESS):
        r = m[mode]
        print(f"{mode:22} {fmt_spread(r['s_per_step']):>20} {fmt_spread(r['time_to_last_step_s'], '.1f'):>22} "
              f"{fmt_spread(r['accuracy_final'], '.3f'):>22}")
    print(f"R alone {fmt_spread(agg['R_alone_s'], '.3f')} s, T alone {fmt_spread(agg['T_alone_s'], '.3f')} s")
    for key in ("overlap_efficiency", "inprocess_overlap_efficiency", "sync_efficiency", "ratio_to_inprocess",
                "ratio_to_inprocess_overlapped", "ratio_to_inprocess_all_cores",
                "inprocess_thread_scaling", "speedup_async_over_sync", "ideal_async_speedup_over_inprocess"):
        print(f"{key:36} {fmt_spread(agg[key])}")
    print(f"{'inprocess_time_to_async_accuracy_s':36} {agg['inprocess_time_to_async_accuracy_s']}")
    path = m["async"]["critical_path"]
    if path:  # the batch the trainer waits for (critical_path.py), medians over batches then repetitions
        print("async path to a batch: " + ", ".join(f"{k[:-2]} {path[k]['median']:.3f}" for k in (*STAGES, "path_s")
                                                    if k in path) + " s")


REAL_MODEL_CONFIG = ROOT / "examples" / "smollm2_chat_arithmetic.yaml"
REAL_MODEL_GOAL = 1.15  #: the distributed job's s/step over one process's on every core, at most (issue 58)


def one_repetition_real(args, broker, rep: int) -> dict:
    """The real model (``--real-model``): async through ``astraflow run`` and the in-process loop
    on every core (what a user would run instead), same prompts, seeds, model, batch and LR."""
    return {"async": system_run(args, broker, rep, "async", "bench-real-async", "async, real model", paths=False),
            "inprocess_all_cores": inprocess_run(args, rep, "inprocess_all_cores", ", real model")}


def aggregate_real(reps: list[dict]) -> dict:
    """The real model's two modes, and their ratio paired within each repetition."""
    modes = {m: {k: spread([r[m][k] for r in reps]) for k in ("s_per_step", "time_to_last_step_s", "accuracy_final")}
             for m in ("async", "inprocess_all_cores")}
    for m in modes:
        modes[m]["accuracy_initial"] = reps[0][m]["accuracy_initial"]
    ratio = ratio_spread(modes["async"]["s_per_step"], modes["inprocess_all_cores"]["s_per_step"])
    return {"modes": modes, "ratio_to_inprocess_all_cores": ratio, "goal": REAL_MODEL_GOAL,
            "goal_met": ratio["median"] <= REAL_MODEL_GOAL,
            # the async job's torch threads (the config's): the in-process loop uses every core
            "async_threads": {k: reps[0]["async"][k] for k in ("trainer_threads", "rollout_threads")}}


def print_real(agg: dict) -> None:
    print_header(f"{'real model':22} {'s/step':>20} {'time to last step s':>22} {'acc final':>22}")
    for mode, r in agg["modes"].items():
        print(f"{mode:22} {fmt_spread(r['s_per_step']):>20} {fmt_spread(r['time_to_last_step_s'], '.1f'):>22} "
              f"{fmt_spread(r['accuracy_final'], '.3f'):>22}")
    print(f"ratio_to_inprocess_all_cores {fmt_spread(agg['ratio_to_inprocess_all_cores'])} "
          f"(goal <= {agg['goal']}: {'met' if agg['goal_met'] else 'not met'})")


def main(argv: list[str] | None = None) -> int:
    def eval_every(ap) -> None:
        ap.add_argument("--eval-every", type=int, default=0, help="in-process evaluations (default: steps / 4)")
        ap.add_argument("--emulated", action="store_true", help="async vs sync on emulated accelerators "
                                                                "(async_vs_sync_emulated.py): the JSON's emulated section")
        ap.add_argument("--profile", default="h100-qwen3-8b", help="--emulated: emulation profile")
        ap.add_argument("--rollout-devices", type=int, default=4, help="--emulated: the RaaS node's devices")
        ap.add_argument("--trainer-devices", type=int, default=4, help="--emulated: the trainer's devices")
        ap.add_argument("--dilation", type=float, default=0.3, help="--emulated: wall seconds per modelled second")
        ap.add_argument("--token-scale", type=int, default=512, help="--emulated: modelled tokens per generated one")
        ap.add_argument("--prompt-token-scale", type=int, default=16, help="--emulated: modelled tokens per prompt one")
        ap.add_argument("--real-model", action="store_true",
                        help="async vs one process on every core on the real model (--config defaults to "
                             "examples/smollm2_chat_arithmetic.yaml): the JSON's real_model section")
        ap.add_argument("--partial-rollouts", action="store_true",
                        help="partial rollouts with and without, on the demo with a long-tailed length spread "
                             "(async_vs_sync_partial.py; --config defaults to examples/arithmetic_long_tail.yaml): "
                             "the JSON's partial_rollouts section")

    args = job_arguments(__doc__.splitlines()[0], RESULTS, argv, eval_every)
    default_config = args.config == str(ROOT / "examples" / "arithmetic_grpo.yaml")
    if args.real_model:
        if default_config:
            args.config = str(REAL_MODEL_CONFIG)
        if args.steps == 40:  # the CPU default; a real model's step takes ~100x the tiny one's
            args.steps = 10
        args.eval_every = args.eval_every or args.steps
        return run_repetitions("async_vs_sync", args, one_repetition_real, aggregate_real, print_real,
                               section="real_model")
    if args.partial_rollouts:
        if default_config:  # the long-tailed demo instead
            args.config = str(async_vs_sync_partial.CONFIG)
        return async_vs_sync_partial.main(args)
    if args.emulated:
        if args.steps == 40:  # the CPU default; modelled steps take longer
            args.steps = 8
        return async_vs_sync_emulated.main(args)
    args.eval_every = args.eval_every or max(1, args.steps // 4)
    return run_repetitions("async_vs_sync", args, one_repetition, aggregate, print_table,
                           keep=("emulated", "partial_rollouts", "real_model"))


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Async vs sync vs one process"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``async_vs_sync.json``."""
    d = load("async_vs_sync")
    if not d:
        return []
    m = d["modes"]
    out = [*heading(REPORT_TITLE),
           f"**Async vs sync vs one process** — `python -m astraflow.benchmarks.async_vs_sync` (the demo job, "
           f"{d['steps']} steps each; async and sync through `astraflow run` on one broker; in-process = the same "
           "prompts, seeds, model, batch and LR in one plain Python process (CPU engine + the project's "
           "DeepSpeedTrainer, no broker); s/step steady state after step 2; median (min–max) of "
           f"{d['repeats']} repetitions{load_note(d)}. R and T are one batch's rollout and one train step, each "
           "measured alone in the in-process run; the system's own busy times are contended and not used as "
           "references)", "",
           "| mode | s/step | time to last step s | accuracy v0 → final |", "|---|---:|---:|---|"]
    labels = {"async": "async (1 RaaS node)", "sync": "sync", "inprocess": "in-process, 1 thread",
              "inprocess_all_cores": f"in-process, {m['inprocess_all_cores']['threads']} threads",
              "inprocess_overlapped": "in-process overlapped (async's schedule: rollout on a 2nd thread), "
                                      "1 thread per side"}
    for mode, label in labels.items():
        r = m[mode]
        out.append(f"| {label} | {_sp(r['s_per_step'])} | {_sp(r['time_to_last_step_s'], '.0f')} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    out += ["", "| R alone s | T alone s | overlap efficiency max(R,T) / async s/step | sync efficiency (R+T) / sync "
            "s/step | async / in-process s/step | async speedup over sync |", "|---:|---:|---:|---:|---:|---:|",
            f"| {_sp(d['R_alone_s'], '.3f')} | {_sp(d['T_alone_s'], '.3f')} | {_sp(d['overlap_efficiency'])} | "
            f"{_sp(d['sync_efficiency'])} | {_sp(d['ratio_to_inprocess'])} | {_sp(d['speedup_async_over_sync'])}x |"]
    out += ["", "| overlap efficiency of the in-process overlapped loop (no plumbing) | async / in-process "
            "overlapped s/step |", "|---:|---:|",
            f"| {_sp(d['inprocess_overlap_efficiency'])} | {_sp(d['ratio_to_inprocess_overlapped'])} |"]
    # (computed from the modes' runs, so a JSON written before the key existed reports it too)
    all_cores = d["ratio_to_inprocess_all_cores"]
    out += ["", f"| async / in-process on every core s/step (goal ≤ {TINY_GOAL}) | the in-process loop's s/step with 1 "
                "thread / on every core (what the other core bought it that day) |", "|---:|---:|",
            f"| {_sp(all_cores)} ({'met' if all_cores['median'] <= TINY_GOAL else 'not met'}) | "
            f"{_sp(thread_scaling(m))}x |"]
    real = d.get("real_model")
    if real:  # the same comparison on the real model (--real-model)
        rm = real["modes"]
        out += ["", f"On the real model (`--real-model`: `{Path(real['config']).name}`, {real['steps']} steps, median "
                    f"(min–max) of {real['repeats']} repetitions): async {_sp(rm['async']['s_per_step'])} s/step"
                    + (f" (trainer on {real['async_threads']['trainer_threads']} torch thread(s), the RaaS node "
                       f"on {real['async_threads']['rollout_threads']})" if "async_threads" in real else "") + ", "
                    f"one process on every core {_sp(rm['inprocess_all_cores']['s_per_step'])}; ratio "
                    f"{_sp(real['ratio_to_inprocess_all_cores'])} (goal ≤ {real['goal']}: "
                    f"{'met' if real['goal_met'] else 'not met'})."]
    return out + [""]


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: s per step of each mode."""
    d = load("async_vs_sync")
    if not d:
        return None
    m = {k: v["s_per_step"]["median"] for k, v in d["modes"].items()}
    return ReadmeRow(REPORT_TITLE, f"s / step, the demo job, median of {d['repeats']}",
                     f"async {m['async']:.2f} · sync {m['sync']:.2f} · one process {m['inprocess']:.2f}", "lower")


if __name__ == "__main__":
    raise SystemExit(main())
