"""``elastic --slurm``: each arm's figures come from Slurm's accounting in the run's summary, the
verdict compares the arms on those, and a cluster without a completion log says why."""

from __future__ import annotations

import pytest

from astraflow.benchmarks.elastic_slurm import slurm_numbers, summarize, table, verdict


def _row(total: float, heartbeat: float) -> dict:
    summary = {"jobs": {"trainer": ["1"], "raas-0": ["2", "5"], "raas-1": ["3"]},
               "device_hours": {"rollout": total * 0.4, "trainer": total * 0.6, "total": total, "cost": total}}
    row = {"wall_s": 100.0, "pool_mean": 1.5, "pool_max": 2, "total_device_hours": heartbeat, "audit_ok": True}
    return slurm_numbers(row, summary)


def test_arms_are_compared_on_slurms_device_hours_not_the_heartbeats():
    arms = {"fixed_small": _row(0.30, 0.10), "fixed_large": _row(0.40, 0.10), "autoscaling": _row(0.27, 0.90)}
    assert arms["autoscaling"]["slurm_jobs"] == 4  # raas-0's resubmitted job counts too
    v = verdict(arms)
    assert v["autoscaling_vs_fixed_small"] == pytest.approx(-0.1) and v["autoscaling_vs_fixed_large"] == pytest.approx(-0.325)
    assert v["below_both"] is True
    assert "autoscaling vs fixed_small -10.0%" in table({**arms, "verdict": v})
    # over repetitions: paired run by run, the arm's row the median repetition's
    reps = {k: summarize([_row(t * f, 0.1) for f in (1.0, 1.1, 0.9)]) for k, t in
            (("fixed_small", 0.30), ("fixed_large", 0.40), ("autoscaling", 0.33))}
    assert reps["autoscaling"]["slurm_device_hours"]["total"] == pytest.approx(0.33)
    v3 = verdict(reps)
    assert v3["autoscaling_vs_fixed_small_spread"]["runs"] == pytest.approx([0.1, 0.1, 0.1])
    assert v3["below_both"] is False and v3["below_both_every_repetition"] is False


def test_a_cluster_without_a_completion_log_says_why():
    row = slurm_numbers({"wall_s": 1.0}, {"jobs": {}, "device_hours": None,
                                         "device_hours_unavailable": "the cluster's JobCompType is not jobcomp/filetxt"})
    assert row["slurm_device_hours"] == {} and row["slurm_cost"] is None
    assert "JobCompType" in row["slurm_device_hours_unavailable"]
