"""Data algorithms inside the dataflow actor, on the real broker.

As in ``test_dataflow_restart.py`` the actor runs in the test's thread and the test plays
the RaaS node and the trainer by writing their records, with rewards chosen per task, so
drops, replays and restarts land exactly where each scenario needs them.
"""

from __future__ import annotations

import uuid

import pytest

from astraflow.topics import job_topics
from astraflow.actors.ledger import read_state
from astraflow.chaos.invariants import audit
from astraflow.actors.signing import group_signer_for, signer_for
from astraflow.config import JobConfig
from astraflow.topics import (Batch, ChunkManifest, Consumer, Metric, Producer, Sample, Task, TrajectoryGroup,
                              VersionAnnouncement)
from astraflow.topics.messages import GroupDrop
from astraflow.topics.replay import read_topic

from .conftest import drive, signed_job, start_dataflow

MIXED, ALL_ONE, ALL_ZERO = [1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]


def _cfg(bootstrap, tmp_path, algorithms, *, B=2, steps=3, staleness=1, **extra) -> JobConfig:
    return signed_job(bootstrap, tmp_path, "algo", {"rollout": {"n_samples": 4},
                                                    "dataflow": {"groups_per_batch": B, "max_staleness": staleness,
                                                                 "algorithms": algorithms, **extra.pop("dataflow", {})},
                                                    "trainer": {"steps": steps}, "kafka": {"trajectory_partitions": 1},
                                                    **extra})


class Peers:
    """The RaaS node (answers tasks with chosen rewards) and the trainer (announces versions)."""

    def __init__(self, cfg: JobConfig, bootstrap: str) -> None:
        self.cfg, self.bootstrap, self.topics = cfg, bootstrap, job_topics(cfg)
        self.producer = Producer(bootstrap, client_id="peers")
        self.tasks: list[Task] = []
        self._reader = Consumer(bootstrap, topics=[self.topics.tasks(cfg.policy)], group_id=f"peers-{uuid.uuid4()}",
                                client_id="peers")

    def new_tasks(self) -> list[Task]:
        new = [d.message for d in self._reader.poll(200) if isinstance(d.message, Task)]
        self.tasks = sorted(self.tasks + new, key=lambda t: t.task_id)  # ids start with the prompt offset
        return new

    def answer(self, task: Task, rewards, version: int = 0) -> None:
        samples = [Sample([7, 8], [-0.5, -0.5], [version, version], float(r), "stop") for r in rewards]
        group = TrajectoryGroup(task.task_id, task.prompt_id, self.cfg.policy, "raas-test", [1, 2], samples,
                                scheduled_version=task.scheduled_version)
        self.producer.send_sync(self.topics.trajectories, group, key=task.task_id,  # signed as the pool signs
                                headers=group_signer_for(self.cfg).headers_for(self.topics.trajectories, group))

    def announce(self, version: int) -> None:
        manifest = ChunkManifest(f"v{version}", self.topics.weights(self.cfg.policy), 0, "", [])
        ann = VersionAnnouncement(self.cfg.policy, version, "snapshot", version, version, manifest, "digest")
        self.producer.send_sync(self.topics.versions, ann, key=self.cfg.policy,
                                headers=signer_for(self.cfg).headers_for(self.topics.versions, ann))

    def records(self, topic: str, cls) -> list:
        return [m for _, _, m in read_topic(self.bootstrap, topic) if isinstance(m, cls)]

    def close(self) -> None:
        self._reader.close()
        self.producer.close()


def keeping_up(actor, peers: Peers, rewards):
    """After each step: answer each new task at the newest version with ``rewards(task)`` and
    announce a version per batch written (a pool and a trainer that keep up)."""
    def after_step() -> None:
        for task in peers.new_tasks():
            peers.answer(task, rewards(task), version=actor.lead.version)
        if actor.lead.ledger.next_step > actor.lead.version:
            peers.announce(actor.lead.ledger.next_step)
    return after_step


@pytest.fixture
def peers_of(bootstrap):
    made = []

    def make(cfg):
        made.append(Peers(cfg, bootstrap))
        return made[-1]
    yield make
    for p in made:
        p.close()


def test_dynamic_sampling_drops_are_recorded_and_replaced(bootstrap, tmp_path, peers_of):
    cfg = _cfg(bootstrap, tmp_path, ["dynamic_sampling"], steps=2)
    peers = peers_of(cfg)
    actor = start_dataflow(cfg, bootstrap)
    try:
        plan = iter([ALL_ONE, MIXED, MIXED, ALL_ZERO] + [MIXED] * 10)
        drive(actor, lambda: actor.lead.ledger.next_step == 2 and not actor.lead.ledger.pending_drops, "2 batches",
              after_step=keeping_up(actor, peers, lambda t: next(plan)))
        for _ in range(3):
            actor.step()
    finally:
        actor.teardown()
    drops = peers.records(peers.topics.drops(cfg.policy), GroupDrop)
    assert [(d.reason, d.detail) for d in drops] == [("zero_variance", "dropped by dynamic_sampling")] * 2
    batches = peers.records(peers.topics.batches(cfg.policy), Batch)
    assert all(len({s.reward for s in g.samples}) > 1 for b in batches for g in b.groups)
    report = audit(bootstrap, peers.topics, cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations
    assert report.drops == {"zero_variance": 2} and report.tasks == 2 * 2 + 2  # each drop replaced once


def test_curators_learn_from_each_group_once_across_restarts(bootstrap, tmp_path, peers_of):
    cfg = _cfg(bootstrap, tmp_path, ["greso", {"name": "filter_solved", "alpha": 0.5, "threshold": 0.7},
                                     "dynamic_sampling"])
    peers = peers_of(cfg)
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: peers.new_tasks() is None or len(peers.tasks) == 4, "4 tasks")
        t = peers.tasks
        # t0 waits for its batch, so the committed offset stays before it; t1, dropped after
        # it, lies beyond that offset: a restart re-reads both and must learn from neither again
        peers.answer(t[0], MIXED)
        peers.answer(t[1], ALL_ONE)
        lead = actor.lead
        drive(actor, lambda: lead.partial and not lead.ledger.pending_drops and lead.ledger.dropped == 1,
              "t0 waiting, t1 dropped")
        before = actor.lead.pipeline.state()
        assert before["algorithms"]["greso"]["streaks"] == {t[1].prompt_id: [1, "easy"]}
        assert before["algorithms"]["filter_solved"]["success"] == {t[1].prompt_id: 0.5}
        actor.teardown()

        actor = start_dataflow(cfg, bootstrap)
        assert actor.lead.pipeline.state() == before  # restored from the log: the committed state record
        drive(actor, lambda: [d.message.task_id for d in actor.lead.partial] == [t[0].task_id], "t0 re-read")
        for _ in range(3):
            actor.step()
        after = actor.lead.pipeline.state()["algorithms"]  # (the drop's slot went to a 5th task: one more decision)
        assert (after["greso"]["streaks"], after["filter_solved"]["success"]) == \
            (before["algorithms"]["greso"]["streaks"], before["algorithms"]["filter_solved"]["success"])

        peers.answer(t[2], MIXED)
        drive(actor, lambda: actor.lead.ledger.next_step == 1, "batch 0")
        learnt = actor.lead.pipeline.state()["algorithms"]
        assert learnt["filter_solved"]["success"] == {t[0].prompt_id: 0.25, t[1].prompt_id: 0.5,
                                                      t[2].prompt_id: 0.25}
        assert learnt["greso"]["streaks"] == {t[1].prompt_id: [1, "easy"]}
        state, _ = read_state(bootstrap, peers.topics.dataflow_state(cfg.policy), cfg.policy)
        assert state.algorithms["algorithms"] == learnt  # written with the batch that taught it
    finally:
        actor.teardown()


def test_replay_marks_batches_and_its_buffer_survives_a_restart(bootstrap, tmp_path, peers_of):
    # B 2 with replay 0.5: batch 0 takes 2 fresh groups, every later batch 1 fresh + 1 replayed;
    # 3 prompts for 5 tasks: the schedule makes a second pass over them
    cfg = _cfg(bootstrap, tmp_path, [{"name": "replay", "ratio": 0.5}], steps=4, data={"num_prompts": 3})
    peers = peers_of(cfg)
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: actor.lead.ledger.next_step == 2, "batch 1",
              after_step=keeping_up(actor, peers, lambda t: MIXED))
        buffer = [(g.group.task_id, g.step) for g in actor.lead.pipeline.composers[0].buffer]
        actor.teardown()
        actor = start_dataflow(cfg, bootstrap)
        assert [(g.group.task_id, g.step) for g in actor.lead.pipeline.composers[0].buffer] == buffer
        drive(actor, lambda: actor.lead.ledger.next_step == 4, "batch 3",
              after_step=keeping_up(actor, peers, lambda t: MIXED))
        for _ in range(3):
            actor.step()
    finally:
        actor.teardown()
    batches = peers.records(peers.topics.batches(cfg.policy), Batch)
    assert [b.replay for b in batches] == [[]] + [[False, True]] * 3
    for prev, b in zip(batches, batches[1:]):
        newest_fresh = [g for i, g in enumerate(prev.groups) if not prev.is_replay(i)][-1]
        assert b.groups[1].task_id == newest_fresh.task_id  # recent: the newest group trained fresh
        assert b.stats["replayed"] == 1
    ids = sorted(t.task_id for t in peers.tasks)
    assert len(ids) == 5 and sum(".1-" in tid for tid in ids) == 2  # 2 tasks of the second pass
    report = audit(bootstrap, peers.topics, cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations
    assert (report.batched_groups, report.replayed_groups, report.tasks) == (5, 3, 5)
    state, _ = read_state(bootstrap, peers.topics.dataflow_state(cfg.policy), cfg.policy)
    assert state.prompt_epoch == 1


def test_a_curator_that_rejects_every_prompt_is_overruled_and_the_metric_says_so(bootstrap, tmp_path, peers_of):
    # difficulty bound 0.5 at level 0: every arithmetic prompt has at least one digit
    cfg = _cfg(bootstrap, tmp_path, [{"name": "curriculum", "levels": [0.5, 1]}], steps=1,
               dataflow={"force_after_skips": 3})
    peers = peers_of(cfg)
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: actor.lead.ledger.next_step == 1, "batch 0",
              after_step=keeping_up(actor, peers, lambda t: MIXED))
    finally:
        actor.teardown()
    state, _ = read_state(bootstrap, peers.topics.dataflow_state(cfg.policy), cfg.policy)
    assert state.algorithms["forced"] == len(peers.tasks) >= 2
    assert state.algorithms["skipped"] == {"curriculum": 3 * state.algorithms["forced"]}
    forced = [m for m in peers.records(peers.topics.metrics, Metric) if m.name == "dataflow.algorithms.forced"]
    assert forced and forced[-1].value == state.algorithms["forced"]
