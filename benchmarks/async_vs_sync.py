"""Asynchronous vs synchronous RL on the same job, budget and machine, in one run.

Runs the demo job twice through ``astraflow run`` machinery on one embedded broker:
``mode: async`` (rollout of batch k+1 overlaps training of batch k, ``max_staleness``
>= 1) and ``mode: sync`` (the same components with staleness 0: rollout waits for the
newest weights, training waits for rollout). From the runs' metrics it reports seconds
per training step (steady state, start-up excluded), rollout and trainer busy fractions,
the ideal overlap bound ``(R+T)/max(R,T)`` from the measured rollout time R and training
time T per step, the achieved speedup, and each run's final held-out accuracy.

Prints one table and writes ``benchmarks/results/async_vs_sync.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from astraflow.benchmarks.results_io import write_results
from astraflow.config import load_config
from astraflow.launcher import run_job
from astraflow.topics import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "async_vs_sync.json"


def analyse(run_dir: Path, nodes: int) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_ts = {}
    for r in rows:
        if r["name"] == "trainer.samples":
            step_ts[int(r["step"])] = r["ts"]
    steps = sorted(step_ts)
    # steady state: from the end of step 2 to the end of the last step
    first, last = steps[1], steps[-1]
    window = step_ts[last] - step_ts[first]
    n = last - first
    in_window = [r for r in rows if step_ts[first] < r["ts"] <= step_ts[last]]
    train = sum(r["value"] for r in in_window if r["name"] == "trainer.train_s")
    busy = sum(r["value"] for r in in_window if r["name"] == "raas.busy_s")
    R, T = busy / n, train / n
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "s_per_step": window / n, "steps_measured": n,
        "rollout_busy_frac": busy / (window * nodes), "trainer_busy_frac": train / window,
        "R_s": R, "T_s": T, "ideal_overlap": (R + T) / max(R, T),
        "accuracy_initial": summary["accuracy_initial"], "accuracy_final": summary["accuracy_final"],
        "wall_s": summary["wall_s"], "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench"))
    args = ap.parse_args(argv)
    results = {}
    with EmbeddedBroker(heap="1g") as broker:
        for mode in ("async", "sync"):
            overrides = {"mode": mode, "trainer.steps": args.steps, "eval.every": 0,
                         "job": f"bench-{mode}-{int(time.time())}"}
            cfg = load_config(args.config, overrides)
            run_dir = Path(args.run_root) / cfg.job
            print(f"--- {mode}: {cfg.job}", flush=True)
            run_job(cfg, bootstrap=broker.bootstrap_servers, run_dir=run_dir, progress=False,
                    overrides=[f"{k}={v}" for k, v in overrides.items()])
            results[mode] = analyse(run_dir, cfg.rollout.nodes)
    a, s = results["async"], results["sync"]
    speedup = s["s_per_step"] / a["s_per_step"]
    hdr = f"{'mode':6} {'s/step':>7} {'rollout busy':>12} {'trainer busy':>12} {'R s':>6} {'T s':>6} {'ideal (R+T)/max':>15} {'speedup':>8} {'acc v0':>7} {'acc final':>9}"
    print(hdr)
    print("-" * len(hdr))
    for mode, r in results.items():
        sp = f"{speedup:.2f}x" if mode == "async" else "1.00x"
        print(f"{mode:6} {r['s_per_step']:>7.2f} {r['rollout_busy_frac']:>12.2f} {r['trainer_busy_frac']:>12.2f} "
              f"{r['R_s']:>6.2f} {r['T_s']:>6.2f} {r['ideal_overlap']:>15.2f} {sp:>8} "
              f"{r['accuracy_initial']:>7.3f} {r['accuracy_final']:>9.3f}")
    out = {"benchmark": "async_vs_sync", "steps": args.steps, "config": args.config, "speedup": speedup,
           "results": results}
    write_results(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
