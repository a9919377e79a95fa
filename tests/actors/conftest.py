"""What the actor tests share: stepping an actor's loop in the test's thread, and a small
dataflow job whose peers (the RaaS node and the trainer) the test plays by writing their
records.

An actor runs here as its pykka loop runs it (``setup`` / ``step`` / ``teardown``), so a
test decides what lands between two steps. The helpers are imported by the test modules
of this folder (``from .conftest import drive``); the fixture is found by name. Modules
that drive another actor (the rollout and trainer poison tests) define a ``cfg`` of their
own, which takes the place of this one there.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from astraflow.actors.dataflow import DataflowActor
from astraflow.actors.signing import group_signer_for, signer_for, with_run_keys
from astraflow.config import JobConfig, from_dict
from astraflow.topics import (ChunkManifest, Producer, Sample, Task, TrajectoryGroup, VersionAnnouncement,
                              ensure_topics, job_topics)
from astraflow.topics.replay import read_topic

#: the small dataflow job's groups per batch, trainer steps and staleness bound
B, STEPS, STALENESS = 2, 3, 1


def drive(actor, until: Callable[[], object], what: str, max_steps: int = 300,
          after_step: Callable[[], None] | None = None) -> None:
    """Step ``actor``'s loop until ``until()`` holds, calling ``after_step()`` after each step
    (peers answering what it wrote); fail naming ``what`` after ``max_steps`` steps."""
    for _ in range(max_steps):
        if until():
            return
        actor.step()
        if after_step is not None:
            after_step()
    raise AssertionError(f"{actor.name} never reached: {what}")


def start_dataflow(cfg: JobConfig, bootstrap: str) -> DataflowActor:
    """A dataflow actor set up (its state read back from the topics), not yet stepped."""
    actor = DataflowActor(None, "dataflow", cfg, bootstrap)
    actor.setup()
    return actor


def signed_job(bootstrap: str, tmp_path, name: str, sections: dict) -> JobConfig:
    """A job config of ``sections`` named ``<name>-<random>`` in ``tmp_path``: its run keys written
    (the peers sign as its trainers and pools do) and its topics made."""
    cfg = from_dict(JobConfig, {"job": f"{name}-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path), **sections})
    cfg = with_run_keys(cfg, tmp_path)
    ensure_topics(bootstrap, job_topics(cfg).specs())
    return cfg


@pytest.fixture
def cfg(bootstrap, tmp_path) -> JobConfig:
    """The small dataflow job (``B`` groups per batch, ``STEPS`` steps, staleness ``STALENESS``),
    its topics made, its run keys written (the peers sign as the trainer and the pool do)."""
    return signed_job(bootstrap, tmp_path, "restart", {"dataflow": {"groups_per_batch": B, "max_staleness": STALENESS},
                                                       "trainer": {"steps": STEPS},
                                                       "kafka": {"trajectory_partitions": 2}})


class Peers:
    """The RaaS node and the trainer, reduced to the records they write."""

    def __init__(self, cfg: JobConfig, bootstrap: str) -> None:
        self.cfg, self.bootstrap, self.topics = cfg, bootstrap, job_topics(cfg)
        self.producer = Producer(bootstrap, client_id="peers")

    def tasks(self) -> list[str]:
        """Task ids in schedule order (ids start with the prompt offset)."""
        return sorted(m.task_id for _, _, m in read_topic(self.bootstrap, self.topics.tasks(self.cfg.policy))
                      if isinstance(m, Task))

    def answer(self, task_id: str, *, partition: int = 0, version: int = 0, ok: bool = True,
               policy: str | None = None) -> None:
        # a group of the size its workflow returns (the dataflow refuses any other: group_size)
        samples = [Sample([7, 8], [-0.5, -0.5], [version, version], 1.0, "stop")] * self.cfg.rollout.n_samples \
            if ok else []
        group = TrajectoryGroup(task_id, task_id.split("-", 1)[1], policy or self.cfg.policy, "raas-test", [1, 2],
                                samples,
                                status="ok" if ok else "failed", error="" if ok else "engine crashed")
        self.producer.send_sync(self.topics.trajectories, group, key=task_id, partition=partition,  # as the pool signs
                                headers=group_signer_for(self.cfg).headers_for(self.topics.trajectories, group))

    def drops(self) -> list:
        return [m for _, _, m in read_topic(self.bootstrap, self.topics.drops(self.cfg.policy))]

    def announce(self, version: int) -> None:
        manifest = ChunkManifest(f"v{version}", self.topics.weights(self.cfg.policy), 0, "", [])
        ann = VersionAnnouncement(self.cfg.policy, version, "snapshot", version, version, manifest, "digest")
        self.producer.send_sync(self.topics.versions, ann, key=self.cfg.policy,
                                headers=signer_for(self.cfg).headers_for(self.topics.versions, ann))

    def close(self) -> None:
        self.producer.close()
