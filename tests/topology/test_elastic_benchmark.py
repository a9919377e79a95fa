"""benchmarks/elastic.py: each arm's numbers come from its run's summary and metrics."""

from __future__ import annotations

import pytest

from astraflow.benchmarks import elastic


def rows_of(sizes, waits_trains):
    rows = [{"ts": 100.0 + 10 * i, "name": "autoscaler.pool_size", "value": v, "step": 0}
            for i, v in enumerate(sizes)]
    for step, (w, t) in enumerate(waits_trains, 1):
        rows += [{"ts": 100.0 + step, "name": "trainer.wait_s", "value": w, "step": step},
                 {"ts": 100.0 + step, "name": "trainer.train_s", "value": t, "step": step}]
    rows.append({"ts": 130.0, "name": "autoscaler.scaled", "value": 3, "step": 0, "label.action": "up",
                 "label.current": 1, "label.reason": "trainer waits 60% > 10%"})
    return sorted(rows, key=lambda r: r["ts"])


def summary(total, rollout, trainer, acc=0.5):
    return {"device_hours": {"total": total, "rollout": rollout, "trainer": trainer, "cost": 2 * total},
            "wall_s": 60.0, "accuracy_final": acc, "accuracy_initial": 0.1, "steps_trained": 3,
            "time_to_first_step_s": 20.0}


def test_arm_numbers_skip_the_boot_step_and_weigh_pool_size_by_time():
    r = elastic.arm_numbers(summary(0.3, 0.1, 0.2), rows_of([1, 1, 3, 3], [(50.0, 1.0), (1.0, 1.0), (3.0, 1.0)]))
    assert r["trainer_wait_frac"] == pytest.approx(4.0 / 6.0, abs=1e-4)  # step 1 (every process booting) left out
    assert (r["pool_max"], r["pool_mean"]) == (3, pytest.approx((1 + 1 + 3) / 3, abs=1e-3))
    assert r["scaling_actions"] == [{"t_s": 30.0, "action": "up", "from": 1, "to": 3,
                                     "reason": "trainer waits 60% > 10%"}]
    assert set(elastic.ARMS) == {"fixed_small", "fixed_large", "autoscaling"}
    for key in ("total_device_hours", "rollout_device_hours", "trainer_device_hours", "wall_s",
                "trainer_wait_frac", "accuracy"):
        assert key in r


def test_verdict_and_table():
    arms = {"fixed_small": elastic.arm_numbers(summary(1.0, 0.2, 0.8), rows_of([1, 1], [])),
            "fixed_large": elastic.arm_numbers(summary(1.2, 0.6, 0.6, acc=0.55), rows_of([4, 4], [])),
            "autoscaling": elastic.arm_numbers(summary(0.9, 0.3, 0.6), rows_of([1, 2], []))}
    v = elastic.verdict(arms)
    assert v["autoscaling_vs_fixed_small"] == pytest.approx(-0.1)
    assert v["autoscaling_vs_fixed_large"] == pytest.approx(0.9 / 1.2 - 1)
    assert v["below_both"] and v["accuracy_spread"] == pytest.approx(0.05)
    assert "vs fixed_large -25.0%" in elastic.table({**arms, "verdict": v})


def test_topologies_differ_only_in_the_pool(tmp_path):
    import argparse

    from astraflow.topology.plan import resolve
    from astraflow.topology.schema import parse_topology
    from astraflow.topology.validation import validate
    a = argparse.Namespace(small=1, large=4, raas_cost=1.0, raas_slowdown=30.0, trainer_devices=4, trainer_cost=1.0,
                           trainer_slowdown=6.0, interval=5.0, window=30.0, cooldown=45.0)
    pools = {}
    for arm in elastic.ARMS:
        t = parse_topology(elastic.topology(arm, a), f"<{arm}>")
        validate(t)
        plan = resolve(t, "policy")
        pools[arm] = (plan.pools["raas"].count, plan.pools["raas"].min, plan.pools["raas"].max,
                      plan.pools["raas"].elastic)
        assert plan.pools["trainer"].devices_per_node == 4 and "EMULATION" in " ".join(plan.notes)
    assert pools == {"fixed_small": (1, 1, 1, False), "fixed_large": (4, 4, 4, False),
                     "autoscaling": (1, 1, 4, True)}
