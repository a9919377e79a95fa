"""The dataflow of a multi-policy job: one lane per policy, no global barrier unless asked.

The dataflow actor runs in the test's thread against the real broker; the test plays the
episode runners (one group per role an episode trains) and the two trainers (version
announcements per policy), so the schedule can be checked exactly. Every role of an
episode generates, so an episode is admitted only when every lane it trains can take its
groups: one episode per trained group, whichever trainer lags.
"""

from __future__ import annotations

import pytest

from astraflow.topics import job_topics
from astraflow.chaos.invariants import audit_job
from astraflow.actors.signing import group_signer_for, signer_for
from astraflow.config import JobConfig
from astraflow.topics import (Batch, ChunkManifest, Producer, Sample, Task, TrajectoryGroup, VersionAnnouncement)
from astraflow.topics.replay import read_topic

from .conftest import drive, signed_job, start_dataflow

B, STEPS = 2, 4
ROLES = {"solver": "solver", "verifier": "verifier"}


def make_cfg(bootstrap, tmp_path, barrier: str, policies: dict | None = None, **top) -> JobConfig:
    return signed_job(bootstrap, tmp_path, "lanes", {"barrier": barrier,
                                                     "dataflow": {"groups_per_batch": B, "max_staleness": 1},
                                                     "trainer": {"steps": STEPS}, "kafka": {"trajectory_partitions": 2},
                                                     "policies": policies or {"solver": {}, "verifier": {}},
                                                     "workflow": {"name": "solver_verifier", "roles": ROLES}, **top})


class Peers:
    def __init__(self, cfg: JobConfig, bootstrap: str) -> None:
        self.cfg, self.bootstrap, self.topics = cfg, bootstrap, job_topics(cfg)
        self.producer = Producer(bootstrap, client_id="peers")
        self.answered: set[str] = set()

    def tasks(self) -> list[Task]:
        return sorted((m for _, _, m in read_topic(self.bootstrap, self.topics.tasks("solver")) if isinstance(m, Task)),
                      key=lambda t: t.task_id)

    def answer_all(self, versions: dict[str, int], version_of=None, rewards_of=None) -> None:
        """Run every new episode: a group per trained role, in one go (as one runner would).

        ``version_of(task, policy)``, when given, names the version a policy's pool generated
        that episode's role with (None: ``versions``), e.g. a pool still on old weights.
        ``rewards_of(task, role)``, when given, names the rewards of the role's samples (one
        sample per reward; default ``n_samples`` samples rewarded 1.0)."""
        for t in self.tasks():
            if t.task_id in self.answered:
                continue
            self.answered.add(t.task_id)
            for role in t.train:
                v = version_of(t, ROLES[role]) if version_of is not None else None
                v = versions[ROLES[role]] if v is None else v
                rewards = rewards_of(t, role) if rewards_of is not None else [1.0] * t.n_samples
                g = TrajectoryGroup(t.task_id, t.prompt_id, ROLES[role], "raas-test", [1, 2],
                                    [Sample([7, 8, 9], [-0.5, 0.0, -0.5], [v, 0, v], r, "stop", loss_mask=[1, 0, 1],
                                            token_roles=[0, 1, 0]) for r in rewards],
                                    role=role, roles=[role, "env"], role_policies=dict(ROLES),
                                    stats={"team_reward": 1.0})
                self.send_group(g)

    def send_group(self, g: TrajectoryGroup) -> None:
        """Write a group as the episode runner does: signed with the lead pool's key."""
        signer = group_signer_for(self.cfg.view(self.cfg.lead_policy))
        self.producer.send_sync(self.topics.trajectories, g, key=g.task_id,
                                headers=signer.headers_for(self.topics.trajectories, g))

    def announce(self, policy: str, version: int) -> None:
        manifest = ChunkManifest(f"v{version}", self.topics.weights(policy), 0, "", [])
        ann = VersionAnnouncement(policy, version, "snapshot", version, version, manifest, "digest")
        self.producer.send_sync(self.topics.versions, ann, key=policy,
                                headers=signer_for(self.cfg.view(policy)).headers_for(self.topics.versions, ann))

    def batches(self, policy: str) -> list[Batch]:
        return [b for _, _, b in read_topic(self.bootstrap, self.topics.batches(policy)) if isinstance(b, Batch)]

    def close(self) -> None:
        self.producer.close()


@pytest.fixture
def run(bootstrap, tmp_path):
    made = []

    def start(barrier: str, policies: dict | None = None, **top):
        cfg = make_cfg(bootstrap, tmp_path, barrier, policies, **top)
        actor = start_dataflow(cfg, bootstrap)
        peers = Peers(cfg, bootstrap)
        made.append((actor, peers))
        return cfg, actor, peers

    yield start
    for actor, peers in made:
        actor.teardown()
        peers.close()


def both_trainers(peers: Peers, versions: dict[str, int], verifier_lag: int = 0) -> None:
    """The trainers: each announces a version per batch of its own, the verifier's
    ``verifier_lag`` batches behind until the solver has trained every step."""
    solver, verifier = len(peers.batches("solver")), len(peers.batches("verifier"))
    trained = {"solver": solver, "verifier": verifier if solver >= STEPS else max(0, verifier - verifier_lag)}
    for policy, v in trained.items():
        if v > versions[policy]:
            versions[policy] = v
            peers.announce(policy, v)


def train_to_the_end(actor, peers, versions, until, what: str, verifier_lag: int = 0, version_of=None,
                     max_steps: int = 400, rewards_of=None) -> None:
    """Step until ``until()``, every pool answering each new episode and both trainers keeping
    up (:func:`both_trainers`) after each step."""
    def after_step() -> None:
        peers.answer_all(versions, version_of, rewards_of)
        both_trainers(peers, versions, verifier_lag)
    drive(actor, until, what, max_steps, after_step)


def test_a_lagging_policy_paces_the_episodes_and_none_is_rolled_out_for_nothing(run, bootstrap):
    """The verifier's trainer runs a batch behind the solver's throughout (and the dataflow
    restarts halfway): every episode trains both policies, so the job rolls out one episode
    per trained group, as many as lockstep would."""
    cfg, actor, peers = run("async")
    versions = {"solver": 0, "verifier": 0}
    done = lambda: all(len(peers.batches(p)) == STEPS for p in ROLES.values())  # noqa: E731
    train_to_the_end(actor, peers, versions, lambda: len(peers.batches("solver")) >= STEPS // 2, "half the steps",
                     verifier_lag=1)
    actor.teardown()  # a restart: the admission rule reads nothing the state record lacks
    actor = start_dataflow(cfg, bootstrap)
    try:
        train_to_the_end(actor, peers, versions, done, "every step of both policies", verifier_lag=1)
        for _ in range(5):
            actor.step()
    finally:
        actor.teardown()
    tasks = peers.tasks()
    assert [t.train for t in tasks] == [["solver", "verifier"]] * (STEPS * B), \
        [t.train for t in tasks]  # the old admission rolled out solver-only episodes here
    assert len({t.task_id for t in tasks}) == STEPS * B
    reports = audit_job(bootstrap, cfg)
    for name, r in reports.items():
        assert r.ok, (name, r.violations)
    assert reports["solver"].batched_groups == reports["verifier"].batched_groups == STEPS * B
    assert not reports["solver"].drops and not reports["verifier"].drops


def test_a_stuck_policy_holds_back_the_episodes_it_could_not_train(run, bootstrap):
    cfg, actor, peers = run("async")
    versions = {"solver": 0, "verifier": 0}  # the verifier's trainer never announces a version
    drive(actor, lambda: len(peers.tasks()) >= 2 * B, "the episodes of two batches", max_steps=200)
    peers.answer_all(versions)
    drive(actor, lambda: len(peers.batches("solver")) >= 2 and len(peers.batches("verifier")) >= 2,
          "two batches of each policy", max_steps=200)
    for v in (1, 2):
        versions["solver"] = v
        peers.announce("solver", v)
    for _ in range(30):  # the solver's bound has room, the verifier's (version 0, staleness 1) has none
        actor.step()
    # an episode the verifier could not train would roll out its role for nothing: none is admitted
    assert len(peers.tasks()) == 2 * B
    assert all(t.train == ["solver", "verifier"] for t in peers.tasks())
    assert [b.step for b in peers.batches("solver")] == [b.step for b in peers.batches("verifier")] == [0, 1]
    reports = audit_job(bootstrap, cfg)
    assert all(r.ok for r in reports.values()), {n: r.violations for n, r in reports.items()}
    versions["verifier"] = 1
    peers.announce("verifier", 1)
    drive(actor, lambda: len(peers.tasks()) == 3 * B, "episodes once the verifier has room", max_steps=200)
    assert all(t.train == ["solver", "verifier"] for t in peers.tasks())


def test_each_lane_batches_on_its_own_and_only_a_lane_that_dropped_takes_a_replacement(run, bootstrap):
    """A verifier group generated on old weights is stale for its batch: the solver's batch
    does not wait for its replacement (no barrier), and the one episode that replaces it,
    scheduled once the solver has every group it needs, trains the verifier alone."""
    cfg, actor, peers = run("async")
    versions = {"solver": 0, "verifier": 0}
    stale_task: list[str] = []

    def version_of(task: Task, policy: str):
        if policy == "verifier" and not stale_task and int(task.task_id[1:8]) >= 3 * B:
            stale_task.append(task.task_id)  # the first episode of the last batch, from a pool still on version 0
            return 0
        return None

    # the solver's last batch is written while the verifier's waits for a replacement episode
    train_to_the_end(actor, peers, versions, lambda: len(peers.batches("solver")) == STEPS, "the solver's last batch",
                     version_of=version_of)
    assert stale_task and len(peers.batches("verifier")) == STEPS - 1
    train_to_the_end(actor, peers, versions, lambda: all(len(peers.batches(p)) == STEPS for p in ROLES.values()),
                     "every step of both policies")
    for _ in range(5):
        actor.step()
    tasks = peers.tasks()
    assert len(tasks) == STEPS * B + 1
    assert [t.train for t in tasks] == [["solver", "verifier"]] * (STEPS * B) + [["verifier"]]
    reports = audit_job(bootstrap, cfg)
    for name, r in reports.items():
        assert r.ok, (name, r.violations)
    assert dict(reports["verifier"].drops) == {"stale": 1} and not reports["solver"].drops
    drops = [m for _, _, m in read_topic(bootstrap, peers.topics.drops("verifier"))]
    assert [(d.task_id, d.reason) for d in drops] == [(f"{stale_task[0]}/verifier", "stale")]


def test_lockstep_schedules_only_what_every_policy_can_train(run, bootstrap):
    cfg, actor, peers = run("lockstep")
    versions = {"solver": 0, "verifier": 0}
    drive(actor, lambda: len(peers.tasks()) >= 2 * B, "the first two batches of episodes", max_steps=200)
    peers.answer_all(versions)
    drive(actor, lambda: len(peers.batches("solver")) >= 2, "two solver batches", max_steps=200)
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
    drive(actor, lambda: len(peers.tasks()) == 3 * B, "episodes once every policy has room", max_steps=200)


def test_the_audit_fails_when_an_episode_owes_a_group_it_never_wrote(run, bootstrap):
    cfg, actor, peers = run("async")
    drive(actor, lambda: len(peers.tasks()) >= B, "episodes", max_steps=200)
    # a broken runner writes the solver's group of the first episode and forgets the verifier's
    first = peers.tasks()[0]
    peers.answered.add(first.task_id)
    g = TrajectoryGroup(first.task_id, first.prompt_id, "solver", "raas-test", [1, 2],
                        [Sample([7], [-0.5], [0], 1.0, "stop")] * first.n_samples, role="solver",
                        role_policies=dict(ROLES))
    peers.send_group(g)
    peers.answer_all({"solver": 0, "verifier": 0})
    drive(actor, lambda: len(peers.batches("solver")) >= 1, "a solver batch", max_steps=200)
    for _ in range(5):
        actor.step()
    reports = audit_job(bootstrap, cfg)
    assert not reports["verifier"].ok
    assert any(f"{first.task_id}/verifier" in v for v in reports["verifier"].violations)


def test_each_policy_runs_its_own_data_algorithms_and_only_its_lane_replaces_what_they_drop(run, bootstrap):
    """Dynamic sampling on the verifier alone: the verifier's groups of the first episodes are
    rewarded alike (no signal), so its lane drops them and takes replacements; the solver's
    lane keeps every group and writes its batches without waiting. Conservation holds per
    policy, the drops are the verifier's and every batch of it has signal."""
    alike = 3
    cfg, actor, peers = run("async", {"solver": {}, "verifier": {"dataflow": {"algorithms": ["dynamic_sampling"]}}},
                            rollout={"n_samples": 2})
    assert [type(a).__name__ for a in actor.lanes["verifier"].pipeline.algorithms] == ["DynamicSampling"]
    assert actor.lanes["solver"].pipeline.empty
    versions = {"solver": 0, "verifier": 0}
    first = []

    def rewards_of(task: Task, role: str) -> list[float]:
        if role == "verifier" and (task.task_id in first or len(first) < alike):
            if task.task_id not in first:
                first.append(task.task_id)
            return [1.0, 1.0]
        return [1.0, 0.0]

    train_to_the_end(actor, peers, versions, lambda: all(len(peers.batches(p)) == STEPS for p in ROLES.values()),
                     "every step of both policies", rewards_of=rewards_of)
    for _ in range(5):
        actor.step()
    tasks = peers.tasks()
    assert [t.train for t in tasks] == [["solver", "verifier"]] * (STEPS * B) + [["verifier"]] * alike
    reports = audit_job(bootstrap, cfg)
    for name, r in reports.items():
        assert r.ok, (name, r.violations)
    assert dict(reports["verifier"].drops) == {"zero_variance": alike} and not reports["solver"].drops
    trained = [g for b in peers.batches("verifier") for g in b.groups]
    assert len(trained) == STEPS * B and not {g.task_id for g in trained} & set(first)
    assert all(len({s.reward for s in g.samples}) > 1 for g in trained)
    assert len([g for b in peers.batches("solver") for g in b.groups]) == STEPS * B


def test_the_team_s_prompt_curators_run_once_in_the_lead_lane(run, bootstrap):
    """A curator in the top-level dataflow section is inherited by every policy, but it
    chooses the team's prompts: only the lead policy's lane (the solver's) runs it."""
    cfg, actor, peers = run("async", dataflow={"groups_per_batch": B, "max_staleness": 1,
                                               "algorithms": ["filter_solved", "dynamic_sampling"]},
                            rollout={"n_samples": 2})
    names = lambda p: [type(a).__name__ for a in actor.lanes[p].pipeline.algorithms]  # noqa: E731
    assert names("solver") == ["FilterSolved", "DynamicSampling"]
    assert names("verifier") == ["DynamicSampling"]
