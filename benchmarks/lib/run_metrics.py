"""Reading a finished run: its metric rows (``metrics.jsonl``) and its ``summary.json``.

A row is one metric as the run's components reported it (``ts``, ``component``, ``name``,
``value``, ``step`` and ``label.*`` keys). Knows the names of the metrics the benchmarks
read, not what any benchmark makes of them.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_rows(run_dir: Path) -> list[dict]:
    """Every metric row of the run in ``run_dir``, in the order written."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def read_summary(run_dir: Path) -> dict:
    """The run's ``summary.json``."""
    return json.loads((Path(run_dir) / "summary.json").read_text())


def total(rows: list[dict], name: str) -> float:
    """The sum of every value of metric ``name`` (a count reported in parts)."""
    return sum(float(r["value"]) for r in rows if r["name"] == name)


def trainer_steps(rows: list[dict]) -> dict[str, dict[int, float]]:
    """Per policy, step -> time its trainer reported the step (``trainer.samples``)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["name"] == "trainer.samples" and r["component"].startswith("trainer."):
            out.setdefault(r["component"].split(".", 1)[1], {})[int(r["step"])] = float(r["ts"])
    return out


def lead_steps(rows: list[dict]) -> dict[int, float]:
    """The (first) trainer's version -> the time it was trained."""
    return next(iter(trainer_steps(rows).values()), {})


def launch_ts(rows: list[dict], summary: dict) -> float:
    """When ``run_job`` started: the first trained step's time minus the summary's time to it."""
    first = min(float(r["ts"]) for r in rows if r["name"] == "trainer.train_s" and r["step"] == 1)
    return first - float(summary["time_to_first_step_s"])


def generated_tokens(rows: list[dict]) -> float:
    """What a run's pools generated in all (``raas.generated_tokens``: every role's own tokens)."""
    return total(rows, "raas.generated_tokens")


def eval_k(rows: list[dict]) -> int | None:
    """Samples per held-out problem of the run's evaluator (``eval.accuracy``'s ``k`` label)."""
    return next((int(r["label.k"]) for r in rows if r["name"] == "eval.accuracy" and "label.k" in r), None)
