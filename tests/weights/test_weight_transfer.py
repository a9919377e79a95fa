"""Weight transfer on the real broker: publisher -> weights/versions topics -> subscribers.

The trainer here is plain torch AdamW on a small random Qwen3 in bf16 (real optimizer
steps, so the deltas have the sparsity of real training); the receiving engine is the
real CPU engine.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch
from kafka import KafkaConsumer, TopicPartition
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from transformers import Qwen3Config, Qwen3ForCausalLM

from astraflow.engines.cpu import CpuEngine
from astraflow.topics import ChunkReader, MissingChunkError, VersionAnnouncement
from astraflow.topics.codec import decode
from astraflow.weights import WeightPublisher, WeightPublishError, WeightSubscriber, publisher, read_latest_announcement
from astraflow.weights.codec import weights_digest
from tests.waiting import wait_until

CHUNK = 16 * 1024  # small chunks: every payload spans several records
WAIT = 30.0


def tiny_config() -> Qwen3Config:
    return Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       tie_word_embeddings=True, pad_token_id=0)


class Trainer:
    """Real AdamW steps on a tiny bf16 causal LM; `named_weights()` returns CPU copies."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = Qwen3ForCausalLM(tiny_config()).to(torch.bfloat16)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.gen = torch.Generator().manual_seed(seed)
        self.version = 0

    def step(self) -> None:
        ids = torch.randint(1, 96, (4, 16), generator=self.gen)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.version += 1

    def named_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def announcements(bootstrap: str, topic: str) -> list[tuple[VersionAnnouncement, dict[str, bytes]]]:
    tp = TopicPartition(topic, 0)
    kc = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    kc.assign([tp])
    kc.seek_to_beginning(tp)
    end, out = kc.end_offsets([tp])[tp], []
    while kc.position(tp) < end:
        for r in kc.poll(timeout_ms=2000).get(tp, []):
            out.append((decode(r.value, r.headers), dict(r.headers)))
    kc.close()
    return out


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter


def test_followers_late_joiners_and_gappy_nodes_hold_the_trainers_bits(bootstrap, job_topics, spans):
    tracer, exporter = spans
    trainer = Trainer()
    history = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=4, tracer=tracer, chunk_size=CHUNK)
    follower = WeightSubscriber(bootstrap, job_topics, "policy", node_id="follower", tracer=tracer).start()
    gappy = WeightSubscriber(bootstrap, job_topics, "policy", node_id="gappy").start()
    late_on_chain = late = None
    try:
        pub.publish(history[0], 0)
        for v in range(1, 11):
            trainer.step()
            history[v] = trainer.named_weights()
            with tracer.start_as_current_span("trainer.step") as step_span:
                # Odd versions pass the context, even ones rely on the caller's current span.
                pub.publish(history[v], v, otel_context.get_current() if v % 2 else None)
            pub.flush(WAIT)
            assert pub.last_announced == v
            # Step in lockstep so the followers really see every version on their own.
            for sub in (follower, late_on_chain):
                assert sub is None or sub.wait_for(v, WAIT), sub.faults
            if v == 2:
                assert gappy.wait_for(2, WAIT)
                gappy_weights = gappy.weights()
                gappy.close()
            if v == 7:
                # A node that holds version 5 missed deltas 6 and 7, which are still on the
                # chain (snapshot 4 + deltas 5, 6, 7): it catches up on deltas alone.
                late_on_chain = WeightSubscriber(bootstrap, job_topics, "policy", initial=history[5],
                                                 initial_version=5, node_id="on-chain").start()
                assert late_on_chain.wait_for(7, WAIT)
        # Back after missing 3..10 (snapshot 8 is newer than what it holds), and a new node.
        gappy = WeightSubscriber(bootstrap, job_topics, "policy", initial=gappy_weights, initial_version=2,
                                 node_id="gappy").start()
        late = WeightSubscriber(bootstrap, job_topics, "policy", node_id="late", tracer=tracer).start()
        for sub in (follower, gappy, late, late_on_chain):
            assert sub.wait_for(10, WAIT), (sub.node_id, sub.faults)
            assert sub.version == 10
            assert bits_equal(sub.weights(), history[10]), sub.node_id
            assert sub.digest() == weights_digest(history[10])
            assert sub.faults == []

        # The follower took one snapshot (it started with nothing) and then only deltas,
        # even across the snapshots at 4 and 8.
        assert follower.path_counts == {"snapshot": 1, "delta": 10}
        assert late_on_chain.path_counts == {"snapshot": 0, "delta": 2 + 3}  # 6 and 7, then 8..10
        assert gappy.path_counts == {"snapshot": 1, "delta": 2}  # snapshot 8, deltas 9 and 10
        assert late.path_counts == {"snapshot": 1, "delta": 2}

        # The real CPU engine receives the version atomically through apply_to.
        model = Qwen3ForCausalLM(tiny_config())
        engine = CpuEngine(model, version=0)
        assert late.apply_to(engine) == 10 and engine.version == 10
        assert late.apply_to(engine) is None  # nothing newer
        state = engine.model.state_dict()
        assert all(torch.equal(state[k], t.float()) for k, t in history[10].items())

        # Announcements: a delta for every version, plus snapshots at 0, 4 and 8; every
        # one carries the trace context of its weights.publish span.
        anns = announcements(bootstrap, job_topics.versions)
        kinds = [(a.version, a.kind) for a, _ in anns]
        assert kinds == [(0, "snapshot"), (1, "delta"), (2, "delta"), (3, "delta"), (4, "delta"), (4, "snapshot"),
                         (5, "delta"), (6, "delta"), (7, "delta"), (8, "delta"), (8, "snapshot"), (9, "delta"),
                         (10, "delta")]
        head = anns[-1][0]
        assert (head.snapshot_version, head.delta_versions, head.base_version) == (8, [9, 10], 9)
        assert head.checksum == weights_digest(history[10])
        publish_spans = {s.context.span_id: s for s in exporter.get_finished_spans() if s.name == "weights.publish"}
        for _, headers in anns:
            span_id = int(headers["traceparent"].decode().split("-")[2], 16)
            assert span_id in publish_spans
        last_publish = publish_spans[int(anns[-1][1]["traceparent"].decode().split("-")[2], 16)]
        assert last_publish.parent.span_id == step_span.get_span_context().span_id  # trainer step -> publish
        step_ids = {s.context.span_id for s in exporter.get_finished_spans() if s.name == "trainer.step"}
        assert sum(1 for s in publish_spans.values() if s.parent and s.parent.span_id in step_ids) == 10
        (apply_span,) = [s for s in exporter.get_finished_spans() if s.name == "raas.weights.apply"]
        assert apply_span.parent.span_id == last_publish.context.span_id  # publish -> apply, one trace

        # Retention: after snapshot 8 the log starts at snapshot 4's first chunk.
        snap4 = next(a for a, _ in anns if a.version == 4 and a.kind == "snapshot").snapshot_manifest
        snap0 = anns[0][0].snapshot_manifest
        tp = TopicPartition(job_topics.weights("policy"), 0)
        kc = KafkaConsumer(bootstrap_servers=bootstrap)
        assert kc.beginning_offsets([tp])[tp] == min(c.offset for c in snap4.chunks)  # its head is sent last
        kc.close()
        with ChunkReader(bootstrap) as reader:
            with pytest.raises(MissingChunkError, match="was deleted"):
                reader.read(snap0)
            assert len(reader.read(snap4)) == snap4.total_bytes
    finally:
        for sub in (follower, gappy, late, late_on_chain):
            if sub is not None:
                sub.close()
        pub.close()


def test_corrupt_chunk_is_detected_never_applied_and_recovered_through_a_snapshot(
        bootstrap, job_topics, make_producer, monkeypatch):
    bad = make_producer(compression_type=None)

    class WriterWithBadRecord(publisher.ChunkWriter):
        def close(self, head=None):
            manifest = super().close(head)
            if self._key != "3" or "-delta-" not in self.object_id:
                return manifest
            # A bad record with the same key and chunk headers, where the manifest points: what
            # a broken writer or a damaged log hands the reader. Chunk 0 is the payload's head.
            first = bytearray(head[: manifest.chunks[0].size])
            first[len(first) // 2] ^= 0x40
            md = bad.send_raw(self.topic, bytes(first), key=self._key, partition=0,
                              headers=[("af-object", self.object_id.encode()), ("af-chunk", b"0")]).get(10)
            chunks = [type(manifest.chunks[0])(md.partition, md.offset, manifest.chunks[0].size,
                                               manifest.chunks[0].digest), *manifest.chunks[1:]]
            return type(manifest)(manifest.object_id, manifest.topic, manifest.total_bytes, manifest.digest, chunks)

    monkeypatch.setattr(publisher, "ChunkWriter", WriterWithBadRecord)
    trainer = Trainer(seed=1)
    history = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=5, chunk_size=CHUNK)
    asked: list[tuple[str, int]] = []  # what a RaaS node would turn into a snapshot request
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-0",
                           on_fault=lambda report, held: asked.append((report, held))).start()
    model = Qwen3ForCausalLM(tiny_config())
    engine = CpuEngine(model, version=-1)
    engine_versions = []
    try:
        pub.publish(history[0], 0)
        for v in range(1, 6):
            trainer.step()
            history[v] = trainer.named_weights()
            pub.publish(history[v], v)
            pub.flush(WAIT)
            if v <= 2:
                assert sub.wait_for(v, WAIT)
            elif v in (3, 4):
                # Detected on the delta path and again on the snapshot path (snapshot 0's
                # chain runs through version 3): the node keeps version 2.
                wait_until(lambda: any(f"cannot reach version {v}" in f for f in sub.faults), WAIT, lambda: sub.faults)
                assert sub.version == 2
                assert bits_equal(sub.weights(), history[2])
            if sub.apply_to(engine) is not None:
                engine_versions.append(engine.version)
        # Version 5 comes with snapshot 5: the snapshot path recovers.
        assert sub.wait_for(5, WAIT), sub.faults
        assert bits_equal(sub.weights(), history[5])
        assert sub.apply_to(engine) == 5
        engine_versions.append(5)
        assert 3 not in engine_versions and 4 not in engine_versions
        recovered = "raas-0: recovered: reached version 5 through the snapshot path (snapshot 5)"
        wait_until(lambda: recovered in sub.faults, WAIT, lambda: sub.faults)
        faults = sub.faults
        assert any("CorruptChunkError" in f and "BLAKE3" in f and "version 3" in f for f in faults), faults
        assert faults[-1] == recovered
        assert sub.path_counts == {"snapshot": 2, "delta": 2}  # snapshots 0 and 5, deltas 1 and 2
        # every unrecovered fault was reported to the node with the version it held; the recovery was not
        assert asked and all(held == 2 for _, held in asked)
        assert all("recovered" not in report for report, _ in asked)
        # A node joining now never needs the bad chunk.
        late = WeightSubscriber(bootstrap, job_topics, "policy", node_id="late").start()
        assert late.wait_for(5, WAIT) and bits_equal(late.weights(), history[5]) and late.faults == []
        late.close()
    finally:
        sub.close()
        pub.close()


def test_restarted_publisher_continues_the_chain(bootstrap, job_topics, caplog):
    trainer = Trainer(seed=2)
    history = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    for v in range(0, 4):
        if v:
            trainer.step()
            history[v] = trainer.named_weights()
        pub.publish(history[v], v)
    pub.close()
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas").start()
    assert sub.wait_for(3, WAIT)

    restarted = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    try:
        assert restarted.last_announced == 3
        before = len(announcements(bootstrap, job_topics.versions))
        with caplog.at_level(logging.INFO, logger=publisher.__name__):
            restarted.publish(history[3], 3)  # the trainer resumed from the checkpoint of step 3
            altered = {k: t.clone() for k, t in history[3].items()}
            next(iter(altered.values())).view(torch.int16)[0] ^= 1
            restarted.publish(altered, 3)
            restarted.flush(WAIT)
        assert len(announcements(bootstrap, job_topics.versions)) == before  # nothing announced again
        assert "already announced" in caplog.text
        assert any(r.levelno == logging.WARNING and "digest" in r.getMessage() for r in caplog.records)

        trainer.step()
        history[4] = trainer.named_weights()
        restarted.publish(history[4], 4)
        restarted.flush(WAIT)
        head = read_latest_announcement(bootstrap, job_topics.versions, "policy")
        assert (head.version, head.kind, head.base_version, head.snapshot_version) == (4, "snapshot", 4, 4)
        assert sub.wait_for(4, WAIT) and bits_equal(sub.weights(), history[4])
        assert sub.path_counts == {"snapshot": 2, "delta": 3}  # 0+1..3, then snapshot 4
    finally:
        sub.close()
        restarted.close()


def test_a_failed_version_surfaces_on_the_next_call_and_is_never_announced(bootstrap, job_topics):
    pub = WeightPublisher(bootstrap, job_topics, "policy", chunk_size=CHUNK)
    try:
        pub.publish({"w": torch.zeros(4, dtype=torch.complex64)}, 0)  # the codec has no complex dtype
        with pytest.raises(WeightPublishError, match="version 0 was not published.*complex"):
            pub.flush(WAIT)
        assert pub.last_announced is None
        pub.publish({"w": torch.ones(4, dtype=torch.bfloat16)}, 1)
        pub.flush(WAIT)
        assert pub.last_announced == 1
        assert read_latest_announcement(bootstrap, job_topics.versions, "policy").kind == "snapshot"
    finally:
        pub.close()


def test_an_on_demand_subscriber_fetches_only_when_asked_and_jumps_to_the_snapshot(bootstrap, job_topics):
    """The evaluator's mode: it needs every `eval.every`-th version, not every delta."""
    trainer = Trainer()
    history = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=4, chunk_size=CHUNK)
    follower = WeightSubscriber(bootstrap, job_topics, "policy", node_id="follower").start()
    lazy = WeightSubscriber(bootstrap, job_topics, "policy", node_id="lazy", on_demand=True).start()
    try:
        pub.publish(history[0], 0)
        for v in range(1, 11):
            trainer.step()
            history[v] = trainer.named_weights()
            pub.publish(history[v], v)
            pub.flush(WAIT)
            assert follower.wait_for(v, WAIT), follower.faults
        time.sleep(1.0)  # the lazy one has seen every announcement by now, and fetched nothing
        assert lazy.version == -1 and lazy.path_counts == {"snapshot": 0, "delta": 0}
        assert not lazy.wait_for(11, 1.0)  # asking beyond the head fetches nothing either
        assert lazy.version == -1
        assert lazy.wait_for(10, WAIT), lazy.faults
        assert bits_equal(lazy.weights(), history[10]) and lazy.digest() == follower.digest()
        assert lazy.path_counts == {"snapshot": 1, "delta": 2}  # snapshot 8, deltas 9 and 10
        assert follower.path_counts == {"snapshot": 1, "delta": 10}
    finally:
        for sub in (follower, lazy):
            sub.close()
        pub.close()


def test_a_joining_subscriber_gives_each_decoded_tensors_payload_bytes_back(bootstrap, job_topics, monkeypatch):
    """The snapshot path never holds the payload whole beside the tensors it becomes."""
    from astraflow.weights import assembly
    from astraflow.topics import ReleasableBuffer

    buffers: list[ReleasableBuffer] = []
    calls: list[tuple[int, int]] = []

    class Recorded(ReleasableBuffer):
        def __init__(self, nbytes: int) -> None:
            super().__init__(nbytes)
            buffers.append(self)

        def release(self, start: int, end: int) -> None:
            calls.append((start, end))
            super().release(start, end)

    monkeypatch.setattr(assembly, "ReleasableBuffer", Recorded)
    gen = torch.Generator().manual_seed(5)
    named = {f"layer{i}.weight": torch.randn(256, 512, generator=gen).to(torch.bfloat16) for i in range(4)}
    pub = WeightPublisher(bootstrap, job_topics, "policy", chunk_size=CHUNK)
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="joiner").start()
    try:
        pub.publish(named, 0)
        pub.flush(WAIT)
        assert sub.wait_for(0, WAIT), sub.faults
        assert bits_equal(sub.weights(), named) and sub.path_counts == {"snapshot": 1, "delta": 0}
    finally:
        sub.close()
        pub.close()
    [buf] = buffers
    assert len(calls) == len(named)  # one range per tensor frame
    # every whole page of the tensor data went back: what stays is the head's page and, per
    # frame, at most the two pages it shares with its neighbours
    assert buf.nbytes > 500_000 and buf.released >= buf.nbytes - 2 * 4096 * len(named) - 4096


def test_a_subscriber_reads_chunks_while_they_are_written_and_checks_them_like_fetched_ones(
        bootstrap, job_topics):
    """Prefetch: chunks come from the tail of weights.<policy>, not a fetch after the announcement.

    A follower started before the first publish assembles every payload it needs (snapshot 0,
    then each delta) from prefetched chunks; one with prefetch off fetches them all; both
    hold the trainer's bits. Snapshot chunks of later versions are not kept by a follower.
    """
    trainer = Trainer(seed=3)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=3, chunk_size=CHUNK)
    on = WeightSubscriber(bootstrap, job_topics, "policy", node_id="prefetching", prefetch=True).start()
    off = WeightSubscriber(bootstrap, job_topics, "policy", node_id="fetching").start()
    try:
        # tailing before the first chunk is written
        wait_until(lambda: on._prefetcher is not None, WAIT, "the prefetcher never started")
        history = {0: trainer.named_weights()}
        pub.publish(history[0], 0)
        pub.flush(WAIT)
        for v in range(1, 5):
            assert on.wait_for(v - 1, WAIT) and off.wait_for(v - 1, WAIT)
            trainer.step()
            history[v] = trainer.named_weights()
            pub.publish(history[v], v)
            pub.flush(WAIT)
        for sub in (on, off):
            assert sub.wait_for(4, WAIT), sub.faults
            assert bits_equal(sub.weights(), history[4]) and sub.faults == []
        kinds = [(p.version, p.kind, p.chunks) for p in pub.published]
        needed = sum(chunks for v, kind, chunks in kinds if kind == "delta" or v == 0)
        assert on.path_counts == {"snapshot": 1, "delta": 4}
        assert on.prefetched_chunks == needed  # every chunk it read came from the tail
        assert off.prefetched_chunks == 0
        assert on._prefetcher is not None and on._prefetcher._bytes == 0  # snapshot 3 was not kept
    finally:
        on.close()
        off.close()
        pub.close()


def test_the_full_transport_publishes_a_snapshot_every_version_and_no_delta(bootstrap, job_topics):
    """`trainer.weight_transport: full` (write_deltas=False): every version a snapshot, and a
    follower reaches each one bit for bit through snapshots alone."""
    trainer = Trainer()
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=10, chunk_size=CHUNK, write_deltas=False)
    follower = WeightSubscriber(bootstrap, job_topics, "policy", node_id="follower").start()
    try:
        for v in range(4):
            if v:
                trainer.step()
            pub.publish(trainer.named_weights(), v)
            pub.flush(WAIT)
            assert follower.wait_for(v, WAIT), follower.faults
            assert bits_equal(follower.weights(), trainer.named_weights())
        assert [p.kind for p in pub.published] == ["snapshot"] * 4
        assert follower.path_counts["delta"] == 0 and follower.path_counts["snapshot"] >= 2
    finally:
        follower.close()
        pub.close()
