"""A job run as a user runs it, for benchmarks that repeat a job: ``astraflow run CONFIG`` in a run dir of its own.

:func:`run_job_cli` runs one repetition (``--set seed=S --set data.seed=S`` and any other
overrides) as a child process and leaves, beside the run's own ``summary.json``, the load
average before and after it, the command and its exit code (:data:`LOAD_FILE`). Knows
nothing about what a benchmark reads from the run dir.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from astraflow.runs import remove_trees

from .results import ROOT, load_now

__all__ = ["LOAD_FILE", "ROOT", "add_run_flags", "PRUNED", "prune_run_dir", "run_job_cli", "run_load", "run_or_collect"]

LOAD_FILE = "bench_load.json"  #: what a benchmark adds to a run dir it made: the load around the run


def run_job_cli(cfg: str, run_dir: Path, seed: int, sets: list[str]) -> int:
    """``astraflow run cfg`` with seed ``seed`` into ``run_dir``; its exit code."""
    cmd = [sys.executable, "-m", "astraflow.cli", "run", cfg, "--run-dir", str(run_dir), "--quiet",
           "--set", f"seed={seed}", "--set", f"data.seed={seed}", *(a for s in sets for a in ("--set", s))]
    before = load_now()
    started = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOAD_FILE).write_text(json.dumps({"before": before, "after": load_now(), "command": cmd,
                                                 "exit_code": proc.returncode,
                                                 "elapsed_s": round(time.time() - started, 1)}, indent=2))
    return proc.returncode


#: what a finished run dir holds that a benchmark does not read once it has analysed the run: the
#: embedded broker's topic data (a SmolLM2 team's weights topics: ~4 GB a run), the trainers'
#: checkpoints (optimizer states included) and the exported versions. Not ``astraflow.runs.HEAVY``
#: (what ``runs prune --kafka-only`` removes): the broker's log stays here and the exports go.
PRUNED = ("kafka/meta", "checkpoints", "hf")


def prune_run_dir(run_dir: Path) -> int:
    """Remove ``run_dir``'s :data:`PRUNED` parts; the bytes freed. Its metrics, summary, traces and
    logs (the broker's too) stay: what a benchmark's ``--reanalyse`` reads. For benchmarks that
    repeat long jobs, whose run dirs would otherwise fill the disk before the last repetition."""
    return sum(size for _, size in remove_trees([Path(run_dir) / part for part in PRUNED]))


def run_load(run_dir: Path) -> dict:
    """What :func:`run_job_cli` recorded of a run (empty for a run dir it did not make)."""
    path = run_dir / LOAD_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def add_run_flags(ap: argparse.ArgumentParser, results: Path) -> None:
    """``--set``, ``--run-root``, ``--collect`` and ``--out``: what every repeated-job benchmark takes."""
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every run")
    ap.add_argument("--run-root", default=str(ROOT / "runs"))
    ap.add_argument("--collect", nargs="+", type=Path, metavar="RUN_DIR", help="read these run dirs; run nothing")
    ap.add_argument("--out", default=str(results))


def run_or_collect(args: argparse.Namespace, seeds: list[int], tag: str) -> list[Path]:
    """The run dirs to read: ``--collect``'s, or one new run per seed of ``args.config``
    (``<run-root>/<config stem>-<tag>s<seed>-<time>``), run one after another."""
    if args.collect:
        return list(args.collect)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dirs = [Path(args.run_root) / f"{Path(args.config).stem}-{tag}s{s}-{stamp}" for s in seeds]
    for seed, d in zip(seeds, dirs):
        run_job_cli(args.config, d, seed, args.set)
    return dirs
