"""A group the job's RaaS pool signed still has to be possible (issue 29, item 3).

The signature says which pool wrote a group, not that an engine produced it: a buggy or
compromised node signs whatever it writes. The dataflow actor runs in the test's thread
against the real broker (the setup of ``test_dataflow_forged_groups``); the peers answer
tasks as a RaaS node does, signed with the pool's run key, some with content no engine of
this job produces: too few samples, a token id past the vocabulary, a turn longer than
``rollout.max_new_tokens``, a sequence past the model's positions, a prompt longer than the
task's, a reward outside the reward's range, a task never published. Each is dead-lettered
once with the check's name, dropped with that reason (its slot goes to a replacement task,
like a failed group's), never trained; the job goes on with the good groups and the audit,
which applies the same checks, counts each. With a refusal that leaves no drop record, or
with the checks switched off, the same kind of log fails the audit.

Lists of mismatched length and non-finite rewards never reach the dataflow's checks: the
codec refuses such a record on decode (``test_dataflow_poison.py``); the unit tests below
show the checks refuse them too when a group is built in-process.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from astraflow.actors import dataflow as dataflow_module
from astraflow.actors.group_checks import GroupLimits, impossible, limits_for
from astraflow.actors.signing import group_signer_for
from astraflow.chaos.invariants import audit, content_limits, group_verifier
from astraflow.config import JobConfig
from astraflow.topics import (Batch, DeadLetter, Producer, Sample, Task, TrajectoryGroup, job_topics)
from astraflow.topics.messages import GroupDrop
from astraflow.topics.replay import read_topic
from astraflow.workflows.api import get_workflow

from .conftest import drive, signed_job, start_dataflow

B, STEPS, STALENESS, N = 2, 3, 1, 4


def _cfg(bootstrap, tmp_path) -> JobConfig:
    return signed_job(bootstrap, tmp_path, "content", {"rollout": {"n_samples": N, "max_new_tokens": 8},
                                                       "dataflow": {"groups_per_batch": B, "max_staleness": STALENESS},
                                                       "trainer": {"steps": STEPS},
                                                       "kafka": {"trajectory_partitions": 1}})


class Pool:
    """The job's RaaS pool, reduced to the groups it writes: signed with the pool's key."""

    def __init__(self, cfg: JobConfig, bootstrap: str) -> None:
        self.cfg, self.bootstrap, self.topics = cfg, bootstrap, job_topics(cfg)
        self.producer = Producer(bootstrap, client_id="pool")
        self.signer = group_signer_for(cfg)

    def tasks(self) -> list[Task]:
        return sorted((m for _, _, m in read_topic(self.bootstrap, self.topics.tasks(self.cfg.policy))
                       if isinstance(m, Task)), key=lambda t: t.task_id)

    def write(self, g: TrajectoryGroup) -> None:
        self.producer.send_sync(self.topics.trajectories, g, key=g.task_id, partition=0,
                                headers=self.signer.headers_for(self.topics.trajectories, g))

    def records(self, topic: str, cls) -> list:
        return [m for _, _, m in read_topic(self.bootstrap, topic) if isinstance(m, cls)]

    def close(self) -> None:
        self.producer.close()


def good(task: Task, prompt_ids=(1, 2)) -> TrajectoryGroup:
    """What an engine of this job writes: ``N`` samples, ids of the char vocabulary, 2 tokens each."""
    samples = [Sample([7, 8], [-0.5, -0.5], [0, 0], float(i % 2), "stop") for i in range(task.n_samples)]
    return TrajectoryGroup(task.task_id, task.prompt_id, task.policy, "raas-test", list(prompt_ids), samples)


def with_sample(g: TrajectoryGroup, **sample) -> TrajectoryGroup:
    """``g`` with its first sample changed (the others stay possible)."""
    return dataclasses.replace(g, samples=[dataclasses.replace(g.samples[0], **sample), *g.samples[1:]])


#: one impossible group per check: (reason, what makes it impossible)
IMPOSSIBLE = [
    ("group_size", lambda t, lim: dataclasses.replace(good(t), samples=good(t).samples[:N - 1])),
    ("token_out_of_vocab", lambda t, lim: with_sample(good(t), tokens=[7, lim.vocab_size])),
    ("length_over_limit", lambda t, lim: with_sample(good(t), tokens=[7] * 9, logprobs=[-0.5] * 9,
                                                     versions=[0] * 9)),  # a turn of 9 > max_new_tokens 8
    ("length_over_limit", lambda t, lim: with_sample(good(t), prompt_ids=[5] * (lim.max_positions - 1))),
    ("length_over_limit", lambda t, lim: good(t, prompt_ids=[5] * (len(t.prompt.encode()) + 3))),
    ("reward_out_of_range", lambda t, lim: with_sample(good(t), reward=1.5)),
]


def test_signed_groups_with_impossible_content_are_refused_and_the_job_trains_on(bootstrap, tmp_path):
    cfg = _cfg(bootstrap, tmp_path)
    topics, limits = job_topics(cfg), limits_for(cfg, cfg.policy)
    assert (limits.vocab_size, limits.max_positions, limits.turn_tokens) == (104, 128, 8)  # the tiny model's config
    pool = Pool(cfg, bootstrap)
    actor = start_dataflow(cfg, bootstrap)
    bad: dict[str, str] = {}  # task id -> the reason it must be refused for
    try:
        drive(actor, lambda: len(pool.tasks()) == 4, "4 tasks (version 0, staleness 1, B 2)")
        # Each refused group frees its slot: a replacement task comes for every one.
        for (reason, make), task in zip(IMPOSSIBLE[:4], pool.tasks()):
            pool.write(make(task, limits))
            bad[task.task_id] = reason
        drive(actor, lambda: len(pool.tasks()) == 8, "4 replacement tasks")
        later = pool.tasks()[4:]
        for (reason, make), task in zip(IMPOSSIBLE[4:], later):
            pool.write(make(task, limits))
            bad[task.task_id] = reason
        for task in later[2:]:
            pool.write(good(task))
        drive(actor, lambda: actor.lead.ledger.next_step == 1 and len(pool.tasks()) == 10,
              "batch 0 from the good groups and 2 more replacements")
        for task in pool.tasks()[8:]:
            pool.write(good(task))
        drive(actor, lambda: actor.lead.ledger.next_step == 2, "batch 1")
        expected = {"group_size": 1, "token_out_of_vocab": 1, "length_over_limit": 3, "reward_out_of_range": 1}
        assert actor.content_rejected == expected
        actor.teardown()
        # a restart re-reads nothing it refused: no second letter, no second drop
        actor = start_dataflow(cfg, bootstrap)
        for _ in range(5):
            actor.step()
        assert actor.lead.ledger.next_step == 2 and not actor.content_rejected
    finally:
        actor.teardown()
        pool.close()

    tasks = pool.tasks()
    assert len(tasks) == 10  # 4 + one replacement per refused group: none lost, none scheduled twice
    trained = [g.task_id for b in pool.records(topics.batches(cfg.policy), Batch) for g in b.groups]
    assert sorted(trained) == [t.task_id for t in tasks[6:]]
    drops = {d.task_id: d for d in pool.records(topics.drops(cfg.policy), GroupDrop)}
    assert {tid: d.reason for tid, d in drops.items()} == bad
    letters = [x for x in pool.records(topics.dlq, DeadLetter) if x.source_topic == topics.trajectories]
    assert sorted(x.offset for x in letters) == sorted(d.source.offset for d in drops.values())  # one each
    for x in letters:
        reason = next(d.reason for d in drops.values() if d.source.offset == x.offset)
        assert x.error_type == "ImpossibleGroup" and x.error.startswith(f"{reason}: "), x.error
    assert "a turn of 9 tokens" in drops[tasks[2].task_id].detail
    assert "over the model's 128 positions" in drops[tasks[3].task_id].detail
    assert "the task's prompt of" in drops[tasks[4].task_id].detail

    checked = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness, verifier=group_verifier(cfg),
                    limits=content_limits(cfg))
    assert checked.ok, checked.violations
    assert checked.rejected_groups == expected and checked.drops == expected
    assert checked.batches == 2 and checked.batched_groups == 4


def test_a_signed_group_for_a_task_never_published_settles_nothing(bootstrap, tmp_path):
    """A group for a task id the dataflow never wrote used to be dropped as a ``duplicate``;
    it is ``unknown_task`` now: dead-lettered, dropped without freeing a slot. Only a holder
    of the pool's key can write one, so the audit still reports it (a definitive finding)."""
    cfg = _cfg(bootstrap, tmp_path)
    topics = job_topics(cfg)
    pool = Pool(cfg, bootstrap)
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: len(pool.tasks()) == 4, "4 tasks")
        t = pool.tasks()
        # ids this dataflow never writes: an offset past the prompts, a pass not begun, a short offset
        forged = [dataclasses.replace(good(t[0]), task_id=f"t9999999-{t[0].prompt_id}"),
                  dataclasses.replace(good(t[0]), task_id=t[0].task_id.replace("-", ".3-", 1)),
                  dataclasses.replace(good(t[0]), task_id=f"t12-{t[0].prompt_id}")]
        for g in forged:
            pool.write(g)
        for task in t[:2]:
            pool.write(good(task))
        drive(actor, lambda: actor.lead.ledger.next_step == 1, "batch 0")
        for _ in range(3):
            actor.step()
        assert actor.content_rejected == {"unknown_task": 3}
        assert len(pool.tasks()) == 4  # no slot freed
    finally:
        actor.teardown()
        pool.close()
    drops = pool.records(topics.drops(cfg.policy), GroupDrop)
    assert sorted(d.reason for d in drops) == ["unknown_task"] * 3
    letters = [x for x in pool.records(topics.dlq, DeadLetter) if x.source_topic == topics.trajectories]
    assert len(letters) == 3 and all(x.error.startswith("unknown_task: ") for x in letters)
    checked = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness, verifier=group_verifier(cfg),
                    limits=content_limits(cfg))
    assert checked.rejected_groups == {"unknown_task": 3}
    assert checked.drops == {"unknown_task": 3}
    assert {f"trajectory group for unknown task {g.task_id}" for g in forged} <= set(checked.definitive)


@pytest.mark.parametrize("sabotage", ["silent_drop", "checks_off"])
def test_the_audit_fails_when_a_refused_group_is_silently_dropped_or_trained(bootstrap, tmp_path, monkeypatch,
                                                                               sabotage):
    """The audit does not take the dataflow's word: a dataflow that refuses a group without a
    drop record (the group is consumed, its slot freed, nothing says so), or one that does not
    check, leaves a log that fails the audit."""
    cfg = _cfg(bootstrap, tmp_path)
    topics, limits = job_topics(cfg), limits_for(cfg, cfg.policy)
    pool = Pool(cfg, bootstrap)
    actor = start_dataflow(cfg, bootstrap)
    if sabotage == "checks_off":
        monkeypatch.setattr(dataflow_module, "impossible", lambda *a, **k: None)
    else:
        ledger = actor.lead.ledger
        take = ledger.take_drops
        monkeypatch.setattr(ledger, "take_drops", lambda: [d for d in take() if d.reason != "token_out_of_vocab"])
    try:
        drive(actor, lambda: len(pool.tasks()) == 4, "4 tasks")
        t = pool.tasks()
        pool.write(with_sample(good(t[0]), tokens=[7, limits.vocab_size + 5]))
        for task in t[1:3]:
            pool.write(good(task))
        drive(actor, lambda: actor.lead.ledger.next_step == 1, "batch 0")
        for _ in range(3):
            actor.step()
    finally:
        actor.teardown()
        pool.close()
    checked = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness, verifier=group_verifier(cfg),
                    limits=content_limits(cfg))
    assert not checked.ok
    assert checked.rejected_groups == {"token_out_of_vocab": 1}
    where = f"group {t[0].task_id} at trajectories[0]@0"
    if sabotage == "silent_drop":
        assert f"{where} is neither batched nor dropped" in checked.violations
        assert "dataflow state says 1 slots freed by drops, the log shows 0" in checked.violations
    else:
        assert any(v.startswith(f"batch 0: {where} was trained, but its content is impossible: token_out_of_vocab")
                   for v in checked.definitive), checked.violations


# -- the checks themselves, one by one (no broker) -------------------------------------------

LIMITS = GroupLimits(vocab_size=100, max_positions=32, turn_tokens=8, n_samples=2,
                     group_sizes={"solver": (1, 1)}, reward_ranges={"solver": (0.0, 1.0)})


def _group(*samples: Sample, prompt_ids=(1, 2), **kw) -> TrajectoryGroup:
    return TrajectoryGroup("t0000000-p", "p", "policy", "raas", list(prompt_ids), list(samples), **kw)


def _s(**kw) -> Sample:
    return dataclasses.replace(Sample([7, 8], [-0.5, -0.5], [0, 0], 1.0, "stop"), **kw)


@pytest.mark.parametrize("group, reason", [
    (_group(_s()), "group_size"),
    (_group(_s(), _s(), _s()), "group_size"),
    (_group(_s(), _s(logprobs=[-0.5])), "length_mismatch"),
    (_group(_s(), _s(loss_mask=[1])), "length_mismatch"),
    (_group(_s(prompt_ids=[]), _s(), prompt_ids=[]), "length_mismatch"),  # no context at all
    (_group(_s(), _s(tokens=[7, -1])), "token_out_of_vocab"),
    (_group(_s(), _s(tokens=[7, 100])), "token_out_of_vocab"),
    (_group(_s(), _s(prompt_ids=[100])), "token_out_of_vocab"),
    (_group(_s(), _s(), prompt_ids=[1, 100]), "token_out_of_vocab"),
    (_group(_s(), _s(tokens=[7] * 9, logprobs=[0.0] * 9, versions=[0] * 9)), "length_over_limit"),
    (_group(_s(), _s(prompt_ids=[1] * 31)), "length_over_limit"),  # 31 + 2 > 32 positions
    (_group(_s(), _s(reward=math.nan)), "reward_not_finite"),
    (_group(_s(), _s(reward=math.inf)), "reward_not_finite"),
    (_group(_s(), _s(), stats={"reward_mean": math.nan}), "reward_not_finite"),
    (_group(_s(), _s(reward=-0.5)), "reward_out_of_range"),
    (_group(_s(), _s(reward=1.01)), "reward_out_of_range"),
])
def test_each_check_names_its_reason(group, reason):
    assert impossible(group, LIMITS)[0] == reason


def test_possible_groups_pass_and_limits_come_from_declarations():
    # a multi-turn sample: turns of 8 trained tokens with context between are within the limit
    chain = _s(tokens=[7] * 8 + [9] * 3 + [7] * 8, logprobs=[-0.1] * 19, versions=[0] * 19,
               loss_mask=[1] * 8 + [0] * 3 + [1] * 8)
    assert impossible(_group(_s(), chain), LIMITS) is None
    assert impossible(_group(_s(reward=0.0), _s(reward=1.0)), LIMITS) is None
    assert impossible(_group(status="failed", error="engine"), LIMITS) is None  # dropped as failed anyway
    # the prompt bound needs the task's prompt (one token per byte, plus a little)
    assert impossible(_group(_s(), _s(), prompt_ids=[1] * 6), LIMITS, prompt_bytes=4) is None
    assert impossible(_group(_s(), _s(), prompt_ids=[1] * 7), LIMITS, prompt_bytes=4)[0] == "length_over_limit"
    # a task's own n_samples (the audit knows it) overrides the job's
    assert impossible(_group(_s(), _s(), _s()), LIMITS, n_samples=3) is None
    # what the workflows declare: the code test generator scores up to 2, the solvers retry
    testgen = get_workflow("code_solver_testgen")
    assert testgen.role_reward_range("test_generator") == (0.0, 2.0)
    assert testgen.group_size("solver", 4) == (4, 8) and testgen.turn_tokens({}, 8) == 24
    assert get_workflow("code_solver_selector").group_size("solver", 4) == (8, 8)
    assert get_workflow("rlvr").role_reward_range("solver", {"reward": "math_answer"}) == (0.0, 1.0)


# -- the audit's side, on logs built here (no broker) ----------------------------------------

def test_the_audit_checks_content_in_a_multi_policy_log_too():
    """A team episode owes each policy a group per role: the content check follows the
    groups through that bookkeeping (the task's own ``n_samples`` sets the sizes)."""
    from astraflow.chaos.invariants import JobLog, check
    from astraflow.topics import Batch, SourceOffset
    from astraflow.topics.messages import DataflowState

    roles = {"solver": "solver", "verifier": "verifier"}
    task = Task("t0000000-p", "p", "solver", "1+1=", "2", 2, roles=roles, train=["solver", "verifier"])
    limits = dataclasses.replace(LIMITS, group_sizes={"solver": (1, 2)}, reward_ranges={"solver": (0.0, 1.0)})
    group = TrajectoryGroup(task.task_id, "p", "solver", "raas", [1, 2], [_s(), _s(tokens=[7, 500])],
                            role="solver", role_policies=roles)
    batch = Batch("solver", 0, [group], [SourceOffset("af.x.trajectories", 0, 0)])
    state = DataflowState("solver", next_step=1, tasks_scheduled=1, groups_dropped=0)
    report = check(JobLog([task], [(0, 0, group)], [batch], [], state, limits=limits), 1, "solver")
    assert report.rejected_groups == {"token_out_of_vocab": 1}
    assert [v for v in report.violations if "impossible" in v] == [
        "batch 0: group t0000000-p at trajectories[0]@0 was trained, but its content is impossible: "
        "token_out_of_vocab: samples[1].tokens hold ids 7..500, outside the model's vocabulary [0, 100)"]
    # the same log read without limits: nothing to say about content
    assert check(JobLog([task], [(0, 0, group)], [batch], [], state), 1, "solver").ok
