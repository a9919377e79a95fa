"""The longer-context tiny model against the 128-position one, on the search agent's work.

Two cached builds (``astraflow model init --task search`` and ``--task search_wide``; or any
``--models``), each measured the way its bootstrap measures (:func:`astraflow.models.measure.mean_score`)
on the held-out turns of both warm-start tasks — ``search`` (a search shows one document; every
episode fits 128 positions) and ``search_wide`` (five documents; up to ~190) — greedy and at
t=0.6 (k=4), and by whole held-out episodes of both jobs (``examples/search_agent.yaml`` and
``examples/search_agent_long.yaml``: all 54 held-out questions x ``eval.k``, the evaluator's own
:func:`~astraflow.actors.evaluator.episode_evaluation`), with each model's own window. The
episode figures at the job's settings are what its RL run starts from (v0).

Prints one table; writes ``benchmarks/results/long_context_model.json``.
Usage: ``python -m astraflow.benchmarks.long_context_model [--models DIR...]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.models.bootstrap import cache_root
from astraflow.models.measure import distinct_examples, mean_score
from astraflow.models.spec import default_spec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "long_context_model.json"
TASKS = ("search", "search_wide")
JOBS = {"search": ROOT / "examples" / "search_agent.yaml", "search_wide": ROOT / "examples" / "search_agent_long.yaml"}


def measure(model_dir: Path) -> dict:
    import torch  # torch, transformers and the engines (seconds to import): only when it measures
    from transformers import AutoTokenizer

    from astraflow.actors.evaluator import episode_evaluation
    from astraflow.actors.heldout import heldout_problems
    from astraflow.config import load_config
    from astraflow.engines.cpu import CpuEngine
    from astraflow.models.warm_start import get_task

    torch.set_num_threads(1)
    report = json.loads((model_dir / "bootstrap.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    engine = CpuEngine(model_dir)
    out = {"model": str(model_dir), "task": report["task"], "positions": engine.max_positions,
           "sft_steps": report["sft_steps"], "build_seconds": report["build_seconds"], "turns": {}, "episodes": {}}
    for task in TASKS:
        warm, spec = get_task(task), default_spec(task)
        knobs = {"max_digits": spec.max_digits, "ops": spec.ops}
        held = distinct_examples(warm, spec.heldout_problems, 0, "heldout", knobs)
        out["turns"][task] = {"greedy": mean_score(warm, engine, tok, held, k=1, temperature=0.0),
                              "t0.6_k4": mean_score(warm, engine, tok, held, k=4, temperature=0.6, seed=0),
                              "examples": len(held)}
        cfg = load_config(JOBS[task])
        ev = episode_evaluation(cfg, engine, tok, heldout_problems(cfg))
        out["episodes"][task] = {"success": ev.accuracy, "stderr": ev.stderr, "stderr_tasks": ev.stderr_tasks,
                                 "episodes": ev.episodes, "turns": ev.turns, "tool_calls": ev.actions}
    engine.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", type=Path,
                    default=[cache_root() / default_spec(t).key(0, t) for t in TASKS])
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    load = load_now()
    rows = [measure(m) for m in args.models]
    head = (f"{'model':<40} {'pos':>5} " + " ".join(f"{t + ' turns g/t.6':>24}" for t in TASKS)
            + " " + " ".join(f"{t + ' episodes':>22}" for t in TASKS))
    print(head)
    print("-" * len(head))
    for r in rows:
        turns = " ".join(f"{r['turns'][t]['greedy']:>11.3f} / {r['turns'][t]['t0.6_k4']:<10.3f}" for t in TASKS)
        eps = " ".join(f"{r['episodes'][t]['success']:>13.3f} ± {r['episodes'][t]['stderr']:.3f}" for t in TASKS)
        print(f"{Path(r['model']).name:<40} {r['positions']:>5} {turns} {eps}")
    write_results(args.out, {"models": rows}, load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
