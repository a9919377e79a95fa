"""No record on ``batches.<policy>`` or ``control`` kills the trainer, and none is retried.

The trainer actor runs in the test's thread (``setup`` / ``step`` / ``teardown``, the calls
its pykka loop makes) with its real engine on the tiny model, against the real broker. The
test plays the dataflow and an attacker: it writes valid batches with a producer and the
poison the audit found with a raw one — a step of -1, a repeat of a trained step, a gap,
token ids outside the vocabulary, a string reward, 5 MB of garbage, ``{]`` on ``control``.
Each is dead-lettered with its coordinates and reason, the next valid batch is trained,
and a restarted trainer, which reads the same records again (no checkpoint yet), writes
no second letter and trains the same steps.
"""

from __future__ import annotations

import base64
import hashlib
import os
import uuid

import orjson
import pytest

from astraflow.actors.trainer import ModelLimits, TrainerActor, refusal
from astraflow.config import JobConfig, from_dict
from astraflow.topics import Batch, DeadLetter, Producer, Sample, SourceOffset, TrajectoryGroup, ensure_topics, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.registry import BATCH_RECORD_MAX_BYTES
from astraflow.topics.replay import read_topic

from .conftest import drive


@pytest.fixture
def cfg(bootstrap, tmp_path) -> JobConfig:
    cfg = from_dict(JobConfig, {"job": f"poison-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path),
                                "trainer": {"steps": 3, "checkpoint_every": 100, "snapshot_every": 100,
                                            "engine": {"threads": 1}}})
    ensure_topics(bootstrap, job_topics(cfg).specs())
    from astraflow.actors.signing import with_run_keys
    return with_run_keys(cfg, tmp_path)  # the trainer signs with the run's key, as in a job


def batch(step: int, token: int = 7, reward: float = 1.0, policy: str = "policy") -> Batch:
    samples = [Sample([token, 8], [-0.5, -0.5], [step, step], r, "stop") for r in (reward, 0.0)]
    group = TrajectoryGroup(f"task-{step}-{token}", f"p-{step}", policy, "raas-test", [1, 2], samples)
    return Batch(policy, step, [group], [SourceOffset("af.x.trajectories", 0, step)])


def _letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    return [m for _, _, m in read_topic(bootstrap, topic) if isinstance(m, DeadLetter)]


def test_poison_batches_and_control_records_are_dead_lettered_once_and_training_goes_on(cfg, bootstrap,
                                                                                        tmp_path):
    topics = job_topics(cfg)
    batches = topics.batches(cfg.policy)
    feeder = Producer(bootstrap, client_id="dataflow-stand-in")
    raw = Producer(bootstrap, client_id="attacker", max_request_size=BATCH_RECORD_MAX_BYTES)
    garbage = os.urandom(5 * 1024 * 1024)
    string_reward = orjson.loads(encode(batch(1))[0])
    string_reward["groups"][0]["samples"][0]["reward"] = "lots"
    poison = [  # (value, headers, what the letter's error says)
        (encode(batch(-1))[0], [("af-type", b"batch"), ("af-schema", b"2")], "step is -1"),
        (encode(batch(0, token=9))[0], [("af-type", b"batch")], "step 0 was trained already"),
        (encode(batch(5))[0], [("af-type", b"batch")], "step 5 leaves a gap"),
        (encode(batch(1, token=104))[0], [("af-type", b"batch")], "outside the model's vocabulary of 104"),
        (orjson.dumps(string_reward), [("af-type", b"batch")], "Sample.reward: expected float, got str"),
        (garbage, [("af-type", b"batch")], "value is not JSON"),
    ]
    actor = TrainerActor(None, "trainer", cfg, bootstrap, str(tmp_path / "run"))
    try:
        feeder.send_sync(batches, batch(0), key="0")
        for value, headers, _ in poison:
            raw.send_raw(batches, value, key=b"x", headers=headers).get(30)
        raw.send_raw(topics.control, b"{]", key=b"x").get(30)
        feeder.send_sync(batches, batch(1), key="1")
        actor.setup()
        drive(actor, lambda: actor.engine.step == 2, "step 2: batches 0 and 1 trained past the poison", max_steps=200)
        assert actor.dead.count == len(poison) + 1
        lineage = [s for s, _ in actor.lineage]
        assert lineage == [0, 1]  # the repeat of step 0 and the forgeries of step 1 were not trained
        letters = _letters(bootstrap, topics.dlq)
        by_offset = {(x.source_topic, x.offset): x for x in letters}
        assert len(by_offset) == len(letters) == len(poison) + 1
        for offset, (value, _, reason) in enumerate(poison, start=1):
            letter = by_offset[(batches, offset)]
            assert reason in letter.error, letter.error
            assert (letter.partition, letter.consumer, letter.value_size) == (0, "trainer.policy", len(value))
            assert letter.value_sha256 == hashlib.sha256(value).hexdigest()
            kept = base64.b64decode(letter.value)
            assert value.startswith(kept) and letter.truncated == (len(kept) < len(value))
        big = by_offset[(batches, len(poison))]
        assert big.truncated and len(base64.b64decode(big.value)) < 100_000  # a prefix, not 5 MB
        control = by_offset[(topics.control, 0)]
        assert control.error_type == "DecodeError" and base64.b64decode(control.value) == b"{]"
        actor.teardown()

        # No checkpoint yet: the restarted trainer reads every record again from offset 0.
        actor = TrainerActor(None, "trainer", cfg, bootstrap, str(tmp_path / "run"))
        actor.setup()
        drive(actor, lambda: actor.engine.step == 2, "step 2 again after the restart", max_steps=200)
        assert [s for s, _ in actor.lineage] == [0, 1]
        assert actor.dead.count == 0 and actor.dead.repeats == len(poison) + 1
        assert len(_letters(bootstrap, topics.dlq)) == len(poison) + 1  # no record was dead-lettered twice
    finally:
        actor.teardown()
        feeder.close()
        raw.close()


def test_a_batch_refused_for_what_only_the_trainer_knows():
    limits = ModelLimits(vocab=104)
    assert refusal(batch(3), "policy", 3, limits) == ""
    assert "policy 'other'" in refusal(batch(3, policy="other"), "policy", 3, limits)
    assert "was trained already" in refusal(batch(2), "policy", 3, limits)
    assert "leaves a gap" in refusal(batch(4), "policy", 3, limits)
    assert "ids 8..104" in refusal(batch(3, token=104), "policy", 3, limits)
    assert "at least 4" in refusal(batch(3), "policy", 3, limits, min_samples=4)
    no_context = batch(3)
    object.__setattr__(no_context.groups[0], "prompt_ids", [])
    assert "no context" in refusal(no_context, "policy", 3, limits)
