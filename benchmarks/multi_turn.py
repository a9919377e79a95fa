"""Multi-turn episodes with tool waits: an episode that steps out of the engine's batch while
its tool runs, against one that stays in it; and the CPU engine's re-prefill cost per turn.

**Episodes.** One RaaS node's poll (the real :class:`~astraflow.actors.episodes.EpisodeRunner`
on the real CPU engine with the tiny model) runs ``--episodes`` episodes of the agent
workflow, ``--samples`` samples each, in the ``bench_tool`` environment: a drill of
``--turns`` sums whose every step is a tool call that sleeps (``--tool-s`` seconds times a
factor in [0.5, 1.5) fixed per episode, sample and turn, so the waits interleave), in two
scenarios: ``uniform`` (only that) and ``heavy_tail`` (10 % of calls, fixed the same way,
take 8 times as long: a search API's or a sandbox's long tail). Both arms
run the same tasks with the same seeds, so they generate the same tokens (checked); only
the runner's ``step_out`` differs:

* ``step_out`` (what ships): a waiting episode leaves the batch (``ep.off_engine``), so
  the others' engine calls go ahead without it;
* ``stay_in`` (the baseline, the old behaviour): a waiting episode still counts as running,
  so the batcher flushes only when every episode is back at the engine: each round of calls
  waits for the slowest tool of the round.

Reported per arm: wall seconds per poll, episodes/s, rollout tokens/s (generated tokens /
wall), engine calls and rows per call; ``--repeats`` repetitions, the arms alternating.

**Re-prefill.** The CPU engine keeps no prefix cache between calls, so turn ``k`` of an
episode re-prefills its whole context. Timed on the engine directly: a batch of
``--samples x --episodes`` rows generating 6 tokens each (EOS not a stop) from contexts of
8, 32, 64 and 96 tokens; ``reprefill_share`` = (t(L) - t(8)) / t(L), the part of a turn at
context L spent re-reading what earlier turns had already read.

Prints one table; writes ``benchmarks/results/multi_turn.json``.
Usage: ``python -m astraflow.benchmarks.multi_turn [--episodes 8] [--samples 2] [--turns 3] [--tool-s 0.3]
[--repeats 3] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import zlib
from pathlib import Path

import torch

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.engines.base import SamplingParams
from astraflow.workflows.environments import EnvTask, environment

RESULTS = Path(__file__).resolve().parent / "results" / "multi_turn.json"
CONTEXTS = (8, 32, 64, 96)
SLOW = 8.0  #: a slow tool call takes this many times the usual
#: scenario -> the share of tool calls that are slow
SCENARIOS = {"uniform": 0.0, "heavy_tail": 0.1}


@environment("bench_tool")
class BenchTool:
    """``turns`` sums in a row; every step is a tool call that sleeps before it answers."""

    def __init__(self, turns: int = 3, tool_s: float = 0.3, tail: float = 0.0) -> None:
        self.turns, self.tool_s, self.tail = int(turns), float(tool_s), float(tail)

    def reset(self, task: EnvTask) -> str:
        self.task, self.k, self.right = task, 0, 0
        return self._problem()

    def _problem(self) -> str:
        a, b = 11 + 7 * self.k, 20 + 3 * self.k
        self.answer = str(a + b)
        return f"{a}+{b}="

    def wait_s(self) -> float:
        key = f"{self.task.episode_id}/{self.task.sample}/{self.k}".encode()
        h, slow = zlib.crc32(key) / 2 ** 32, zlib.crc32(key + b"/slow") / 2 ** 32 < self.tail
        return self.tool_s * (0.5 + h) * (SLOW if slow else 1.0)

    def step(self, action):
        time.sleep(self.wait_s())
        self.right += str(action).strip() == self.answer
        self.k += 1
        if self.k >= self.turns:
            return "done", self.right / self.turns, True, {"tool_calls": self.k}
        return self._problem(), 0.0, False, {}


def _tasks(args, tail: float = 0.0) -> list:
    from astraflow.topics import Task  # the Kafka client (~0.7 s to import): only when it measures
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}
    params = {"env": "bench_tool", "env_params": {"turns": args.turns, "tool_s": args.tool_s, "tail": tail},
              "action_format": "eos", "max_turns": args.turns + 2, "deadline_s": 600.0, "env_timeout_s": 60.0}
    return [Task(f"t{i:07d}-p{i}", f"p{i}", "p", "bench", "", args.samples, sampling, workflow="agent", role="agent",
                 params=params) for i in range(args.episodes)]


def run_arm(engine, tok, tasks, step_out: bool) -> dict:
    from astraflow.actors.episodes import EpisodeRunner  # the Kafka client with it (~0.7 s): only when it measures
    runner = EpisodeRunner("p", "bench", engine, tok, 7, engine_lock=threading.Lock(), step_out=step_out)
    try:
        t0 = time.perf_counter()
        per_task = runner.run(tasks)
        wall = time.perf_counter() - t0
    finally:
        runner.close()
    groups = [g for gs in per_task for g in gs]
    bad = [g.error for g in groups if g.status != "ok"]
    if bad:
        raise RuntimeError(f"an episode failed: {bad[0]}")
    tokens = sum(sum(s.loss_mask) for g in groups for s in g.samples)
    steps = sum(s.info.get("actions", 0) for g in groups for s in g.samples)
    return {"wall_s": wall, "episodes_per_s": len(tasks) / wall, "tokens_per_s": tokens / wall, "tokens": tokens,
            "tool_calls": steps, "engine_calls": runner.engine_calls,
            "rows_per_call": runner.engine_rows / max(1, runner.engine_calls),
            "fingerprint": [list(s.tokens) for g in groups for s in g.samples]}


def reprefill(engine, rows: int, repeats: int) -> dict:
    """Seconds of one call per context length, the lengths interleaved round by round (so the
    machine's load falls on all of them alike)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    prompts = {n: [[5 + (i + j) % 20 for j in range(n)] for i in range(rows)] for n in CONTEXTS}
    for n in CONTEXTS:
        engine.generate(prompts[n], params, seeds=list(range(rows)))  # warm each shape
    times: dict[int, list[float]] = {n: [] for n in CONTEXTS}
    for _ in range(repeats):
        for n in CONTEXTS:
            t0 = time.perf_counter()
            gens = engine.generate(prompts[n], params, seeds=list(range(rows)))
            times[n].append(time.perf_counter() - t0)
            assert all(len(g.tokens) == 6 for g in gens), "a row stopped early: the comparison needs equal work"
    out = {str(n): spread(v) for n, v in times.items()}
    base = out[str(CONTEXTS[0])]["median"]
    for n in CONTEXTS:
        s = out[str(n)]
        s["reprefill_share"] = max(0.0, (s["median"] - base) / s["median"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tool-s", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 episodes, 1 repetition (a smoke run; not a result)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.episodes, args.repeats = 2, 1
    from transformers import AutoTokenizer  # transformers and the engine (~1 s to import): only when it measures

    from astraflow.engines.cpu import CpuEngine
    from astraflow.models.bootstrap import ensure_tiny_model
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    load = load_now()
    path = ensure_tiny_model()
    tok, engine = AutoTokenizer.from_pretrained(str(path)), CpuEngine(path)
    try:
        run_arm(engine, tok, _tasks(args)[:1], True)  # warm the engine
        scenarios = {}
        for scenario, tail in SCENARIOS.items():
            tasks = _tasks(args, tail)
            arms = {"step_out": [], "stay_in": []}
            for _ in range(args.repeats):
                for name in arms:
                    arms[name].append(run_arm(engine, tok, tasks, name == "step_out"))
            same = all(a["fingerprint"] == b["fingerprint"] for a, b in zip(arms["step_out"], arms["stay_in"]))
            if not same:
                raise RuntimeError("the two arms generated different tokens: not a comparison of the same episodes")
            summary = {}
            for name, runs in arms.items():
                summary[name] = {k: spread([r[k] for r in runs]) for k in ("wall_s", "episodes_per_s", "tokens_per_s",
                                                                              "engine_calls", "rows_per_call")}
                summary[name]["tokens"] = runs[0]["tokens"]
                summary[name]["tool_calls"] = runs[0]["tool_calls"]
            scenarios[scenario] = {"slow_share": tail, "slow_factor": SLOW, "same_tokens_both_arms": same,
                                   "arms": summary,
                                   "step_out_speedup": ratio_spread(summary["stay_in"]["wall_s"],
                                                                    summary["step_out"]["wall_s"])}
        prefill = reprefill(engine, args.episodes * args.samples, max(5, args.repeats))
    finally:
        engine.close()
    data = {"benchmark": "multi_turn", "quick": args.quick,
            "setup": {"episodes": args.episodes, "samples": args.samples, "turns": args.turns, "tool_s": args.tool_s,
                      "repeats": args.repeats, "engine": "cpu (tiny model)"},
            "scenarios": scenarios, "reprefill": prefill}
    write_results(args.out, data, load)
    print(f"multi-turn episodes with tool waits ({args.episodes} episodes x {args.samples} samples, {args.turns} "
          f"turns, tool {args.tool_s} s x [0.5, 1.5), a slow call x{SLOW:g}); {args.repeats} repetitions, "
          f"median (min-max)")
    print(f"{'scenario':<11} {'arm':<9} {'s/poll':>18} {'episodes/s':>18} {'tokens/s':>20} {'engine calls':>14} "
          f"{'rows/call':>16}")
    for scenario, sc in scenarios.items():
        for name, s in sc["arms"].items():
            print(f"{scenario:<11} {name:<9} {fmt_spread(s['wall_s']):>18} {fmt_spread(s['episodes_per_s']):>18} "
                  f"{fmt_spread(s['tokens_per_s'], '.1f'):>20} {fmt_spread(s['engine_calls'], '.0f'):>14} "
                  f"{fmt_spread(s['rows_per_call'], '.1f'):>16}")
        print(f"{scenario:<11} step_out speedup (stay_in s / step_out s): {fmt_spread(sc['step_out_speedup'])}; "
              f"{sc['slow_share']:.0%} of tool calls slow; same tokens in both arms: {sc['same_tokens_both_arms']}")
    print("re-prefill on the CPU engine (a turn of 6 tokens x "
          f"{args.episodes * args.samples} rows, no prefix cache): "
          + ", ".join(f"ctx {k}: {fmt_spread(v, '.3f')} s (re-prefill {v['reprefill_share']:.0%})"
                      for k, v in prefill.items()))
    print(f"wrote {args.out}")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Multi-turn episodes with tool waits"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``multi_turn.json`` (none for a quick run)."""
    d = load("multi_turn")
    if not d or d.get("quick"):
        return []
    st = d["setup"]
    out = [*heading(REPORT_TITLE),
           f"**Multi-turn episodes with tool waits** — `python -m astraflow.benchmarks.multi_turn` (one RaaS "
           f"node's poll on the CPU engine: {st['episodes']} agent episodes x {st['samples']} samples, {st['turns']} "
           f"turns, every step a tool call of {st['tool_s']} s x [0.5, 1.5); the same episodes and tokens in both arms; "
           f"median (min–max) of {st['repeats']} repetitions{load_note(d)})", "",
           "| tool latency | arm | s / poll | episodes/s | tokens/s | engine calls | rows / call |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for name, sc in d["scenarios"].items():
        label = "uniform" if not sc["slow_share"] else f"{sc['slow_share']:.0%} of calls x{sc['slow_factor']:g}"
        for arm, r in sc["arms"].items():
            out.append(f"| {label} | {arm} | {_sp(r['wall_s'])} | {_sp(r['episodes_per_s'])} | "
                       f"{_sp(r['tokens_per_s'], '.1f')} | {_sp(r['engine_calls'], '.0f')} | "
                       f"{_sp(r['rows_per_call'], '.1f')} |")
    out += ["", "Step-out speedup (stay_in s / step_out s): " + "; ".join(
        f"{name} {_sp(sc['step_out_speedup'])}" for name, sc in d["scenarios"].items()) + ". Re-prefill on the CPU "
        "engine (no prefix cache; a 6-token turn of 16 rows): " + ", ".join(
        f"context {k}: {v['median']:.3f} s ({v['reprefill_share']:.0%} re-prefill)" for k, v in d["reprefill"].items())
        + ".", ""]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
