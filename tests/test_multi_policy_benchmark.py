"""The multi-policy benchmark: its sequential baseline does the job's work, and its
numbers are shaped as documented.

The baseline (``benchmarks/sequential_multi.py``) runs two iterations of the solver-verifier
team on the tiny models: every episode's samples must be exactly what the workflow gives
through ``run_episode`` for the same task and seeds on the same weights (with
``batch_invariant``), the weights must reach the engines between iterations, and without
``batch_invariant`` an iteration's calls must be coalesced into one per policy and stage.
The result-shaping functions of ``benchmarks/multi_policy*.py`` run on small made-up
metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from astraflow.benchmarks import multi_policy as mp
from astraflow.benchmarks import multi_policy_alone as mp_alone
from astraflow.benchmarks import multi_policy_arms as mp_arms
from astraflow.benchmarks import multi_policy_results as mp_results
from astraflow.benchmarks import multi_policy_runs as mp_runs
from astraflow.benchmarks import sequential_multi as seq
from astraflow.benchmarks.lib import steady
from astraflow.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "solver_verifier.yaml"
B, N = 3, 2


def _tiny_config(tmp_path: Path, **extra):
    data = yaml.safe_load(CONFIG.read_text())
    data["dataflow"]["groups_per_batch"] = B
    data["rollout"].update(n_samples=N, batch_invariant=True)
    data["trainer"]["steps"] = 2
    data["eval"].update(problems=4, k=1)
    # the baseline's plumbing is under test, not the verifier's skill: start the verifier from
    # the cached arithmetic model instead of building its warm start (minutes on a fresh machine)
    data["policies"]["verifier"]["model"] = {"task": "arithmetic"}
    data.update(extra)
    path = tmp_path / "sv.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_sequential_baseline_runs_the_workflows_episodes_for_the_same_seeds(tmp_path):
    from astraflow.workflows.api import run_episode
    from astraflow.workflows.datasets import load_prompts

    cfg = _tiny_config(tmp_path)
    prompts = load_prompts("arithmetic", 2 * 2 * B, seed=cfg.data.seed, max_digits=cfg.data.max_digits,
                           ops=cfg.data.ops)
    seen = []

    def check(k, team, tasks, results, groups):
        assert [t.task_id for t in tasks] == [f"t{i:07d}-{prompts[i].prompt_id}" for i in range(k * B, k * B + B)]
        assert all(t.scheduled_versions == {"solver": k, "verifier": k} for t in tasks)
        for task, got in zip(tasks, results):
            # The same episode alone, every role a plain EngineRole on the same weights.
            want = run_episode(team.spec, team.episode(task, team.roles(task)), cfg.seed)
            assert set(got.trajectories) == {"solver", "verifier"}
            for role in got.trajectories:
                assert [(t.tokens, t.logprobs, t.versions, t.loss_mask, t.reward) for t in got.trajectories[role]] \
                    == [(t.tokens, t.logprobs, t.versions, t.loss_mask, t.reward) for t in want.trajectories[role]]
            assert got.team_reward == want.team_reward
            # every token a role trained on was generated at this iteration's version
            assert {v for ts in got.trajectories.values() for t in ts for v, m in zip(t.versions, t.loss_mask)
                    if m} == {k}
        assert {p: len(g) for p, g in groups.items()} == {"solver": B, "verifier": B}
        assert sorted(g.group_key for g in groups["verifier"]) == sorted(f"{t.task_id}/verifier" for t in tasks)
        assert all(len(g.samples) == N for g in groups["verifier"])
        # Without batch invariance, the calls of all episodes are coalesced per policy and stage.
        team.batch_invariant = False
        _, _, batcher = team.rollout(tasks)
        team.batch_invariant = True
        assert batcher.calls["verifier"] == 1 and batcher.calls["solver"] in (1, 2)
        seen.append(k)

    result = seq.run(cfg, 2, on_iteration=check)
    assert seen == [0, 1]
    assert [r["iteration"] for r in result["per_iteration"]] == [1, 2]
    for r in result["per_iteration"]:
        assert r["samples"]["verifier"] == B * N and r["samples"]["solver"] >= B * N
        assert r["G_s"] > 0 and r["T_solver_s"] > 0 and r["T_verifier_s"] > 0
        assert math.isfinite(r["loss_solver"]) and math.isfinite(r["loss_verifier"])
    assert 0.0 <= result["team_accuracy_final"] <= 1.0 and 0.0 <= result["accuracy_final"] <= 1.0


def test_the_baseline_needs_equal_batches_for_every_policy(tmp_path):
    data = yaml.safe_load(CONFIG.read_text())
    data["policies"]["verifier"]["dataflow"] = {"groups_per_batch": 4}
    path = tmp_path / "uneven.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="groups_per_batch"):
        seq.SequentialTeam(load_config(path))


# -- result shaping -------------------------------------------------------------------------
def _metric(ts, component, name, value, step):
    return {"ts": ts, "component": component, "name": name, "value": value, "step": step}


def _team_run(tmp_path: Path) -> Path:
    """A made-up two-policy run: launch at t=100, solver steps every 2 s from 120, verifier
    every 3 s from 121 (so it finishes last), the evaluator's version-0 pass ends at 125.5."""
    rows = []
    for k in range(1, 7):
        rows.append(_metric(120 + 2 * (k - 1), "trainer.solver", "trainer.samples", 8, k))
        rows.append(_metric(120 + 2 * (k - 1), "trainer.solver", "trainer.train_s", 0.5, k))
        rows.append(_metric(121 + 3 * (k - 1), "trainer.verifier", "trainer.samples", 8, k))
        rows.append(_metric(121 + 3 * (k - 1), "trainer.verifier", "trainer.train_s", 0.5, k))
    rows += [_metric(125.5, "eval.solver", "eval.team_accuracy", 0.3, 0),
             _metric(124.0, "eval.solver", "eval.accuracy", 0.2, 0),
             _metric(140.0, "eval.solver", "eval.team_accuracy", 0.5, 6),
             _metric(126.0, "raas-solver-0", "raas.busy_s", 4.5, 0),
             _metric(129.0, "raas-verifier-0", "raas.busy_s", 2.0, 0),
             _metric(127.0, "dataflow.solver", "dataflow.dropped.stale", 1, 3),
             _metric(126.0, "raas-solver-0", "raas.tasks", 8, 0), _metric(130.0, "raas-solver-0", "raas.tasks", 5, 1)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["ts"])))
    (run / "summary.json").write_text(json.dumps({"time_to_first_step_s": 20.0, "wall_s": 45.0,
                                                  "team_accuracy_final": 0.5, "accuracy_final": 0.4,
                                                  "team_accuracy_by_version": {"0": 0.3, "6": 0.5}}))
    return run


def test_team_runs_are_measured_on_the_policy_that_finishes_last_after_start_up(tmp_path):
    r = mp_runs.analyse_team(_team_run(tmp_path))
    assert r["last_policy"] == "verifier" and r["raas_busy_s"] == 6.5 and r["groups_dropped"] == 1.0
    # verifier: step 3 ends at 127 (the first after the eval at 125.5), step 6 at 136: 9 s / 3 steps
    assert r["by_policy"]["verifier"] == {"s_per_step": 3.0, "from_step": 3, "to_step": 6}
    # solver: step 4 ends at 126 (step 3 at 124 is before the eval's end)
    assert r["by_policy"]["solver"]["from_step"] == 4 and r["by_policy"]["solver"]["s_per_step"] == 2.0
    assert r["s_per_iter"] == 3.0
    assert r["time_to_last_step_s"] == pytest.approx(36.0) and r["initial_eval_s"] == pytest.approx(25.5)
    assert r["team_accuracy"] == 0.5


def test_team_runs_count_the_episodes_rolled_out_per_trained_group(tmp_path):
    r = mp_runs.analyse_team(_team_run(tmp_path))
    assert r["episodes"] == 13.0  # every committed poll of the lead pool
    base = yaml.safe_load(CONFIG.read_text())
    cfg = load_config(mp_arms.write_config(mp_arms.team_config(base, "async", 2, "j-team", str(tmp_path)), tmp_path))
    out = mp_runs.with_trained_groups(r, cfg)
    assert out["trained_groups"] == 2 * cfg.dataflow.groups_per_batch
    assert out["episodes_per_trained_group"] == 13.0 / out["trained_groups"]


def test_steady_state_starts_after_step_two_without_an_evaluation():
    ts = {1: 10.0, 2: 11.0, 3: 13.0, 4: 15.0}
    assert steady.steady_s_per_step(ts) == {"s_per_step": 2.0, "from_step": 2, "to_step": 4}
    with pytest.raises(ValueError, match="at least 3"):
        steady.steady_s_per_step({1: 1.0, 2: 2.0})


def test_solver_alone_accuracy_is_the_newest_evaluated_version_within_the_time():
    rows = [_metric(100 + 5 * k, "trainer.solver", "trainer.samples", 8, k) for k in range(1, 9)]
    rows += [_metric(101, "eval.solver", "eval.accuracy", 0.1, 0), _metric(121, "eval.solver", "eval.accuracy", 0.3, 2),
             _metric(131, "eval.solver", "eval.accuracy", 0.4, 5), _metric(142, "eval.solver", "eval.accuracy", 0.6, 7)]
    # launched at 90: within 40 s it trained up to version 6 (ts 130), whose newest evaluated version is 5
    assert mp_alone.accuracy_at(rows, 90.0, 40.0) == {"accuracy": 0.4, "version_reached": 6, "version_evaluated": 5,
                                               "steps_trained": 8}
    assert mp_alone.accuracy_at(rows, 90.0, 5.0)["version_evaluated"] == 0


def test_exported_evaluation_reads_the_newest_export_below_each_mark():
    rows = [_metric(100 + 5 * k, "trainer.solver", "trainer.samples", 8, k) for k in range(1, 13)]
    # launched at 90: by 40 s it trained v6, by 62 s v10; exports every 4 (v4, v8, v12)
    assert mp_alone.exported_needed(rows, 90.0, [40.0], [4, 8, 12]) == [4, 12]
    assert mp_alone.exported_needed(rows, 90.0, [40.0, 62.0], [4, 8, 12]) == [4, 8, 12]
    assert mp_alone.exported_needed(rows, 90.0, [50.0], [4, 8, 12]) == [8, 12]
    assert mp_alone.exported_needed(rows, 90.0, [12.0], [4, 8, 12]) == [12]  # v1 only: version 0 stays the live one
    assert mp_alone.exported_needed(rows, 90.0, [40.0], []) == []


def test_exported_versions_are_evaluated_by_the_evaluators_own_function(tmp_path):
    """Two exports of different weights: each row is that export's held-out accuracy, as the
    evaluator itself measures it, under its version."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.actors.common import make_rollout_engine, model_path
    from astraflow.actors.evaluator import heldout_accuracy, heldout_problems

    cfg = _tiny_config(tmp_path, eval={"problems": 8, "k": 2, "every": 0})
    alone = mp_arms.solver_alone_config(yaml.safe_load((tmp_path / "sv.yaml").read_text()), cfg, 4, 0, "j", str(tmp_path))
    config = mp_arms.write_config(alone, tmp_path)
    run = tmp_path / "run"
    good = run / "hf" / "solver" / "v4"
    shutil.copytree(model_path(cfg), good)
    broken = run / "hf" / "solver" / "v8"
    model = AutoModelForCausalLM.from_pretrained(str(good))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.save_pretrained(str(broken))
    AutoTokenizer.from_pretrained(str(good)).save_pretrained(str(broken))
    assert mp_alone.exported_versions(run, "solver") == [4, 8]
    rows = mp_alone.evaluate_exported(config, run, [0, 4, 8])  # version 0: the job's own model
    assert [(r["name"], r["step"]) for r in rows] == [("eval.accuracy", 0), ("eval.accuracy", 4), ("eval.accuracy", 8)]
    assert rows[0]["value"] == rows[1]["value"] and rows[0]["label.k"] == 2
    rows = rows[1:]
    direct = load_config(config)
    want = heldout_accuracy(direct, make_rollout_engine(direct, good, kind="cpu"),
                            AutoTokenizer.from_pretrained(str(good)), heldout_problems(direct))
    assert rows[0]["value"] == pytest.approx(want) and want > 0
    assert rows[1]["value"] == 0.0  # zeroed weights answer nothing right


def test_arm_configs_are_the_team_job_and_the_solver_alone(tmp_path):
    base = yaml.safe_load(CONFIG.read_text())
    team = mp_arms.team_config(base, "lockstep", 7, "j-team", str(tmp_path))
    cfg = load_config(mp_arms.write_config(team, tmp_path))
    assert (cfg.barrier, cfg.eval.every) == ("lockstep", 0)
    assert {p: cfg.view(p).trainer.steps for p in cfg.policy_names} == {"solver": 7, "verifier": 7}
    assert base["barrier"] == "async", "the base config must not change"
    alone = load_config(mp_arms.write_config(mp_arms.solver_alone_config(base, cfg, 30, 2, "j-alone", str(tmp_path)), tmp_path))
    solver = cfg.view("solver")
    assert alone.policy_names == ("solver",) and alone.workflow.name == "rlvr"
    assert alone.workflow.params == {"reward": "exact_match"}
    assert (alone.model, alone.rollout, alone.dataflow) == (solver.model, solver.rollout, solver.dataflow)
    assert alone.trainer.engine == solver.trainer.engine and alone.trainer.steps == 30
    assert (alone.eval.every, alone.eval.problems, alone.seed, alone.data) == (2, cfg.eval.problems, cfg.seed, cfg.data)


def _rep(a, b, c, team, alone):
    kafka = lambda s: {"s_per_iter": s, "time_to_last_step_s": 10 * s, "team_accuracy": team,  # noqa: E731
                       "team_accuracy_by_version": {"0": 0.3}, "raas_busy_s": 10 * s, "groups_dropped": 0.0,
                       "load_before": [1.0, 1.0, 1.0]}
    return {"async": kafka(a), "lockstep": kafka(b),
            "sequential": {"s_per_iter": c, "time_to_last_step_s": 8 * c, "team_accuracy_final": team - 0.1,
                           "G_s": 1.0, "T_solver_s": 0.5, "T_verifier_s": 0.4, "W_s": 0.01, "threads": 2,
                           "load_before": [2.0, 1.0, 1.0]},
            "solver_alone": {"accuracy": alone, "version_reached": 12, "seconds": 50.0,
                             "load_before": [3.0, 1.0, 1.0]}}


def test_aggregate_pairs_speedups_within_a_repetition_and_notes_say_who_wins(capsys):
    reps = [_rep(4.0, 5.0, 2.0, 0.5, 0.4), _rep(3.0, 6.0, 3.0, 0.6, 0.45), _rep(5.0, 5.0, 2.5, 0.55, 0.5)]
    reps[1]["lockstep"]["failed_attempts"] = [{"job": "j", "cause": "hung"}]
    agg = mp_results.aggregate(reps)
    assert agg["failed_runs"] == [{"repetition": 2, "arm": "lockstep", "job": "j", "cause": "hung"}]
    assert agg["speedup_vs_sequential"]["runs"] == [0.5, 1.0, 0.5]
    assert agg["speedup_vs_lockstep"]["runs"] == [1.25, 2.0, 1.0]
    assert agg["s_per_iter"]["async"]["median"] == 4.0 and agg["s_per_iter"]["sequential"]["n"] == 3
    assert agg["team_accuracy"]["median"] == 0.55 and agg["solver_alone_accuracy"]["median"] == 0.45
    assert agg["arms"]["sequential"]["T_verifier_s"]["median"] == 0.4
    assert agg["load_1m_at_arm_start"]["max"] == 3.0
    notes = mp_results.notes(agg, 2, 16, 2)
    assert notes[0].startswith("(c) sequential wins") and "2 cores" in notes[0]
    assert notes[1].startswith("(a) async beats (b) lockstep")
    assert "team's held-out accuracy is 0.550 and the solver alone's 0.450" in notes[2] and "12 versions" in notes[2]
    assert not any(n.startswith("Team training lowered") for n in notes)  # 0.3 at version 0, higher after
    faster = mp_results.notes(mp_results.aggregate([_rep(1.0, 1.0, 2.0, 0.5, 0.4)] * 3), 2, 16, 2)
    assert faster[0].startswith("(a) async is 2.00x faster") and faster[1].startswith("(b) lockstep is not slower")
    assert "busy 10 s in (a) against 10 s in (b)" in faster[1]
    worse = mp_results.notes(mp_results.aggregate([_rep(1.0, 1.0, 2.0, 0.2, 0.4)] * 3), 2, 16, 2)
    assert any(n.startswith("Team training lowered the team's held-out accuracy") and "0.300 at version 0" in n
               for n in worse)
    mp_results.print_table(agg)
    table = capsys.readouterr().out
    assert "(c) sequential" in table and "speedup_vs_sequential" in table and "(" in table


def test_a_failed_or_hung_arm_is_recorded_and_run_again():
    from astraflow.topology.processes import RunFailed
    jobs = []

    def once(job):
        jobs.append(job)
        if len(jobs) == 1:
            raise RunFailed("run exceeded its 360s timeout")
        return {"s_per_iter": 1.0}

    r = mp_arms.run_attempts("async", 0, once)
    assert r["s_per_iter"] == 1.0 and len(jobs) == 2
    assert r["failed_attempts"] == [{"job": jobs[0], "cause": "run exceeded its 360s timeout"}]

    def never(job):
        raise mp_runs.NoSteps(f"{job}: no step trained")

    with pytest.raises(RuntimeError, match="failed 2 times"):
        mp_arms.run_attempts("lockstep", 1, never)


def test_a_team_runs_last_line_gives_the_teams_accuracy_first_and_the_lead_alone_beside_it():
    from astraflow.cli import done_line
    one = {"steps_trained": 40, "wall_s": 191.2, "accuracy_by_version": {"0": 0.155, "40": 0.235}}
    assert done_line(one, "policy") == "done: 40 versions in 191s; held-out accuracy v0:0.155 -> v40:0.235"
    team = {**one, "team_accuracy_by_version": {"0": 0.145, "40": 0.02}}
    line = done_line(team, "solver")
    assert "of the team v0:0.145 -> v40:0.020" in line and line.endswith("of solver alone v0:0.155 -> v40:0.235")
    assert "of the team not measured" in done_line({**team, "team_accuracy_by_version": {}}, "solver")


def test_a_team_runs_last_line_gives_every_policys_and_the_teams_accuracy_from_first_to_last():
    from astraflow.cli import done_line
    # Three evaluations each: the line gives the first and the last (from -> to), not the curve.
    summary = {"steps_trained": 40, "wall_s": 191.2,
               "accuracy_by_version": {"0": 0.155, "20": 0.2, "40": 0.235},
               "team_accuracy_by_version": {"0": 0.145, "20": 0.05, "40": 0.02},
               "policy_reward_by_version": {"solver": {"0": 0.15, "20": 0.19, "40": 0.23},
                                            "verifier": {"0": 0.5, "18": 0.7, "37": 0.8}}}
    line = done_line(summary, "solver")
    assert line == ("done: 40 versions in 191s; held-out accuracy of the team v0:0.145 -> v40:0.020; "
                    "of solver alone v0:0.155 -> v40:0.235; held-out role reward of solver v0:0.150 -> v40:0.230, "
                    "of verifier v0:0.500 -> v37:0.800")
    # Versions order numerically, not as strings (v9 before v10).
    line = done_line({**summary, "team_accuracy_by_version": {"0": 0.1, "10": 0.3, "9": 0.2}}, "solver")
    assert "of the team v0:0.100 -> v10:0.300;" in line
    # A verifier that was never measured is said to be, not left out.
    line = done_line({**summary, "policy_reward_by_version": {"solver": {"0": 0.1}, "verifier": {}}}, "solver")
    assert line.endswith("of solver v0:0.100, of verifier not measured")


def test_the_remote_call_cost_comes_from_the_runs_own_spans(tmp_path):
    import json

    from astraflow.benchmarks.multi_policy_runs import remote_calls

    def span(name, start, end, **attrs):
        return json.dumps({"name": name, "start_time": f"2026-12-01T10:00:{start:06.3f}Z",
                           "end_time": f"2026-12-01T10:00:{end:06.3f}Z", "attributes": attrs})
    (tmp_path / "traces").mkdir()
    lines = [span("raas.workflow", 0, 9)] * 2 + [
        span("raas.generate", 1, 1 + d, role="verifier", remote=True) for d in (0.5, 1.0, 2.0)] + [
        span("raas.generate", 0, 5, role="solver"), '{"name": "raas.gen']  # a local call; a span cut off
    (tmp_path / "traces" / "raas-solver-0-1.jsonl").write_text("\n".join(lines))
    (tmp_path / "traces" / "trainer-solver-1.jsonl").write_text(span("raas.generate", 0, 50, remote=True))
    out = remote_calls(tmp_path)
    assert out["calls"] == 3 and out["episodes"] == 2 and out["hops_per_episode"] == 1.5
    assert abs(out["median_s"] - 1.0) < 1e-6 and abs(out["p95_s"] - 2.0) < 1e-6


def test_the_team_against_the_solver_alone_at_equal_tokens_with_standard_errors(tmp_path, capsys):
    # (d): 10 tokens per poll every 5 s from 100; (a) generated 35 in its run, so (d) had by 115
    rows = [_metric(100 + 5 * k, "raas-solver-0", "raas.generated_tokens", 10, k) for k in range(8)]
    assert mp_alone.time_of_tokens(rows, 35) == 115.0 and mp_alone.time_of_tokens(rows, 81) is None
    run = _team_run(tmp_path)
    extra = [{**_metric(124.5, "eval.solver", "eval.accuracy", 0.2, 0), "label.k": 4, "label.problems": 400},
             _metric(126.0, "raas-solver-0", "raas.generated_tokens", 30, 0),
             _metric(130.0, "raas-solver-0", "raas.generated_tokens", 20, 5)]
    for step, (acc, first, app, rej) in enumerate([(0.1, 0.2, 0.0, 0.1), (0.5, 0.2, 0.1, 0.4)] * 3):
        for key, v in (("verifier_accuracy", acc), ("first_accuracy", first), ("approved_correct", app),
                       ("rejected_wrong", rej)):
            extra.append(_metric(126.0 + step, "raas-solver-0", f"raas.episode.{key}", v, step))
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in extra))
    a = mp_runs.analyse_team(run)
    assert a["generated_tokens"] == 50.0 and a["eval_k"] == 4
    # the last half of the run (versions >= 2.5): steps 3, 5 at (0.5, ...), step 4 at (0.1, ...)
    assert a["verifier"]["accuracy"] == pytest.approx((0.5 + 0.1 + 0.5) / 3)
    assert a["verifier"]["tpr"] == pytest.approx((0.1 + 0 + 0.1) / 3 / 0.2)
    assert a["verifier"]["tnr"] == pytest.approx((0.4 + 0.1 + 0.4) / 3 / 0.8)
    best = mp_alone.best_evaluated([_metric(1.0, "eval.solver", "eval.accuracy", v, step)
                              for step, v in ((0, 0.2), (8, 0.45), (16, 0.45), (24, 0.3))])
    assert best == {"accuracy_best_evaluated": 0.45, "version_best_evaluated": 16}  # ties: the later version
    alone = {"accuracy": 0.4, "version_reached": 12, "seconds": 50.0, "load_before": [1.0] * 3,
             "accuracy_initial": 0.2, **best,
             "equal_tokens": {"tokens": 50.0, "reached": True, "seconds": 20.0, "version_reached": 5,
                              "accuracy": 0.3}}
    agg = mp_results.aggregate([{"async": {**a, "load_before": [1.0] * 3}, "solver_alone": alone}], problems=400)
    assert "lockstep" not in agg["arms"] and "speedup_vs_lockstep" not in agg
    assert agg["solver_alone_accuracy_equal_tokens"]["median"] == 0.3
    row = agg["standard_errors"]["by_repetition"][0]
    assert row["k"] == 4 and row["team"]["se"] == pytest.approx(math.sqrt(0.5 * 0.5 / 1600))
    assert row["alone_initial"]["accuracy"] == 0.2 and row["team_initial"]["accuracy"] == 0.3
    diff = row["team_minus_equal_tokens"]
    assert diff["diff"] == pytest.approx(0.2)
    assert diff["se"] == pytest.approx(math.sqrt(0.25 / 1600 + 0.21 / 1600))
    assert diff["in_se"] == pytest.approx(0.2 / diff["se"])
    assert diff["se_upper"] == pytest.approx(math.sqrt(0.25 / 400 + 0.21 / 400))
    # The headline keys carry their SEs, pooled from the same per-repetition rows.
    assert agg["team_accuracy"]["mean"] == 0.5 and agg["team_accuracy"]["se"] == pytest.approx(row["team"]["se"])
    assert agg["team_accuracy_equal_tokens"] == agg["team_accuracy"]
    assert agg["solver_alone_accuracy_equal_tokens"]["mean"] == 0.3
    assert agg["solver_alone_accuracy_equal_tokens"]["se_upper"] == pytest.approx(math.sqrt(0.21 / 400))
    assert agg["solver_alone_accuracy"]["se"] == pytest.approx(math.sqrt(0.24 / 1600))
    assert agg["solver_alone_accuracy_best_evaluated"]["median"] == 0.45
    assert agg["team_minus_alone"]["best_evaluated"]["diff"] == pytest.approx(0.05)
    pooled = agg["team_minus_alone"]["equal_tokens"]
    assert pooled["diff"] == pytest.approx(0.2) and pooled["in_se"] == pytest.approx(diff["in_se"])
    assert pooled["in_se_upper"] == pytest.approx(0.2 / diff["se_upper"]) and pooled["repetitions_team_ahead"] == 1
    two = mp_results.aggregate([{"async": {**a, "load_before": [1.0] * 3}, "solver_alone": alone},
                        {"async": {**a, "load_before": [1.0] * 3, "team_accuracy": 0.2}, "solver_alone": alone}],
                       problems=400)
    d2 = two["team_minus_alone"]["equal_tokens"]  # +0.2 and -0.1: the mean, its SE shrinks by sqrt(2)
    assert d2["diff"] == pytest.approx(0.05) and d2["repetitions_team_ahead"] == 1 and d2["repetitions"] == 2
    rows2 = two["standard_errors"]["by_repetition"]
    assert d2["se"] == pytest.approx(math.hypot(*(r["team_minus_equal_tokens"]["se"] for r in rows2)) / 2)
    notes = mp_results.notes(agg, 2, 6, 2)
    assert any("At equal generated tokens (50, every role's own)" in n and "0.300" in n for n in notes)
    assert any(n.startswith("repetition 1 (400 problems x k=4): team 0.500 +- 0.013") for n in notes)
    mp_results.print_table(agg)
    printed = capsys.readouterr().out
    assert "(d) at equal tokens" in printed and "team - alone at equal tokens (mean of 1): +0.200" in printed


def test_overrides_reach_every_arms_config(tmp_path):
    base = yaml.safe_load(CONFIG.read_text())
    data = mp.with_overrides(base, {"workflow.params.retry": "fresh", "eval.problems": 400})
    assert "retry" not in base["workflow"]["params"], "the base config must not change"
    cfg = load_config(mp_arms.write_config(mp_arms.team_config(data, "async", 2, "j-team", str(tmp_path)), tmp_path))
    assert cfg.workflow.params["retry"] == "fresh" and cfg.eval.problems == 400
    alone = mp_arms.solver_alone_config(data, cfg, 30, 2, "j-alone", str(tmp_path))
    assert alone["eval"]["problems"] == 400 and alone["workflow"]["name"] == "rlvr"


def test_the_smollm2_team_and_its_solver_alone_are_both_on_smollm2(tmp_path):
    path = ROOT / "examples" / "smollm2_solver_verifier.yaml"
    base = yaml.safe_load(path.read_text())
    cfg = load_config(mp_arms.write_config(mp_arms.team_config(base, "async", 2, "j-team", str(tmp_path)), tmp_path))
    assert cfg.trainer.steps == 2 and cfg.eval.every == 0
    alone = load_config(mp_arms.write_config(mp_arms.solver_alone_config(base, cfg, 30, 2, "j-alone", str(tmp_path)),
                                             tmp_path))
    assert alone.workflow.name == "rlvr" and alone.workflow.params == {"reward": "last_number"}
    assert alone.model.name == "smollm2-135m-instruct" and alone.data.source == "arithmetic_chat"
    assert alone.rollout.max_new_tokens == cfg.view("solver").rollout.max_new_tokens
    assert mp.team_vs_alone_section(path.stem) == "team_vs_alone_smollm2_solver_verifier"


def test_the_team_against_the_solver_alone_is_a_section_of_the_one_results_file(tmp_path, monkeypatch):
    """`--arms async,alone` into the default file writes its `team_vs_alone` section and keeps the
    speed arms' run; a speed run written afterwards keeps that section."""
    results = tmp_path / "multi_policy.json"
    monkeypatch.setattr(mp, "RESULTS", results)
    mp.save(results, ["async", "alone", "lockstep", "sequential"], {"benchmark": "multi_policy", "s_per_iter": 1}, None)
    mp.save(results, ["alone", "async"], {"benchmark": "multi_policy", "team_accuracy": {"median": 0.3}}, None)
    data = json.loads(results.read_text())
    assert data["s_per_iter"] == 1 and data["team_vs_alone"]["team_accuracy"] == {"median": 0.3}
    assert "team_accuracy" not in data  # the accuracy run's numbers are in its section only
    mp.save(results, ["async", "lockstep"], {"benchmark": "multi_policy", "s_per_iter": 2}, None)
    data = json.loads(results.read_text())
    assert data["s_per_iter"] == 2 and data["team_vs_alone"]["team_accuracy"] == {"median": 0.3}
    # another workflow's team against its solver alone: a section of its own, kept by both writers
    mp.save(results, ["async", "alone"], {"team_accuracy": {"median": 0.2}}, None, "code_solver_testgen")
    mp.save(results, ["async", "lockstep"], {"benchmark": "multi_policy", "s_per_iter": 3}, None)
    data = json.loads(results.read_text())
    assert data["team_vs_alone_code_solver_testgen"]["team_accuracy"] == {"median": 0.2}
    assert data["team_vs_alone"]["team_accuracy"] == {"median": 0.3} and data["s_per_iter"] == 3
    # the same workflow on SmolLM2 (its config file's name): a team of its own, the tiny one's kept
    mp.save(results, ["async", "alone"], {"team_accuracy": {"median": 0.1}}, None, "smollm2_solver_verifier")
    data = json.loads(results.read_text())
    assert data["team_vs_alone_smollm2_solver_verifier"]["team_accuracy"] == {"median": 0.1}
    assert data["team_vs_alone"]["team_accuracy"] == {"median": 0.3}
    other = tmp_path / "elsewhere.json"  # --out elsewhere: the whole result, as before
    mp.save(other, ["async", "alone"], {"benchmark": "multi_policy", "team_accuracy": {"median": 0.4}}, None)
    assert json.loads(other.read_text())["team_accuracy"] == {"median": 0.4}


def test_an_analysed_runs_heavy_parts_are_removed_and_what_reanalysis_reads_stays(tmp_path):
    """A SmolLM2 team's repetition writes ~10 GB (weights topics, checkpoints, exports): three
    filled this machine's disk before the last arm. Each analysed arm's run dir keeps its metrics,
    summary, traces and logs; ``--keep-run-data`` keeps everything."""
    import argparse

    def run_dir(name: str) -> Path:
        d = tmp_path / name
        for part, size in (("kafka/meta/af.j.weights.solver-0/00.log", 3000), ("kafka/server.log", 10),
                           ("checkpoints/solver/step-10/optim.pt", 2000), ("hf/solver/v10/model.safetensors", 500),
                           ("metrics.jsonl", 5), ("summary.json", 5), ("traces/raas-0.jsonl", 5),
                           ("logs/trainer.log", 5)):
            (d / part).parent.mkdir(parents=True, exist_ok=True)
            (d / part).write_bytes(b"x" * size)
        return d

    d = run_dir("pruned")
    out = mp_arms.pruned({"s_per_iter": 1.0}, d, argparse.Namespace(keep_run_data=False))
    assert out == {"s_per_iter": 1.0, "pruned_bytes": 5500}
    assert not (d / "kafka" / "meta").exists() and not (d / "checkpoints").exists() and not (d / "hf").exists()
    kept = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
    assert kept == ["kafka/server.log", "logs/trainer.log", "metrics.jsonl", "summary.json", "traces/raas-0.jsonl"]
    d = run_dir("kept")
    assert mp_arms.pruned({}, d, argparse.Namespace(keep_run_data=True)) == {}
    assert (d / "kafka" / "meta").is_dir() and (d / "checkpoints").is_dir() and (d / "hf").is_dir()
