"""The dataflow counts only signed versions: a forged lineage cannot stall or flood the schedule.

The real dataflow actor on the real broker, with the run's own key pair (what `astraflow
node` makes); the trainer is played by signed announcements, the forger by records written
straight to ``versions``.
"""

from __future__ import annotations

import uuid

from astraflow.actors.signing import signer_for, with_run_keys
from astraflow.config import JobConfig, from_dict
from astraflow.topics import ChunkManifest, DeadLetter, Metric, Producer, VersionAnnouncement, ensure_topics, job_topics
from astraflow.topics.replay import read_topic
from astraflow.weights.signing import H_SIG, H_SIGNER, AnnouncementSigner, ensure_key_pair, load_private_key

from .conftest import drive, start_dataflow

B, STALENESS, STEPS = 2, 1, 10


def _cfg(bootstrap, tmp_path) -> JobConfig:
    cfg = from_dict(JobConfig, {"job": f"signed-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path),
                                "dataflow": {"groups_per_batch": B, "max_staleness": STALENESS},
                                "trainer": {"steps": STEPS}, "kafka": {"trajectory_partitions": 1}})
    cfg = with_run_keys(cfg, tmp_path / "run")
    ensure_topics(bootstrap, job_topics(cfg).specs())
    return cfg


def _announcement(cfg: JobConfig, version: int, epoch: int = 0) -> VersionAnnouncement:
    manifest = ChunkManifest(f"v{version}", job_topics(cfg).weights(cfg.policy), 0, "", [])
    return VersionAnnouncement(cfg.policy, version, "snapshot", version, version, manifest, "digest", epoch=epoch)


def test_forged_versions_are_dead_lettered_counted_and_the_schedule_follows_the_real_trainer(bootstrap, tmp_path):
    cfg = _cfg(bootstrap, tmp_path)
    topics = job_topics(cfg)
    trainer = signer_for(cfg)
    producer = Producer(bootstrap, client_id="peers")
    actor = start_dataflow(cfg, bootstrap)
    try:
        def announce(ann: VersionAnnouncement, headers=None) -> int:
            return producer.send_sync(topics.versions, ann, key=cfg.policy, headers=headers).offset

        announce(real := _announcement(cfg, 1), trainer.headers_for(topics.versions, real))
        bound_at_1 = (1 + STALENESS + 1) * B
        drive(actor, lambda: actor.lead.version == 1 and actor.lead.ledger.tasks_scheduled == bound_at_1, "version 1",
              max_steps=100)

        # A far newer lineage: unsigned; with the real record's signature; signed by another key.
        stolen = trainer.headers_for(topics.versions, real)
        forged = _announcement(cfg, 1000, epoch=7)
        offsets = [announce(forged),
                   announce(forged, [h for h in stolen if h[0] in (H_SIG, H_SIGNER)]),
                   announce(forged, _other_signer(tmp_path).headers_for(topics.versions, forged))]
        drive(actor, lambda: sum(actor.versions_gate.rejected.values()) == 3, "the forgeries read", max_steps=100)
        assert actor.versions_gate.rejected == {"unsigned": 1, "bad_signature": 1, "wrong_key": 1}
        assert (actor.lead.epoch, actor.lead.version) == (0, 1)
        for _ in range(5):
            actor.step()
        assert actor.lead.ledger.tasks_scheduled == bound_at_1  # version 1000 would have opened the whole horizon

        # The real trainer's next version moves the bound: the job goes on.
        announce(real := _announcement(cfg, 2), trainer.headers_for(topics.versions, real))
        drive(actor, lambda: actor.lead.version == 2 and actor.lead.ledger.tasks_scheduled == (2 + STALENESS + 1) * B,
              "version 2", max_steps=100)

        letters = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
        assert [(d.source_topic, d.offset, d.consumer) for d in letters] == [
            (topics.versions, o, f"dataflow.{cfg.policy}") for o in offsets]
        assert [d.error.split(":")[0] for d in letters] == ["unsigned", "bad_signature", "wrong_key"]
        counted = [m for _, _, m in read_topic(bootstrap, topics.metrics)
                   if isinstance(m, Metric) and m.name == "dataflow.versions_rejected"]
        assert sorted(m.labels["reason"] for m in counted) == ["bad_signature", "unsigned", "wrong_key"]
    finally:
        actor.teardown()
        producer.close()


def _other_signer(tmp_path) -> AnnouncementSigner:
    ensure_key_pair(tmp_path / "other.ed25519", tmp_path / "other.ed25519.pub")
    return AnnouncementSigner(load_private_key(tmp_path / "other.ed25519"))
