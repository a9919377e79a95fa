"""Steady state: the window of a run whose steps say what the schedule does once started.

A run's first steps pay start-up (every process booting, the evaluator's version-0 pass,
batches rolled out ahead of the trainer); the benchmarks measure seconds per step from a
later step's end to the last step's end, and the work each emulated resource did inside that
window. Knows the trainer's step metrics and the emulated accounts' metrics, not any arm.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.benchmarks.lib.emulated import merge_shared
from astraflow.benchmarks.lib.run_metrics import read_rows, trainer_steps
from astraflow.benchmarks.lib.stats import spread


def steady_steps(run_dir: Path) -> tuple[list[dict], dict[int, float], int, int]:
    """A run's metrics, each trained step's time, and the steady window's first and last step
    (the end of step 2 to the end of the last step)."""
    rows = read_rows(run_dir)
    step_ts = {int(r["step"]): r["ts"] for r in rows if r["name"] == "trainer.samples"}
    steps = sorted(step_ts)
    if len(steps) < 3:
        raise RuntimeError(f"{run_dir}: {len(steps)} trained steps; steady state needs at least 3")
    return rows, step_ts, steps[1], steps[-1]


def in_steps(rows: list[dict], name: str, first: int, last: int) -> float:
    """The sum of a trainer metric ``name`` over steps ``first`` (excluded) to ``last``, keyed by
    the step each value reports (one per step): by its timestamp, the step that ends a window
    would be counted or not by a few milliseconds."""
    return sum({int(r["step"]): r["value"] for r in rows if r["name"] == name and first < int(r["step"]) <= last}
               .values())


def in_time(rows: list[dict], name: str, t0: float, t1: float) -> float:
    """The sum of metric ``name`` reported after ``t0`` up to ``t1`` (a node's, which has no step)."""
    return sum(r["value"] for r in rows if r["name"] == name and t0 < r["ts"] <= t1)


def steady_s_per_step(step_ts: dict[int, float], not_before: float | None = None) -> dict:
    """Seconds per step from the end of step 2 (or of the first step ending at or after
    ``not_before``, if later) to the end of the last step."""
    steps = sorted(step_ts)
    if len(steps) < 3:
        raise ValueError(f"{len(steps)} trained steps; steady state needs at least 3")
    first = steps[1]
    if not_before is not None:
        later = [s for s in steps[1:-1] if step_ts[s] >= not_before]
        first = later[0] if later else steps[-2]
    last = steps[-1]
    return {"s_per_step": (step_ts[last] - step_ts[first]) / (last - first), "from_step": first, "to_step": last}


def window_work(rows: list[dict], t0: float, t1: float, iterations: int, slack_s: float = 0.5) -> dict[str, float]:
    """Per emulated component, its modelled seconds of work between wall times ``t0`` and ``t1``
    per iteration: the change of its cumulative ``emulated.<call>.modelled_s`` reports (a
    trainer's at each step's end, a node's at each heartbeat; ``slack_s`` takes in a report
    sent just after the instant it belongs to). Over a steady window this is the work each
    resource did per iteration there, whatever it rolled out ahead before the window; the
    busiest one's is the window's lower bound, and bound / measured its utilisation."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        name = r["name"]
        if name.startswith("emulated.") and name.endswith(".modelled_s"):
            series.setdefault((r["component"], name), []).append((float(r["ts"]), float(r["value"])))

    def at(points: list[tuple[float, float]], t: float) -> float:
        return max((v for ts, v in points if ts <= t + slack_s), default=0.0)  # cumulative: never falls

    out: dict[str, float] = {}
    for (comp, _), points in series.items():
        out[comp] = out.get(comp, 0.0) + (at(points, t1) - at(points, t0)) / iterations
    return out


#: how a result's steady windows were measured: ending at a step with work still in flight
#: (:func:`steps_for_window`) and generated context priced as generated (``emulation/cost.py``);
#: a result without it was measured before stop 66's fixes, and is not mixed with one that has it
WINDOW_RULE = "in_flight_both_ends"


def steps_for_window(window_end: int, max_staleness: int) -> int:
    """Steps a Kafka arm must train for its steady window to end at step ``window_end`` with
    work still in flight: the dataflow schedules no episode past the job's last batch, and
    at step ``k``'s end the staleness bound lets it schedule up to batch
    ``k + max_staleness + 1``; a job of fewer steps would let the pools run dry inside the
    window (their last batches already rolled out, nothing new admitted), so the window's
    last steps would train work done before it and flatter the schedule."""
    return window_end + max_staleness + 1


def whole_run_fields(per: list[dict]) -> dict:
    """Over an arm's repetitions (each with ``s_per_iter`` and ``whole_run_bound_s_per_iter``):
    the busiest resource's work per batch over the whole run as a spread — a bound no steady
    state beats — and how many windows measured faster than it; {} when the runs record none
    (the trainer-centred arm)."""
    if not per or "whole_run_bound_s_per_iter" not in per[0]:
        return {}
    return {"whole_run_bound_s_per_iter": spread([x["whole_run_bound_s_per_iter"] for x in per]),
            "faster_than_whole_run_work": sum(x["s_per_iter"] < x["whole_run_bound_s_per_iter"] for x in per)}


def steady_window(rows: list[dict], policy: str, max_staleness: int, dilation: float,
                  shared: set[str] = frozenset(), window_end: int | None = None) -> dict:
    """A Kafka arm's steady state, from its metrics ``rows``: seconds per iteration over
    ``policy``'s trainer steps from the end of step ``max_staleness + 2`` to the end of step
    ``window_end`` (default: the last; a run of :func:`steps_for_window` keeps work in flight at
    both ends), modelled (wall / ``dilation``), and the bound of that window, the busiest
    resource's modelled work per iteration **inside it** (:func:`window_work`), so bound /
    measured is that resource's utilisation there. Before the window the pools roll out up to
    ``max_staleness`` batches ahead of the trainers (several polls in flight at once) and the
    first steps train those: a window that took them in would credit the schedule with work
    done before it; after the job's last batch is scheduled they run dry, and a window that
    took that in would credit the schedule with work done before it too. With too few steps
    the window is the last step alone. A ``shared`` policy's pool and trainer take turns on
    the same devices: one resource for the bound, their work added (:func:`merge_shared`;
    ``work_in_window_by_resource`` keeps each component's)."""
    ts = trainer_steps(rows)[policy]
    last = max(ts) if window_end is None else window_end
    if last not in ts:
        raise ValueError(f"{policy} trained no step {last}; the window cannot end there")
    if last < 3:
        raise ValueError(f"{last} trained steps of {policy}; a steady window needs at least 3")
    first = min(max(2, max_staleness + 2), last - 1)
    iters = last - first
    in_window = window_work(rows, ts[first], ts[last], iters)
    resources = merge_shared(in_window, shared if isinstance(shared, dict) else set(shared))
    per_iter = (ts[last] - ts[first]) / iters / dilation
    bound = max(resources.values())
    return {"s_per_iter": per_iter, "lower_bound_s_per_iter": bound, "scheduling_efficiency": bound / per_iter,
            "busiest": max(resources, key=resources.get), "work_in_window_by_resource": in_window,
            **({"shared_resources": {k: v for k, v in resources.items() if k.startswith("shared.")}} if shared else {}),
            "window_steps": [first, last]}
