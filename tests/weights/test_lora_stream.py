"""A LoRA policy's weight stream on the real broker: versions carry the adapter alone and
name their base; a node serving another base (or full weights) refuses them onto the
dead-letter topic and goes on. The trainer is the real DeepSpeed trainer with a peft
adapter on the ``smol_random`` model; the receiving engine is the real CPU engine."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the DeepSpeed trainer below runs on CPU

from astraflow.engines.cpu import CpuEngine  # noqa: E402
from astraflow.engines.lora import is_adapter_name  # noqa: E402
from astraflow.topics import ChunkReader, DeadLetter, DeadLetters  # noqa: E402
from astraflow.topics.replay import read_topic  # noqa: E402
from astraflow.weights import WeightPublisher, WeightSubscriber  # noqa: E402
from astraflow.weights.adapters import WRONG_BASE, base_digest  # noqa: E402
from astraflow.weights.codec import encode_snapshot, weights_digest  # noqa: E402
from astraflow.weights.format import read_table  # noqa: E402
from tests.engines.test_lora import LORA, make_trainer, rollout  # noqa: E402
from tests.waiting import wait_until  # noqa: E402
from tests.weights.test_weight_transfer import CHUNK, WAIT, announcements, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def trained(smol_random):
    """A LoRA trainer on smol_random and a batch rolled out from its base."""
    from transformers import AutoTokenizer

    batch = rollout(CpuEngine(smol_random), AutoTokenizer.from_pretrained(str(smol_random)))
    return make_trainer(smol_random), batch


def test_a_lora_version_carries_only_the_adapter_and_names_its_base(bootstrap, job_topics, smol_random, trained):
    trainer, batch = trained
    base = base_digest(smol_random)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=2, chunk_size=CHUNK, base_model=base)
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-0", base_model=base).start()
    engine = CpuEngine(smol_random, lora=LORA)
    try:
        pub.resume(trainer.named_weights(), trainer.step)
        start = trainer.step
        for _ in range(3):
            trainer.train_step(batch)
            pub.publish(trainer.named_weights(), trainer.step)
        pub.flush(WAIT)
        assert sub.wait_for(start + 3, WAIT), sub.faults
        adapter = trainer.named_weights()
        assert sub.digest() == weights_digest(adapter) and set(sub.weights()) == set(adapter)
        assert sub.apply_to(engine) == start + 3 and sub.faults == []

        anns = [a for a, _ in announcements(bootstrap, job_topics.versions)]
        assert anns and all(a.base_model == base for a in anns)
        kinds = {a.manifest.object_id: a.manifest for a in anns}
        kinds.update({a.snapshot_manifest.object_id: a.snapshot_manifest for a in anns})
        with ChunkReader(bootstrap) as reader:
            for manifest in kinds.values():  # every payload on the topic: snapshots and deltas
                _, entries = read_table(reader.read(manifest))
                assert entries and all(is_adapter_name(e.name) for e in entries), manifest.object_id
        assert {p.kind for p in pub.published} == {"snapshot", "delta"}
    finally:
        sub.close()
        pub.close()

    # Against a full snapshot of the model (what a full fine-tuning policy publishes), in the
    # same dtype: the adapter's share of the model's elements, with room for its tensor table.
    module = trainer.engine.module
    full = {k: v.detach().clone() for k, v in module.get_base_model().state_dict().items() if not is_adapter_name(k)}
    full_bytes = len(encode_snapshot(full, 0))
    share = sum(t.numel() for t in adapter.values()) / sum(t.numel() for t in full.values())
    lora_bytes = max(p.payload_bytes for p in pub.published if p.kind == "snapshot")
    assert lora_bytes / full_bytes <= 2 * share, (lora_bytes, full_bytes, share)
    assert share < 0.01  # (the bound above is then a real one)


def _letters(bootstrap: str, topic: str, consumer: str) -> list[DeadLetter]:
    return [m for _, _, m in read_topic(bootstrap, topic) if isinstance(m, DeadLetter) and m.consumer == consumer]


def test_a_version_for_another_base_is_refused_and_dead_lettered(bootstrap, job_topics, make_producer, smol_random,
                                                                 trained, tmp_path):
    from transformers import Qwen3ForCausalLM

    trainer, batch = trained
    same = tmp_path / "same-base"
    shutil.copytree(smol_random, same)  # another directory, the same weights: the same base
    other = tmp_path / "other-base"
    torch.manual_seed(1)
    Qwen3ForCausalLM(tiny_config()).save_pretrained(other)
    base = base_digest(smol_random)
    assert base_digest(same) == base and base_digest(other) != base

    pub = WeightPublisher(bootstrap, job_topics, "policy", chunk_size=CHUNK, base_model=base)
    refused: dict[str, list] = {"other": [], "full": []}

    def node(name: str, served: str) -> WeightSubscriber:
        dead = DeadLetters(make_producer(client_id=name), job_topics.dlq, name)
        return WeightSubscriber(bootstrap, job_topics, "policy", node_id=name, base_model=served, dead_letters=dead,
                                on_reject=refused.setdefault(name, []).append).start()

    subs = {"other": node("other", base_digest(other)), "full": node("full", ""), "same": node("same", base)}
    try:
        pub.resume(trainer.named_weights(), trainer.step)
        trainer.train_step(batch)
        pub.publish(trainer.named_weights(), trainer.step)
        pub.flush(WAIT)
        head = trainer.step
        assert subs["same"].wait_for(head, WAIT), subs["same"].faults
        engine = CpuEngine(same, lora=LORA)
        assert subs["same"].apply_to(engine) == head

        for name in ("other", "full"):  # both announcements refused, once each; nothing held, no fault
            sub = subs[name]
            wait_until(lambda: len(refused[name]) == 2, WAIT, lambda: sub.rejected)
            assert sub.rejected == {WRONG_BASE: 2} and sub.held() is None and sub.faults == []
            assert [r.version for r in refused[name]] == [head - 1, head]
            assert sub._thread.is_alive()
            letters = wait_until(lambda: (lambda got: len(got) == 2 and got)(_letters(bootstrap, job_topics.dlq, name)),
                                 WAIT, f"{name}: two dead letters")
            assert {(x.source_topic, x.error_type) for x in letters} == {(job_topics.versions, "WrongBaseError")}
            assert all(WRONG_BASE in x.error and base[:16] in x.error for x in letters)
        # A node waiting for a version it refused says why when its wait runs out.
        from astraflow.actors.engine_weights import EngineWeights
        from astraflow.engines.gate import EngineGate

        mine = CpuEngine(other)
        with pytest.raises(TimeoutError, match=r"did not arrive within 0s \(have 0\); versions refused: "
                                               r"\{'wrong_base': 2\}"):
            EngineWeights(subs["other"], mine, EngineGate(mine), "other").wait_for(head, 0.0, lambda: None)
        assert "this reader serves full weights" in _letters(bootstrap, job_topics.dlq, "full")[0].error
        assert "this reader's base is" in _letters(bootstrap, job_topics.dlq, "other")[0].error
        assert subs["same"].rejected == {}
    finally:
        for sub in subs.values():
            sub.close()
        pub.close()
