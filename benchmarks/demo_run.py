"""The results tables of ``make demo``: ``benchmarks/results/demo_run.json`` is a demo run's
``runs/<job>-<time>/summary.json`` (held-out accuracy by version, wall time, audit), copied as written.

It owns the demo's section of docs/benchmarks.md and its README line; it runs nothing (``make demo`` is
the run) and knows nothing of the other benchmarks.
"""

from __future__ import annotations

from astraflow.benchmarks.report_format import Loader, ReadmeRow, heading

REPORT_TITLE = "Demo"


def report_rows(load: Loader) -> list[str]:
    """The demo's section of docs/benchmarks.md, from ``demo_run.json``."""
    d = load("demo_run")
    if not d:
        return []
    acc = " → ".join(f"v{v}: {a:.3f}" for v, a in d["accuracy_by_version"].items())
    return [*heading(REPORT_TITLE),
            f"**Demo** — `make demo` ({d['steps_trained']} versions in {d['wall_s']:.0f} s wall, "
            f"{d['samples_trained']:,} samples trained, async, 1 RaaS node): held-out pass@1 "
            f"(200 problems × 4 samples, T=0.6) {acc}{_logp_gap(d)}", "",
            "![demo run](../benchmarks/results/demo_plot.png)", ""]


def _logp_gap(d: dict) -> str:
    if d.get("train_inference_logp_gap") is None:
        return ""
    return (f". Training–inference log-prob gap (mean |logp_trainer − logp_behaviour| over tokens generated at "
            f"the trained version, {d['train_inference_logp_gap_steps']} steps): "
            f"{d['train_inference_logp_gap']:.1e} (max {d['train_inference_logp_gap_max']:.1e})")


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: held-out pass@1 before and after the demo's run."""
    d = load("demo_run")
    if not d:
        return None
    return ReadmeRow(REPORT_TITLE, f"held-out pass@1 of the tiny model, v0 → v{d['steps_trained']} "
                     f"({d['wall_s']:.0f} s wall)",
                     f"{d['accuracy_initial']:.3f} → {d['accuracy_final']:.3f}", "higher")
