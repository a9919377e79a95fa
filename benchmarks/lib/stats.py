"""Repetition statistics: a number measured several times, and ratios of such numbers.

A number measured several times is stored as a :func:`spread` — ``median`` with ``min``,
``max`` and every run — so each table can show the spread. Ratios of two arms are paired
run by run (:func:`ratio_spread`: the arms were measured alternately). Knows nothing about
where results are written.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "n", "runs"}`` of repeated measurements of one number."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("spread() needs at least one measurement")
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals), "runs": vals}


def ratio_spread(num: dict[str, Any], den: dict[str, Any]) -> dict[str, Any]:
    """The spread of ``num / den`` run by run (runs paired in order: measured alternately)."""
    if num["n"] != den["n"]:
        raise ValueError(f"ratio of spreads needs paired runs, got {num['n']} and {den['n']}")
    return spread([a / b for a, b in zip(num["runs"], den["runs"])])


def spread_each(per: list[dict], key: str) -> dict:
    """Each entry of the repetitions' ``key`` dicts as a spread over them (0 where one lacks it)."""
    return {k: spread([x[key].get(k, 0.0) for x in per]) for k in per[0][key]}


def fmt_spread(s: dict[str, Any], fmt: str = ".2f") -> str:
    """``median (min–max)`` for tables."""
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}–{s['max']:{fmt}})"
