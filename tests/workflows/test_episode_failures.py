"""Deterministic episode errors are counted per node; enough in a row, with no success, stop it."""

from __future__ import annotations

import threading

import pytest

from astraflow.actors.episodes import EpisodeRunner, EpisodesFailing, deterministic
from astraflow.topics import Task
from astraflow.workflows.api import workflow


@workflow("test_raises_on_bad", roles=("solver",))
def _raises_on_bad(ep):
    """Fails on a prompt it cannot parse, as a user workflow with a bug or a strict parser would."""
    if "bad" in ep.prompt:
        raise ValueError(f"cannot parse {ep.prompt!r}")
    from astraflow.workflows.api import get_workflow
    return get_workflow("rlvr").fn(ep)


@workflow("test_times_out", roles=("solver",))
def _times_out(ep):
    raise TimeoutError("the verifier service did not answer")


def _task(i: int, prompt: str, wf: str = "test_raises_on_bad") -> Task:
    return Task(f"t{i}", f"p{i}", "policy", prompt, "2", 2, {"max_new_tokens": 2}, workflow=wf)


def test_user_errors_are_deterministic_and_world_errors_are_not():
    from astraflow.errors import DataError, RetriableError
    assert all(deterministic(e) for e in (ValueError("x"), TypeError("x"), KeyError("x"), ZeroDivisionError(),
                                          AttributeError("x"), DataError("x")))
    assert not any(deterministic(e) for e in (TimeoutError("x"), ConnectionError("x"), RuntimeError("cuda"),
                                              RetriableError("x"), OSError("x")))


def test_a_streak_of_deterministic_failures_stops_and_a_success_resets_it(tokenizer_and_engine):
    tok, engine = tokenizer_and_engine
    runner = EpisodeRunner("policy", "raas-test", engine, tok, 0, engine_lock=threading.Lock())
    try:
        per_task = runner.roll_out([_task(0, "bad 1+1="), _task(1, "bad 2+2=")])
        assert [gs[0].status for gs in per_task] == ["failed", "failed"]
        assert runner.failures.count == 2
        runner.failures.check(3)  # below the bound: nothing happens
        # a transient failure neither counts nor resets
        runner.roll_out([_task(2, "x", wf="test_times_out")])
        assert runner.failures.count == 2
        # a success between failures resets the streak
        per_task = runner.roll_out([_task(3, "bad 3+3="), _task(4, "1+1=")])
        assert [gs[0].status for gs in per_task] == ["failed", "ok"] and runner.failures.count == 0
        runner.roll_out([_task(5, "bad a"), _task(6, "bad b"), _task(7, "bad c")])
        with pytest.raises(EpisodesFailing) as e:
            runner.failures.check(3)
        assert not e.value.retriable
        assert "3 episodes in a row failed" in str(e.value) and "rollout.max_episode_failures: 3" in str(e.value)
        assert "task t7 of workflow 'test_raises_on_bad': ValueError: cannot parse 'bad c'" in str(e.value)
        runner.failures.check(0)  # 0: never
    finally:
        runner.close()
