"""Replay and export on the real broker, without a job run: what a job recorded, and bad input.

The long end-to-end tests (a real job, then replays of it) are in ``tests/e2e/test_replay.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kafka import KafkaAdminClient, TopicPartition

from astraflow.cli import _overrides, main
from astraflow.replay.recorded import RecordError, read_batches, recorded_versions
from astraflow.topics import Batch
from astraflow.weights import WeightPublisher
from astraflow.weights.codec import tensor_hashes, weights_digest
from tests.weights.test_weight_transfer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def job_config(tmp_path: Path, job: str) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
    data.update(job=job, run_dir=str(tmp_path / "runs"))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def last_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


def test_recorded_versions_hold_every_announced_digest_and_the_tensor_hashes_still_on_the_log(bootstrap, job_topics):
    trainer = Trainer()
    weights = {0: trainer.named_weights()}
    # Tiny chunks: a payload's header and tensor table span several records.
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=2, chunk_size=512, producer_id="t")
    pub.resume(weights[0], 0)
    for v in range(1, 5):
        trainer.step()
        weights[v] = trainer.named_weights()
        pub.publish(weights[v], v)
    pub.flush(timeout=60)
    pub.close()
    rec = recorded_versions(bootstrap, job_topics, "policy")
    assert {v: rec[v].digest for v in weights} == {v: weights_digest(w) for v, w in weights.items()}
    assert all(rec[v].epoch == 0 for v in weights)
    # The publisher trimmed everything before the previous snapshot (v2): v0 and v1 are
    # known by their announcements only; v2..v4 also by the payloads' tensor tables.
    for v in (2, 3, 4):
        assert rec[v].tensors == {k: h.hex() for k, h in tensor_hashes(weights[v]).items()}, v
        assert "weights" in rec[v].sources
    assert rec[0].tensors is None and rec[1].tensors is None


def test_replay_of_an_unknown_job_names_it_and_the_jobs_there(bootstrap, job_topics, tmp_path, capsys):
    rc = main(["replay", "--job", "no-such-job", "--bootstrap-servers", bootstrap,
               "--config", str(job_config(tmp_path, "no-such-job"))])
    assert rc == 3
    line = last_error(capsys)
    assert line.startswith("astraflow: error: no job 'no-such-job'")
    assert "af.no-such-job.batches.policy does not exist" in line and job_topics.job in line


def test_export_of_an_unknown_job_is_one_clear_line(bootstrap, tmp_path, capsys):
    rc = main(["export", "--job", "no-such-job", "--bootstrap-servers", bootstrap, "--out", str(tmp_path / "x")])
    assert rc == 3
    assert "no job 'no-such-job'" in last_error(capsys)
    assert not (tmp_path / "x").exists()


def test_replay_of_batches_trimmed_by_retention_says_which_offsets_are_gone(bootstrap, job_topics, make_producer,
                                                                            tmp_path, capsys):
    topic = job_topics.batches("policy")
    p = make_producer()
    for step in range(4):
        p.send_sync(topic, Batch("policy", step, [], []), key=str(step))
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): 2})
    finally:
        admin.close()
    rc = main(["replay", "--job", job_topics.job, "--bootstrap-servers", bootstrap,
               "--config", str(job_config(tmp_path, job_topics.job)), "--run-dir", str(tmp_path / "replay")])
    assert rc == 3
    assert f"{topic}: offsets 0..1 were deleted by retention (the log starts at 2)" in last_error(capsys)
    # From a checkpoint's offset that is gone, the same; from one that is kept, the batches.
    with pytest.raises(RecordError, match="offsets 1..1 were deleted"):
        list(read_batches(bootstrap, topic, offset=1, step=1))
    assert [(o, b.step) for o, b in read_batches(bootstrap, topic, offset=2, step=2)] == [(2, 2), (3, 3)]
    with pytest.raises(RecordError, match=f"{topic}@3 holds step 3 where step 5 was expected"):
        list(read_batches(bootstrap, topic, offset=3, step=5))


def test_replay_needs_the_config_and_changes_only_trainer_settings(bootstrap, job_topics, tmp_path, capsys):
    base = ["replay", "--job", job_topics.job, "--bootstrap-servers", bootstrap]
    assert main(base) == 2  # a bad command line
    assert "needs --config: a job's topics record its batches and weights, not its config" in last_error(capsys)
    assert main([*base, "--config", str(job_config(tmp_path, job_topics.job)), "--set", "rollout.temperature=0.5"]) == 2
    assert "replay --set rollout.temperature: a replay changes only trainer.engine.* and eval.* keys" in \
        last_error(capsys)


def test_a_checkpoint_path_that_holds_no_checkpoint_is_named(bootstrap, job_topics, make_producer, tmp_path, capsys):
    make_producer().send_sync(job_topics.batches("policy"), Batch("policy", 0, [], []), key="0")
    rc = main(["replay", "--job", job_topics.job, "--bootstrap-servers", bootstrap,
               "--config", str(job_config(tmp_path, job_topics.job)), "--from-checkpoint", str(tmp_path / "nothing")])
    assert rc == 3
    assert f"--from-checkpoint {tmp_path / 'nothing'}: not a checkpoint" in last_error(capsys)


def test_set_reads_scientific_notation_as_a_number():
    # YAML 1.1 would hand the config loader the string '1e-3' (a type error for trainer.engine.lr).
    assert _overrides(["trainer.engine.lr=1e-3", "trainer.engine.loss=m2po", "eval.k=2"]) == {
        "trainer.engine.lr": 1e-3, "trainer.engine.loss": "m2po", "eval.k": 2}
