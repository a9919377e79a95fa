"""The emulated scale benchmark's layouts: the same work per device at every device count,
and job configs the loader accepts (every key it sets exists and is in range)."""

from __future__ import annotations

import argparse

import pytest

from astraflow.benchmarks import emulated_scale as es
from astraflow.config import load_config


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_every_device_count_keeps_the_work_per_device_and_loads_as_a_job(n):
    lay = es.layout(n, 8)
    assert lay["rollout_devices"] + lay["trainer_devices"] == n
    assert lay["nodes"] * lay["devices_per_node"] == lay["rollout_devices"] and lay["devices_per_node"] <= 8
    assert lay["groups_per_batch"] / n == es.GROUPS_PER_8 / 8  # weak scaling: a batch's share per device
    assert lay["tasks_per_call"] * lay["nodes"] == lay["groups_per_batch"]
    args = argparse.Namespace(profile="h100-qwen3-8b", dilation=0.3, token_scale=512, prompt_token_scale=16,
                              steps=4)
    ov = es.overrides(args, lay, f"scale-{n}")
    cfg = load_config(es.CONFIG, ov)
    assert cfg.rollout.nodes == lay["nodes"] and cfg.rollout.device.count == lay["devices_per_node"]
    assert cfg.trainer.device.count == lay["trainer_devices"] and cfg.rollout.device.emulated
    assert cfg.rollout.device.dilation == pytest.approx(0.3 * n / 8)  # the real work's share stays small


def test_a_layout_that_cannot_split_evenly_is_refused():
    with pytest.raises(ValueError, match="do not split evenly"):
        es.layout(40, 8)  # 20 rollout devices over 3 nodes


def test_the_bound_prices_a_batch_over_every_episode_rolled_out_fenced_ones_included():
    """Fenced polls' episodes did their work (it is in the device totals) and were redone by
    another node: priced over committed episodes only, that work would read as needed and
    the "lower bound" would exceed the time measured (efficiency 1.13-1.19 in stop 39's run)."""
    rows = [{"name": "raas.fenced_tasks", "value": v, "label.node": n}
            for n, v in (("raas-0", 4), ("raas-0", 12), ("raas-1", 8))]  # running counts per node
    rows += [{"name": "raas.task_group_generation", "value": g, "label.node": "raas-0"} for g in (3, 3, 9)]
    assert es.episodes_fenced(rows) == 20  # the last count of each node
    assert es.rebalances(rows) == 6
    assert es.rebalances([]) == 0 and es.episodes_fenced([]) == 0
    from astraflow.benchmarks.lib.emulated import resource_work
    summary = {"emulated": {"raas-0": {"generate": {"modelled_s": 120.0}}, "trainer": {"train": {"modelled_s": 60.0}}}}
    committed, fenced = 40, es.episodes_fenced(rows)
    priced = resource_work(summary, committed + fenced, 16, 3)["raas-0"]
    assert priced == pytest.approx(120.0 * 16 / 60) and priced < resource_work(summary, committed, 16, 3)["raas-0"]


def test_a_pools_work_is_priced_over_every_episode_it_worked_on_the_stops_polls_in_flight_included():
    """With several polls in flight, a job stops with up to that many polls rolled out but never
    committed (stop 41's 16-device team run: 256 episodes committed, 4 x 64 in flight, the
    "bound" 85.5 s over a measured 73.6 s per iteration). Each node reports them with its
    device totals."""
    from astraflow.benchmarks.lib.emulated import episodes_worked, resource_work
    rows = [{"name": "raas.tasks", "value": 64, "label.node": "raas-0"} for _ in range(4)]
    rows += [{"name": "raas.fenced_tasks", "value": 8, "label.node": "raas-1"},
             {"name": "raas.tasks_in_flight", "value": 192, "label.node": "raas-0", "ts": 1.0},
             {"name": "raas.tasks_in_flight", "value": 128, "label.node": "raas-0", "ts": 2.0},  # a gauge: the last
             {"name": "raas.tasks_in_flight", "value": 0, "label.node": "raas-1", "ts": 2.0}]
    assert episodes_worked(rows) == 256 + 8 + 128
    assert episodes_worked([r for r in rows if r["name"] == "raas.tasks"]) == 256
    summary = {"emulated": {"raas-0": {"generate": {"modelled_s": 339.0}}}}
    assert resource_work(summary, episodes_worked(rows), 64, 4)["raas-0"] == pytest.approx(339.0 * 64 / 392)


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_the_team_at_scale_keeps_table_2s_split_per_device_and_loads_as_a_job(n, tmp_path):
    """``--job solver_verifier``: Table 2's recorded split (the rule's, at 8 devices) scaled by
    N/8, the batch grown with N, every pool on nodes of <= 8 devices; Table 2's settings."""
    import json

    table2 = json.loads(es.TABLE2.read_text())
    lay = es.sv_layout(n, 8, table2)
    assert sum(d for parts in lay["split"].values() for d in parts.values()) == n
    for p, parts in table2["device_split"]["split"].items():
        assert lay["split"][p] == {st: d * n // 8 for st, d in parts.items()}
        pool = lay["pools"][p]
        assert pool["nodes"] * pool["devices_per_node"] == lay["split"][p]["rollout"] and pool["devices_per_node"] <= 8
    assert lay["groups_per_batch"] == 32 * n // 8
    args = argparse.Namespace(dilation=0.3, steps=5, run_root=str(tmp_path))
    data, dilation = es.sv_config(args, lay, f"sv-{n}", table2)
    path = tmp_path / "sv.yaml"
    import yaml
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert dilation == pytest.approx(0.3 * n / 8) and cfg.dataflow.groups_per_batch == 32 * n // 8
    for p in cfg.policy_names:
        view = cfg.view(p)
        assert view.rollout.nodes == lay["pools"][p]["nodes"] and view.rollout.device.count == lay["pools"][p]["devices_per_node"]
        assert view.trainer.device.count == lay["split"][p]["trainer"]
        assert view.rollout.polls_in_flight == table2["polls_in_flight"] and cfg.dataflow.max_staleness == table2["max_staleness"]
    with pytest.raises(ValueError, match="multiple"):
        es.sv_layout(12, 8, table2)


def test_the_bound_of_a_window_is_the_work_each_resource_did_inside_it():
    """A pool that rolled its batches out ahead, before the window, did no work in it: the
    window's bound is the trainer's work there, and never exceeds the window's length."""
    from astraflow.benchmarks.lib.steady import window_work

    def cum(comp, points):
        return [{"name": "emulated.generate.modelled_s" if comp.startswith("raas") else "emulated.train.modelled_s",
                 "component": comp, "ts": t, "value": v} for t, v in points]
    rows = cum("raas-0", [(1.0, 50.0), (3.0, 200.0), (5.0, 288.0), (9.0, 288.0), (12.0, 300.0)])
    rows += cum("trainer", [(4.0, 60.0), (6.0, 125.0), (8.0, 190.0), (10.0, 255.0)])
    w = window_work(rows, 6.0, 10.0, 2, slack_s=0.1)
    assert w == {"raas-0": 0.0, "trainer": pytest.approx(65.0)}
    assert window_work(rows, 1.0, 12.0, 1, slack_s=0.1)["raas-0"] == pytest.approx(250.0)
    assert window_work([], 0.0, 1.0, 1) == {}


def test_the_steady_window_leaves_out_the_batches_rolled_out_ahead_and_is_priced_inside_itself():
    """Table 2's (a)/(b) and the team at scale read one steady window: it starts at the end of
    step max_staleness + 2 (the pool's burst before it, the batches the first steps train, is
    outside), its s/iter is modelled (wall / dilation), and its bound is the busiest resource's
    work inside it: here the trainer, busy every second of the window, so efficiency 1."""
    from astraflow.benchmarks.lib.steady import steady_window

    steps = [{"name": "trainer.samples", "component": "trainer.solver", "step": k, "ts": 10.0 * k, "value": 256}
             for k in range(1, 13)]
    # the pool rolls out 4 batches in the first 20 s (280 modelled s), then 30 modelled s per 10 wall s
    pool = [{"name": "emulated.generate.modelled_s", "component": "raas-solver-0", "ts": t,
             "value": 280.0 if t <= 20 else 280.0 + 3.0 * (t - 20)} for t in range(0, 121, 5)]
    # the trainer works all the time: 10 wall s = 100 modelled s per step at dilation 0.1
    trainer = [{"name": "emulated.train.modelled_s", "component": "trainer.solver", "ts": 10.0 * k,
                "value": 100.0 * k} for k in range(1, 13)]
    w = steady_window(steps + pool + trainer, "solver", max_staleness=3, dilation=0.1)
    assert w["window_steps"] == [5, 12]
    assert w["s_per_iter"] == pytest.approx(100.0)
    assert w["work_in_window_by_resource"]["raas-solver-0"] == pytest.approx(30.0)
    assert w["busiest"] == "trainer.solver" and w["scheduling_efficiency"] == pytest.approx(1.0)
    # the pool and trainer taking turns on the same devices are one resource: their work adds up
    turns = steady_window(steps + pool + trainer, "solver", max_staleness=3, dilation=0.1, shared={"solver"})
    assert turns["busiest"] == "shared.solver" and turns["lower_bound_s_per_iter"] == pytest.approx(130.0)
    assert turns["shared_resources"] == {"shared.solver": pytest.approx(130.0)}
    assert turns["work_in_window_by_resource"] == w["work_in_window_by_resource"]  # each component's kept
    # no batches rolled out ahead (max_staleness 0): the window starts after step 2
    assert steady_window(steps + pool + trainer, "solver", max_staleness=0, dilation=0.1)["window_steps"] == [2, 12]
    with pytest.raises(ValueError, match="steady window"):
        steady_window(steps[:2], "solver", max_staleness=3, dilation=0.1)


def test_a_window_that_ends_where_the_pools_run_dry_flatters_the_schedule_and_one_ended_earlier_does_not():
    """The fault Table 2 had before stop 66: the job's last batches were rolled out before
    the window closed, so its last steps only waited for the trainer. A 16-step run whose pool
    runs dry after step 12 (its horizon reached) measured to step 16 reads faster than the pool
    can go; measured to step 12 (:func:`steps_for_window` steps trained: 12 + max_staleness + 1)
    it reads the pool's own pace, bound and efficiency 1."""
    from astraflow.benchmarks.lib.steady import steady_window, steps_for_window

    assert steps_for_window(12, 3) == 16
    # the pool needs 200 modelled s per batch (20 wall s at dilation 0.1): the trainer waits on it
    # until step 12; the rest was rolled out ahead, so steps 13..16 come every 5 wall s
    ts = {k: 20.0 * k for k in range(1, 13)} | {12 + j: 240.0 + 5.0 * j for j in range(1, 5)}
    steps = [{"name": "trainer.samples", "component": "trainer.solver", "step": k, "ts": t, "value": 256}
             for k, t in ts.items()]
    pool = [{"name": "emulated.generate.modelled_s", "component": "raas-solver-0", "ts": float(t),
             "value": 10.0 * min(t, 240)} for t in range(0, 261, 5)]
    trainer = [{"name": "emulated.train.modelled_s", "component": "trainer.solver", "ts": t,
                "value": 50.0 * k} for k, t in ts.items()]
    rows = steps + pool + trainer
    dry = steady_window(rows, "solver", max_staleness=3, dilation=0.1)
    honest = steady_window(rows, "solver", max_staleness=3, dilation=0.1, window_end=12)
    assert dry["window_steps"] == [5, 16] and honest["window_steps"] == [5, 12]
    assert honest["s_per_iter"] == pytest.approx(200.0) and honest["busiest"] == "raas-solver-0"
    assert honest["scheduling_efficiency"] == pytest.approx(1.0)
    # the whole window reads faster than the pool's pace: credit for batches rolled out before it
    assert dry["s_per_iter"] < 0.8 * honest["s_per_iter"]
    with pytest.raises(ValueError, match="no step 17"):
        steady_window(rows, "solver", max_staleness=3, dilation=0.1, window_end=17)


def test_a_team_run_at_new_device_counts_keeps_the_counts_measured_the_same_way(tmp_path):
    """Running 32 devices after 8 and 16 must not drop them; a section measured with other
    steps (or another Table 2) is replaced, never mixed into the new one."""
    import json
    table2 = {"profile": "h100-qwen3-8b", "token_scale": 256, "max_staleness": 3}
    settings = {k: table2.get(k) for k in es.SV_SETTINGS}
    old = {"steps": 12, "dilation_at_8": 0.3, "table2_settings": settings, "window": es.WINDOW_RULE,
           "layouts": {"8": {"devices": 8}, "16": {"devices": 16}},
           "repetitions": {"8": [{"samples_per_s": 6.1}], "16": [{"samples_per_s": 10.8}]}}
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"benchmark": "emulated_scale", "solver_verifier": old}))
    args = argparse.Namespace(steps=12, dilation=0.3)
    kept = es.kept_counts(out, args, table2, [16, 32])
    assert kept == {8: ({"devices": 8}, [{"samples_per_s": 6.1}])}  # 16 is remeasured, so not kept
    assert es.kept_counts(out, argparse.Namespace(steps=6, dilation=0.3), table2, [32]) == {}
    assert es.kept_counts(out, args, {**table2, "max_staleness": 1}, [32]) == {}
    assert es.kept_counts(tmp_path / "absent.json", args, table2, [32]) == {}
    # a section whose windows ended where its pools ran dry (before stop 66) is not mixed in
    out.write_text(json.dumps({"benchmark": "emulated_scale", "solver_verifier": {**old, "window": None}}))
    assert es.kept_counts(out, args, table2, [32]) == {}
    out.write_text(json.dumps({"benchmark": "emulated_scale", "solver_verifier": old}))
    # --add-repetitions: the count remeasured keeps what it recorded too, and the new repetitions follow
    more = argparse.Namespace(steps=12, dilation=0.3, add_repetitions=True)
    assert es.kept_counts(out, more, table2, [16]) == {8: ({"devices": 8}, [{"samples_per_s": 6.1}]),
                                                         16: ({"devices": 16}, [{"samples_per_s": 10.8}])}


def _team_at_8(solver_trainer_s: float) -> tuple[dict, list[dict]]:
    lay = {"devices": 8, "pools": {"solver": {"nodes": 1, "devices_per_node": 3, "trainer_devices": 2},
                                   "verifier": {"nodes": 1, "devices_per_node": 1, "trainer_devices": 2}}}
    work = {"raas-solver-0": 70.0, "raas-verifier-0": 60.0, "trainer.solver": solver_trainer_s, "trainer.verifier": 27.0}
    return lay, [{"work_by_resource": work}, {"work_by_resource": {**work, "trainer.solver": solver_trainer_s + 2.0}}]


def test_the_balanced_split_gives_the_busiest_trainer_the_devices_a_scaled_split_starves_it_of():
    """At 8 the rule keeps Table 2's split (the smallest trainer of 2 is the bound); at 64 the
    scaled split (16 + 16 trainers) leaves the solver's trainer the bound at ~1.3x the pools,
    the balanced one moves devices to it, prices no stage above the scaled split's bound, and
    every pool splits evenly over nodes of <= 8."""
    import math
    base = _team_at_8(78.0)
    s = lambda d: 0.9 ** math.log2(d)  # noqa: E731
    at8 = es.sv_balanced_split(8, 8, base, 0.9)
    assert at8["split"] == {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}}
    assert at8["priced_stage_s"]["solver.trainer"] == pytest.approx(79.0)  # the mean of the repetitions
    bal = es.sv_balanced_split(64, 8, base, 0.9)
    split = bal["split"]
    assert sum(d for parts in split.values() for d in parts.values()) == 64
    assert split["solver"]["trainer"] > 16 > split["verifier"]["trainer"] >= 2
    scaled_solver_trainer = 79.0 * 8 * 2 * s(2) / (16 * s(16))
    assert bal["priced_bound_s_per_iter"] < scaled_solver_trainer
    assert bal["priced_bound_s_per_iter"] == max(bal["priced_stage_s"].values())
    for p, parts in split.items():
        assert es.pool_fits(parts["rollout"], 8)
    lay = es.sv_layout(64, 8, {"devices": 8, "device_split": {"split": split}}, bal)
    assert lay["split_rule"] == "balanced" and lay["pools"]["solver"]["trainer_devices"] == split["solver"]["trainer"]
    # a cheaper solver trainer needs fewer devices: the rule follows the measured work
    assert es.sv_balanced_split(64, 8, _team_at_8(30.0), 0.9)["split"]["solver"]["trainer"] < split["solver"]["trainer"]
    assert not es.pool_fits(9, 8) and es.pool_fits(10, 8) and es.pool_fits(24, 8)
    with pytest.raises(ValueError, match="cannot hold"):
        es.sv_balanced_split(5, 8, base, 0.9)


def _table2(solver_trainer_s: float) -> dict:
    work = {"raas-solver-0": 62.0, "raas-verifier-0": 52.0, "trainer.solver": solver_trainer_s,
            "trainer.verifier": 28.0}
    return {"devices": 8, "profile": "h100-qwen3-8b", "token_scale": 256, "prompt_token_scale": 16,
            "device_split": {"split": {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}},
                             "min_train_devices": 2},
            "repetitions": [{"async": {"work_in_window_by_resource": work}},
                            {"async": {"work_in_window_by_resource": {**work, "trainer.solver": solver_trainer_s + 2}}}]}


def test_the_repriced_split_follows_what_a_ran_not_what_c_priced():
    """Table 2's (a) bound by its solver trainer (97 s against a 62-s pool of 3 devices): priced on
    (a)'s own steady windows, a device moves from the solver's pool (3 x 62 = 186 device-s over
    2: 93) to its trainer (97 x 2 s(2) over 3 s(3)); a trainer that is not the bound keeps the
    split, and no trainer goes below the devices its states need. Every pool and trainer keeps
    devices of its own (this rule's pool model would credit taking turns with a speed-up)."""
    import math

    from astraflow.benchmarks.multi_policy_resplit import repriced_split
    from astraflow.emulation.profile import load_profile
    s = lambda d: load_profile("h100-qwen3-8b").efficiency.train_scaling ** math.log2(d)  # noqa: E731
    r = repriced_split(_table2(96.0))
    assert r["split"] == {"solver": {"rollout": 2, "trainer": 3}, "verifier": {"rollout": 1, "trainer": 2}}
    assert r["priced_stage_s"]["solver.rollout"] == pytest.approx(62.0 * 3 / 2)
    assert r["priced_stage_s"]["solver.trainer"] == pytest.approx(97.0 * 2 * s(2) / (3 * s(3)))
    assert r["priced_bound_s_per_iter"] == max(r["priced_stage_s"].values())
    assert repriced_split(_table2(50.0))["split"] == _table2(50.0)["device_split"]["split"]
    assert all(parts["trainer"] >= 2 for parts in repriced_split(_table2(400.0))["split"].values())


def test_a_split_priced_on_runs_may_take_turns_when_given_the_swaps_price(monkeypatch):
    """With a swap price, the verifier's pool (52 s on 1) and trainer (28 s on 2) may take turns
    on 2 devices (26 + 28 + a swap), freeing one for the solver's trainer; the disjoint best is
    kept beside it; a policy measured taking turns had its swap in its trainer's work, priced
    without it and then with one swap again; below the margin, devices of their own."""
    import math

    from astraflow.benchmarks.lib import device_split
    from astraflow.benchmarks.multi_policy_resplit import repriced_split
    from astraflow.emulation.cost import CostModel
    from astraflow.emulation.profile import load_profile
    k = load_profile("h100-qwen3-8b").efficiency.train_scaling
    s = lambda d: k ** math.log2(d)  # noqa: E731
    swap = CostModel(load_profile("h100-qwen3-8b"), 256, 16).swap_s
    t2 = _table2(96.0)

    def price(t2):
        return device_split.split_from_runs(t2["device_split"]["split"], [r["async"] for r in t2["repetitions"]],
                                            "work_in_window_by_resource", 8, k, 2, swap=swap)
    r = price(t2)
    assert r["split"] == {"solver": {"rollout": 3, "trainer": 3}, "verifier": {"shared": 2}}
    assert r["priced_stage_s"]["verifier.shared"] == pytest.approx(52.0 / 2 + 28.0 + swap(2))
    assert r["priced_stage_s"]["solver.trainer"] == pytest.approx(97.0 * 2 * s(2) / (3 * s(3)))
    assert r["disjoint"]["split"] == repriced_split(t2)["split"]
    assert r["priced_bound_s_per_iter"] < (1 - device_split.SHARE_MARGIN) * r["disjoint"]["priced_bound_s_per_iter"]
    turns = _table2(96.0)
    turns["device_split"]["split"] = {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"shared": 2}}
    for rep in turns["repetitions"]:
        w = rep["async"]["work_in_window_by_resource"]
        w["trainer.verifier"] += swap(2)
        w["raas-verifier-0"] /= 2  # the same device-seconds on 2 devices
    again = price(turns)
    assert again["split"] == r["split"]
    assert again["priced_stage_s"]["verifier.shared"] == pytest.approx(52.0 / 2 + 28.0 + swap(2))
    monkeypatch.setattr(device_split, "SHARE_MARGIN", 0.5)
    assert price(t2)["split"] == r["disjoint"]["split"] and "disjoint" not in price(t2)


def test_reprice_refuses_a_table_2_without_steady_windows(tmp_path):
    from types import SimpleNamespace

    from astraflow.benchmarks.multi_policy_resplit import reprice_main
    old = tmp_path / "t2.json"
    old.write_text('{"repetitions": [{"async": {"work_by_resource": {}}}]}')
    with pytest.raises(SystemExit, match="no steady-window Table 2"):
        reprice_main(SimpleNamespace(out=str(old)))


def test_table_2s_notes_name_the_bound_of_the_window_and_count_each_device_once():
    """The notes say which resource bound (a)'s steady window and how many device-seconds its
    work is: a pool's work counts once per device, dealt over its nodes (two nodes of a
    3-device pool are 1.5 devices each, not 3)."""
    from types import SimpleNamespace

    from astraflow.benchmarks.multi_policy_emulated import notes
    med = lambda v: {"median": v}  # noqa: E731

    def agg(win):
        return {"arms": {"async": {"s_per_iter": med(90.0), "lower_bound_s_per_iter": med(90.0),
                                   "busiest": ["trainer.solver"] * 3, "work_in_window_by_resource":
                                   {k: med(v) for k, v in win.items()}},
                         "lockstep": {"s_per_iter": med(95.0), "lower_bound_s_per_iter": med(95.0)},
                         "colocated": {"s_per_iter": med(180.0), "lower_bound_s_per_iter": med(180.0)}},
                "speedup_vs_sequential": med(2.0)}
    split = {"split": {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}},
             "priced_stage_s": {"solver.rollout": 100.0, "solver.trainer": 99.0, "verifier.rollout": 60.0,
                                "verifier.trainer": 30.0}, "priced_bound_s_per_iter": 100.0, "min_train_devices": 2}
    args = SimpleNamespace(devices=8, profile="h100-qwen3-8b", dilation=0.3, workload="", polls_in_flight=4,
                           max_staleness=3, max_new_tokens_modelled=4096)
    one = " ".join(notes(agg({"raas-solver-0": 60.0, "raas-verifier-0": 50.0, "trainer.solver": 90.0,
                              "trainer.verifier": 20.0}), split, args))
    assert "trainer.solver in 3 of 3 repetitions" in one and "priced from (c)'s training" in one
    assert "450 device-seconds" in one and "3.20x of (c)" in one  # 60x3 + 50 + 90x2 + 20x2
    two = " ".join(notes(agg({"raas-solver-0": 60.0, "raas-solver-1": 60.0, "raas-verifier-0": 50.0,
                              "trainer.solver": 90.0, "trainer.verifier": 20.0}), split, args))
    assert "450 device-seconds" in two and "raas-solver-1 60.0 s x 1.5" in two


def test_the_tune_moves_a_device_from_the_least_busy_stage_that_can_spare_one_to_the_busiest():
    """Table 2's (a) bound by its solver trainer: the verifier's pool (1 device) and trainer (2, the
    fewest its states fit) cannot give one, so the solver's pool does; a split already tried is
    not probed again, and with nothing to give there is no move."""
    from astraflow.benchmarks.multi_policy_resplit import next_move
    split = {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}}
    work = {"raas-solver-0": 64.0, "trainer.solver": 92.5, "raas-verifier-0": 51.0, "trainer.verifier": 23.7}
    m = next_move(split, work, 2, [split])
    assert m == {"split": {"solver": {"rollout": 2, "trainer": 3}, "verifier": {"rollout": 1, "trainer": 2}},
                 "from": "solver.rollout", "to": "solver.trainer"}
    assert split["solver"] == {"rollout": 3, "trainer": 2}  # the split it was given is left as it was
    # the least busy stage that can spare one goes first: a verifier trainer of 3 gives before the solver's pool
    wide = {"solver": {"rollout": 3, "trainer": 1}, "verifier": {"rollout": 1, "trainer": 3}}
    assert next_move(wide, work, 1, [wide])["from"] == "verifier.trainer"
    assert next_move(wide, work, 1, [wide, next_move(wide, work, 1, [wide])["split"]])["from"] == "solver.rollout"
    # a pool's nodes add up; when the busiest is a pool, a trainer above its minimum gives
    two_nodes = {"raas-solver-0": 40.0, "raas-solver-1": 40.0, "trainer.solver": 60.0, "raas-verifier-0": 10.0,
                 "trainer.verifier": 20.0}
    assert next_move({"solver": {"rollout": 2, "trainer": 3}, "verifier": {"rollout": 1, "trainer": 2}}, two_nodes,
                     2, [])["to"] == "solver.rollout"
    tight = {"solver": {"rollout": 1, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}}
    assert next_move(tight, work, 2, [tight]) is None


def test_tune_refuses_a_table_2_it_cannot_start_from(tmp_path):
    from types import SimpleNamespace

    from astraflow.benchmarks.multi_policy_resplit import tune_main
    old = tmp_path / "t2.json"
    old.write_text('{"repetitions": [{"async": {"work_by_resource": {}}}]}')
    with pytest.raises(SystemExit, match="no steady-window Table 2"):
        tune_main(SimpleNamespace(out=str(old)))
    t2 = _table2(96.0)
    t2["device_split"]["split"]["verifier"] = {"shared": 2}
    old.write_text(__import__("json").dumps(t2))
    with pytest.raises(SystemExit, match="shared placement"):
        tune_main(SimpleNamespace(out=str(old)))
