"""Table 2's aggregation (``multi_policy --emulated``): the partial-rollouts arm lands in its own
section beside (a) without it, the whole-run cross-check counts a window faster than its
busiest resource's work, and the time weights wait to be loaded is read per node from the run's
metrics."""

from __future__ import annotations

import pytest

from astraflow.benchmarks.multi_policy_emulated import aggregate
from astraflow.benchmarks.multi_policy_emulated_arms import weights_waits


def _arm(s: float, bound: float, whole: float | None = None, wait: float | None = None, rows: float = 0.0) -> dict:
    out = {"s_per_iter": s, "lower_bound_s_per_iter": bound, "cpu_fraction": {"x": 0.1}, "overruns": 0}
    if whole is not None:
        out.update(whole_run_bound_s_per_iter=whole, busiest="raas-solver-0", window_steps=[5, 12],
                   work_in_window_by_resource={"raas-solver-0": bound},
                   weights_wait_s_per_load={"raas-solver-0": wait, "raas-verifier-0": wait / 2}, partial_rows=rows)
    return out


def _rep(a: float, partial: float | None, a_whole: float = 80.0) -> dict:
    rep = {"colocated": _arm(190.0, 189.0), "async": _arm(a, 85.0, a_whole, wait=30.0),
           "lockstep": _arm(100.0, 95.0, 96.0, wait=40.0)}
    if partial is not None:
        rep["async_partial"] = _arm(partial, 84.0, 82.0, wait=3.0, rows=120.0)
    return rep


def test_the_partial_arm_is_reported_beside_a_without_it():
    agg = aggregate([_rep(90.0, 81.0), _rep(92.0, 82.0), _rep(94.0, 90.0)])
    pr = agg["partial_rollouts"]
    assert pr["emulated"] is True
    assert pr["without"]["s_per_iter"]["median"] == 92.0 and pr["with"]["s_per_iter"]["median"] == 82.0
    assert pr["speedup_with_over_without"]["runs"] == pytest.approx([90 / 81, 92 / 82, 94 / 90])
    # the most-waiting node's wait per load (the verifier's pool waits half as long here)
    assert pr["without"]["weights_wait_s_per_load"]["median"] == 30.0 and pr["with"]["weights_wait_s_per_load"]["median"] == 3.0
    assert pr["with"]["partial_rows"]["median"] == 120.0
    assert agg["arms"]["async_partial"]["speedup_vs_sequential"]["median"] == pytest.approx(190 / 82)
    assert "partial_rollouts" not in aggregate([_rep(90.0, None)] * 3)  # --no-partial


def test_a_window_faster_than_its_busiest_resources_whole_run_work_is_counted():
    agg = aggregate([_rep(90.0, None, a_whole=95.0), _rep(92.0, None, a_whole=80.0), _rep(94.0, None, a_whole=99.0)])
    assert agg["arms"]["async"]["faster_than_whole_run_work"] == 2
    assert agg["arms"]["async"]["whole_run_bound_s_per_iter"]["median"] == 95.0


def test_the_time_weights_wait_is_each_nodes_last_total_over_its_loads_in_modelled_seconds():
    rows = [{"name": "raas.weights_wait_s", "component": "raas", "label.node": "raas-solver-0", "value": v}
            for v in (1.0, 3.0, 6.0)]
    rows += [{"name": "raas.weights_loads", "component": "raas", "label.node": "raas-solver-0", "value": v}
             for v in (1, 2, 4)]
    rows += [{"name": "raas.weights_wait_s", "component": "raas", "label.node": "raas-verifier-0", "value": 0.0}]
    # 6 wall s over 4 loads at dilation 0.3: 5 modelled s per load; a node that never loaded is left out
    assert weights_waits(rows, 0.3) == {"raas-solver-0": pytest.approx(5.0)}
