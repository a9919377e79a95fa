"""What-if replays of one recorded job: its own settings (a bit-exact check) beside changed ones.

Replays a job's recorded batches (``astraflow replay``) once with the settings it ran
with — every announced version must come back bit for bit — and once per ``--what-if``
(default: the M2PO loss, and a 5x learning rate), each a new lineage trained on the same
batches and evaluated on the job's held-out set at the versions its evaluator measured.
The job is an existing one (``--job``, ``--bootstrap-servers``, ``--config``; e.g. the
README demo after ``astraflow broker start --data-dir <its run dir>/kafka``) or, without
``--job``, a short job this script first runs on an embedded broker.

Prints one table and writes ``benchmarks/results/replay_whatif.json`` (and the first what-if's
plot beside it, ``replay_whatif.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.cli import _overrides
from astraflow.config import load_config
from astraflow.launcher import run_job
from astraflow.replay import ReplayRequest, replay
from astraflow.topics import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "replay_whatif.json"
DEFAULT_WHAT_IFS = ["m2po:trainer.engine.loss=m2po", "lr_x5:trainer.engine.lr=1.0e-3"]


def _what_if(spec: str) -> tuple[str, dict]:
    name, _, sets = spec.partition(":")
    if not sets:
        raise SystemExit(f"--what-if expects NAME:KEY=VALUE[,KEY=VALUE...], got {spec!r}")
    return name, _overrides(sets.split(","))


def _row(name: str, summary: dict) -> dict:
    div = summary["first_divergence"]
    return {
        "lineage": name, "id": summary["lineage"], "changes": summary["changes"],
        "versions_compared": summary["versions_compared"], "versions_matched": summary["versions_matched"],
        "bit_exact": summary["bit_exact"], "diverged_at_version": div["version"] if div else None,
        "accuracy_by_version": summary["accuracy_by_version"], "accuracy_final": summary["accuracy_final"],
        "recorded_accuracy_by_version": summary["recorded_accuracy_by_version"],
        "steps": summary["steps_trained"], "wall_s": summary["wall_s"], "run_dir": summary["run_dir"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", help="an existing job to replay (default: run a short one first)")
    ap.add_argument("--bootstrap-servers", help="its cluster (with --job)")
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"),
                    help="the job's config (with --job: the file it ran with)")
    ap.add_argument("--steps", type=int, default=20, help="without --job: steps of the job to run")
    ap.add_argument("--to-step", type=int, help="replay up to this version (default: every recorded batch)")
    ap.add_argument("--what-if", action="append", metavar="NAME:KEY=VALUE[,...]",
                    help=f"a changed lineage (repeatable; default: {' '.join(DEFAULT_WHAT_IFS)})")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench-replay"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    what_ifs = [_what_if(s) for s in args.what_if or DEFAULT_WHAT_IFS]
    run_root = Path(args.run_root) / time.strftime("%Y%m%d-%H%M%S")
    load = load_now()
    with contextlib.ExitStack() as stack:
        if args.job:
            if not args.bootstrap_servers:
                raise SystemExit("--job needs --bootstrap-servers (the cluster that holds the job's topics)")
            bootstrap, base = args.bootstrap_servers, {"job": args.job}
            source = "existing job"
        else:
            broker = EmbeddedBroker(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "kafka").start()
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap_servers
            base = {"trainer.steps": args.steps, "job": f"replay-bench-{int(time.time())}"}
            run_job(load_config(args.config, base), bootstrap=bootstrap, run_dir=run_root / "job", progress=False)
            source = f"a {args.steps}-step job run by this script"
        cfg = load_config(args.config, base)
        rows = []
        for name, changes in [("recorded", {}), *what_ifs]:
            summary = replay(ReplayRequest(cfg, load_config(args.config, {**base, **changes}), bootstrap,
                                           to_step=args.to_step,
                                           run_dir=run_root / name), say=lambda _: None)
            rows.append(_row(name, summary))
            print(f"{name}: {summary['steps_trained']} versions in {summary['wall_s']:.0f}s", flush=True)
    _print(cfg.job, rows)
    write_results(args.out, {"job": cfg.job, "source": source, "config": cfg.source, "lineages": rows}, load)
    if len(rows) > 1:  # the first what-if's plot (replay beside the recorded job) for the README
        shutil.copyfile(Path(rows[1]["run_dir"]) / "plot.png", Path(args.out).with_suffix(".png"))
    return 0 if rows[0]["bit_exact"] else 1


def _print(job: str, rows: list[dict]) -> None:
    versions = sorted({int(v) for r in rows for v in r["accuracy_by_version"]})
    recorded = rows[0]["recorded_accuracy_by_version"]
    head = ["lineage", "bit-exact / diverges at"] + [f"acc v{v}" for v in versions] + ["replay s"]
    table = [["job (recorded)", "-"] + [f"{recorded[v]:.3f}" if v in recorded else "-" for v in versions] + ["-"]]
    for r in rows:
        verdict = (f"yes ({r['versions_matched']}/{r['versions_compared']})" if r["bit_exact"] else
                   f"v{r['diverged_at_version']}" if r["diverged_at_version"] is not None else "no divergence")
        acc = r["accuracy_by_version"]
        table.append([r["lineage"], verdict] + [f"{acc[v]:.3f}" if v in acc else "-" for v in versions]
                     + [f"{r['wall_s']:.0f}"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    print(f"\nwhat-if replays of job {job} (the same recorded batches, held-out pass@1)")
    for line in [head, *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths)))


if __name__ == "__main__":
    sys.exit(main())
