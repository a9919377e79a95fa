"""No record on ``tasks.<policy>`` kills a RaaS node into a loop.

The node runs in the test's thread (``setup`` / ``step`` / ``teardown``) with its real CPU
engine on the tiny model, against the real broker. Undecodable tasks and tasks with
settings out of bounds are dead-lettered as they are polled; a task scheduled at a version
no trainer ever announces (a forgery) ends the node's wait with its error, as before, but
is first answered with a failure record and committed, so the restarted node does not wait
for it again: it rolls out the next task.
"""

from __future__ import annotations

import uuid

import pytest

from astraflow.actors import rollout
from astraflow.config import JobConfig, from_dict
from astraflow.topics import DeadLetter, Producer, Task, TrajectoryGroup, ensure_topics, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.replay import read_topic

from .conftest import drive


@pytest.fixture
def cfg(bootstrap, tmp_path) -> JobConfig:
    cfg = from_dict(JobConfig, {"job": f"raas-poison-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path),
                                "rollout": {"n_samples": 2, "max_new_tokens": 3, "tasks_per_call": 1,
                                            "heartbeat_s": 1.0, "engine": {"kind": "cpu", "threads": 1}}})
    ensure_topics(bootstrap, job_topics(cfg).specs())
    from astraflow.actors.signing import with_run_keys
    return with_run_keys(cfg, tmp_path)  # the node checks announcements against the run's key, as in a job


def _groups(bootstrap: str, topic: str) -> list[TrajectoryGroup]:
    return [m for _, _, m in read_topic(bootstrap, topic) if isinstance(m, TrajectoryGroup)]


def test_poison_tasks_are_answered_or_dead_lettered_once_and_the_node_goes_on(cfg, bootstrap, monkeypatch):
    monkeypatch.setattr(rollout, "WEIGHT_WAIT_LIMIT_S", 2.0)
    topics = job_topics(cfg)
    tasks = topics.tasks(cfg.policy)
    feeder = Producer(bootstrap, client_id="dataflow-stand-in")
    hot = Task("t-hot", "p", cfg.policy, "1+1=", "2", 2, {"temperature": "hot"})
    forged = Task("t-forged", "p", cfg.policy, "1+1=", "2", 2, scheduled_version=10**9)
    good = Task("t-good", "p", cfg.policy, "1+1=", "2", 2)
    feeder.send_raw(tasks, b"{]", key=b"x", headers=[("af-type", b"task")], partition=0).get(30)
    feeder.send_raw(tasks, encode(hot)[0], key=b"t-hot", headers=[("af-type", b"task"), ("af-schema", b"3")],
                    partition=0).get(30)
    feeder.send_sync(tasks, forged, key="t-forged", partition=0)
    node = rollout.RolloutActor(None, "raas", cfg, bootstrap, "raas-p")
    try:
        node.setup()
        with pytest.raises(TimeoutError, match="version 1000000000 did not arrive"):
            drive(node, lambda: False, "the forged task's wait to end", max_steps=120)
        node.teardown()
        (failed,) = _groups(bootstrap, topics.trajectories)
        assert (failed.task_id, failed.status) == ("t-forged", "failed") and "did not arrive" in failed.error
        letters = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
        assert sorted((x.source_topic, x.offset, x.consumer) for x in letters) == [(tasks, 0, "raas-p"),
                                                                                     (tasks, 1, "raas-p")]
        assert any("sampling['temperature'] is 'hot'" in x.error for x in letters)

        feeder.send_sync(tasks, good, key="t-good", partition=0)
        node = rollout.RolloutActor(None, "raas", cfg, bootstrap, "raas-p")  # restarted, as its supervisor would
        node.setup()
        drive(node, lambda: len(_groups(bootstrap, topics.trajectories)) == 2, "the next task rolled out",
              max_steps=120)
        assert sorted((g.task_id, g.status) for g in _groups(bootstrap, topics.trajectories)) == \
            [("t-forged", "failed"), ("t-good", "ok")]
        assert len([m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]) == 2
    finally:
        node.teardown()
        feeder.close()
