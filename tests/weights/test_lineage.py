"""Lineage epochs on the real broker: a trainer that resumes behind the announced head.

The "trainer" is plain AdamW on a tiny bf16 Qwen3 (as in test_weight_transfer.py); a
resume from an older checkpoint is played by restoring an earlier copy of the model and
optimizer and training on other data, which gives the other history a GPU retrain would.
"""

from __future__ import annotations

import copy
import logging

import torch
from transformers import Qwen3ForCausalLM

from astraflow.engines.cpu import CpuEngine
from astraflow.weights import WeightPublisher, WeightSubscriber, read_latest_announcement, subscriber
from astraflow.weights.codec import weights_digest
from tests.waiting import wait_until
from tests.weights.test_weight_transfer import CHUNK, WAIT, Trainer, announcements, bits_equal, tiny_config


def _fork(trainer: Trainer, seed: int) -> Trainer:
    """The trainer as restored from a checkpoint, fed other data from here on."""
    other = copy.deepcopy(trainer)
    other.gen = torch.Generator().manual_seed(seed)
    return other


def test_a_resume_behind_the_head_opens_a_new_epoch_that_every_node_follows(bootstrap, job_topics, caplog):
    trainer = Trainer(seed=3)
    old = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    follower = WeightSubscriber(bootstrap, job_topics, "policy", node_id="follower").start()
    engine = CpuEngine(Qwen3ForCausalLM(tiny_config()), version=0)
    new_pub = late = None
    try:
        assert pub.resume(old[0], 0) == 0
        checkpoint = None
        for v in range(1, 7):
            trainer.step()
            old[v] = trainer.named_weights()
            if v == 4:
                checkpoint = copy.deepcopy(trainer)  # the last checkpoint before the crash
            pub.publish(old[v], v)
        pub.flush(WAIT)
        assert follower.wait_for(6, WAIT) and follower.apply_to(engine) == 6

        # The trainer crashed after announcing 5 and 6 and resumes from its checkpoint at 4.
        resumed = _fork(checkpoint, seed=99)
        new = {4: resumed.named_weights()}
        assert bits_equal(new[4], old[4])
        new_pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
        assert new_pub.last_announced == 6
        assert new_pub.resume(new[4], 4) == 1
        for v in (5, 6, 7):
            resumed.step()
            new[v] = resumed.named_weights()
            new_pub.publish(new[v], v)
        new_pub.flush(WAIT)
        assert not bits_equal(new[6], old[6])  # another history: the old 5 and 6 are discarded
        final = weights_digest(new[7])

        # A zombie of the old epoch goes on announcing; nobody may follow it.
        with caplog.at_level(logging.WARNING, logger=subscriber.__name__):
            trainer.step()
            pub.publish(trainer.named_weights(), 7)
            pub.flush(WAIT)
            late = WeightSubscriber(bootstrap, job_topics, "policy", node_id="late").start()
            for sub in (follower, late):
                assert sub.wait_for(7, WAIT, epoch=1), (sub.node_id, sub.faults)
                assert (sub.epoch, sub.version, sub.digest()) == (1, 7, final), sub.node_id
                assert bits_equal(sub.weights(), new[7])
            wait_until(lambda: "ignoring version 7 of lineage epoch 0" in caplog.text, WAIT,
                       "no log of version 7 ignored")
        assert follower.faults == [] and late.faults == []
        head = read_latest_announcement(bootstrap, job_topics.versions, "policy")
        assert (head.epoch, head.version, head.checksum) == (1, 7, final)

        # The engine held version 6 of epoch 0 and now rolls out with the new lineage.
        assert follower.apply_to(engine) == 7 and engine.version == 7
        assert follower.held_by(engine) == (1, 7, final)
        state = engine.model.state_dict()
        assert all(torch.equal(state[k], t.float()) for k, t in new[7].items())

        # Epoch 1 starts with a snapshot of the resumed version; its versions are contiguous.
        anns = [a for a, _ in announcements(bootstrap, job_topics.versions)]
        epoch1 = [(a.version, a.kind) for a in anns if a.epoch == 1]
        assert epoch1 == [(4, "snapshot"), (5, "delta"), (6, "delta"), (7, "delta")]
        assert [a.version for a in anns if a.epoch == 0 and a.kind == "delta"] == [1, 2, 3, 4, 5, 6, 7]
        assert anns[-1].epoch == 0  # the zombie's announcement is the newest record, and was ignored
    finally:
        for closable in (follower, late, new_pub, pub):
            if closable is not None:
                closable.close()


def test_a_node_behind_the_fork_moves_down_to_the_new_epoch(bootstrap, job_topics):
    """A node on version 6 of epoch 0 must drop to version 4 of epoch 1 at once, not wait for 7."""
    trainer = Trainer(seed=4)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas").start()
    engine = CpuEngine(Qwen3ForCausalLM(tiny_config()), version=0)
    new_pub = None
    try:
        pub.resume(trainer.named_weights(), 0)
        for v in range(1, 7):
            trainer.step()
            if v == 4:
                checkpoint = copy.deepcopy(trainer)
            pub.publish(trainer.named_weights(), v)
        pub.close()
        assert sub.wait_for(6, WAIT) and sub.apply_to(engine) == 6
        new_pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
        resumed = _fork(checkpoint, seed=7)
        assert new_pub.resume(resumed.named_weights(), 4) == 1
        new_pub.flush(WAIT)
        assert sub.wait_for(4, WAIT, epoch=1), sub.faults
        assert (sub.epoch, sub.version) == (1, 4)
        assert sub.digest() == weights_digest(resumed.named_weights())
        assert sub.path_counts == {"snapshot": 2, "delta": 6}
        assert sub.apply_to(engine) == 4 and engine.version == 4  # lower number, newer lineage
        assert sub.held_by(engine).epoch == 1
        state = engine.model.state_dict()
        assert all(torch.equal(state[k], t.float()) for k, t in resumed.named_weights().items())
    finally:
        sub.close()
        if new_pub is not None:
            new_pub.close()


def test_a_resume_at_the_announced_head_continues_the_epoch_with_deltas(bootstrap, job_topics):
    trainer = Trainer(seed=5)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    pub.resume(trainer.named_weights(), 0)
    for v in (1, 2):
        trainer.step()
        pub.publish(trainer.named_weights(), v)
    pub.close()
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas").start()
    restarted = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    try:
        assert sub.wait_for(2, WAIT)
        assert restarted.resume(trainer.named_weights(), 2) == 0  # checkpoint == announced head
        trainer.step()
        restarted.publish(trainer.named_weights(), 3)
        restarted.flush(WAIT)
        head = read_latest_announcement(bootstrap, job_topics.versions, "policy")
        assert (head.epoch, head.version, head.kind, head.base_version) == (0, 3, "delta", 2)
        assert sub.wait_for(3, WAIT) and sub.digest() == weights_digest(trainer.named_weights())
        assert sub.path_counts == {"snapshot": 1, "delta": 3}  # no second snapshot

        # Same version, other weights (a non-deterministic retrain to the head): a new epoch.
        again = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
        altered = trainer.named_weights()
        next(iter(altered.values())).view(torch.int16)[0] ^= 1
        assert again.resume(altered, 3) == 1
        again.close()
        assert sub.wait_for(3, WAIT, epoch=1) and sub.digest() == weights_digest(altered)
    finally:
        sub.close()
        restarted.close()
