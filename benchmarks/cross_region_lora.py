"""Cross-region with a LoRA policy: the mirrored link's bytes per version, adapter against full model.

Issue 59's cross-region arm. ``cross_region``'s mirrored arm (the demo job through ``astraflow
launch``: trainer, dataflow and one RaaS node in region A, two RaaS nodes in region B on a
cluster of their own that MirrorMaker 2 fills; an emulated link of ``--bandwidth-mbps`` and
``--latency-ms`` each way; bf16 sparse deltas with a snapshot every ``--snapshot-every``
versions), run two ways in each repetition (order alternating):

* ``full``: the demo job as it is: every weight trains and every version carries the model;
* ``lora``: the same job with ``trainer.engine.lora`` (``--rank``, alpha 2 x rank, on
  ``--targets``) at ``--lora-lr``: a version carries the adapter's matrices alone (and names
  the base by its digest).

Per arm, ``cross_region.arm_numbers``'s cell (link bytes toward B per version published, tasks
included; the weight bytes the trainer published per version; crossings; region B's lag; the
held-out accuracy at the last version; the audit); over the repetitions median (min–max), and
``lora_over_full``: the link's bytes per version of the LoRA arm over the full arm's, paired
within a repetition. Bytes do not depend on the machine's load; seconds and lag do.

    python -m astraflow.benchmarks.cross_region_lora          # 3 repetitions x 2 arms, ~20 min
    python -m astraflow.benchmarks.cross_region_lora --quick  # a smoke run (numbers mean nothing)

Writes ``benchmarks/results/cross_region_lora.json``. Needs what ``cross_region`` needs (root,
``ip``, ``tc``, ``unshare``, ``nsenter``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from astraflow.benchmarks.cross_region import ROOT, run_arm
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_header
from astraflow.topology.netns import check_capabilities

RESULTS = ROOT / "benchmarks" / "results" / "cross_region_lora.json"
ARMS = ("full", "lora")
#: the cell's numbers given as spreads over the repetitions
KEYS = ("link_bytes_per_version", "weights_bytes_per_version", "weights_crossings", "lag_versions_p95", "s_per_step",
        "accuracy")


def lora_settings(rank: int, lr: float, targets: list[str]) -> dict:
    """The job settings that make the demo's policy a LoRA adapter of its model."""
    return {"trainer": {"engine": {"lr": lr, "lora": {"rank": rank, "alpha": 2.0 * rank,
                                                       "target_modules": list(targets)}}}}


def aggregate(reps: list[dict]) -> dict:
    """Per arm each of :data:`KEYS` as a spread and the audit over every run; the paired ratio."""
    arms = {}
    for arm in ARMS:
        runs = [r[arm] for r in reps]
        arms[arm] = {k: spread([float(r[k]) for r in runs]) for k in KEYS if all(r.get(k) is not None for r in runs)}
        arms[arm]["audit_ok"] = all(r["audit_ok"] for r in runs)
    return {"arms": arms, "lora_over_full": ratio_spread(arms["lora"]["link_bytes_per_version"],
                                                         arms["full"]["link_bytes_per_version"])}


def print_table(agg: dict) -> None:
    print_header(f"{'arm':6} {'link B/version':>30} {'published B/version':>30} {'accuracy':>22} {'audit':>6}")
    for arm, a in agg["arms"].items():
        print(f"{arm:6} {fmt_spread(a['link_bytes_per_version'], ',.0f'):>30} "
              f"{fmt_spread(a['weights_bytes_per_version'], ',.0f'):>30} {fmt_spread(a['accuracy'], '.3f'):>22} "
              f"{'ok' if a['audit_ok'] else 'FAIL':>6}")
    print(f"LoRA's link bytes per version over full's (paired): {fmt_spread(agg['lora_over_full'], '.4f')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="trainer steps per run")
    p.add_argument("--snapshot-every", type=int, default=10)
    p.add_argument("--problems", type=int, default=200, help="held-out problems of the final evaluation")
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--bandwidth-mbps", type=float, default=100.0)
    p.add_argument("--latency-ms", type=float, default=50.0, help="each way")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="q_proj,v_proj,up_proj", help="LoRA target modules, comma-separated")
    p.add_argument("--lora-lr", type=float, default=2e-3, help="the LoRA arm's learning rate (the demo's is 2e-4)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 repetition, 4 steps, 40 problems")
    p.add_argument("--run-root", type=Path, default=Path("runs") / "cross_region_lora")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.lr = None  # cross_region.job_settings: the full arm keeps the demo's learning rate
    if a.quick:
        a.steps, a.problems, a.snapshot_every, a.repeats = 4, 40, 2, 1
    elif a.repeats < 3:
        p.error("--repeats must be >= 3 (the table shows median and spread)")
    check_capabilities()
    load = load_now()
    targets = a.targets.split(",")
    extra = {"full": {}, "lora": lora_settings(a.rank, a.lora_lr, targets)}
    reps = []
    for rep in range(a.repeats):
        order = ARMS if rep % 2 == 0 else ARMS[::-1]
        reps.append({arm: run_arm(f"lora_{arm}" if arm == "lora" else "mirrored_delta", "mirrored", "delta", a,
                                  a.run_root, extra[arm]) for arm in order})
    agg = aggregate(reps)
    print_table(agg)
    write_results(a.out, {"benchmark": "cross_region_lora", "quick": a.quick, **agg, "repetitions": reps,
                          "settings": {"job": "examples/arithmetic_grpo.yaml", "steps": a.steps,
                                       "delta_snapshot_every": a.snapshot_every, "publish_dtype": "bfloat16",
                                       "eval_problems": a.problems, "eval_k": a.k, "repeats": a.repeats, "seed": a.seed,
                                       "lora": {"rank": a.rank, "alpha": 2.0 * a.rank, "targets": targets,
                                                "lr": a.lora_lr},
                                       "link": {"bandwidth_mbps": a.bandwidth_mbps, "latency_ms_each_way": a.latency_ms,
                                                "emulation": "emulated: tc tbf + Toxiproxy (topology/links.py)"}}},
                  load)
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import Loader, heading, load_note  # noqa: E402 (kept with the tables)

REPORT_TITLE = "Cross-region with a LoRA policy"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md (none for a quick run)."""
    d = load("cross_region_lora")
    if not d or d.get("quick"):
        return []
    st, lo = d["settings"], d["settings"]["lora"]
    out = [*heading(REPORT_TITLE),
           f"**{REPORT_TITLE}** — `python -m astraflow.benchmarks.cross_region_lora` (cross-region's mirrored arm: "
           f"the demo job, {st['steps']} steps, bf16 sparse deltas with a snapshot every {st['delta_snapshot_every']} "
           f"versions, region B's two RaaS nodes on a cluster MirrorMaker 2 fills over an emulated "
           f"{st['link']['bandwidth_mbps']:g} Mbit/s link; full fine-tuning against a LoRA adapter of rank "
           f"{lo['rank']} on {', '.join(lo['targets'])} at lr {lo['lr']:g}; median (min–max) of {st['repeats']} "
           f"repetitions{load_note(d)})", "",
           "| policy | link bytes / version | published bytes / version | accuracy | audit |", "|---|---:|---:|---:|---|"]
    for arm, a in d["arms"].items():
        out.append(f"| {'LoRA' if arm == 'lora' else 'full model'} | {fmt_spread(a['link_bytes_per_version'], ',.0f')} | "
                   f"{fmt_spread(a['weights_bytes_per_version'], ',.0f')} | {fmt_spread(a['accuracy'], '.3f')} | "
                   f"{'ok' if a['audit_ok'] else 'FAIL'} |")
    return out + ["", f"The link carries {fmt_spread(d['lora_over_full'], '.4f')} of the full arm's bytes per version with "
                      f"the LoRA policy (paired; tasks and everything else B fetches included).", ""]


if __name__ == "__main__":
    raise SystemExit(main())
