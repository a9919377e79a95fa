"""The shipped code-workflow examples run end to end (briefly) through `astraflow run`'s loop.

Each trains both policies a few versions on the real broker and writes what a user reads:
a progress bar per policy, a plot panel per policy, each policy's and the team's held-out
figures in summary.json, and a last line that carries them all.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("name", ["code_solver_selector", "code_solver_testgen"])
def test_the_code_example_trains_both_policies_and_reports_each_and_the_team(name, bootstrap, tmp_path, capsys):
    import uuid
    cfg = load_config(ROOT / "examples" / f"{name}.yaml", {**BRIEF, "job": f"{name.replace('_', '-')}-"
                                                           f"{uuid.uuid4().hex[:8]}"})
    summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=True, timeout_s=1500)
    err = capsys.readouterr().err
    policies = cfg.policy_names
    assert len(policies) == 2
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
    for p, curve in summary["policy_reward_by_version"].items():
        assert len(curve) >= 2 and max(map(int, curve)) == 2, (p, curve)
    line = done_line(summary, cfg.lead_policy)
    assert "held-out accuracy of the team v0:" in line and "of solver alone v0:" in line
    assert all(f"of {p} v0:" in line for p in policies)
    plot = tmp_path / "run" / "plot.png"
    assert plot.exists() and plot.stat().st_size > 10_000
