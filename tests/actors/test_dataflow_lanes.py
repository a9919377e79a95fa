"""The dataflow of a multi-policy job: one lane per policy, no global barrier unless asked.

The dataflow actor runs in the test's thread against the real broker; the test plays the
episode runners (one group per role an episode trains) and the two trainers (version
announcements per policy), so the schedule can be checked exactly.
"""

from __future__ import annotations

import uuid

import pytest

from astraflow.topics import job_topics
from astraflow.actors.dataflow import DataflowActor
from astraflow.chaos.invariants import audit_job
from astraflow.config import JobConfig, from_dict
from astraflow.topics import (Batch, ChunkManifest, Producer, Sample, Task, TrajectoryGroup, VersionAnnouncement,
                              ensure_topics)
from astraflow.topics.replay import read_topic

B, STEPS = 2, 4
ROLES = {"solver": "solver", "verifier": "verifier"}


def make_cfg(bootstrap, tmp_path, barrier: str) -> JobConfig:
    cfg = from_dict(JobConfig, {"job": f"lanes-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path), "barrier": barrier,
                                "dataflow": {"groups_per_batch": B, "max_staleness": 1},
                                "trainer": {"steps": STEPS}, "kafka": {"trajectory_partitions": 2},
                                "policies": {"solver": {}, "verifier": {}},
                                "workflow": {"name": "solver_verifier", "roles": ROLES}})
    ensure_topics(bootstrap, job_topics(cfg).specs())
    return cfg


class Peers:
    def __init__(self, cfg: JobConfig, bootstrap: str) -> None:
        self.cfg, self.bootstrap, self.topics = cfg, bootstrap, job_topics(cfg)
        self.producer = Producer(bootstrap, client_id="peers")
        self.answered: set[str] = set()

    def tasks(self) -> list[Task]:
        return sorted((m for _, _, m in read_topic(self.bootstrap, self.topics.tasks("solver")) if isinstance(m, Task)),
                      key=lambda t: t.task_id)

    def answer_all(self, versions: dict[str, int]) -> None:
        """Run every new episode: a group per trained role, in one go (as one runner would)."""
        for t in self.tasks():
            if t.task_id in self.answered:
                continue
            self.answered.add(t.task_id)
            for role in t.train:
                v = versions[ROLES[role]]
                g = TrajectoryGroup(t.task_id, t.prompt_id, ROLES[role], "raas-test", [1, 2],
                                    [Sample([7, 8, 9], [-0.5, 0.0, -0.5], [v, 0, v], 1.0, "stop", loss_mask=[1, 0, 1],
                                            token_roles=[0, 1, 0])],
                                    role=role, roles=[role, "env"], role_policies=dict(ROLES),
                                    stats={"team_reward": 1.0})
                self.producer.send_sync(self.topics.trajectories, g, key=t.task_id)

    def announce(self, policy: str, version: int) -> None:
        manifest = ChunkManifest(f"v{version}", self.topics.weights(policy), 0, "", [])
        self.producer.send_sync(self.topics.versions, VersionAnnouncement(
            policy, version, "snapshot", version, version, manifest, "digest"), key=policy)

    def batches(self, policy: str) -> list[Batch]:
        return [b for _, _, b in read_topic(self.bootstrap, self.topics.batches(policy)) if isinstance(b, Batch)]

    def close(self) -> None:
        self.producer.close()


def drive(actor: DataflowActor, until, what: str, max_steps: int = 200) -> None:
    for _ in range(max_steps):
        if until():
            return
        actor.step()
    raise AssertionError(f"dataflow never reached: {what}")


@pytest.fixture
def run(bootstrap, tmp_path):
    made = []

    def start(barrier: str):
        cfg = make_cfg(bootstrap, tmp_path, barrier)
        actor = DataflowActor(None, "dataflow", cfg, bootstrap)
        actor.setup()
        peers = Peers(cfg, bootstrap)
        made.append((actor, peers))
        return cfg, actor, peers

    yield start
    for actor, peers in made:
        actor.teardown()
        peers.close()


def test_a_stuck_policy_does_not_hold_back_the_other(run, bootstrap):
    cfg, actor, peers = run("async")
    versions = {"solver": 0, "verifier": 0}  # the verifier's trainer never announces a version
    for step in range(STEPS):
        drive(actor, lambda: len(peers.tasks()) >= (step + 1) * B, f"episodes for solver step {step}")
        peers.answer_all(versions)
        drive(actor, lambda: len(peers.batches("solver")) >= step + 1, f"solver batch {step}")
        versions["solver"] = step + 1
        peers.announce("solver", step + 1)
    tasks = peers.tasks()
    both = [t for t in tasks if t.train == ["solver", "verifier"]]
    alone = [t for t in tasks if t.train == ["solver"]]
    # the verifier's bound at version 0 with staleness 1 is two batches of groups
    assert len(both) == 2 * B and len(alone) == len(tasks) - 2 * B > 0
    assert all(t.roles == ROLES and t.workflow == "solver_verifier" for t in tasks)
    assert len(peers.batches("solver")) == STEPS and len(peers.batches("verifier")) == 2
    reports = audit_job(bootstrap, cfg)
    assert reports["solver"].ok, reports["solver"].violations
    assert reports["episodes"].ok
    # the verifier lane has nothing open and nothing unsettled
    assert reports["verifier"].ok, reports["verifier"].violations
    assert all(g.group_key.endswith("/verifier") for b in peers.batches("verifier") for g in b.groups)


def test_lockstep_schedules_only_what_every_policy_can_train(run, bootstrap):
    cfg, actor, peers = run("lockstep")
    versions = {"solver": 0, "verifier": 0}
    drive(actor, lambda: len(peers.tasks()) >= 2 * B, "the first two batches of episodes")
    peers.answer_all(versions)
    drive(actor, lambda: len(peers.batches("solver")) >= 2, "two solver batches")
    for v in (1, 2):
        versions["solver"] = v
        peers.announce("solver", v)
    for _ in range(30):  # the solver is ahead, but the stuck verifier holds the whole job
        actor.step()
    assert len(peers.tasks()) == 2 * B
    assert all(t.train == ["solver", "verifier"] for t in peers.tasks())
    assert [b.step for b in peers.batches("verifier")] == [0, 1]
    versions["verifier"] = 1
    peers.announce("verifier", 1)
    drive(actor, lambda: len(peers.tasks()) == 3 * B, "episodes once every policy has room")


def test_the_audit_fails_when_an_episode_owes_a_group_it_never_wrote(run, bootstrap):
    cfg, actor, peers = run("async")
    drive(actor, lambda: len(peers.tasks()) >= B, "episodes")
    # a broken runner writes the solver's group of the first episode and forgets the verifier's
    first = peers.tasks()[0]
    peers.answered.add(first.task_id)
    g = TrajectoryGroup(first.task_id, first.prompt_id, "solver", "raas-test", [1, 2],
                        [Sample([7], [-0.5], [0], 1.0, "stop")], role="solver", role_policies=dict(ROLES))
    peers.producer.send_sync(peers.topics.trajectories, g, key=first.task_id)
    peers.answer_all({"solver": 0, "verifier": 0})
    drive(actor, lambda: len(peers.batches("solver")) >= 1, "a solver batch")
    for _ in range(5):
        actor.step()
    reports = audit_job(bootstrap, cfg)
    assert not reports["verifier"].ok
    assert any(f"{first.task_id}/verifier" in v for v in reports["verifier"].violations)
