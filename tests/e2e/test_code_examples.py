"""The shipped code-workflow examples run end to end (briefly) through `astraflow run`'s loop.

Each trains both policies a few versions on the real broker and writes what a user reads:
a progress bar per policy, a plot panel per policy, each policy's and the team's held-out
figures in summary.json, and a last line that carries them all.

The roles' warm starts are real builds of the bootstrap, cut to a few steps and placed in
a private cache under the keys the job looks up: what is tested here is the job around the
models (a full warm start takes much longer than a test; `astraflow model init` builds
those). Cut that short they miss their targets, so the run must also say so.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from pathlib import Path

import pytest

from astraflow.cli import done_line
from astraflow.config import load_config
from astraflow.launcher import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BRIEF = {"trainer.steps": 2, "trainer.checkpoint_every": 1, "trainer.snapshot_every": 1,
         "dataflow.groups_per_batch": 2, "rollout.n_samples": 2, "rollout.tasks_per_call": 2,
         "rollout.heartbeat_s": 1.0, "eval.problems": 4, "eval.k": 1}
QUICK = {"max_steps": 4, "eval_every": 2, "eval_problems": 8, "heldout_problems": 8}


@pytest.fixture(scope="module")
def code_models(tmp_path_factory) -> Path:
    """A models cache holding each code role's warm start (seed 0) under its default key,
    each a real bootstrap build of a few steps."""
    from astraflow.models.build import build_tiny_model
    from astraflow.models.spec import default_spec
    cache = tmp_path_factory.mktemp("cache")
    for task in ("code_solver", "selector", "test_generator"):
        spec = default_spec(task)
        build_tiny_model(cache / "build" / task, seed=0, spec=dataclasses.replace(spec, **QUICK), task=task,
                         pool_size=256)
        shutil.copytree(cache / "build" / task, cache / "models" / spec.key(0, task))
    return cache


@pytest.mark.timeout(1800)  # three few-step builds, then a job; a loaded 2-core box takes minutes each
@pytest.mark.parametrize("name", ["code_solver_selector", "code_solver_testgen"])
def test_the_code_example_trains_both_policies_and_reports_each_and_the_team(name, bootstrap, code_models, tmp_path,
                                                                              capsys, monkeypatch):
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(code_models))  # the launcher's processes inherit it
    # The overrides reach the job's processes too (each loads the example with them): its own
    # job name (topics), the brief sizes.
    sets = {**BRIEF, "job": f"{name.replace('_', '-')}-{uuid.uuid4().hex[:8]}"}
    cfg = load_config(ROOT / "examples" / f"{name}.yaml", sets)
    summary = run_job(cfg, bootstrap=bootstrap, overrides=[f"{k}={v}" for k, v in sets.items()],
                      run_dir=tmp_path / "run", progress=True, timeout_s=1500)
    out, err = capsys.readouterr()
    policies = cfg.policy_names
    assert len(policies) == 2
    # each policy ran on its own role's warm start from the private cache
    for p in policies:
        assert f"model of {p}: {code_models / 'models'}" in out, (p, out)
    # cut short, each warm start missed its target: the run says so, per policy, and records it
    assert set(summary["warm_start_warnings"]) == set(policies)
    for p, warning in summary["warm_start_warnings"].items():
        assert warning.startswith("WARNING: warm start of task") and f"{warning} (model of {p})" in err
    for p in policies:  # a bar per policy
        assert f"{cfg.job} {p} versions" in err, p
    assert summary["error"] is None and summary["audit"]["ok"] is True
    # the engines' groups pass the content checks (two attempts per sample, retries, rewards up to 2)
    assert not any(c["rejected_groups"] for c in summary["audit"]["final"]["counts"].values())
    assert summary["steps_trained_by_policy"] == {p: 2 for p in policies}
    # the team metric, at version 0 and at the end
    team = summary["team_accuracy_by_version"]
    # (a version is measured when the evaluator reaches it: the first may be v0 or just after)
    assert len(team) >= 2 and max(map(int, team)) == 2 and all(0.0 <= a <= 1.0 for a in team.values())
    # each policy's held-out figure: the solver alone, and every policy's role reward in the team
    assert len(summary["accuracy_by_version"]) >= 2 and max(summary["accuracy_by_version"]) == 2
    assert set(summary["policy_reward_by_version"]) == set(policies)
    high = {"solver": 1.0, "selector": 1.0, "test_generator": 2.0}  # the workflow's reward ranges
    for p, curve in summary["policy_reward_by_version"].items():
        assert len(curve) >= 2 and max(map(int, curve)) == 2, (p, curve)
        assert all(0.0 <= r <= high[p] for r in curve.values()), (p, curve)
    # the last line: the team's, the solver's alone and each policy's, each from its first to its last version
    line = done_line(summary, cfg.lead_policy)
    first, last = min(team, key=int), max(team, key=int)
    assert f"held-out accuracy of the team v{first}:{team[first]:.3f} -> v{last}:{team[last]:.3f}" in line
    acc = summary["accuracy_by_version"]
    assert f"of solver alone v{min(acc)}:{acc[min(acc)]:.3f} -> v{max(acc)}:{acc[max(acc)]:.3f}" in line
    for p, curve in summary["policy_reward_by_version"].items():
        lo, hi = min(curve, key=int), max(curve, key=int)
        assert f"of {p} v{lo}:{curve[lo]:.3f} -> v{hi}:{curve[hi]:.3f}" in line, (p, line)
    assert "conservation audit ok" in line
    run = tmp_path / "run"
    plot = run / "plot.png"
    assert plot.exists() and plot.stat().st_size > 10_000
