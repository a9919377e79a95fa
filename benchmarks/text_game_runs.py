"""Repetitions of an agent job (the text game by default): does held-out success rise, and by how many standard errors?

Runs ``astraflow run examples/text_game.yaml`` (or ``--config``: any agent job, e.g.
``examples/search_agent_long.yaml``) ``--repeats`` times, one after another, each in a
run dir of its own under ``--run-root`` and with its own seed (``--set seed=S --set data.seed=S``:
the rollout and evaluation sampling and the order of the training games; the warm-started model,
``model.seed``, is the same), or, with ``--collect DIR...``, reads run dirs made before. Every
number comes from each run dir's ``summary.json`` (the run's own record of its metrics topic):

* held-out success at the first and the last evaluated version, from → to, and the rise;
* its standard error over episodes (games × ``eval.k`` samples) and over games (the ``k``
  samples of one game are not independent), at both versions;
* the rise in standard errors three ways: over episodes, over games (unpaired:
  ``sqrt(se0² + se1²)``), and over games **paired** (the same held-out games at both versions:
  the standard error of the mean per-game change, which a game's own difficulty does not inflate);
* model turns and tool calls (environment steps) per held-out episode, from → to;
* wall seconds of the run, and the load average before and after it (this box is shared).

Prints one table; writes ``benchmarks/results/text_game_runs.json`` (or ``--out``).
Usage: ``python -m astraflow.benchmarks.text_game_runs [--repeats 3] [--seeds 0 1 2]
[--config examples/text_game.yaml] [--set KEY=VALUE]...`` or ``... --collect RUN_DIR...``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from astraflow.benchmarks.lib.job_runs import add_run_flags, run_load, run_or_collect
from astraflow.benchmarks.lib.results import load_now, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "text_game_runs.json"


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def repetition(run_dir: Path) -> dict:
    """One run dir's figures, from its ``summary.json``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    episodes = summary.get("eval_episodes_by_version")
    tasks = summary.get("eval_task_reward_by_version")
    if not episodes or not tasks:
        raise ValueError(f"{run_dir}/summary.json has no held-out episode figures (eval_episodes_by_version, "
                         f"eval_task_reward_by_version): not an agent job's run, or one from before they existed")
    v0, v1 = min(episodes, key=int), max(episodes, key=int)
    a, b = episodes[v0], episodes[v1]
    games = sorted(set(tasks[v0]) & set(tasks[v1]), key=int)
    change = [tasks[v1][g] - tasks[v0][g] for g in games]
    rise = b["accuracy"] - a["accuracy"]
    unpaired = math.hypot(a["stderr_tasks"], b["stderr_tasks"])
    paired = _se(change)
    over_episodes = math.hypot(a["stderr"], b["stderr"])
    load = run_load(run_dir)
    cfg_seed = next((c.split("=", 1)[1] for c in load.get("command", []) if c.startswith("seed=")), None)
    return {
        "run_dir": str(run_dir), "seed": int(cfg_seed) if cfg_seed is not None else None,
        "versions": [int(v0), int(v1)], "from": a["accuracy"], "to": b["accuracy"], "rise": rise,
        "episodes": int(b["episodes"]), "games": len(games),
        "stderr_episodes": [a["stderr"], b["stderr"]], "stderr_games": [a["stderr_tasks"], b["stderr_tasks"]],
        "stderr_rise_episodes": over_episodes, "stderr_rise_games": unpaired, "stderr_rise_games_paired": paired,
        "z_episodes": rise / over_episodes if over_episodes else None,
        "z_games": rise / unpaired if unpaired else None,
        "z_games_paired": rise / paired if paired else None,
        "games_up_down_same": [sum(c > 0 for c in change), sum(c < 0 for c in change), sum(c == 0 for c in change)],
        "turns": [a["turns"], b["turns"]], "tool_calls": [a["actions"], b["actions"]],
        "wall_s": summary["wall_s"], "steps_trained": summary["steps_trained"],
        "audit_ok": (summary.get("audit") or {}).get("ok"),
        "load_before": load.get("before", {}).get("loadavg"), "load_after": load.get("after", {}).get("loadavg"),
    }


def _z(x: float | None) -> str:
    return f"{x:+.1f}" if x is not None else "-"


def table(rows: list[dict]) -> str:
    head = (f"{'seed':>4} {'from':>6} {'to':>6} {'rise':>6} {'z ep':>5} {'z game':>6} {'z pair':>6} "
            f"{'games +/-/=':>11} {'turns':>11} {'tool calls':>11} {'wall s':>7} {'load':>11}")
    out = [head, "-" * len(head)]
    for r in rows:
        ud = "/".join(map(str, r["games_up_down_same"]))
        load = f"{(r['load_before'] or ['?'])[0]}->{(r['load_after'] or ['?'])[0]}"
        out.append(f"{r['seed'] if r['seed'] is not None else '?':>4} {r['from']:6.3f} {r['to']:6.3f} "
                   f"{r['rise']:+6.3f} {_z(r['z_episodes']):>5} {_z(r['z_games']):>6} {_z(r['z_games_paired']):>6} "
                   f"{ud:>11} {r['turns'][0]:5.2f}->{r['turns'][1]:4.2f} "
                   f"{r['tool_calls'][0]:5.2f}->{r['tool_calls'][1]:4.2f} {r['wall_s']:7.0f} {load:>11}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/text_game.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seeds", type=int, nargs="*", help="one per repetition (default 0, 1, ...)")
    add_run_flags(ap, RESULTS)
    args = ap.parse_args(argv)
    load_before = load_now()
    dirs = run_or_collect(args, args.seeds if args.seeds else list(range(args.repeats)), "rep-")
    rows = [repetition(d) for d in dirs]
    print(table(rows))
    rises = [r["rise"] for r in rows]
    result = {
        "config": args.config, "overrides": args.set, "repetitions": rows,
        "rise": {"mean": statistics.mean(rises), "min": min(rises), "max": max(rises),
                 "stdev": statistics.stdev(rises) if len(rises) > 1 else 0.0},
        "min_z": {k: min((r[k] for r in rows if r[k] is not None), default=None)
                  for k in ("z_episodes", "z_games", "z_games_paired")},
        "wall_s_max": max(r["wall_s"] for r in rows),
    }
    print(f"rise over {len(rows)} repetitions: mean {result['rise']['mean']:+.3f} "
          f"(min {result['rise']['min']:+.3f}, max {result['rise']['max']:+.3f}); fewest SE: "
          + ", ".join(f"{k} {_z(v)}" for k, v in result["min_z"].items()))
    write_results(args.out, result, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
