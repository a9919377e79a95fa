"""Whether a warm start met its target accuracy, and the warning when it did not.

A build stops early once its validation accuracy reaches the spec's ``target_accuracy``;
it *met* the target when that happened before ``max_steps`` and its held-out greedy
accuracy is at least the target too. :func:`target_of` judges a build's report (also one
written before the judgement was stored), :func:`target_warning` words a miss, and
:func:`model_warning` reads it off a model directory's ``bootstrap.json`` (what the launcher
says at start).

It reads reports only: it knows nothing about building, caching or measuring a model.
"""

from __future__ import annotations

import json
from pathlib import Path

from .spec import MARKER
from .warm_start import DEFAULT_TASK

__all__ = ["model_warning", "target_of", "target_warning"]


def target_of(report: dict) -> dict:
    """Whether a build met its warm-start target: the validation accuracy reached it (the
    early stop fired before ``max_steps``) *and* the held-out greedy accuracy is at least it.

    Returns ``{"accuracy", "reached_on_validation", "heldout_greedy", "met", "missed_by"}``
    (``missed_by``: how far the held-out greedy accuracy is below the target, 0 when not).
    Works on reports written before the field existed (it reads ``val_accuracy`` and the spec).
    """
    want = float(report["spec"]["target_accuracy"])
    val, greedy = float(report["val_accuracy"]), float(report["heldout_accuracy_greedy"])
    reached = val >= want
    return {"accuracy": want, "reached_on_validation": reached, "heldout_greedy": greedy,
            "met": reached and greedy >= want, "missed_by": round(max(0.0, want - greedy), 4)}


def target_warning(report: dict) -> str | None:
    """One ``WARNING:`` line when the build missed its warm-start target, else None."""
    t = report.get("target") or target_of(report)
    if t["met"]:
        return None
    why = []
    if not t["reached_on_validation"]:
        why.append(f"validation accuracy {report['val_accuracy']:.3f} never reached it in "
                   f"{report['sft_steps']} steps (max_steps {report['spec']['max_steps']})")
    if t["heldout_greedy"] < t["accuracy"]:
        why.append(f"held-out greedy accuracy is {t['heldout_greedy']:.3f}")
    return (f"WARNING: warm start of task {report.get('task', DEFAULT_TASK)!r} missed its target accuracy "
            f"{t['accuracy']:.2f}: {'; '.join(why)}. RL starts from a weaker policy than intended "
            f"(raise --max-steps or lower --target-accuracy)")


def model_warning(model_dir: str | Path) -> str | None:
    """:func:`target_warning` of the warm start in ``model_dir`` (its ``bootstrap.json``);
    None for a model that met its target or was not built by this bootstrap (a configured
    Hugging Face directory, or a trained export, has no marker)."""
    marker = Path(model_dir) / MARKER
    if not marker.exists():
        return None
    try:
        return target_warning(json.loads(marker.read_text()))
    except (ValueError, KeyError, TypeError):  # a marker of another shape judges nothing
        return None
