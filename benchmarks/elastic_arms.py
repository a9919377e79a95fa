"""The arms of the elastic benchmark: one job on a topology that differs only in its RaaS pool.

``fixed_small``, ``fixed_large`` and ``autoscaling`` run the arithmetic demo job through
``astraflow launch``; an arm's devices are the caller's (the CPU arms' slowdown devices by
default, cost-model devices for ``elastic --emulated``). Each arm comes back as its row: the
device-hours of the heartbeats, the trainer's wait, the pool's sizes over time, the accuracy
and the conservation audit. Knows how to launch an arm and read its run; comparing the arms
and pricing emulated devices is :mod:`.elastic` and :mod:`.elastic_emulated`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.run_metrics import read_rows

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("fixed_small", "fixed_large", "autoscaling")


def job_settings(steps: int, problems: int, groups_per_batch: int = 8, tasks_per_call: int = 2) -> dict:
    """The job every arm runs (on top of examples/arithmetic_grpo.yaml)."""
    return {
        "rollout": {"n_samples": 8, "tasks_per_call": tasks_per_call, "max_new_tokens": 6, "heartbeat_s": 2.0,
                    "engine": {"threads": 1}},
        "dataflow": {"groups_per_batch": groups_per_batch, "max_staleness": 1},
        "trainer": {"steps": steps, "checkpoint_every": max(10, steps), "snapshot_every": 10,
                    "engine": {"threads": 1}},
        "eval": {"every": 0, "problems": problems, "k": 2, "threads": 1},
        "kafka": {"task_partitions": 8},
    }


def topology(arm: str, a: argparse.Namespace, trainer_device: dict | None = None,
             raas_device: dict | None = None) -> dict:
    """One arm's topology; the devices default to the slowdown-emulated ones of the CPU arms."""
    count = a.large if arm == "fixed_large" else a.small
    trainer_device = trainer_device or {"kind": "h100-emulated", "count": a.trainer_devices,
                                        "slowdown": a.trainer_slowdown}
    raas = {"component": "raas", "hosts": ["local"], "count": count, "threads": 1,
            "device": raas_device or {"kind": "a10-emulated", "count": 1, "slowdown": a.raas_slowdown},
            "cost_per_device_hour": a.raas_cost}
    if arm == "autoscaling":
        raas.update(min=a.small, max=a.large)
    return {
        "name": f"elastic-{arm}",
        "regions": {"local": {"kafka": "embedded", "hosts": ["local"], "pools": {
            "dataflow": {"component": "dataflow", "hosts": ["local"]},
            "trainer": {"component": "trainer", "hosts": ["local"], "threads": 1,
                        "device": trainer_device,
                        "cost_per_device_hour": a.trainer_cost},
            "raas": raas}}},
        "autoscaler": {"enabled": arm == "autoscaling", "interval_s": a.interval, "window_s": a.window,
                       "cooldown_s": a.cooldown, "confirm": 2,
                       **({"scale_up_wait": a.scale_up_wait} if getattr(a, "scale_up_wait", None) else {})},
    }


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def run_arm(arm: str, a: argparse.Namespace, bootstrap: str, run_root: Path, settings: dict | None = None,
            topo: dict | None = None, backend: str = "local") -> dict:
    # the job machinery and the audit (~2 s to import): only when an arm runs
    from astraflow.chaos.invariants import audit
    from astraflow.config import load_config
    from astraflow.launcher import launch
    from astraflow.topics import job_topics

    data = _merge(yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text()),
                  settings or job_settings(a.steps, a.problems))
    data.update(job=f"elastic-{arm.replace('_', '-')}-{int(time.time())}", seed=a.seed)
    run_dir = run_root / data["job"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(data))
    (run_dir / "topology.yaml").write_text(yaml.safe_dump(topo or topology(arm, a), sort_keys=False))
    cfg = load_config(run_dir / "job.yaml")
    print(f"[{arm}] launching ({run_dir})", flush=True)
    summary = launch(run_dir / "topology.yaml", cfg, bootstrap=bootstrap, run_dir=run_dir / "run", progress=False,
                     timeout_s=a.timeout, backend=backend)
    rows = read_rows(run_dir / "run")
    report = audit(bootstrap, job_topics(cfg), cfg.policy, cfg.effective_staleness)
    return {**arm_numbers(summary, rows), "audit_ok": report.ok, "run_dir": str(run_dir),
            "emulated_accounts": summary.get("emulated", {}),
            **({"slurm_summary": summary["slurm"]} if "slurm" in summary else {})}


def arm_numbers(summary: dict, rows: list[dict]) -> dict:
    """One arm's row of the JSON, from its run summary and metrics rows."""
    d = summary["device_hours"]
    steps = {}
    for r in rows:
        if r["name"] in ("trainer.wait_s", "trainer.train_s") and r["step"] >= 2:
            steps.setdefault(r["step"], {})[r["name"]] = r["value"]
    waited = sum(s.get("trainer.wait_s", 0.0) for s in steps.values())
    trained = sum(s.get("trainer.train_s", 0.0) for s in steps.values())
    train_times = sorted(s["trainer.train_s"] for s in steps.values() if "trainer.train_s" in s)
    return {
        "total_device_hours": round(d["total"], 5), "rollout_device_hours": round(d["rollout"], 5),
        "trainer_device_hours": round(d["trainer"], 5), "cost": round(d["cost"], 4),
        "wall_s": summary["wall_s"], "trainer_wait_frac": round(waited / (waited + trained), 4) if steps else None,
        # the same emulated step on every arm: how much slower it ran shows the cores' contention
        "trainer_step_s_median": round(train_times[len(train_times) // 2], 3) if train_times else None,
        "accuracy": summary["accuracy_final"], "accuracy_initial": summary["accuracy_initial"],
        "steps_trained": summary["steps_trained"], "time_to_first_step_s": summary["time_to_first_step_s"],
        **pool_sizes(rows),
        "scaling_actions": [{"t_s": round(r["ts"] - rows[0]["ts"], 1), "action": r["label.action"],
                             "from": r["label.current"], "to": r["value"], "reason": r["label.reason"]}
                            for r in rows if r["name"] == "autoscaler.scaled"],
    }


def pool_sizes(rows: list[dict]) -> dict:
    """Largest and time-weighted mean RaaS pool size, from the autoscaler's per-decision record."""
    series = [(r["ts"], r["value"]) for r in rows if r["name"] == "autoscaler.pool_size"]
    if len(series) < 2:
        return {"pool_max": series[0][1] if series else None, "pool_mean": series[0][1] if series else None}
    span = series[-1][0] - series[0][0]
    mean = sum(v * (t2 - t1) for (t1, v), (t2, _) in zip(series, series[1:])) / span if span > 0 else series[0][1]
    return {"pool_max": max(v for _, v in series), "pool_mean": round(mean, 3)}


def plot(path: Path, rows: list[dict],
         title: str = "autoscaling arm: pool size and trainer wait (devices emulated on CPU)") -> None:
    import matplotlib  # (~1 s to import): only when a plot is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = min(r["ts"] for r in rows)
    size = [(r["ts"] - t0, r["value"]) for r in rows if r["name"] == "autoscaler.pool_size"]
    wait = [(r["ts"] - t0, r["value"]) for r in rows if r["name"] == "autoscaler.wait_frac"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if size:
        ax.step(*zip(*size), where="post", color="tab:blue", label="RaaS pool size (nodes)")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("nodes", color="tab:blue")
    ax2 = ax.twinx()
    if wait:
        ax2.plot(*zip(*wait), color="tab:red", label="trainer wait fraction (window)")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("trainer wait fraction", color="tab:red")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(loc="lower right", bbox_to_anchor=(0.88, 0.15))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
