"""A replay's run directory: ``metrics.jsonl``, ``summary.json`` and ``plot.png``.

The metrics rows have the launcher's shape (``ts``, ``component``, ``name``, ``value``,
``step``), so the tools that read a job's run directory read a replay's. The summary
and the plot put the replay beside what the job recorded (held-out accuracy and policy
entropy per version), which is the point of a what-if. It knows nothing about training.
"""

from __future__ import annotations

import json
from pathlib import Path

from astraflow.topics import Metric

__all__ = ["write_outputs"]


def write_outputs(run_dir: Path, summary: dict, rows: list[dict], recorded: list[Metric]) -> None:
    """Write the run directory; adds the job's recorded accuracy and entropy to ``summary``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rec_acc = _by_version(recorded, "eval.accuracy")
    rec_entropy = _by_version(recorded, "trainer.entropy")
    acc = summary["accuracy_by_version"]
    summary.update(
        recorded_accuracy_by_version=rec_acc,
        accuracy_initial=acc[min(acc)] if acc else None,
        accuracy_final=acc[max(acc)] if acc else None,
        recorded_accuracy_final=rec_acc.get(summary["steps_trained"]),
    )
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    entropy = {r["step"]: r["value"] for r in rows if r["name"] == "trainer.entropy"}
    _plot(run_dir / "plot.png", summary, acc, rec_acc, entropy, rec_entropy)


def _by_version(metrics: list[Metric], name: str) -> dict[int, float]:
    # Later records win: a trainer that resumed behind its head re-reports the versions after it.
    return dict(sorted({m.step: m.value for m in metrics if m.name == name}.items()))


def _plot(path: Path, summary: dict, acc: dict, rec_acc: dict, entropy: dict, rec_entropy: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = "replay" if summary["mode"] == "verify" else f"what-if ({summary['lineage']})"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mine, theirs, title in ((left, acc, rec_acc, "held-out accuracy (pass@1)"),
                                    (right, entropy, rec_entropy, "policy entropy (nats/token)")):
        if theirs:
            ax.plot(list(theirs), list(theirs.values()), "o-" if len(theirs) < 30 else "-", color="tab:gray",
                    label="recorded job", alpha=0.8)
        if mine:
            ax.plot(list(mine), list(mine.values()), "o--" if len(mine) < 30 else "--", color="tab:red", label=label)
        if summary.get("branch_step") is not None:
            ax.axvline(summary["branch_step"], color="tab:blue", lw=0.8, ls=":", label="branch")
        ax.set_xlabel("policy version")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if mine or theirs:
            ax.legend(loc="best")
    changes = ", ".join(f"{k.rsplit('.', 1)[1]}={b}" for k, (_, b) in summary["changes"].items())
    fig.suptitle(f"replay of {summary['job']}" + (f": {changes}" if changes else " (recorded settings)"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
