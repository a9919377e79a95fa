"""Two sync runs with the same seed write the same trajectories, byte for byte.

Sample seeds derive from (job seed, task id, sample index), ``rollout.batch_invariant``
gives each task a generate call of its own, and the trainer takes a batch's groups in task
order, so nothing that varies between runs (which tasks a poll returns, arrival order,
process timing) reaches a trajectory; only timestamps and the node id may differ.
"""

from __future__ import annotations

import dataclasses

import pytest

from astraflow.launcher import run_job
from astraflow.topics import TrajectoryGroup, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.replay import read_topic

pytestmark = pytest.mark.slow

STEPS = 5


def trajectories(bootstrap: str, cfg) -> dict[str, bytes]:
    """Each task's group as encoded bytes, with the run-specific fields blanked."""
    out: dict[str, bytes] = {}
    for _, _, g in read_topic(bootstrap, job_topics(cfg).trajectories):
        assert isinstance(g, TrajectoryGroup)
        assert g.task_id not in out, f"{g.task_id} answered twice"
        value, _ = encode(dataclasses.replace(g, node_id="", started_at=0.0, finished_at=0.0))
        out[g.task_id] = value
    return out


def test_two_sync_runs_with_the_same_seed_write_identical_trajectories(bootstrap, make_job_config, tmp_path):
    runs = []
    for i in range(2):
        cfg = make_job_config({"mode": "sync", "seed": 11, "trainer": {"steps": STEPS},
                               "rollout": {"batch_invariant": True}}, name=f"det{i}")
        summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / f"run{i}", progress=False, timeout_s=600)
        assert summary["steps_trained"] == STEPS
        runs.append(trajectories(bootstrap, cfg))
    first, second = runs
    assert len(first) >= STEPS * cfg.dataflow.groups_per_batch
    assert first.keys() == second.keys()
    differing = sorted(t for t in first if first[t] != second[t])
    assert not differing, f"{len(differing)} of {len(first)} groups differ, first {differing[0]}"
