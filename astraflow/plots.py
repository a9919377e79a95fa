"""``plot.png`` of a run directory: the run's metrics rows drawn as reward and accuracy curves.

One policy: the batch reward (train) and the held-out accuracy by policy version, in one
panel. Several: a panel per policy (its batch reward by its own versions and its held-out
role reward in the team; the lead's with its held-out accuracy alone) and one for the team
(the lead's team reward per batch and the held-out team accuracy).

It reads the rows :mod:`astraflow.run_outputs` collected (``step``, ``name``, ``value``,
``component``, ``label.*``) and the job config for titles; it knows nothing of processes,
topics or the rest of the run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from astraflow.config import JobConfig


def _emulated(rows: list[dict]) -> str:
    """A title's label when any device of the run was emulated (its times are modelled)."""
    profiles = sorted({str(r.get("label.profile")) for r in rows if r["name"].startswith("emulated.")})
    return f" — EMULATED devices: {', '.join(profiles)}" if profiles else ""


def plot_run(path: Path, rows: list[dict], cfg: JobConfig) -> None:
    if len(cfg.policy_names) > 1:
        _plot_policies(path, rows, cfg)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    reward = sorted((r["step"], r["value"]) for r in rows if r["name"] == "trainer.reward")
    acc = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.accuracy")
    fig, ax = plt.subplots(figsize=(7, 4))
    if reward:
        ax.plot(*zip(*reward), label="batch reward (train)", color="tab:blue")
    stderr = {r["step"]: r["value"] for r in rows if r["name"] == "eval.stderr"}  # agent episodes: ± 1 SE
    if acc and stderr:
        ax.errorbar(*zip(*acc), yerr=[stderr.get(s, 0.0) for s, _ in acc], fmt="o-", capsize=3,
                    label="held-out success (± 1 SE over episodes)", color="tab:red")
    elif acc:
        ax.plot(*zip(*acc), "o-", label="held-out accuracy (pass@1)", color="tab:red")
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"{cfg.job} ({cfg.mode}){_emulated(rows)}")
    ax.grid(alpha=0.3)
    if reward or acc:  # a run that failed before training has nothing to label
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_policies(path: Path, rows: list[dict], cfg: JobConfig) -> None:
    """A panel per policy (its batch reward by its own versions) and the team's accuracy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = cfg.policy_names
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.2 * (len(names) + 1), 3.8))
    for ax, p in zip(axes, names):
        reward = sorted((r["step"], r["value"]) for r in rows
                        if r["name"] == "trainer.reward" and r["component"] == f"trainer.{p}")
        if reward:
            ax.plot(*zip(*reward), color="tab:blue", label="batch reward")
        if p == cfg.lead_policy:
            acc = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.accuracy")
            if acc:
                ax.plot(*zip(*acc), "o-", color="tab:red", label="held-out accuracy (alone)")
        # its held-out score in the team: mean reward of its role(s), by its own version
        held = sorted((int(r.get("label.version", r["step"])), r["value"]) for r in rows
                      if r["name"] == "eval.policy_reward" and r.get("label.policy") == p)
        if held:
            ax.plot(*zip(*held), "s--", color="tab:orange", label="held-out role reward (team)")
        ax.set_title(f"policy {p}")
        ax.set_xlabel(f"{p} version")
        # a role's reward may exceed 1 (the test generator's is two indicators summed)
        ax.set_ylim(0, max([1.0] + [y for line in ax.lines for y in line.get_ydata()]) * 1.02)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right", fontsize=8)
    team = sorted((r["step"], r["value"]) for r in rows if r["name"] == "dataflow.team_reward"
                  and r.get("label.policy") == cfg.lead_policy)
    ax = axes[-1]
    if team:
        ax.plot(*zip(*team), color="tab:green", label="team reward (train batches)")
    held = sorted((r["step"], r["value"]) for r in rows if r["name"] == "eval.team_accuracy")
    if held:
        ax.plot(*zip(*held), "o-", color="tab:purple", label="team accuracy (held-out)")
    if ax.lines:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title("team")
    ax.set_xlabel(f"{cfg.lead_policy} batch step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{cfg.job} ({cfg.workflow.name}, barrier {cfg.barrier}){_emulated(rows)}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
