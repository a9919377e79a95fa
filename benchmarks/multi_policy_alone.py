"""Arm (d) of ``multi_policy``: the solver alone, read against the team at equal time and tokens.

From (d)'s finished run: the held-out accuracy of the newest evaluated version it had trained
by (a)'s wall-clock and when it had generated (a)'s tokens, its best evaluated version, and
(``--alone-eval exported``) the exported versions those comparisons read, evaluated here after
the run. Then the binomial standard errors of the team's and the solver alone's accuracies,
per repetition and pooled over repetitions. Knows the evaluator's metrics and the exports'
layout; knows nothing about how the arms are launched or printed.
"""

from __future__ import annotations

import time
from pathlib import Path

from astraflow.benchmarks.lib.run_metrics import (eval_k, generated_tokens, launch_ts, lead_steps, read_rows,
                                                  read_summary)


def binomial_se(p: float, problems: int, k: int) -> float:
    """Standard error of a mean of ``problems`` x ``k`` 0/1 samples (as if independent)."""
    return (p * (1 - p) / (problems * k)) ** 0.5


def time_of_tokens(rows: list[dict], tokens: float) -> float | None:
    """When the run's pool had generated ``tokens`` (``raas.generated_tokens``, summed in time
    order); ``None`` if it never did."""
    total = 0.0
    for r in sorted((r for r in rows if r["name"] == "raas.generated_tokens"), key=lambda r: float(r["ts"])):
        total += float(r["value"])
        if total >= tokens:
            return float(r["ts"])
    return None


def best_evaluated(rows: list[dict]) -> dict:
    """(d)'s best held-out accuracy at any version it evaluated in its whole run (which runs
    ``--alone-run-factor`` times (a)'s wall-clock): a bound in the solver alone's favour, since
    the evaluator of a loaded box lags the trainer and the version read at (a)'s time or
    tokens is the newest one evaluated by then."""
    evals = {int(r["step"]): float(r["value"]) for r in rows if r["name"] == "eval.accuracy"}
    v = max(evals, key=lambda k: (evals[k], k))
    return {"accuracy_best_evaluated": evals[v], "version_best_evaluated": v}


def version_reached(steps: dict[int, float], start: float, seconds: float) -> int:
    """The newest of ``steps`` (:func:`lead_steps`) trained within ``seconds`` of ``start`` (0: none)."""
    return max((s for s, ts in steps.items() if ts - start <= seconds), default=0)


def accuracy_at(rows: list[dict], start: float, seconds: float) -> dict:
    """The held-out accuracy of the newest evaluated version trained within ``seconds`` of ``start``."""
    steps = lead_steps(rows)
    reached = version_reached(steps, start, seconds)
    evals = {int(r["step"]): float(r["value"]) for r in rows if r["name"] == "eval.accuracy"}
    measured = [v for v in evals if v <= reached]
    if not measured:
        raise ValueError(f"no version up to {reached} was evaluated (evaluated: {sorted(evals)})")
    v = max(measured)
    return {"accuracy": evals[v], "version_reached": reached, "version_evaluated": v,
            "steps_trained": max(steps, default=0)}


def analyse_alone(run_dir: Path, config: Path, eval_mode: str, seconds: float, tokens: float | None = None) -> dict:
    """(d)'s accuracies from its finished run ``run_dir`` (job config ``config``): at ``seconds``
    from its launch and, with ``tokens``, when it had generated as many. ``eval_mode``
    ``exported``: the versions read are evaluated here first (:func:`evaluate_exported`), and
    version 0 too where its evaluator had not finished it when the run was stopped."""
    rows = read_rows(run_dir)
    summary = read_summary(run_dir)
    start = launch_ts(rows, summary)
    initial = summary["accuracy_initial"]
    when = time_of_tokens(rows, tokens) if tokens else None  # (d) had generated (a)'s tokens
    if eval_mode == "exported":
        from astraflow.config import load_config  # the job machinery (~1 s to import): only for exported versions
        policy = load_config(config).policy
        marks = [seconds] + ([when - start] if when is not None else [])
        versions = exported_needed(rows, start, marks, exported_versions(run_dir, policy))
        rows = [r for r in rows if r["name"] != "eval.accuracy" or int(r["step"]) == 0]
        if initial is None:  # its evaluator was stopped with the run before version 0 was done
            versions = [0, *versions]
        rows += evaluate_exported(config, run_dir, versions)
        if initial is None:
            initial = next(r["value"] for r in rows if r.get("exported") and r["step"] == 0)
    at = accuracy_at(rows, start, seconds)
    out = {**at, "seconds": seconds, **best_evaluated(rows), "accuracy_initial": initial,
           "generated_tokens": generated_tokens(rows), "eval_k": eval_k(rows), "run_dir": str(run_dir),
           "eval_mode": eval_mode}
    if tokens:
        out["equal_tokens"] = ({"tokens": tokens, "reached": False} if when is None else
                               {"tokens": tokens, "reached": True, "seconds": when - start,
                                **accuracy_at(rows, start, when - start)})
    return out


def exported_versions(run_dir: Path, policy: str) -> list[int]:
    """The versions a run exported as Hugging Face directories (``hf/<policy>/v<k>``)."""
    root = run_dir / "hf" / policy
    return sorted(int(d.name[1:]) for d in root.glob("v*") if d.name[1:].isdigit()) if root.is_dir() else []


def evaluate_exported(config: Path, run_dir: Path, versions: list[int]) -> list[dict]:
    """Held-out accuracy of each of ``versions`` of the job's policy, from its exports, by the
    evaluator's own function (same problems, k, temperature, reward and sandbox), in this
    process after the run: nothing else shares the cores, so an evaluation slower than
    training (code in the sandbox) measures the very versions the comparisons read. Rows as
    the evaluator's ``eval.accuracy`` metrics (``step``: the version)."""
    # transformers, the engines and the job machinery (~2 s to import): only when exports are evaluated
    from transformers import AutoTokenizer

    from astraflow.actors.common import configure_sandbox, make_rollout_engine, model_path, set_threads
    from astraflow.actors.evaluator import heldout_accuracy, heldout_problems
    from astraflow.config import load_config
    cfg = load_config(config)
    configure_sandbox(cfg)
    set_threads(cfg.eval.threads)
    problems = heldout_problems(cfg)
    rows = []
    for v in versions:
        # version 0: the job's own model (what the trainer started from)
        path = model_path(cfg) if v == 0 else run_dir / "hf" / cfg.policy / f"v{v}"
        t0 = time.perf_counter()
        engine = make_rollout_engine(cfg, path, kind="cpu", name=f"bench-eval-v{v}")
        acc = heldout_accuracy(cfg, engine, AutoTokenizer.from_pretrained(str(path)), problems)
        print(f"    (d) v{v}: held-out accuracy {acc:.3f} ({len(problems)} problems x {cfg.eval.k}, "
              f"{time.perf_counter() - t0:.0f} s after the run)", flush=True)
        rows.append({"ts": time.time(), "component": f"bench.eval.{cfg.policy}", "name": "eval.accuracy",
                     "value": acc, "step": v, "exported": True, "label.k": cfg.eval.k})
    return rows


def exported_needed(rows: list[dict], start: float, marks: list[float], exported: list[int]) -> list[int]:
    """The exported versions the comparisons read: per mark (seconds from ``start``), the newest
    export at or below the version trained by then; and the newest export of all (for the best
    evaluated)."""
    steps, need = lead_steps(rows), set()
    for seconds in marks:
        reached = version_reached(steps, start, seconds)
        below = [v for v in exported if 0 < v <= reached]
        if below:
            need.add(max(below))
    if exported:
        need.add(max(exported))
    return sorted(need)


def standard_errors(reps: list[dict], problems: int) -> dict:
    """Per repetition: the team's and the solver alone's held-out accuracies, each with its
    binomial SE over problems x k, and the difference team - alone in SEs of the difference."""
    out = []
    for r in reps:
        a, d = r["async"], r["solver_alone"]
        k = a.get("eval_k") or d.get("eval_k") or 1

        def with_se(p: float) -> dict:  # se_upper: as if the k samples of a problem were all alike
            return {"accuracy": p, "se": binomial_se(p, problems, k), "se_upper": binomial_se(p, problems, 1)}
        team = with_se(a["team_accuracy"])
        row = {"problems": problems, "k": k, "team": team, "team_initial": with_se(a["team_accuracy_by_version"]["0"]),
               "alone_initial": with_se(d["accuracy_initial"]), "alone_equal_wall_clock": with_se(d["accuracy"])}
        eq = d.get("equal_tokens")
        if eq and eq["reached"]:
            row["alone_equal_tokens"] = with_se(eq["accuracy"])
        if "accuracy_best_evaluated" in d:
            row["alone_best_evaluated"] = with_se(d["accuracy_best_evaluated"])
        for key in ("alone_equal_wall_clock", "alone_equal_tokens", "alone_best_evaluated"):
            if key in row:
                diff = team["accuracy"] - row[key]["accuracy"]
                se = (team["se"] ** 2 + row[key]["se"] ** 2) ** 0.5
                upper = (team["se_upper"] ** 2 + row[key]["se_upper"] ** 2) ** 0.5
                row[f"team_minus_{key.removeprefix('alone_')}"] = {"diff": diff, "se": se, "se_upper": upper,
                                                                   "in_se": diff / se if se else None}
        out.append(row)
    return {"by_repetition": out}


#: team_minus_alone's comparisons, in words
COMPARISONS = {"equal_wall_clock": "at equal wall-clock", "equal_tokens": "at equal tokens",
               "best_evaluated": "at its best evaluated version of its whole run"}


def pooled_accuracies(rows: list[dict], agg: dict) -> dict:
    """The headline keys, each with its standard error, from the per-repetition rows (the one
    source of every SE here): ``team_accuracy`` (and ``team_accuracy_equal_tokens``, the same
    measurement: the team is read at its end and the solver alone at the team's wall-clock or
    tokens), ``solver_alone_accuracy`` and ``solver_alone_accuracy_equal_tokens`` get ``mean``
    (over repetitions) and ``se`` / ``se_upper`` of that mean (``sqrt(sum se_i^2) / R``); and
    ``team_minus_alone`` per comparison: the mean difference, its SEs and the difference in
    SEs (``in_se`` binomial, ``in_se_upper`` counting problems only)."""
    def pool(key: str) -> dict:
        got = [r[key] for r in rows]
        n = len(got)
        return {"mean": sum(g["accuracy"] for g in got) / n,
                "se": sum(g["se"] ** 2 for g in got) ** 0.5 / n,
                "se_upper": sum(g["se_upper"] ** 2 for g in got) ** 0.5 / n}

    out: dict = {"team_accuracy": {**agg["team_accuracy"], **pool("team")},
                 "solver_alone_accuracy": {**agg["solver_alone_accuracy"], **pool("alone_equal_wall_clock")}}
    diffs: dict = {}
    for key in ("equal_wall_clock", "equal_tokens", "best_evaluated"):
        if not all(f"team_minus_{key}" in r for r in rows):
            continue
        got = [r[f"team_minus_{key}"] for r in rows]
        n = len(got)
        d = sum(g["diff"] for g in got) / n
        se = sum(g["se"] ** 2 for g in got) ** 0.5 / n
        upper = sum(g["se_upper"] ** 2 for g in got) ** 0.5 / n
        diffs[key] = {"diff": d, "se": se, "se_upper": upper, "in_se": d / se if se else None,
                      "in_se_upper": d / upper if upper else None,
                      "repetitions_team_ahead": sum(g["diff"] > 0 for g in got), "repetitions": n}
    if "equal_tokens" in diffs:
        out["team_accuracy_equal_tokens"] = out["team_accuracy"]
        out["solver_alone_accuracy_equal_tokens"] = {**agg["solver_alone_accuracy_equal_tokens"],
                                                     **pool("alone_equal_tokens")}
    out["team_minus_alone"] = diffs
    return out
