"""Held-out evaluation of the code workflows: the job's code problems, the team and each policy's score."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.actors.evaluator import heldout_accuracy, team_accuracy, team_evaluation
from astraflow.actors.heldout import heldout_problems
from astraflow.config import load_config
from astraflow.topics import Metric
from astraflow.workflows.arithmetic import split_of
from tests.workflows.conftest import tokenizer_and_engine  # noqa: F401 - a fixture, found by name

ROOT = Path(__file__).resolve().parents[2]


def _cfg(name: str, problems: int = 2, k: int = 1):
    return load_config(ROOT / "examples" / f"{name}.yaml", {"eval.problems": problems, "eval.k": k})


def test_a_code_jobs_heldout_set_is_held_out_code_with_its_tests_and_reference():
    cfg = _cfg("code_solver_selector", problems=20)
    problems = heldout_problems(cfg)
    assert len(problems) == 20 and problems == heldout_problems(cfg)  # fixed for every version and replay
    for p in problems:
        assert split_of(p.text) == "heldout" and p.text.endswith(";f=")
        assert p.metadata["tests"] and p.metadata["reference"]
    # The arithmetic jobs keep their held-out arithmetic.
    arith = load_config(ROOT / "examples" / "solver_verifier.yaml", {"eval.problems": 5})
    assert all("=" in p.text and not p.metadata for p in heldout_problems(arith))


# Sandbox runs per episode: minutes on a loaded box. The test generator's case (which raised
# before the metadata reached it) runs in `make test`, the selector's in `make test-all`.
@pytest.mark.parametrize("name", [pytest.param("code_solver_selector", marks=pytest.mark.slow), "code_solver_testgen"])
def test_the_team_evaluation_runs_the_code_workflow_and_scores_every_policy(tokenizer_and_engine, name):
    tok, engine = tokenizer_and_engine
    cfg = _cfg(name)
    problems = heldout_problems(cfg)
    engines = {p: engine for p in cfg.policy_names}
    # The test generator's reward needs the reference from the problem's metadata: without
    # it every held-out episode of code_solver_testgen raised.
    team, by_policy = team_evaluation(cfg, engines, tok, problems)
    assert set(by_policy) == set(cfg.policy_names)
    top = 2.0 if name == "code_solver_testgen" else 1.0  # the generator's reward is two indicators
    assert 0.0 <= team <= 1.0 and all(0.0 <= r <= top for r in by_policy.values())
    assert team == team_accuracy(cfg, engines, tok, problems[:len(problems)])  # seeded: the same episodes again
    assert 0.0 <= heldout_accuracy(cfg, engine, tok, problems) <= 1.0


def test_the_run_records_each_policys_heldout_reward_by_its_own_version():
    from astraflow.run_outputs import RunState, record
    state = RunState(lead="solver")
    record(state, Metric("eval.solver", "eval.policy_reward", 0.25, step=8, labels={"policy": "solver", "version": 8}))
    record(state, Metric("eval.solver", "eval.policy_reward", 0.75, step=8,
                         labels={"policy": "selector", "version": 6}))
    record(state, Metric("eval.solver", "eval.team_accuracy", 0.5, step=8))
    assert state.policy_reward == {"solver": {8: 0.25}, "selector": {6: 0.75}} and state.team_accuracy == {8: 0.5}
