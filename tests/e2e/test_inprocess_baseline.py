"""The in-process baseline runs the same job as ``astraflow run`` in sync mode.

With ``rollout.batch_invariant`` a sync run's trajectories are a function of the seed
alone (see test_determinism), so the one-process loop of
``benchmarks/inprocess_loop.py`` must write the very same groups, step after step: same
tasks, same tokens, same logprobs. If it did not, its s/step would not be a baseline for
the same work. Its overlapped variant (async's schedule in one process) must do the same
work as the same schedule run in turn: threads change when, not what.
"""

from __future__ import annotations

import dataclasses

import pytest

from astraflow.benchmarks import inprocess_loop
from astraflow.launcher import run_job
from astraflow.topics.codec import encode

from .test_determinism import trajectories

STEPS = 3


@pytest.mark.slow
def test_inprocess_loop_writes_the_sync_runs_trajectories(bootstrap, make_job_config, tmp_path):
    cfg = make_job_config({"mode": "sync", "seed": 5, "trainer": {"steps": STEPS},
                           "rollout": {"batch_invariant": True}}, name="inproc")
    summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=600)
    assert summary["steps_trained"] == STEPS
    system = trajectories(bootstrap, cfg)

    mine: dict[str, bytes] = {}

    def keep(step: int, groups: list) -> None:
        for g in groups:
            assert g.scheduled_version == step
            mine[g.task_id] = encode(dataclasses.replace(g, node_id="", started_at=0.0, finished_at=0.0))[0]

    result = inprocess_loop.run(cfg, STEPS, on_batch=keep)
    assert len(mine) == STEPS * cfg.dataflow.groups_per_batch
    assert mine.keys() <= system.keys()
    differing = sorted(t for t in mine if mine[t] != system[t])
    assert not differing, f"{len(differing)} of {len(mine)} groups differ, first {differing[0]}"
    assert result["accuracy_final"] == summary["accuracy_final"]  # same weights, same held-out set
    assert len(result["per_step"]) == STEPS and all(r["R_s"] > 0 and r["T_s"] > 0 for r in result["per_step"])


def test_the_overlapped_loop_rolls_out_with_the_version_before_and_does_the_same_work_in_turn(make_job_config):
    cfg = make_job_config({"seed": 3, "rollout": {"batch_invariant": True}}, name="overlap")
    steps = 4

    def keep(into: list):
        def on_batch(step: int, groups: list) -> None:
            into.append([encode(dataclasses.replace(g, started_at=0.0, finished_at=0.0))[0] for g in groups])
            # batch k is rolled out with version k - 1 (batch 0 with version 0), as async at staleness 1
            assert {v for g in groups for s in g.samples for v in s.versions} == {max(0, step - 1)}, step
            assert {g.scheduled_version for g in groups} == {max(0, step - 1)}, step
        return on_batch

    in_turn, overlapped = [], []
    a = inprocess_loop.run(cfg, steps, threads=1, on_batch=keep(in_turn), staleness=1)
    b = inprocess_loop.run(cfg, steps, threads=1, on_batch=keep(overlapped), staleness=1, overlap=True)
    assert len(overlapped) == steps and overlapped == in_turn
    assert b["accuracy_final"] == a["accuracy_final"]  # the same weights at the end
    assert (a["overlap"], b["overlap"]) == (False, True)
    # every step but the last rolls the next batch out; the last has none, and is not a steady step
    assert [r["R_s"] > 0 for r in b["per_step"]] == [True] * (steps - 1) + [False]
    assert b["s_per_step"] == pytest.approx(sum(r["step_s"] for r in b["per_step"][2:-1]) / (steps - 3))
    with pytest.raises(ValueError, match="overlap needs staleness 1"):
        inprocess_loop.run(cfg, steps, overlap=True)
