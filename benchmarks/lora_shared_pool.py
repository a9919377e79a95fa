"""Two LoRA policies of one base on ONE RaaS pool, against the same job on two pools (CPU).

The job is ``examples/solver_verifier_lora_shared.yaml`` (the solver–verifier team, both
policies LoRA adapters of one base), shortened to ``--steps`` iterations, run two ways in each
repetition (their order alternating, so that neither always starts on a cold box):

* ``shared``: as written: the verifier has no pool of its own (``rollout.pool: solver``), so
  one engine holds the base once and both adapters, and one engine call generates rows of both
  policies, each under its own adapter and version;
* ``two_pools``: the same job with that one key removed: the verifier gets a pool of its own
  (``rollout.nodes`` nodes, each with its own copy of the base).

Both run through ``run_job`` with ``barrier: async`` (``multi_policy_arms.run_team``, as arm (a)
of ``multi_policy``); per run, from its own metrics and summary: seconds per iteration
(``multi_policy``'s definition: the policy whose last step comes last, from the end of step 2),
per policy the versions trained and its training reward per version (the curve), the team's
held-out accuracy at the start and at the end, and the conservation audit's verdict. Median
(min–max) over ``--repeats``; ``shared_over_two_pools`` is the s/iteration ratio paired within a
repetition (below 1: the shared pool is faster).

Writes the ``shared_pool`` section of ``benchmarks/results/lora.json`` (its other sections stay).

    python -m astraflow.benchmarks.lora_shared_pool            # 3 repetitions x 2 arms x 20 iterations
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml

from astraflow.benchmarks.lib.job_runs import ROOT
from astraflow.benchmarks.lib.results import load_now, repo_relative, write_section
from astraflow.benchmarks.lib.run_metrics import read_rows, read_summary
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_header

RESULTS = ROOT / "benchmarks" / "results" / "lora.json"
CONFIG = ROOT / "examples" / "solver_verifier_lora_shared.yaml"
SECTION = "shared_pool"
ARMS = ("shared", "two_pools")


def arm_config(base: dict, arm: str) -> dict:
    """The job of ``arm``: ``base`` as written (``shared``), or with every policy that rolls out on
    another's pool given a pool of its own (``two_pools``). ValueError when ``base`` shares none."""
    data = copy.deepcopy(base)
    shared = [p for p, sec in (data.get("policies") or {}).items() if ((sec or {}).get("rollout") or {}).get("pool")]
    if not shared:
        raise ValueError("the job has no policy on another policy's pool (policies.<name>.rollout.pool): nothing to "
                         "compare")
    if arm == "two_pools":
        for p in shared:
            del data["policies"][p]["rollout"]["pool"]
    elif arm != "shared":
        raise ValueError(f"arm {arm!r}: one of {', '.join(ARMS)}")
    return data


def reward_curves(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per policy, version -> the training reward of the batch that made it (``trainer.reward``)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["name"] == "trainer.reward" and r["component"].startswith("trainer."):
            out.setdefault(r["component"].split(".", 1)[1], {})[str(int(r["step"]))] = float(r["value"])
    return out


def run_arm(base: dict, arm: str, args, rep: int) -> dict:
    """One run of ``arm``: ``multi_policy``'s team analysis, plus the curves and the audit."""
    from astraflow.benchmarks.multi_policy_arms import run_team  # the job machinery: only when a run starts
    r = run_team(arm_config(base, arm), "async", args, rep)
    run_dir = Path(r["run_dir"])
    summary = read_summary(run_dir)
    keep = ("s_per_iter", "last_policy", "steps_by_policy", "time_to_first_step_s", "wall_s", "team_accuracy",
            "team_accuracy_by_version", "raas_busy_s", "episodes", "generated_tokens", "run_dir", "load_before",
            "failed_attempts")
    return {**{k: r.get(k) for k in keep}, "reward_by_version": reward_curves(read_rows(run_dir)),
            "audit_ok": (summary.get("audit") or {}).get("ok")}


def aggregate(reps: list[dict]) -> dict[str, Any]:
    """Per arm its spreads; the paired ratio of the shared pool's s/iteration to two pools'."""
    arms = {}
    for arm in ARMS:
        runs = [r[arm] for r in reps]
        initial = [(r["team_accuracy_by_version"] or {}).get("0") for r in runs]
        arms[arm] = {"s_per_iter": spread([r["s_per_iter"] for r in runs]),
                     "wall_s": spread([r["wall_s"] for r in runs]),
                     "team_accuracy_final": _spread([r["team_accuracy"] for r in runs]),
                     "team_accuracy_initial": _spread(initial),
                     "versions_by_policy": {p: spread([float(r["steps_by_policy"][p]) for r in runs])
                                            for p in runs[0]["steps_by_policy"]},
                     "audit_ok": all(r["audit_ok"] for r in runs)}
    return {"arms": arms, "shared_over_two_pools": ratio_spread(arms["shared"]["s_per_iter"],
                                                                arms["two_pools"]["s_per_iter"])}


def _spread(values: list) -> dict | None:
    """The spread of the values a run recorded (None when none did)."""
    present = [v for v in values if v is not None]
    return spread(present) if present else None


def print_table(agg: dict) -> None:
    print_header(f"{'arm':10} {'s/iteration':>22} {'team acc start':>22} {'team acc end':>22} {'audit':>6}")
    for arm, a in agg["arms"].items():
        acc = [fmt_spread(a[k], ".3f") if a[k] else "-" for k in ("team_accuracy_initial", "team_accuracy_final")]
        print(f"{arm:10} {fmt_spread(a['s_per_iter']):>22} {acc[0]:>22} {acc[1]:>22} {'ok' if a['audit_ok'] else 'FAIL':>6}")
    print(f"shared pool's s/iteration over two pools' (paired): {fmt_spread(agg['shared_over_two_pools'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--steps", type=int, default=20, help="iterations per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds a run may take before it counts as hung")
    ap.add_argument("--run-root", type=Path, default=ROOT / "runs" / "bench-lora-shared-pool")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the table shows median and spread)")
    base = yaml.safe_load(args.config.read_text())
    load_before = load_now()
    reps = []
    for rep in range(args.repeats):
        order = ARMS if rep % 2 == 0 else ARMS[::-1]
        out = {}
        for arm in order:
            print(f"--- repetition {rep + 1}: {arm}", flush=True)
            out[arm] = run_arm(base, arm, args, rep)
        reps.append({**out, "order": list(order)})
    agg = aggregate(reps)
    print_table(agg)
    section = {"config": repo_relative(args.config), "steps": args.steps, "repeats": args.repeats, **agg,
               "method": __doc__, "repetitions": reps}
    write_section(args.out, SECTION, section, load_before, "lora")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
