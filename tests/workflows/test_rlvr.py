"""The ``rlvr`` workflow as a RaaS node runs it (the episode runner): a task's samples depend
on (job seed, task id, sample index) only."""

from __future__ import annotations

import threading

import torch

from astraflow.actors.episodes import EpisodeRunner
from astraflow.topics import Task
from astraflow.workflows.seeds import sample_seed, task_seeds

from .test_episodes import CountingEngine  # the real engine, counting the rows of each call

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8}


def task(task_id: str, prompt: str, answer: str, n: int = 4, sampling: dict = SAMPLING) -> Task:
    return Task(task_id, f"p-{task_id}", "policy", prompt, answer, n, sampling)


def roll_out(tok, engine, tasks, seed: int, batch_invariant: bool = False) -> list:
    """One group per task (the one-role workflow trains its one role), as a node's poll makes them."""
    runner = EpisodeRunner("policy", "raas-test", engine, tok, seed, engine_lock=threading.Lock(),
                           batch_invariant=batch_invariant)
    try:
        out = runner.roll_out(tasks)
    finally:
        runner.close()
    assert all(len(groups) == 1 and groups[0].status == "ok" for groups in out)
    return [groups[0] for groups in out]


def values(group) -> tuple:
    """Everything of a group that must be reproducible (not timestamps or the node id)."""
    return (group.task_id, group.prompt_ids, group.scheduled_version,
            [(s.tokens, s.logprobs, s.versions, s.reward, s.finish_reason, s.text) for s in group.samples])


def test_sample_seeds_are_a_stable_hash_of_job_seed_task_and_index():
    # Pinned: a salted hash() or a changed derivation would silently change every rollout.
    assert sample_seed(0, "t0000003-p3", 0) == sample_seed(0, "t0000003-p3", 0) == 184066467463303164
    seeds = task_seeds(0, "t0000003-p3", 8)
    assert len(set(seeds)) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert task_seeds(1, "t0000003-p3", 8) != seeds
    assert task_seeds(0, "t0000004-p3", 8) != seeds


def test_a_group_does_not_depend_on_the_tasks_sharing_its_poll(tokenizer_and_engine):
    tok, engine = tokenizer_and_engine
    a, b, c = task("ta", "12+34=", "46"), task("tb", "7+5=", "12", n=3), task("tc", "98+76=12 and 3+4=", "7")
    alone = roll_out(tok, engine, [a], 7, batch_invariant=True)[0]
    first = roll_out(tok, engine, [a, b, c], 7, batch_invariant=True)
    last = roll_out(tok, engine, [c, b, a], 7, batch_invariant=True)
    # Byte-identical, logprob bits included, wherever the task sits in the poll.
    assert values(first[0]) == values(alone) == values(last[2])
    assert values(first[1]) == values(last[1]) and values(first[2]) == values(last[0])
    assert len({tuple(s.tokens) for s in alone.samples}) > 1  # samples differ from each other
    other_job = roll_out(tok, engine, [a], 8, batch_invariant=True)[0]
    assert [s.tokens for s in other_job.samples] != [s.tokens for s in alone.samples]


def test_one_call_for_all_tasks_samples_the_same_tokens(tokenizer_and_engine):
    """One call for all tasks (the default) trades the logprob bits, not the seeds, for throughput."""
    tok, engine = tokenizer_and_engine
    tasks = [task("ta", "12+34=", "46"), task("tb", "7+5=", "12"), task("tc", "98+76=12 and 3+4=", "7")]
    isolated = roll_out(tok, engine, tasks, 3, batch_invariant=True)
    batched = roll_out(tok, engine, tasks, 3)
    for g, h in zip(isolated, batched):
        assert [s.tokens for s in g.samples] == [s.tokens for s in h.samples]
        for s, t in zip(g.samples, h.samples):
            torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-4, rtol=1e-4)
    # Tasks of other sampling settings in one poll: one call per setting, rows in poll order.
    counting = CountingEngine(engine)
    mixed = [tasks[0], task("td", "1+1=", "2", n=2, sampling=dict(SAMPLING, temperature=0.5)), tasks[1]]
    groups = roll_out(tok, counting, mixed, 3)
    assert counting.calls == [4 + 4, 2]
    assert [s.tokens for s in groups[0].samples] == [s.tokens for s in batched[0].samples]
    assert [s.tokens for s in groups[2].samples] == [s.tokens for s in batched[1].samples]
