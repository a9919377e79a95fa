"""The in-process baseline runs the same job as ``astraflow run`` in sync mode.

With ``rollout.batch_invariant`` a sync run's trajectories are a function of the seed
alone (see test_determinism), so the one-process loop of
``benchmarks/inprocess_loop.py`` must write the very same groups, step after step: same
tasks, same tokens, same logprobs. If it did not, its s/step would not be a baseline for
the same work.
"""

from __future__ import annotations

import dataclasses

import pytest

from astraflow.benchmarks import inprocess_loop
from astraflow.launcher import run_job
from astraflow.topics.codec import encode

from .test_determinism import trajectories

pytestmark = pytest.mark.slow

STEPS = 3


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
