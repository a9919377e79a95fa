"""benchmarks/elastic*.py: each arm's numbers come from its run's summary and metrics."""

from __future__ import annotations

import pytest
import yaml

from astraflow.benchmarks import elastic, elastic_arms


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
    r = elastic_arms.arm_numbers(summary(0.3, 0.1, 0.2), rows_of([1, 1, 3, 3], [(50.0, 1.0), (1.0, 1.0), (3.0, 1.0)]))
    assert r["trainer_wait_frac"] == pytest.approx(4.0 / 6.0, abs=1e-4)  # step 1 (every process booting) left out
    assert (r["pool_max"], r["pool_mean"]) == (3, pytest.approx((1 + 1 + 3) / 3, abs=1e-3))
    assert r["scaling_actions"] == [{"t_s": 30.0, "action": "up", "from": 1, "to": 3,
                                     "reason": "trainer waits 60% > 10%"}]
    assert set(elastic.ARMS) == {"fixed_small", "fixed_large", "autoscaling"}
    for key in ("total_device_hours", "rollout_device_hours", "trainer_device_hours", "wall_s",
                "trainer_wait_frac", "accuracy"):
        assert key in r


def test_verdict_and_table():
    arms = {"fixed_small": elastic_arms.arm_numbers(summary(1.0, 0.2, 0.8), rows_of([1, 1], [])),
            "fixed_large": elastic_arms.arm_numbers(summary(1.2, 0.6, 0.6, acc=0.55), rows_of([4, 4], [])),
            "autoscaling": elastic_arms.arm_numbers(summary(0.9, 0.3, 0.6), rows_of([1, 2], []))}
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
        t = parse_topology(elastic_arms.topology(arm, a), f"<{arm}>")
        validate(t)
        plan = resolve(t, "policy")
        pools[arm] = (plan.pools["raas"].count, plan.pools["raas"].min, plan.pools["raas"].max,
                      plan.pools["raas"].elastic)
        assert plan.pools["trainer"].devices_per_node == 4 and "EMULATION" in " ".join(plan.notes)
    assert pools == {"fixed_small": (1, 1, 1, False), "fixed_large": (4, 4, 4, False),
                     "autoscaling": (1, 1, 4, True)}


def emulated_args(**kw):
    import argparse
    base = dict(profile="h100-qwen3-8b", dilation=0.4, token_scale=512, prompt_token_scale=16, trainer_devices=None,
                seed=0, small=None, large=None, raas_cost=1.0, trainer_cost=1.0, interval=5.0, window=60.0,
                cooldown=60.0, steps=15, problems=100)
    return argparse.Namespace(**{**base, **kw})


def test_emulated_arms_put_cost_model_devices_on_the_trainer_and_raas_pools():
    from astraflow.benchmarks import elastic_emulated as em
    from astraflow.config import load_config
    from astraflow.topology.plan import resolve
    from astraflow.topology.schema import parse_topology
    from astraflow.topology.validation import validate
    a = emulated_args()
    p = em.price(a)
    a.small, a.large = p["small"], p["large"]
    sizes = {}
    for arm in elastic.ARMS:
        t = parse_topology(em.topology(arm, a, p["trainer_devices"]), f"<{arm}>")
        validate(t)
        plan = resolve(t, "policy")
        trainer, raas = plan.pools["trainer"], plan.pools["raas"]
        sizes[arm] = (raas.count, raas.min, raas.max)
        assert trainer.devices_per_node == 2 and raas.devices_per_node == 1  # 8B training states need 2 H100s
        for pool, section in ((trainer, "trainer"), (raas, "rollout")):
            assert pool.device.emulate == "h100-qwen3-8b" and pool.device.slowdown == 1.0  # the cost model, no stretch
            assert pool.device_kind == "h100"
            sets = pool.overrides()  # what a node of the pool is launched with
            assert f"{section}.device.profile=h100-qwen3-8b" in sets and f"{section}.device.dilation=0.4" in sets
            assert f"{section}.device.token_scale=512" in sets
        assert not plan.pools["dataflow"].device.emulated  # everything else as the CPU arms
        # a node's job config with its pool's --set items is a cost-model emulated device
        overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in raas.overrides())
                     if k.startswith("rollout.device.")}
        cfg = load_config(elastic_arms.ROOT / "examples" / "arithmetic_grpo.yaml", overrides)
        assert cfg.rollout.device.emulated and cfg.rollout.device.profile == "h100-qwen3-8b"
    assert sizes == {"fixed_small": (1, 1, 1), "fixed_large": (4, 4, 4), "autoscaling": (1, 1, 4)}


def test_the_pricing_rule_puts_small_below_and_large_above_the_balance_point():
    from astraflow.benchmarks import elastic_emulated as em
    p = em.price(emulated_args())
    assert p["small"] < p["balance_nodes"] < p["large"]
    pr = p["predicted"]
    assert pr["fixed_small"]["trainer_wait_frac"] > 0.3  # the small pool starves the trainer
    assert pr["fixed_large"]["pool_busy_frac"] < 0.6  # the large one idles
    # the balance point is the cheapest of the three in device-seconds per step
    assert pr["balance"]["device_s_per_step"] < min(pr["fixed_small"]["device_s_per_step"],
                                                    pr["fixed_large"]["device_s_per_step"])
    assert "N* = 2 x" in em.rule_text(p)
    # sizes given on the command line win over the rule
    q = em.price(emulated_args(small=2, large=3))
    assert (q["small"], q["large"], q["sizes_from_rule"]) == (2, 3, False)


def test_emulated_device_hours_are_modelled_hours():
    from astraflow.benchmarks import elastic_emulated as em
    row = elastic_arms.arm_numbers(summary(0.3, 0.1, 0.2), rows_of([1, 2], [(3.0, 1.0)]))
    m = em.modelled(row, dilation=0.4)
    assert m["total_device_hours"] == pytest.approx(0.3 / 0.4) and m["wall_total_device_hours"] == 0.3
    assert m["rollout_device_hours"] == pytest.approx(0.25) and m["trainer_device_hours"] == pytest.approx(0.5)
    assert m["cost"] == pytest.approx(0.6 / 0.4) and m["modelled_s"] == pytest.approx(60.0 / 0.4)
    assert m["wall_s"] == 60.0 and m["wall_time_to_first_step_s"] == 20.0
    assert m["trainer_wait_frac"] == row["trainer_wait_frac"]  # a fraction: the same in either unit


def test_report_renders_the_emulated_section_and_skips_a_quick_one(tmp_path):
    import json

    from astraflow.benchmarks import elastic_emulated as em
    p = em.price(emulated_args())
    arms = {arm: {**em.modelled(elastic_arms.arm_numbers(summary(t, r, t - r), rows_of([1, n], [])), 0.4),
                  "instrument": {"overruns": 0, "cpu_fraction": {}}}
            for arm, t, r, n in (("fixed_small", 0.4, 0.1, 1), ("fixed_large", 0.5, 0.3, 4), ("autoscaling", 0.3, 0.1, 2))}
    section = {"emulated": True, "quick": False, "profile": "h100-qwen3-8b", "dilation": 0.4, "steps": 15,
               "job_shape": {"groups_per_batch": 32, "n_samples": 8}, "pricing": p, **arms,
               "verdict": elastic.verdict(arms), "machine": {"cpus": 2},
               "load": {"before": {"loadavg": [3.0, 2.0, 1.0]}, "after": {"loadavg": [4.0, 2.0, 1.0]}}}
    (tmp_path / "elastic.json").write_text(json.dumps({"benchmark": "elastic", "emulated": section}))
    def load(name):
        return json.loads((tmp_path / f"{name}.json").read_text())
    text = "\n".join(em.report_rows(load))
    assert "EMULATED" in text and "modelled device-hours" in text and "small 1, large 4" in text
    assert "| autoscaling | 150 |" in text and "| 0.750 |" in text  # 60 wall s and 0.3 device-hours at dilation 0.4
    assert "vs fixed_large -40.0%" in text
    section["quick"] = True
    (tmp_path / "elastic.json").write_text(json.dumps({"benchmark": "elastic", "emulated": section}))
    assert em.report_rows(load) == []


def test_the_emulated_verdict_pairs_repetitions_and_an_incomplete_run_voids_it():
    from astraflow.benchmarks import elastic_emulated as em

    def row(dh, acc=0.2, complete=True):
        return {"total_device_hours": dh, "modelled_s": 100.0, "trainer_wait_frac": 0.1, "accuracy": acc,
                "instrument": {"overruns": 1}, "complete": complete}
    reps = {"fixed_small": [row(1.0), row(1.2), row(1.1)], "fixed_large": [row(1.1), row(1.0), row(1.3)],
            "autoscaling": [row(0.9), row(1.08), row(1.2)]}
    v = em.verdict(reps)
    small, large = v["autoscaling_vs_fixed_small_spread"], v["autoscaling_vs_fixed_large_spread"]
    # repetition by repetition: 0.9/1.0, 1.08/1.2, 1.2/1.1 against small; 0.9/1.1, 1.08/1.0, 1.2/1.3 against large
    assert small["runs"] == pytest.approx([-0.1, -0.1, 1.2 / 1.1 - 1])
    assert large["runs"] == pytest.approx([0.9 / 1.1 - 1, 0.08, 1.2 / 1.3 - 1])
    assert v["autoscaling_vs_fixed_small"] == pytest.approx(-0.1)
    assert v["below_both"] and not v["below_both_every_repetition"] and v["valid"]
    s = em.summarize(reps["fixed_large"])
    assert s["total_device_hours"] == 1.1 and s["total_device_hours_spread"]["max"] == 1.3  # the median run's row
    assert s["overruns_total"] == 3 and len(s["repetitions"]) == 3
    reps["fixed_large"][2] = row(1.3, complete=False)  # a run that stopped short
    assert em.verdict(reps)["valid"] is False and em.summarize(reps["fixed_large"])["complete"] is False
