"""What a run records from the ``metrics`` topic, and the run directory's outputs made from it.

:class:`RunState` is the run as seen so far (every metric row; versions trained, samples,
the last reward and the held-out accuracy by version; per policy and for the team in a
multi-policy job); :func:`record` adds one ``metrics`` record to it. :func:`write_outputs`
writes, when the run ends, ``metrics.jsonl`` and ``metrics.csv`` (the rows by time),
``summary.json`` (the figures of the run: steps, wall and first-step time, accuracy and
``eval.dataset``'s benchmark sets by version, busy and wait time, weight-update sizes, the
train-inference logp gap, restarts, the requests, retries and failures per environment
server, and what the caller adds) and ``plot.png`` (drawn by
:mod:`astraflow.plots`).

It knows nothing of the broker or of how the records were read: the caller's loop feeds
it; of processes it reads only their restart counts.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.plots import plot_run

if TYPE_CHECKING:
    from astraflow.config import JobConfig
    from astraflow.topology.processes import Proc


@dataclass
class RunState:
    rows: list[dict] = field(default_factory=list)
    trained: int = 0
    accuracy: dict[int, float] = field(default_factory=dict)
    samples: float = 0.0
    reward: float | None = None
    trained_by: dict[str, int] = field(default_factory=dict)  #: policy -> newest trained step
    reward_by: dict[str, float] = field(default_factory=dict)
    team: list[tuple[int, float]] = field(default_factory=list)  #: (lead step, team reward of its batch)
    lead: str = ""
    team_accuracy: dict[int, float] = field(default_factory=dict)  #: lead version -> held-out team accuracy
    #: policy -> its version -> mean reward of its role(s) in the held-out team evaluation
    policy_reward: dict[str, dict[int, float]] = field(default_factory=dict)
    heldout: str = ""  #: what the held-out set is (the evaluator's label: the job's own rows, a generator's split)
    #: version -> the held-out episodes' figures (an agent workflow's evaluation): stderr,
    #: stderr_tasks, episodes, turns, actions
    episodes: dict[int, dict[str, float]] = field(default_factory=dict)
    #: version -> held-out task index -> the mean reward of its samples
    task_reward: dict[int, dict[int, float]] = field(default_factory=dict)


EPISODE_FIGURES = ("eval.stderr", "eval.stderr_tasks", "eval.episodes", "eval.turns", "eval.actions")


def record(state: RunState, m) -> None:
    """Add one record of the ``metrics`` topic (anything but a ``Metric`` is ignored)."""
    from astraflow.topics import Metric
    if not isinstance(m, Metric):
        return
    state.rows.append({"ts": m.ts, "component": m.component, "name": m.name, "value": m.value, "step": m.step,
                       **{f"label.{k}": v for k, v in m.labels.items()}})
    policy = m.component.split(".", 1)[1] if m.component.startswith("trainer.") else ""
    if m.name == "trainer.samples":
        state.trained = max(state.trained, m.step)
        state.trained_by[policy] = max(state.trained_by.get(policy, 0), m.step)
        state.samples += m.value
    elif m.name == "trainer.reward":
        state.reward = m.value
        state.reward_by[policy] = m.value
    elif m.name == "dataflow.team_reward" and m.labels.get("policy") in (None, state.lead):
        state.team.append((m.step, m.value))
    elif m.name == "eval.accuracy":
        state.accuracy[m.step] = m.value
        state.heldout = str(m.labels.get("heldout", state.heldout))
    elif m.name in EPISODE_FIGURES:
        state.episodes.setdefault(m.step, {})[m.name.split(".", 1)[1]] = m.value
    elif m.name == "eval.task_reward" and "task" in m.labels:
        state.task_reward.setdefault(m.step, {})[int(m.labels["task"])] = m.value
    elif m.name == "eval.team_accuracy":
        state.team_accuracy[m.step] = m.value
    elif m.name == "eval.policy_reward" and m.labels.get("policy"):
        version = int(m.labels.get("version", m.step))
        state.policy_reward.setdefault(str(m.labels["policy"]), {})[version] = m.value


def write_outputs(run_dir: Path, cfg: JobConfig, state: RunState, started: float, procs: list[Proc],
                  interrupted: bool, error: str | None, extra: dict | None = None) -> dict:
    """Write the run directory's metrics, summary and plot; returns the summary."""
    from astraflow.engines.hf_export import HFExports
    rows = sorted(state.rows, key=lambda r: r["ts"])
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("ts", "component", "name", "value", "step"), k))
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys or ["ts"])
        w.writeheader()
        w.writerows(rows)
    steps = sorted({r["step"] for r in rows if r["name"] == "trainer.train_s"})
    first = [r for r in rows if r["name"] == "trainer.train_s" and r["step"] == 1]
    def total(name: str) -> float:
        return sum(r["value"] for r in rows if r["name"] == name)
    acc = {int(k): v for k, v in sorted(state.accuracy.items())}
    summary = {
        "job": cfg.job, "mode": cfg.mode, "seed": cfg.seed, "config": cfg.source, "run_dir": str(run_dir),
        "steps_trained": max(steps, default=0), "wall_s": round(time.time() - started, 2),
        # launch -> the first trained step's metric (broker, model, processes, first batch)
        "time_to_first_step_s": round(min(r["ts"] for r in first) - started, 2) if first else None,
        "heldout": state.heldout or None,
        "accuracy_by_version": acc,
        "accuracy_initial": acc.get(min(acc)) if acc else None,
        "accuracy_final": acc.get(max(acc)) if acc else None,
        # an agent workflow's held-out episodes: standard errors (over episodes, over tasks),
        # turns and tool calls per episode, and each task's mean reward (paired across versions)
        **({"eval_episodes_by_version": {str(v): {"accuracy": acc.get(v), **{k: round(x, 6) for k, x in f.items()}}
                                         for v, f in sorted(state.episodes.items())}} if state.episodes else {}),
        **({"eval_task_reward_by_version": {str(v): {str(i): round(r, 6) for i, r in sorted(t.items())}
                                            for v, t in sorted(state.task_reward.items())}}
           if state.task_reward else {}),
        "trainer_train_s": round(total("trainer.train_s"), 3), "trainer_wait_s": round(total("trainer.wait_s"), 3),
        "raas_busy_s": round(total("raas.busy_s"), 3), "raas_serve_busy_s": round(total("raas.serve_busy_s"), 3),
        "samples_trained": int(total("trainer.samples")),
        "weights_delta_bytes_mean": _mean([r["value"] for r in rows if r["name"] == "weights.delta_bytes"]),
        "weights_snapshot_bytes_mean": _mean([r["value"] for r in rows if r["name"] == "weights.snapshot_bytes"]),
        "weights_delta_changed_frac_mean": _mean([r["value"] for r in rows
                                                  if r["name"] == "weights.delta_changed_frac"]),
        # Mean |logp_trainer - logp_behaviour| over tokens generated at the version being
        # trained, averaged over the steps that had such tokens (async steps may have none).
        **_gap_summary([r["value"] for r in rows if r["name"] == "trainer.train_inference_logp_gap"]),
        "restarts": {p.node_id: p.restarts for p in procs if p.restarts},
        **({"steps_trained_by_policy": dict(state.trained_by),
            "team_reward_last": state.team[-1][1] if state.team else None,
            "team_reward_by_step": {str(k): round(v, 4) for k, v in sorted(state.team)},
            "team_accuracy_by_version": {str(k): round(v, 4) for k, v in sorted(state.team_accuracy.items())},
            "team_accuracy_final": state.team_accuracy[max(state.team_accuracy)] if state.team_accuracy else None,
            # each policy's held-out figure, by its own version: the lead's is its accuracy
            # alone (accuracy_by_version); every policy's is also the mean reward of its
            # role(s) in the held-out team evaluation
            "policy_reward_by_version": {p: {str(k): round(v, 4)
                                             for k, v in sorted(state.policy_reward.get(p, {}).items())}
                                         for p in cfg.policy_names}}
           if len(cfg.policy_names) > 1 else {}),
        **_dataset_summary(rows),
        **_emulated_summary(rows),
        **_env_server_summary(rows),
        # the trained models: the trainers' final Hugging Face exports (engines/hf_export.py)
        "models": {p: str(d) for p in cfg.policy_names if (d := HFExports(run_dir / "hf" / p).final()) is not None},
        "interrupted": interrupted, "error": error, **(extra or {}),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_run(run_dir / "plot.png", rows, cfg)
    return summary


def _dataset_summary(rows: list[dict]) -> dict:
    """``{"dataset_accuracy_by_version": {set: {version: {"accuracy", "stderr", "problems"}}}}``
    from the evaluator's ``eval.dataset`` measurements (``eval.dataset_accuracy`` and
    ``eval.dataset_stderr``, labelled with the set); nothing when the job named no set."""
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r["name"] in ("eval.dataset_accuracy", "eval.dataset_stderr") and r.get("label.dataset"):
            at = out.setdefault(str(r["label.dataset"]), {}).setdefault(str(r["step"]), {})
            at["accuracy" if r["name"] == "eval.dataset_accuracy" else "stderr"] = round(r["value"], 6)
            at["problems"] = r.get("label.problems")
    return {"dataset_accuracy_by_version": out} if out else {}


def _emulated_summary(rows: list[dict]) -> dict:
    """``{"emulated": {component: {"profile", "devices", call: {modelled_s, held_s, cpu_fraction,
    calls}}}}`` from each component's last ``emulated.*`` totals; nothing when no device was emulated.
    Modelled seconds are what the emulated devices would have taken, not this machine's time."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["name"].startswith("emulated."):
            _, call, stat = r["name"].split(".", 2)
            comp = out.setdefault(r["component"], {"profile": r.get("label.profile"), "devices": r.get("label.devices")})
            comp.setdefault(call, {})[stat] = r["value"]
    return {"emulated": out} if out else {}


def _env_server_summary(rows: list[dict]) -> dict:
    """``{"env_servers": {url: {"requests", "retries", "failures"}}}``: each RaaS process's last
    ``raas.env_*`` totals per environment server, added up over processes; nothing when the job
    reached no environment server."""
    last: dict[tuple[str, object, object], dict[str, float]] = {}
    for r in rows:
        if r["name"] in ("raas.env_requests", "raas.env_retries", "raas.env_failures") and r.get("label.server"):
            process = (str(r["label.server"]), r.get("label.node"), r.get("label.pid"))
            last.setdefault(process, {})[r["name"][len("raas.env_"):]] = r["value"]
    out: dict[str, dict[str, int]] = {}
    for (url, _, _), counts in sorted(last.items(), key=lambda kv: str(kv[0])):
        at = out.setdefault(url, {"requests": 0, "retries": 0, "failures": 0})
        for k, v in counts.items():
            at[k] += int(v)
    return {"env_servers": out} if out else {}


def _gap_summary(gaps: list[float]) -> dict:
    return {"train_inference_logp_gap": sum(gaps) / len(gaps) if gaps else None,
            "train_inference_logp_gap_max": max(gaps, default=None),
            "train_inference_logp_gap_steps": len(gaps)}


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None
