"""What the benchmarks that run the demo job several times share: their command line and
their run loop (repetitions on one embedded broker, one table, one JSON).

Used by ``async_vs_sync.py``, ``publish_dtype.py``, ``delta_sparsity.py`` and ``broker_jit.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_results, write_section
from astraflow.topics import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]


def job_arguments(description: str, results: Path, argv: list[str] | None,
                  extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """``--config --steps --repeats --quick --out --run-root`` (plus ``extra``'s), checked:
    at least 3 repetitions unless ``--quick`` (6 steps, 1 repetition), at least 4 steps."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="6 steps, 1 repetition (a smoke run, not a result)")
    ap.add_argument("--out", default=str(results))
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench"))
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    check_repetitions(ap, args, quick_steps=6)
    return args


def check_repetitions(ap: argparse.ArgumentParser, args: argparse.Namespace, quick_steps: int) -> None:
    """``--quick``: ``quick_steps`` steps, 1 repetition; otherwise at least 3 repetitions (every
    table shows median and spread) and at least 4 steps (steady state starts after step 2)."""
    if args.quick:
        args.steps, args.repeats = min(args.steps, quick_steps), 1
    elif args.repeats < 3:
        ap.error("--repeats must be >= 3 (the tables show median and spread); --quick for a smoke run")
    if args.steps < 4:
        ap.error("--steps must be >= 4 (steady state starts after step 2)")


def run_repetitions(name: str, args: argparse.Namespace, one_repetition: Callable[..., dict],
                    aggregate: Callable[[list[dict]], dict], print_table: Callable[[dict], None],
                    keep: tuple[str, ...] = (), section: str | None = None, extra: dict | None = None,
                    shared_broker: bool = True) -> int:
    """Every repetition on one embedded broker (``shared_broker=False``: none; each run starts its
    own and ``one_repetition`` gets None), then the table and ``args.out``: the whole file
    (the sections ``keep`` names, which other runs of the benchmark write, carried over as they
    were), or only its ``section`` (with ``extra`` fields), the rest left as measured."""
    load_before = load_now()
    with EmbeddedBroker(heap="1g") if shared_broker else contextlib.nullcontext() as broker:
        reps = [one_repetition(args, broker, rep) for rep in range(args.repeats)]
    agg = aggregate(reps)
    print_table(agg)
    out = {"benchmark": name, "steps": args.steps, "repeats": args.repeats, "config": args.config,
           "quick": args.quick, **(extra or {}), **agg, "repetitions": reps}
    if section is not None:
        write_section(args.out, section, out, load_before, name)
        return 0
    before = json.loads(Path(args.out).read_text()) if keep and Path(args.out).is_file() else {}
    out.update({k: before[k] for k in keep if k in before})
    write_results(args.out, out, load_before)
    return 0


def run_job_once(args: argparse.Namespace, broker, rep: int, overrides: dict, label: str):
    """One run of ``args.config`` with ``overrides`` (its ``job`` names the run) on ``broker``,
    under ``args.run_root``; returns its run dir and config."""
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when a run starts
    from astraflow.launcher import run_job
    cfg = load_config(args.config, overrides)
    run_dir = Path(args.run_root) / cfg.job
    print(f"--- repetition {rep + 1}: {label} ({cfg.job})", flush=True)
    run_job(cfg, bootstrap=broker.bootstrap_servers, run_dir=run_dir, progress=False,
            overrides=[f"{k}={v}" for k, v in overrides.items()])
    return run_dir, cfg
