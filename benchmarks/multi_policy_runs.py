"""Reading a team run of ``multi_policy`` (arms (a) async and (b) lockstep) from its records.

What one Kafka team run did, from its run directory: seconds per iteration of the policy that
finishes last after start-up, each policy's steady rate, the team's held-out accuracy, where
the RaaS time went, what a role served by the other pool cost (the run's own trace spans) and
the verifier's rates on the training episodes. Knows the run's metric and span names; knows
nothing about how the run was launched or how the arms are compared.
"""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

from astraflow.benchmarks.lib.run_metrics import (eval_k, generated_tokens, launch_ts, read_rows, read_summary,
                                                  total, trainer_steps)
from astraflow.benchmarks.lib.steady import steady_s_per_step


class NoSteps(RuntimeError):
    """A run that ended without training a step (nothing to measure)."""


def initial_eval_end(rows: list[dict]) -> float | None:
    """When the evaluator finished its version-0 evaluation (team included), if it did."""
    ts = [float(r["ts"]) for r in rows if r["name"] in ("eval.accuracy", "eval.team_accuracy") and r["step"] == 0]
    return max(ts, default=None)


def analyse_team(run_dir: Path) -> dict:
    """Arm (a) or (b): seconds per iteration, per-policy rates, start-up and the team's accuracy."""
    rows = read_rows(run_dir)
    summary = read_summary(run_dir)
    steps = trainer_steps(rows)
    if not steps:
        raise NoSteps(f"{run_dir}: no step trained")
    eval0 = initial_eval_end(rows)
    per = {p: steady_s_per_step(ts, eval0) for p, ts in steps.items()}
    last = max(steps, key=lambda p: steps[p][max(steps[p])])
    start = launch_ts(rows, summary)
    return {"s_per_iter": per[last]["s_per_step"], "last_policy": last, "by_policy": per,
            "steps_by_policy": {p: max(ts) for p, ts in steps.items()},
            "time_to_first_step_s": summary["time_to_first_step_s"],
            "initial_eval_s": None if eval0 is None else eval0 - start,
            "time_to_last_step_s": max(steps[p][max(steps[p])] for p in steps) - start,
            "team_accuracy": summary.get("team_accuracy_final"),
            "team_accuracy_by_version": summary.get("team_accuracy_by_version"),
            "accuracy_alone_final": summary.get("accuracy_final"), "wall_s": summary["wall_s"],
            # where the RaaS time went: every node's poll-to-commit seconds, and groups rolled out for nothing
            "raas_busy_s": total(rows, "raas.busy_s"),
            "groups_dropped": sum(float(r["value"]) for r in rows if r["name"].startswith("dataflow.dropped.")),
            # episodes rolled out: the lead pool's committed polls (every role of each one generated)
            "episodes": total(rows, "raas.tasks"),
            # what a role call over Kafka costs the episode: the lead node's running mean of the
            # wait per remote call (request out, served by the other pool, reply back), last value
            "remote_wait_s_per_call": next((float(r["value"]) for r in reversed(rows)
                                            if r["name"] == "raas.remote_wait_s_per_call"), float("nan")),
            "remote_calls": remote_calls(run_dir),
            "generated_tokens": generated_tokens(rows),
            "eval_k": eval_k(rows), "verifier": verifier_rates(rows),
            "run_dir": str(run_dir)}


def with_trained_groups(result: dict, cfg) -> dict:
    """Add the fresh groups each policy trained (steps x groups per batch; the lead's) and the
    episodes rolled out per trained group (1.0: no episode's roles were rolled out for nothing)."""
    lead = cfg.view(cfg.lead_policy)
    trained = lead.trainer.steps * lead.dataflow.groups_per_batch
    return {**result, "trained_groups": trained, "episodes_per_trained_group": result["episodes"] / trained}


def verifier_rates(rows: list[dict]) -> dict:
    """The verifier on (a)'s training episodes of the run's last half (by the lead's version):
    accuracy, true-positive rate (approved / right first attempts), true-negative rate and the
    share of first attempts it rejected, from the episode metrics (means of n-sample shares,
    so the rates are ratios of means)."""
    def mean(key: str) -> float | None:
        vals = [(int(r["step"]), float(r["value"])) for r in rows if r["name"] == f"raas.episode.{key}"]
        if not vals:
            return None
        half = max(s for s, _ in vals) / 2
        late = [v for s, v in vals if s >= half]
        return sum(late) / len(late)
    acc, first, app, rej = (mean(k) for k in ("verifier_accuracy", "first_accuracy", "approved_correct",
                                               "rejected_wrong"))
    out = {"accuracy": acc, "first_accuracy": first, "retries": mean("retries")}
    if None not in (first, app, rej):
        out["tpr"] = app / first if first else None
        out["tnr"] = rej / (1 - first) if first < 1 else None
    return out


def _span_s(span: dict) -> float:
    at = lambda k: datetime.fromisoformat(span[k].replace("Z", "+00:00")).timestamp()  # noqa: E731
    return at("end_time") - at("start_time")


def remote_calls(run_dir: Path) -> dict:
    """What a role served by another policy's pool costs, from the run's own traces: every
    ``raas.generate`` span of a remote role (request out, served, reply back; wall seconds),
    its median and p95, and remote calls per episode (``raas.workflow`` spans)."""
    durations: list[float] = []
    episodes = 0
    for f in sorted((run_dir / "traces").glob("raas-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                span = json.loads(line)
            except ValueError:
                continue  # a span cut off by a stopped node
            if span.get("name") == "raas.workflow":
                episodes += 1
            elif span.get("name") == "raas.generate" and span.get("attributes", {}).get("remote"):
                durations.append(_span_s(span))
    if not durations:
        return {"calls": 0, "episodes": episodes}
    durations.sort()
    return {"calls": len(durations), "episodes": episodes, "median_s": statistics.median(durations),
            "p95_s": durations[min(len(durations) - 1, int(0.95 * len(durations)))],
            "hops_per_episode": len(durations) / episodes if episodes else float("nan")}
