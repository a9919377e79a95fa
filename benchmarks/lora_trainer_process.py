"""Two LoRA policies of SmolLM2 trained in one trainer process against two: the memory it saves.

Writes the ``trainer_process`` section of ``benchmarks/results/lora.json``. ``trainer.process``
lets one trainer process train several policies' adapters of one base, each later engine's
frozen base being the first one's tensors (``engines.lora.share_base``). Per
repetition, on the same rolled-out batches (``real_model_weights.rollouts``, seed = the
repetition):

* **one process**: a child building both policies' trainers (rank 8 on all seven
  projections, the two adapters' own seeds) and training each on every batch, in turn;
* **two processes**: the same two trainers, each in a child of its own, one after the other;
  their figures are summed (what two trainer processes hold side by side).

Every child runs with glibc's mmap threshold pinned (``lib.memory.PINNED_MALLOC``) and reports
its resident set once the trainers are built (``built_mb``), its peak (``VmHWM``) and its
resident set once trained. The one process takes its trainers' steps in turn, as this child
does; in a job their actors may step at once, whose activations would then add up (not
measured). Arms alternate in order across repetitions.

    python -m astraflow.benchmarks.lora_trainer_process            # 3 repetitions x 2 batches
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
from pathlib import Path

from astraflow.benchmarks.lib.child import child_run, run_child, write_result
from astraflow.benchmarks.lib.job_runs import ROOT
from astraflow.benchmarks.lib.memory import PINNED_MALLOC, vm_mb
from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.lib.table import print_header

RESULTS = ROOT / "benchmarks" / "results" / "lora.json"
SECTION = "trainer_process"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIGURES = ("built_mb", "peak_rss_mb", "rss_after_train_mb")


def lora_extra(seed: int, rank: int) -> dict:
    return {"trainer.engine.lora": {"rank": rank, "alpha": 2.0 * rank, "target_modules": TARGETS},
            "trainer.engine.lr": 2e-4, "trainer.engine.seed": seed}


def train_child(argv: list[str]) -> int:
    """``--train-child``: build the trainers of ``--seeds`` (one per policy) in this process,
    train each on every pickled batch in turn; this process's memory."""
    from astraflow.actors.common import make_train_engine, model_path, set_threads, to_train_batch
    from astraflow.benchmarks.real_model_weights import _config
    from astraflow.topics import Batch

    ap = argparse.ArgumentParser()
    ap.add_argument("--train-child", action="store_true")
    ap.add_argument("--batches", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    batches = pickle.loads(args.batches.read_bytes())
    set_threads(args.threads)
    before = vm_mb("VmRSS")
    trainers = []
    for s in args.seeds:
        cfg = _config(s, extra=lora_extra(s, args.rank))
        trainers.append((cfg, make_train_engine(cfg, model_path(cfg))))
    built = vm_mb("VmRSS")
    for k, groups in enumerate(batches):
        for cfg, trainer in trainers:
            trainer.train_step(to_train_batch(Batch(cfg.policy, k, groups, [])))
    write_result(args.out, {"trainers": len(trainers), "rss_before_mb": before, "built_mb": built,
                            "peak_rss_mb": vm_mb("VmHWM"), "rss_after_train_mb": vm_mb("VmRSS"),
                            "shared_base_params": [t.shared_base_params for _, t in trainers],
                            "base_params": sum(1 for _ in trainers[0][1].engine.module.parameters())})
    for _, trainer in trainers:
        trainer.close()
    return 0


def one_repetition(rep: int, args) -> dict:
    from astraflow.benchmarks.real_model_weights import rollouts
    batches, info = rollouts(rep, args.steps, args.groups)
    seeds = [1000 + 2 * rep, 1001 + 2 * rep]  # the two policies' adapters
    out: dict = {"rollouts": info, "seeds": seeds}
    order = ["one_process", "two_processes"][::(-1 if rep % 2 else 1)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "batches.pkl"
        path.write_bytes(pickle.dumps(batches))

        def child(which: list[int], what: str) -> dict:
            return run_child("astraflow.benchmarks.lora_trainer_process",
                             ["--train-child", "--batches", str(path), "--seeds", *map(str, which), "--rank",
                              str(args.rank), "--threads", str(args.threads)], what, env=PINNED_MALLOC)
        for arm in order:
            print(f"--- repetition {rep + 1}: {arm}", flush=True)
            if arm == "one_process":
                out[arm] = child(seeds, "one trainer process of two LoRA trainers")
            else:
                parts = [child([s], f"a trainer process of one LoRA trainer (seed {s})") for s in seeds]
                out[arm] = {**{f: sum(p[f] for p in parts) for f in FIGURES}, "processes": parts}
    out["order"] = order
    return out


def aggregate(reps: list[dict]) -> dict:
    rows = {arm: {f: spread([r[arm][f] for r in reps]) for f in FIGURES} for arm in ("one_process", "two_processes")}
    rows["saved_mb"] = {f: spread([r["two_processes"][f] - r["one_process"][f] for r in reps]) for f in FIGURES}
    return rows


def print_table(section: dict) -> None:
    print_header(f"{'two LoRA trainers of SmolLM2':30} {'built MB':>22} {'peak MB':>22} {'once trained MB':>22}")
    for arm in ("one_process", "two_processes", "saved_mb"):
        r = section["rows"][arm]
        print(f"{arm:30} " + " ".join(f"{fmt_spread(r[f], ',.0f'):>22}" for f in FIGURES))


def main(argv: list[str] | None = None) -> int:
    if (code := child_run(argv, "--train-child", train_child)) is not None:
        return code
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="batches each trainer trains on")
    ap.add_argument("--groups", type=int, default=4, help="prompts per batch (8 samples each)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the table shows median and spread)")
    load_before = load_now()
    reps = [one_repetition(rep, args) for rep in range(args.repeats)]
    section = {"steps": args.steps, "groups": args.groups, "rank": args.rank, "targets": TARGETS,
               "malloc_env": PINNED_MALLOC, "rows": aggregate(reps), "repetitions": reps,
               "note": "the one process's trainers step in turn; in a job they may step at once"}
    print_table(section)
    write_section(args.out, SECTION, section, load_before, "lora")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
