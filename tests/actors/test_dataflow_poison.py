"""No record on ``trajectories`` or ``versions`` kills the dataflow, and none is retried.

Once a group whose reward was a string reached the dataflow's arithmetic (``TypeError``, six
in-process retries, then the process), and a 3 MB garbage record could not be dead-lettered
at all (its letter was over the producer's limit). The dataflow actor runs in the test's
thread against the real broker; the test answers tasks as a RaaS node would and writes the
poison with a raw producer. Each poison record gets one letter with its coordinates and
reason, the batch is still made from the valid groups, and a restarted dataflow writes no
second letter.
"""

from __future__ import annotations

import base64
import hashlib
import os

import orjson

from astraflow.topics import DeadLetter, Producer, Sample, TrajectoryGroup, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.replay import read_topic

from .conftest import Peers, drive, start_dataflow


def _group(task_id: str, **sample) -> dict:
    s = Sample([7, 8], [-0.5, -0.5], [0, 0], 1.0, "stop")
    data = orjson.loads(encode(TrajectoryGroup(task_id, task_id.split("-", 1)[1], "policy", "raas-x", [1, 2],
                                               [s]))[0])
    data["samples"][0].update(sample)
    return data


def test_poison_groups_and_announcements_are_dead_lettered_once_and_batching_goes_on(cfg, bootstrap):
    topics = job_topics(cfg)
    peers = Peers(cfg, bootstrap)
    raw = Producer(bootstrap, client_id="attacker", max_request_size=topics.max_message_bytes(topics.trajectories))
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: len(peers.tasks()) == 4, "4 tasks")
        t = peers.tasks()
        group = [("af-type", b"trajectory-group"), ("af-schema", b"2")]
        garbage = os.urandom(3 * 1024 * 1024)
        stats = _group(t[2])
        stats["stats"] = {"team_reward": "high"}
        poison = [  # (topic, value, headers, what the letter's error says)
            (topics.trajectories, orjson.dumps(_group(t[0], reward="lots")), group,
             "Sample.reward: expected float, got str"),
            (topics.trajectories, orjson.dumps(_group(t[1])).replace(b'"reward":1.0', b'"reward":1e999'), group,
             "value is not JSON"),
            (topics.trajectories, orjson.dumps(_group(t[2], logprobs=[-0.5])), group,
             "logprobs has 1 entries but tokens has 2"),
            (topics.trajectories, orjson.dumps(stats), group, "stats['team_reward'] is str"),
            (topics.trajectories, garbage, group, "value is not JSON"),
            (topics.versions, b"{]", [("af-type", b"version")], "value is not JSON"),
        ]
        for topic, value, headers, _ in poison:
            raw.send_raw(topic, value, key=b"policy", headers=headers, partition=0).get(30)
        peers.answer(t[0])
        peers.answer(t[1])
        drive(actor, lambda: actor.lead.ledger.next_step == 1, "batch 0 from the valid groups")
        (batch,) = [m for _, _, m in read_topic(bootstrap, topics.batches(cfg.policy))]
        assert sorted(g.task_id for g in batch.groups) == [t[0], t[1]]
        assert all(isinstance(s.reward, float) for g in batch.groups for s in g.samples)
        assert actor.dead.count == len(poison)
        letters = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
        assert len(letters) == len(poison)
        for letter, (topic, value, _, reason) in zip(sorted(letters, key=lambda x: (x.source_topic != topics.trajectories, x.offset)), poison):
            assert (letter.source_topic, letter.partition, letter.consumer) == (topic, 0, f"dataflow.{cfg.policy}")
            assert reason in letter.error, letter.error
            assert letter.value_size == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
            assert value.startswith(base64.b64decode(letter.value))
        assert [x.truncated for x in letters].count(True) == 1  # the 3 MB one: a prefix of it
        actor.teardown()

        actor = start_dataflow(cfg, bootstrap)
        for _ in range(10):  # re-reads versions from the start, and what lies past the committed offsets
            actor.step()
        assert actor.lead.ledger.next_step == 1
        assert actor.dead.count == 0 and actor.dead.repeats >= 1  # the versions poison, read again
        assert len([m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]) == len(poison)
    finally:
        actor.teardown()
        peers.close()
        raw.close()


def test_garbage_behind_the_dataflow_state_is_dead_lettered_and_the_state_before_it_is_read(bootstrap,
                                                                                             job_topics):
    """A restart reads the newest state record; one that does not decode is no state this code
    wrote: it goes to the DLQ and the search goes on behind it (once it failed every restart)."""
    import pytest

    from astraflow.actors.ledger import read_state
    from astraflow.topics import DeadLetters, DecodeError
    from astraflow.topics.messages import DataflowState
    topic = job_topics.dataflow_state("policy")
    producer = Producer(bootstrap, client_id="state")
    try:
        producer.send_sync(topic, DataflowState("policy", 3, 6, 0), key="policy")
        producer.send_raw(topic, b"{]", key=b"policy", headers=[("af-type", b"dataflow-state")]).get(10)
        with pytest.raises(DecodeError, match="does not decode"):
            read_state(bootstrap, topic, "policy")
        dead = DeadLetters(producer, job_topics.dlq, "dataflow.policy", recall=bootstrap)
        for _ in range(2):  # a second restart: the same record, no second letter
            state, _ = read_state(bootstrap, topic, "policy", dead_letters=dead)
            assert state == DataflowState("policy", 3, 6, 0)
        assert (dead.count, dead.repeats) == (1, 1)
        (letter,) = [m for _, _, m in read_topic(bootstrap, job_topics.dlq) if isinstance(m, DeadLetter)]
        assert (letter.source_topic, letter.offset) == (topic, 1)
    finally:
        producer.close()
