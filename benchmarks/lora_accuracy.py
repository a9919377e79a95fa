"""LoRA against full fine-tuning on the real model: held-out accuracy after equal versions.

Writes the ``accuracy`` section of ``benchmarks/results/lora.json`` (the bytes and memory rows
``benchmarks/lora.py`` writes stay). Every run is ``astraflow run
examples/smollm2_chat_arithmetic.yaml`` (SmolLM2-135M-Instruct, GRPO on chat arithmetic) for
``--steps`` versions, evaluated greedily on its held-out problems at v0 and at the last version:

1. **The LoRA learning rate, chosen by a sweep.** One LoRA run per ``--sweep-lrs`` at seed
   ``--sweep-seed`` (its own prompts and held-out problems: none of the measured seeds'); the
   lr whose final held-out accuracy is highest is taken (a tie: the smaller lr). Every sweep
   run is recorded.
2. **The comparison.** Per seed of ``--seeds``: full fine-tuning at the job's lr (not swept:
   ``full_lr`` in the JSON) and LoRA (``--rank``, alpha 2 x rank, ``--targets``) at the
   chosen lr, the same seed: the same
   prompts in the same order and the same held-out problems, so the two final accuracies are
   paired over problems. Per arm: each seed's v0 and final accuracy with its standard error over
   problems, and the mean over seeds; per seed, LoRA's final minus full's final with its
   standard error paired over problems (``lora_minus_full``).

Nothing in it decides for the reader: the JSON holds both arms' figures; the table prints them.

    python -m astraflow.benchmarks.lora_accuracy                      # sweep, then 3 seeds x 2 arms
    python -m astraflow.benchmarks.lora_accuracy --collect-sweep D... --collect D...  # read run dirs
    python -m astraflow.benchmarks.lora_accuracy --sweep-lrs A B C --collect-sweep DA DB  # run C, then compare

(``--collect`` takes the comparison's run dirs in the order full s0, lora s0, full s1, ...)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from astraflow.benchmarks.lib.job_runs import ROOT, run_job_cli
from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.table import print_header
from astraflow.config import load_config

RESULTS = ROOT / "benchmarks" / "results" / "lora.json"
CONFIG = "examples/smollm2_chat_arithmetic.yaml"
SECTION = "accuracy"
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def lora_sets(rank: int, lr: float, targets: list[str]) -> list[str]:
    """The ``--set`` pairs of a LoRA run: rank, alpha 2 x rank, the target modules and the lr."""
    return [f"trainer.engine.lora={{rank: {rank}, alpha: {2.0 * rank}, target_modules: [{', '.join(targets)}]}}",
            f"trainer.engine.lr={lr!r}"]


def held_out(run_dir: Path) -> dict:
    """A run's held-out rewards per problem at its first and last evaluated version, from its
    ``summary.json``; ValueError for a run that did not evaluate twice."""
    summary = json.loads((run_dir / "summary.json").read_text())
    per = summary.get("eval_task_reward_by_version") or {}
    if len(per) < 2:
        raise ValueError(f"{run_dir}/summary.json: held-out rewards at {len(per)} version(s), two needed "
                         "(eval at v0 and at the last version)")
    v0, v1 = min(per, key=int), max(per, key=int)
    return {"run_dir": str(run_dir), "versions": [int(v0), int(v1)], "v0": per[v0], "final": per[v1],
            "wall_s": summary.get("wall_s"), "steps_trained": summary.get("steps_trained"),
            "audit_ok": (summary.get("audit") or {}).get("ok")}


def mean_se(values: list[float]) -> dict:
    """The mean and its standard error (0 for a single value)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "se": se, "n": len(values)}


def run_figures(h: dict) -> dict:
    """One run: accuracy at v0 and at the end, each with its SE over problems."""
    return {"run_dir": h["run_dir"], "versions": h["versions"], "accuracy_v0": mean_se(list(h["v0"].values())),
            "accuracy_final": mean_se(list(h["final"].values())), "wall_s": h["wall_s"],
            "steps_trained": h["steps_trained"], "audit_ok": h["audit_ok"]}


def choose_lr(sweep: dict[float, dict]) -> float:
    """The swept lr with the highest final held-out accuracy; a tie goes to the smaller lr."""
    return min(sweep, key=lambda lr: (-sweep[lr]["accuracy_final"]["mean"], lr))


def paired_difference(full: dict, lora: dict) -> dict:
    """LoRA's final minus full fine-tuning's, paired over the problems both evaluated."""
    problems = sorted(set(full["final"]) & set(lora["final"]), key=int)
    if not problems:
        raise ValueError(f"{full['run_dir']} and {lora['run_dir']} share no held-out problem: not the same seed?")
    return mean_se([lora["final"][p] - full["final"][p] for p in problems])


def compare(pairs: list[tuple[int, dict, dict]]) -> dict:
    """Per arm and seed its figures, the arms' means over seeds, and per seed the paired difference."""
    arms: dict[str, dict] = {"full": {"seeds": {}}, "lora": {"seeds": {}}}
    diffs = {}
    for seed, full, lora in pairs:
        arms["full"]["seeds"][str(seed)] = run_figures(full)
        arms["lora"]["seeds"][str(seed)] = run_figures(lora)
        diffs[str(seed)] = paired_difference(full, lora)
    for arm in arms.values():
        finals = [r["accuracy_final"]["mean"] for r in arm["seeds"].values()]
        arm["accuracy_final_over_seeds"] = mean_se(finals)
        arm["accuracy_v0_over_seeds"] = mean_se([r["accuracy_v0"]["mean"] for r in arm["seeds"].values()])
    return {"arms": arms, "lora_minus_full": diffs,
            "lora_minus_full_over_seeds": mean_se([d["mean"] for d in diffs.values()])}


def print_table(section: dict) -> None:
    print_header(f"{'run':22} {'acc v0':>16} {'acc final':>16} {'wall s':>8}")
    for lr, r in section["sweep"]["runs"].items():
        print(f"{'sweep lora lr ' + lr:22} {_ms(r['accuracy_v0']):>16} {_ms(r['accuracy_final']):>16} "
              f"{r['wall_s'] or 0:>8.0f}")
    for arm, a in section["arms"].items():
        for seed, r in a["seeds"].items():
            print(f"{arm + ' seed ' + seed:22} {_ms(r['accuracy_v0']):>16} {_ms(r['accuracy_final']):>16} "
                  f"{r['wall_s'] or 0:>8.0f}")
    for seed, d in section["lora_minus_full"].items():
        print(f"seed {seed}: lora - full at the end {_ms(d)} (paired over {d['n']} problems)")


def _ms(x: dict) -> str:
    return f"{x['mean']:.3f} ± {x['se']:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--steps", type=int, default=10, help="versions per run (every arm the same)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sweep-lrs", type=float, nargs="+", default=[5e-5, 2e-4, 1e-3])
    ap.add_argument("--sweep-seed", type=int, default=100)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--targets", default=TARGETS, help="LoRA target modules, comma-separated")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench-lora-accuracy"))
    ap.add_argument("--collect-sweep", nargs="+", type=Path, metavar="RUN_DIR", help="the sweep's run dirs, in "
                    "--sweep-lrs order; lrs past the last dir given are run (a sweep extended)")
    ap.add_argument("--collect", nargs="+", type=Path, metavar="RUN_DIR",
                    help="the comparison's run dirs: full, lora per seed in --seeds order (run nothing for it)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if len(args.seeds) < 3 and not args.collect:
        ap.error("--seeds: at least 3 (the comparison reports a spread over seeds)")
    targets = args.targets.split(",")
    base = [f"trainer.steps={args.steps}", f"eval.every={args.steps}"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    load_before = load_now()

    def run(tag: str, seed: int, sets: list[str]) -> Path:
        d = Path(args.run_root) / f"{tag}-s{seed}-{stamp}"
        print(f"--- {tag}, seed {seed}: {d}", flush=True)
        code = run_job_cli(args.config, d, seed, base + sets)
        if code != 0:
            raise SystemExit(f"{tag} seed {seed} exited {code}: see {d}")
        return d

    sweep_dirs = list(args.collect_sweep or [])
    if len(sweep_dirs) > len(args.sweep_lrs):
        ap.error(f"--collect-sweep: {len(sweep_dirs)} run dirs for {len(args.sweep_lrs)} --sweep-lrs")
    sweep_dirs += [run(f"sweep-lora-lr{lr:g}", args.sweep_seed, lora_sets(args.rank, lr, targets))
                   for lr in args.sweep_lrs[len(sweep_dirs):]]
    sweep = {lr: run_figures(held_out(d)) for lr, d in zip(args.sweep_lrs, sweep_dirs, strict=True)}
    lr = choose_lr(sweep)
    print(f"chosen LoRA lr {lr:g} (final held-out accuracy {sweep[lr]['accuracy_final']['mean']:.3f} at seed "
          f"{args.sweep_seed})", flush=True)
    if args.collect:
        if len(args.collect) != 2 * len(args.seeds):
            ap.error(f"--collect: {2 * len(args.seeds)} run dirs (full and lora per seed), got {len(args.collect)}")
        dirs = [(args.collect[2 * i], args.collect[2 * i + 1]) for i in range(len(args.seeds))]
    else:
        dirs = [(run("full", s, []), run(f"lora-r{args.rank}", s, lora_sets(args.rank, lr, targets)))
                for s in args.seeds]
    section = {"config": args.config, "steps": args.steps, "seeds": args.seeds, "rank": args.rank,
               "full_lr": load_config(ROOT / args.config).trainer.engine.lr,  # the job's own: not swept
               "alpha": 2.0 * args.rank, "targets": targets,
               "sweep": {"seed": args.sweep_seed, "lrs": args.sweep_lrs, "chosen_lr": lr,
                         "rule": "the highest final held-out accuracy at the sweep seed; a tie: the smaller lr",
                         "runs": {f"{k:g}": v for k, v in sweep.items()}},
               **compare([(s, held_out(f), held_out(g)) for s, (f, g) in zip(args.seeds, dirs)])}
    print_table(section)
    write_section(args.out, SECTION, section, load_before, "lora")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
