"""Async vs sync without CPU contention: the demo job on emulated accelerators (``async_vs_sync --emulated``).

The demo job (``examples/arithmetic_grpo.yaml``, 16 prompts x 8 samples per batch) with its
RaaS node on ``--rollout-devices`` and its trainer on ``--trainer-devices`` emulated devices
of ``--profile``: the tiny model does the work, every call is held for its modelled time
(``emulation/cost.py``), so the rollout and the trainer no longer split two cores. Per
repetition, ``mode: async`` then ``mode: sync`` on one embedded broker, same seeds.

From each run's own emulated accounts (summary.json ``emulated``): **R** = the RaaS node's
modelled seconds (generate + weight loads) per batch of episodes, **T** = the trainer's
modelled seconds per step. Then ``overlap_efficiency`` = max(R, T) / async s per step,
``sync_efficiency`` = (R + T) / sync s per step, and ``speedup_async_over_sync`` against the
cost model's ideal (R + T) / max(R, T). Seconds per step are steady state (end of step 2
to the last step), wall / dilation: **modelled seconds, emulated**, not GPU measurements.

Writes the ``emulated`` section of ``benchmarks/results/async_vs_sync.json`` (the CPU
sections stay as measured).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from astraflow.benchmarks.lib.emulated import cpu_fractions, overruns, resource_work
from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.run_metrics import read_summary, total
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.steady import steady_steps
from astraflow.benchmarks.lib.table import print_header

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "async_vs_sync.json"
MODES = ("async", "sync")


def overrides(args, mode: str, job: str) -> dict:
    dev = lambda n: {"kind": "emulated", "profile": args.profile, "count": n, "dilation": args.dilation,  # noqa: E731
                     "token_scale": args.token_scale, "prompt_token_scale": args.prompt_token_scale}
    return {"mode": mode, "job": job, "trainer.steps": args.steps, "eval.every": 0, "eval.problems": 50, "eval.k": 1,
            "trainer.cpu_nice": 0, "rollout.tasks_per_call": 16,
            "rollout.device": dev(args.rollout_devices), "trainer.device": dev(args.trainer_devices)}


def analyse(run_dir: Path, dilation: float, groups_per_batch: int) -> dict:
    rows, step_ts, first, last = steady_steps(run_dir)
    steps = max(step_ts)
    summary = read_summary(run_dir)
    episodes = total(rows, "raas.tasks")
    em = summary.get("emulated", {})
    work = resource_work(summary, episodes, groups_per_batch, steps)
    R = sum(w for k, w in work.items() if not k.startswith("trainer"))
    T = sum(w for k, w in work.items() if k.startswith("trainer"))
    # the largest component's CPU share of its holds (one definition with Table 2 and the scale benchmark)
    cpu = max(cpu_fractions(em).values(), default=0.0)
    return {"s_per_step": (step_ts[last] - step_ts[first]) / (last - first) / dilation, "R_s": R, "T_s": T,
            "episodes_per_trained_group": episodes / (steps * groups_per_batch),
            "max_cpu_fraction": cpu, "overruns": overruns(em),
            "accuracy_final": summary.get("accuracy_final"), "run_dir": str(run_dir)}


def one_repetition(args, broker, rep: int) -> dict:
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when a run starts
    from astraflow.launcher import run_job
    out = {}
    for mode in MODES:
        job = f"bench-emu-{mode}-{int(time.time())}-{rep}"
        ov = overrides(args, mode, job)
        cfg = load_config(args.config, ov)
        run_dir = Path(args.run_root) / job
        print(f"--- repetition {rep + 1}: {mode} ({job})", flush=True)
        run_job(cfg, bootstrap=broker.bootstrap_servers, run_dir=run_dir, progress=False,
                overrides=[f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in ov.items()])
        out[mode] = analyse(run_dir, args.dilation, cfg.dataflow.groups_per_batch)
    return out


def aggregate(reps: list[dict]) -> dict:
    s = lambda mode, key: spread([r[mode][key] for r in reps])  # noqa: E731
    a, sy = s("async", "s_per_step"), s("sync", "s_per_step")
    best = spread([max(r["async"]["R_s"], r["async"]["T_s"]) for r in reps])
    both = spread([r["sync"]["R_s"] + r["sync"]["T_s"] for r in reps])
    ideal = spread([(r["async"]["R_s"] + r["async"]["T_s"]) / max(r["async"]["R_s"], r["async"]["T_s"]) for r in reps])
    return {"modes": {m: {k: s(m, k) for k in ("s_per_step", "R_s", "T_s", "max_cpu_fraction", "overruns",
                                                 "episodes_per_trained_group")} for m in MODES},
            "overlap_efficiency": ratio_spread(best, a), "sync_efficiency": ratio_spread(both, sy),
            "speedup_async_over_sync": ratio_spread(sy, a), "ideal_speedup_async_over_sync": ideal}


def print_table(agg: dict, args) -> None:
    print(f"EMULATED: rollout {args.rollout_devices} + trainer {args.trainer_devices} x {args.profile} "
          f"(modelled seconds; dilation {args.dilation})")
    hdr = f"{'mode':8} {'s/step':>22} {'R s':>22} {'T s':>22}"
    print_header(hdr)
    for m in MODES:
        r = agg["modes"][m]
        print(f"{m:8} {fmt_spread(r['s_per_step'], '.1f'):>22} {fmt_spread(r['R_s'], '.1f'):>22} "
              f"{fmt_spread(r['T_s'], '.1f'):>22}")
    for k in ("overlap_efficiency", "sync_efficiency", "speedup_async_over_sync", "ideal_speedup_async_over_sync"):
        print(f"{k:32} {fmt_spread(agg[k])}")


def main(args) -> int:
    from astraflow.topics import EmbeddedBroker  # the Kafka client (~0.7 s to import): only when the runs start
    load_before = load_now()
    with EmbeddedBroker(heap="1g") as broker:
        reps = [one_repetition(args, broker, rep) for rep in range(args.repeats)]
    agg = aggregate(reps)
    print_table(agg, args)
    section = {"emulated": True, "profile": args.profile, "rollout_devices": args.rollout_devices,
               "trainer_devices": args.trainer_devices, "dilation": args.dilation, "token_scale": args.token_scale,
               "prompt_token_scale": args.prompt_token_scale, "steps": args.steps, "repeats": args.repeats,
               "quick": args.quick, "method": __doc__, **agg, "repetitions": reps}
    write_section(args.out, "emulated", section, load_before, "async_vs_sync")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, fmt_spread as _sp)


REPORT_TITLE = "Async vs sync, EMULATED"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the ``emulated`` section of ``async_vs_sync.json``."""
    d = (load("async_vs_sync") or {}).get("emulated")
    if not d:
        return []
    m = d["modes"]
    out = [*heading(REPORT_TITLE),
           f"**Async vs sync, EMULATED** — `python -m astraflow.benchmarks.async_vs_sync --emulated` (the demo job, "
           f"{d['steps']} steps; RaaS node on {d['rollout_devices']} and trainer on {d['trainer_devices']} emulated "
           f"{d['profile']} devices; **modelled seconds**; R and T from each run's own emulated accounts; median "
           f"(min–max) of {d['repeats']} repetitions)", "",
           "| mode (emulated) | modelled s/step | R s | T s |", "|---|---:|---:|---:|"]
    for mode in ("async", "sync"):
        r = m[mode]
        out.append(f"| {mode} | {_sp(r['s_per_step'], '.1f')} | {_sp(r['R_s'], '.1f')} | {_sp(r['T_s'], '.1f')} |")
    out += ["", f"Overlap efficiency max(R,T) / async s/step {_sp(d['overlap_efficiency'])}; sync efficiency "
                f"{_sp(d['sync_efficiency'])}; async speed-up over sync {_sp(d['speedup_async_over_sync'])}x against "
                f"the cost model's ideal {_sp(d['ideal_speedup_async_over_sync'])}x.", ""]
    return out


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: modelled s per step, async and sync."""
    d = (load("async_vs_sync") or {}).get("emulated")
    if not d:
        return None
    m = {k: v["s_per_step"]["median"] for k, v in d["modes"].items()}
    return ReadmeRow(REPORT_TITLE, f"modelled s / step on {d['profile']}, median of {d['repeats']}",
                     f"async {m['async']:.1f} · sync {m['sync']:.1f}", "lower", emulated=True)
