"""Does a real pretrained model learn here? Repetitions of the SmolLM2 chat-arithmetic job, paired over problems.

Runs ``astraflow run examples/smollm2_chat_arithmetic.yaml`` (or ``--config``) once per seed,
one after another, each in a run dir of its own (``--set seed=S --set data.seed=S``: the
sampling, the training prompts' order and the held-out problems), or, with ``--collect
DIR...``, reads run dirs made before. Per run, from its ``summary.json`` (the run's own
record of its metrics topic; the job evaluates greedily at its first and last version):

* held-out accuracy at v0 and at the final version, each with its standard error over problems;
* the rise, and its standard error **paired** over problems (the same held-out problems at
  both versions: the standard error of the mean per-problem change), and the rise in those
  standard errors (``rise_se_paired``; the issue's bar is >= 2 within 30 minutes);
* wall seconds of the run and the load average around it (this box is shared).

With ``--sets gsm8k100 humaneval`` each run's v0 model and its final exported version
(``<run>/hf/<policy>/v<N>``) are also evaluated on those benchmark sets after the run
(greedy; outside the run's wall time). Prints one table; writes
``benchmarks/results/real_model_runs.json`` (or ``--out``).

Usage: ``python -m astraflow.benchmarks.real_model_runs [--seeds 0 1 2] [--set KEY=VALUE]...
[--sets gsm8k100 humaneval] [--sets-limit N]`` or ``... --collect RUN_DIR...``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from astraflow.benchmarks.lib.job_runs import ROOT, add_run_flags, run_load, run_or_collect
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.table import print_header

RESULTS = ROOT / "benchmarks" / "results" / "real_model_runs.json"
CONFIG = "examples/smollm2_chat_arithmetic.yaml"


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def repetition(run_dir: Path) -> dict:
    """One run dir's figures, from its ``summary.json``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    per_problem = summary.get("eval_task_reward_by_version")
    if not per_problem or len(per_problem) < 2:
        raise ValueError(f"{run_dir}/summary.json has no per-problem held-out rewards at two versions "
                         f"(eval_task_reward_by_version): a run from before they were recorded, or one that "
                         f"evaluated once")
    v0, v1 = min(per_problem, key=int), max(per_problem, key=int)
    problems = sorted(set(per_problem[v0]) & set(per_problem[v1]), key=int)
    a = [per_problem[v0][p] for p in problems]
    b = [per_problem[v1][p] for p in problems]
    change = [y - x for x, y in zip(a, b)]
    rise = statistics.mean(change)
    paired = _se(change)
    load = run_load(run_dir)
    return {
        "run_dir": str(run_dir), "seed": summary.get("seed"),
        "versions": [int(v0), int(v1)], "problems": len(problems),
        "accuracy_v0": statistics.mean(a), "accuracy_final": statistics.mean(b),
        "se_v0": _se(a), "se_final": _se(b), "rise": rise, "se_rise_paired": paired,
        "rise_se_paired": rise / paired if paired else None,
        "problems_up_down_same": [sum(c > 0 for c in change), sum(c < 0 for c in change), sum(c == 0 for c in change)],
        "wall_s": summary["wall_s"], "time_to_first_step_s": summary.get("time_to_first_step_s"),
        "steps_trained": summary["steps_trained"], "audit_ok": (summary.get("audit") or {}).get("ok"),
        "load_before": load.get("before", {}).get("loadavg"), "load_after": load.get("after", {}).get("loadavg"),
    }


def benchmark_sets(run: dict, config: str, sets: list[str], limit: int | None,
                   done: dict | None = None) -> dict:
    """``sets`` at the run's v0 model and its final exported version: {set: {v0, final, rows}}.
    ``done`` keeps each (model dir, set)'s score across runs: every seed starts from the same
    fetched model, and greedy decoding scores it the same each time."""
    from transformers import AutoTokenizer

    from astraflow.actors.common import model_path
    from astraflow.config import load_config
    from astraflow.engines.cpu import CpuEngine
    from astraflow.workflows.chat import PromptRenderer
    from astraflow.workflows.eval_sets import evaluate_set

    cfg = load_config(ROOT / config)
    start = model_path(cfg)
    final = Path(run["run_dir"]) / "hf" / cfg.policy / f"v{run['versions'][1]}"
    done = {} if done is None else done
    out: dict = {}
    for label, path in (("v0", start), ("final", final)):
        todo = [name for name in sets if (str(path), name) not in done]
        if todo:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            engine = CpuEngine(path, threads=None)
            render = PromptRenderer(path, cfg.data.chat_template, cfg.data.system, tokenizer)
            for name in todo:
                done[str(path), name] = evaluate_set(engine, tokenizer, name, render=render, limit=limit)
            engine.close()
        for name in sets:
            mean, rows = done[str(path), name]
            out.setdefault(name, {"rows": len(rows)})[label] = mean
    return out


def table(rows: list[dict]) -> None:
    print_header(f"{'seed':>4} {'v0':>13} {'final':>13} {'rise':>7} {'SE paired':>9} {'rise/SE':>7} "
                 f"{'+/-/=':>9} {'wall s':>7} {'load':>11}  benchmark sets (v0 -> final)")
    for r in rows:
        ud = "/".join(map(str, r["problems_up_down_same"]))
        load = f"{(r['load_before'] or ['?'])[0]}->{(r['load_after'] or ['?'])[0]}"
        z = f"{r['rise_se_paired']:+.1f}" if r["rise_se_paired"] is not None else "-"
        sets = "  ".join(f"{k} {v.get('v0', float('nan')):.3f}->{v.get('final', float('nan')):.3f}"
                         for k, v in (r.get("sets") or {}).items())
        print(f"{r['seed'] if r['seed'] is not None else '?':>4} {r['accuracy_v0']:6.3f}±{r['se_v0']:.3f} "
              f"{r['accuracy_final']:6.3f}±{r['se_final']:.3f} {r['rise']:+7.3f} {r['se_rise_paired']:9.3f} "
              f"{z:>7} {ud:>9} {r['wall_s']:7.0f} {load:>11}  {sets}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sets", nargs="*", default=[], help="benchmark sets to evaluate at v0 and final (gsm8k100, "
                                                         "humaneval) after each run")
    ap.add_argument("--sets-limit", type=int, help="evaluate only the first N items of each set")
    add_run_flags(ap, RESULTS)
    args = ap.parse_args(argv)
    load_before = load_now()
    dirs = run_or_collect(args, args.seeds, "")
    runs = [repetition(d) for d in dirs]
    scored: dict = {}
    for r in runs:
        if args.sets:
            r["sets"] = benchmark_sets(r, args.config, args.sets, args.sets_limit, scored)
    table(runs)
    zs = [r["rise_se_paired"] for r in runs if r["rise_se_paired"] is not None]
    result = {"benchmark": "real_model_runs", "config": args.config, "overrides": args.set, "runs": runs,
              "min_rise_se_paired": min(zs) if zs else None, "wall_s_max": max(r["wall_s"] for r in runs)}
    print(f"{len(runs)} runs: rise in paired SE min {result['min_rise_se_paired']}, wall max "
          f"{result['wall_s_max']:.0f} s (bar: >= 2 SE within 1800 s in each)")
    write_results(args.out, result, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import Loader, ReadmeRow, heading, load_note  # noqa: E402 (with the tables)

REPORT_TITLE = "A real model learns: SmolLM2-135M-Instruct"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``real_model_runs.json``."""
    d = load("real_model_runs")
    if not d:
        return []
    out = [*heading(REPORT_TITLE),
           f"**{REPORT_TITLE}** — `python -m astraflow.benchmarks.real_model_runs` (`{d['config']}`: GRPO on "
           f"chat-formatted sums, greedy held-out accuracy of the job's own evaluator at its first and last "
           f"version, {len(d['runs'])} run(s){load_note(d)}; the bar is a rise of at least 2 standard errors, "
           f"paired over problems, within 1,800 s)", "",
           "| seed | v0 ± SE | final ± SE | rise | SE of the rise (paired) | rise / SE | problems +/−/= | wall s |"
           + "".join(f" {name} v0 → final |" for name in _set_names(d)),
           "|---:|---|---|---:|---:|---:|---|---:|" + "---|" * len(_set_names(d))]
    for r in d["runs"]:
        z = f"{r['rise_se_paired']:+.1f}" if r["rise_se_paired"] is not None else "–"
        sets = "".join(f" {r['sets'][n]['v0']:.2f} → {r['sets'][n]['final']:.2f} ({r['sets'][n]['rows']} items) |"
                       if n in (r.get("sets") or {}) else " – |" for n in _set_names(d))
        out.append(f"| {r['seed'] if r['seed'] is not None else '?'} | {r['accuracy_v0']:.3f} ± {r['se_v0']:.3f} "
                   f"(v{r['versions'][0]}) | {r['accuracy_final']:.3f} ± {r['se_final']:.3f} (v{r['versions'][1]}) | "
                   f"{r['rise']:+.3f} | {r['se_rise_paired']:.3f} | {z} | "
                   f"{'/'.join(map(str, r['problems_up_down_same']))} | {r['wall_s']:,.0f} |{sets}")
    return out + [""]


def _set_names(d: dict) -> list[str]:
    """The benchmark sets any run was scored on, in first-seen order."""
    return list(dict.fromkeys(n for r in d["runs"] for n in (r.get("sets") or {})))


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: the real model's held-out rise, in paired standard errors."""
    d = load("real_model_runs")
    if not d:
        return None
    runs = d["runs"]
    return ReadmeRow(REPORT_TITLE, f"held-out greedy accuracy v0 → final, rise in paired SE; {len(runs)} seed(s), "
                     f"≤ {max(r['wall_s'] for r in runs):,.0f} s wall",
                     " · ".join(f"{r['accuracy_v0']:.2f} → {r['accuracy_final']:.2f} ({r['rise_se_paired']:+.1f} SE)"
                                for r in runs), "higher")
