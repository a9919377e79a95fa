"""Signed announcements on the real broker: only the policy's trainer moves its weights or its epoch.

The attacks are the ones an audit ran: a ~800-byte announcement on ``versions`` claiming a
higher lineage epoch (which used to stall every node on a version that never comes), and a
snapshot of negated weights published with the project's own publisher under a newer epoch
(which used to reach every RaaS engine and fence the real trainer off). The trainer is the
real AdamW loop of test_weight_transfer.py; the RaaS engine is the real CPU engine.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from transformers import Qwen3ForCausalLM

from astraflow.engines.cpu import CpuEngine
from astraflow.topics import DeadLetter, DeadLetters
from astraflow.topics.replay import read_topic
from astraflow.weights import AnnouncementSigner, AnnouncementVerifier, WeightPublisher, WeightSubscriber
from astraflow.weights import read_latest_announcement, subscriber
from astraflow.weights.codec import weights_digest
from astraflow.weights.signing import H_SIG, H_SIGNER, ensure_key_pair, load_private_key, load_public_key
from tests.waiting import wait_until
from tests.weights.test_weight_transfer import CHUNK, WAIT, Trainer, announcements, bits_equal, tiny_config


def _keys(tmp_path, name: str) -> tuple[AnnouncementSigner, AnnouncementVerifier]:
    private, public = tmp_path / f"{name}.ed25519", tmp_path / f"{name}.ed25519.pub"
    assert ensure_key_pair(private, public)
    return AnnouncementSigner(load_private_key(private)), AnnouncementVerifier(load_public_key(public))


def _letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    return [m for _, _, m in read_topic(bootstrap, topic) if isinstance(m, DeadLetter)]


def test_a_forged_announcement_with_a_higher_epoch_is_dead_lettered_and_nodes_keep_the_real_lineage(
        bootstrap, job_topics, make_producer, tmp_path, caplog):
    signer, verifier = _keys(tmp_path, "policy")
    trainer = Trainer(seed=11)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK, signer=signer,
                          verifier=verifier)
    refused = []
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-0", verifier=verifier,
                           dead_letters=DeadLetters(make_producer(client_id="raas-0"), job_topics.dlq, "raas-0"),
                           on_reject=refused.append).start()
    forger = make_producer(client_id="forger")
    restarted = None
    try:
        pub.resume(trainer.named_weights(), 0)
        for v in (1, 2, 3):
            trainer.step()
            pub.publish(trainer.named_weights(), v)
        pub.flush(WAIT)
        assert sub.wait_for(3, WAIT) and (sub.epoch, sub.version) == (0, 3), sub.faults
        [(real, real_headers)] = [(a, h) for a, h in announcements(bootstrap, job_topics.versions)][-1:]
        assert real_headers[H_SIGNER] == signer.key_id.encode()

        # The same chain under a far higher epoch and version: unsigned, then with the real
        # record's signature copied onto it (a signature names its bytes, not its sender).
        forged = dataclasses.replace(real, epoch=real.epoch + 5, version=1000)
        first = forger.send_sync(job_topics.versions, forged, key="policy").offset
        second = forger.send_sync(job_topics.versions, forged, key="policy",
                                  headers=[(H_SIG, real_headers[H_SIG]), (H_SIGNER, real_headers[H_SIGNER])]).offset
        with caplog.at_level(logging.WARNING, logger=subscriber.__name__):
            # the count moves before the callback runs: wait for both
            wait_until(lambda: sum(sub.rejected.values()) == 2 and len(refused) == 2, WAIT, lambda: sub.rejected)
        assert sub.rejected == {"unsigned": 1, "bad_signature": 1}
        assert [(r.offset, r.reason, r.epoch, r.version) for r in refused] == [
            (first, "unsigned", 5, 1000), (second, "bad_signature", 5, 1000)]
        assert "refusing the announcement" in caplog.text

        # The job goes on: the next real version is followed, in the real epoch.
        trainer.step()
        pub.publish(trainer.named_weights(), 4)
        pub.flush(WAIT)
        assert sub.wait_for(4, WAIT, epoch=0) and (sub.epoch, sub.version) == (0, 4), sub.faults
        assert sub.digest() == weights_digest(trainer.named_weights()) and sub.faults == []

        letters = _letters(bootstrap, job_topics.dlq)
        assert [(d.source_topic, d.offset, d.error_type, d.consumer) for d in letters] == [
            (job_topics.versions, first, "SignatureError", "raas-0"),
            (job_topics.versions, second, "SignatureError", "raas-0")]
        assert letters[0].error.startswith("unsigned: ") and letters[1].error.startswith("bad_signature: ")

        # A restarted trainer reads past the forgeries too: it continues the real epoch.
        restarted = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK,
                                    signer=signer, verifier=verifier)
        assert (restarted.last_announced, restarted.epoch) == (4, 0)
        assert restarted.resume(trainer.named_weights(), 4) == 0
        # Unchecked, the same read is fooled: what the signature check prevents.
        assert read_latest_announcement(bootstrap, job_topics.versions, "policy").epoch == 5
    finally:
        for closable in (sub, restarted, pub):
            if closable is not None:
                closable.close()


def test_a_snapshot_signed_by_another_key_under_a_newer_epoch_never_reaches_the_engine(
        bootstrap, job_topics, make_producer, tmp_path):
    signer, verifier = _keys(tmp_path, "trainer")
    other, _ = _keys(tmp_path, "attacker")
    trainer = Trainer(seed=12)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK, signer=signer,
                          verifier=verifier)
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-0", verifier=verifier,
                           dead_letters=DeadLetters(make_producer(client_id="raas-0"), job_topics.dlq, "raas-0")
                           ).start()
    engine = CpuEngine(Qwen3ForCausalLM(tiny_config()), version=0)
    attacker = restarted = None
    try:
        pub.resume(trainer.named_weights(), 0)
        for v in (1, 2):
            trainer.step()
            pub.publish(trainer.named_weights(), v)
        pub.flush(WAIT)
        real2 = trainer.named_weights()
        assert sub.wait_for(2, WAIT) and sub.apply_to(engine) == 2

        # The project's own publisher, its own key, negated weights: it reads the head, finds
        # other weights than announced and opens epoch 1 with a snapshot, as a resume would.
        negated = {k: -t for k, t in real2.items()}
        attacker = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK,
                                   signer=other, producer_id="attacker")
        assert attacker.resume(negated, 2) == 1
        attacker.flush(WAIT)
        assert read_latest_announcement(bootstrap, job_topics.versions, "policy").epoch == 1  # it is on the topic
        wait_until(lambda: sub.rejected.get("wrong_key", 0) >= 1, WAIT, lambda: sub.rejected)
        assert sub.apply_to(engine) is None and engine.version == 2  # nothing newer to load
        assert (sub.epoch, sub.version) == (0, 2) and bits_equal(sub.weights(), real2)

        [letter] = _letters(bootstrap, job_topics.dlq)
        assert letter.error.startswith(f"wrong_key: signed by key {other.key_id}") and verifier.key_id in letter.error

        # The real trainer is not fenced off: its next version reaches the engine, and a
        # restart of it continues epoch 0 rather than opening one above the attacker's.
        trainer.step()
        pub.publish(trainer.named_weights(), 3)
        pub.flush(WAIT)
        assert sub.wait_for(3, WAIT, epoch=0) and sub.apply_to(engine) == 3
        assert sub.held_by(engine) == (0, 3, weights_digest(trainer.named_weights()))
        state = engine.model.state_dict()
        assert all(torch.equal(state[k], t.float()) for k, t in trainer.named_weights().items())
        restarted = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK,
                                    signer=signer, verifier=verifier)
        assert restarted.resume(trainer.named_weights(), 3) == 0
        assert sub.faults == []
    finally:
        for closable in (sub, restarted, attacker, pub):
            if closable is not None:
                closable.close()


def test_without_a_required_signature_unsigned_announcements_count_but_foreign_signatures_do_not(
        bootstrap, job_topics, make_producer, tmp_path):
    """``trainer.require_signatures: false`` (a job written before signing): unsigned records
    still count; one signed by another key still does not."""
    signer, _ = _keys(tmp_path, "trainer")
    other, _ = _keys(tmp_path, "other")
    lenient = AnnouncementVerifier(signer.public_key, require=False)
    trainer = Trainer(seed=13)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)  # unsigned
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-0", verifier=lenient).start()
    try:
        pub.resume(trainer.named_weights(), 0)
        pub.flush(WAIT)
        assert sub.wait_for(0, WAIT)
        [(head, _)] = announcements(bootstrap, job_topics.versions)
        forged = dataclasses.replace(head, epoch=3)
        make_producer(client_id="forger").send_sync(job_topics.versions, forged, key="policy",
                                                    headers=other.headers_for(job_topics.versions, forged))
        wait_until(lambda: sub.rejected == {"wrong_key": 1}, WAIT, lambda: sub.rejected)
        trainer.step()
        pub.publish(trainer.named_weights(), 1)
        pub.flush(WAIT)
        assert sub.wait_for(1, WAIT, epoch=0) and sub.epoch == 0
    finally:
        sub.close()
        pub.close()
