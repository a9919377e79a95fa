"""MirrorMaker 2 between two real clusters, and chunks read where their offsets do not hold.

Home is the session's broker; the region is a second embedded broker with a real dedicated
MirrorMaker 2 process between them (one of each for the module: JVMs start slowly). The
mirror is what a region's nodes read weights from, so the weights published at home by the
real publisher must be found and verified there, from the manifests of the *mirrored*
``versions`` topic, although transaction markers shift the mirror's offsets.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import torch
from blake3 import blake3
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from astraflow.topics import (ChunkReader, EmbeddedBroker, JobTopics, MissingChunkError, Producer, ensure_topics,
                              write_chunks)
from astraflow.topics.chunking import H_DIGEST, H_INDEX, H_OBJECT, iter_slices, manifest_digest
from astraflow.topics.messages import ChunkManifest, ChunkRef
from astraflow.topics.mirror import MirrorMaker
from astraflow.topics.mirror_plan import MirrorPlan, mirrored_specs
from astraflow.topics import security
from astraflow.weights import WeightPublisher, WeightSubscriber, read_latest_announcement
from astraflow.weights.codec import weights_digest

KiB = 1024
CHUNK = 16 * KiB
SNAPSHOT_BYTES = 4 * 1024 * KiB


# -- fixtures: a region's cluster and the mirror into it ---------------------------------

@pytest.fixture(scope="module")
def region():
    broker = EmbeddedBroker(heap="384m", startup_timeout=180).start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def mirrored_job(bootstrap) -> JobTopics:
    topics = JobTopics(job="m" + uuid.uuid4().hex[:10], policies=("policy",), task_partitions=2,
                       trajectory_partitions=1)
    ensure_topics(bootstrap, topics.specs())
    return topics


@pytest.fixture(scope="module")
def mirror(bootstrap, region, mirrored_job, tmp_path_factory):
    plan = MirrorPlan.for_job(mirrored_job, source=("home", bootstrap), target=("regionb", region.bootstrap_servers),
                              snapshot_bytes=SNAPSHOT_BYTES, retention_ms=3 * 3600 * 1000)
    mm = MirrorMaker(plan, tmp_path_factory.mktemp("mm2"), startup_timeout=240)
    mm.start()
    try:
        yield mm
    finally:
        mm.close()


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(192, 64, generator=g).to(torch.bfloat16),
            "proj": torch.randn(64, 64, generator=g).to(torch.bfloat16)}


def step(named: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A sparse update, like a training step's in bf16."""
    g = torch.Generator().manual_seed(seed)
    out = {k: v.clone() for k, v in named.items()}
    flat = out["embed"].view(-1)
    idx = torch.randint(0, flat.numel(), (300,), generator=g)
    flat[idx] = flat[idx] + torch.randn(300, generator=g).to(torch.bfloat16) * 0.01
    return out


def records(bootstrap: str, topic: str, isolation_level: str) -> list:
    tp = TopicPartition(topic, 0)
    kc = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                       isolation_level=isolation_level, max_partition_fetch_bytes=8 * 1024 * KiB)
    try:
        kc.assign([tp])
        kc.seek_to_beginning(tp)
        end, out = kc.end_offsets([tp])[tp], []
        deadline = time.monotonic() + 30
        while kc.position(tp) < end and time.monotonic() < deadline:
            for batch in kc.poll(timeout_ms=1000).values():
                out += batch
        return out
    finally:
        kc.close()


# -- the plan ----------------------------------------------------------------------------

def test_the_plan_mirrors_one_way_exactly_once_with_its_own_bound(tmp_path):
    topics = JobTopics(job="plan", policies=("a", "b"))
    plan = MirrorPlan.for_job(topics, source=("home", "h:1"), target=("west", "w:1"), snapshot_bytes=1000,
                              keep_snapshots=3)
    path = plan.write(tmp_path / "mm2.properties", rest_port=1234)
    text = path.read_text()
    props = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    assert props["home->west.enabled"] == "true" and props["west->home.enabled"] == "false"
    assert props["west.exactly.once.source.support"] == "enabled"
    assert props["home.consumer.isolation.level"] == "read_committed"
    assert props["replication.policy.class"].endswith("IdentityReplicationPolicy")
    assert props["sync.topic.configs.enabled"] == "false"
    assert props["emit.checkpoints.enabled"] == props["emit.heartbeats.enabled"] == "false"
    # a Java regex of exactly the weight topics, escaped for java.util.Properties
    assert props["home->west.topics"] == r"af\\.plan\\.versions|af\\.plan\\.weights\\.a|af\\.plan\\.weights\\.b"
    assert plan.matches("af.plan.weights.a") and not plan.matches("af.plan.tasks.a")
    assert not plan.matches("af.plan.control") and not plan.matches("af.plan.trajectories")
    specs = {s.name: s for s in plan.target_specs}
    assert specs["af.plan.weights.a"].configs()["retention.bytes"] == "3000"
    assert specs["af.plan.weights.a"].retention_ms > 0
    assert specs["af.plan.versions"].cleanup_policy == "compact"
    assert all(s.configs()["message.timestamp.type"] == "CreateTime" for s in specs.values())


def test_a_plan_without_a_bound_or_with_two_topic_selections_is_refused():
    topics = JobTopics(job="plan")
    home = next(s for s in topics.specs() if s.name == topics.weights("policy"))  # retention -1 / -1 at home
    with pytest.raises(ValueError, match=f"{topics.weights('policy')} has retention.ms=-1"):
        MirrorPlan("home", "h:1", "west", "w:1", topics=(home.name,), target_specs=(home,))
    with pytest.raises(ValueError, match="exactly one of topics"):
        MirrorPlan("home", "h:1", "west", "w:1", topics=("x",), topics_regex="x.*")
    with pytest.raises(ValueError, match="source_alias"):
        MirrorPlan("home->x", "h:1", "west", "w:1", topics=("x",))
    with pytest.raises(ValueError, match="snapshot_bytes"):
        mirrored_specs(topics, snapshot_bytes=0)


# -- reading where offsets do not hold (no mirror needed) --------------------------------

def _chunk_records(payload: bytes, object_id: str, chunk_size: int) -> list[tuple[bytes, list]]:
    out = []
    for i, piece in enumerate(iter_slices(payload, chunk_size)):
        value = bytes(piece)
        out.append((value, [("af-type", b"chunk"), (H_OBJECT, object_id.encode()), (H_INDEX, str(i).encode()),
                            (H_DIGEST, blake3(value).hexdigest().encode())]))
    return out


def _manifest_elsewhere(object_id: str, topic: str, chunks: list[tuple[bytes, list]], t0_ms: int) -> ChunkManifest:
    """A manifest as the home cluster wrote it: offsets that do not hold on this cluster."""
    refs = [ChunkRef(0, 10_000_000 + i, len(v), blake3(v).hexdigest()) for i, (v, _) in enumerate(chunks)]
    return ChunkManifest(object_id, topic, sum(r.size for r in refs), manifest_digest(refs), refs,
                         first_timestamp_ms=t0_ms, last_timestamp_ms=t0_ms + 60_000)


def test_chunks_announced_before_they_arrive_are_waited_for_and_copies_are_skipped(job_topics, bootstrap):
    topic = job_topics.weights("policy")
    payload = os.urandom(5 * 10 * KiB)
    chunks = _chunk_records(payload, "obj-late", 10 * KiB)
    manifest = _manifest_elsewhere("obj-late", topic, chunks, int(time.time() * 1000))
    producer = Producer(bootstrap, compression_type=None)
    reader = ChunkReader(bootstrap, poll_timeout_ms=500, arrival_timeout_s=60)
    got: dict[str, object] = {}
    try:
        t = threading.Thread(target=lambda: got.update(payload=reader.read(manifest)), daemon=True)
        t.start()
        time.sleep(1.5)
        assert t.is_alive(), "the reader gave up before the chunks arrived"
        # as an at-least-once mirror delivers them: the first two, the same two again, the rest
        for value, headers in [*chunks[:2], *chunks[:2], *chunks[2:]]:
            producer.send_raw(topic, value, partition=0, headers=headers).get(10)
        t.join(60)
        assert got.get("payload") == payload
        assert reader.located == len(chunks) and reader.duplicates == 2
    finally:
        reader.close()
        producer.close()


def test_chunks_that_never_arrive_fail_with_a_clear_error_after_the_bound(job_topics, bootstrap):
    chunks = _chunk_records(os.urandom(3 * KiB), "obj-never", KiB)
    manifest = _manifest_elsewhere("obj-never", job_topics.weights("policy"), chunks, int(time.time() * 1000))
    with ChunkReader(bootstrap, poll_timeout_ms=300, arrival_timeout_s=1.5) as reader:
        t0 = time.monotonic()
        with pytest.raises(MissingChunkError, match=r"did not arrive .* within 2s .*MirrorMaker"):
            reader.read(manifest)
        assert time.monotonic() - t0 >= 1.5


def test_a_time_lookup_that_lands_on_a_transaction_marker_still_finds_the_chunks(job_topics, bootstrap):
    """On a mirror, records are written in transactions: a commit marker carries the time of the
    commit, later than the records copied after it were written at home. The time lookup may
    name that marker; the chunks behind it are still found (not taken for deleted)."""
    from kafka import KafkaProducer

    topic = job_topics.weights("policy")
    now = int(time.time() * 1000)
    kp = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"marker-{uuid.uuid4().hex}")
    try:
        kp.init_transactions()
        kp.begin_transaction()
        kp.send(topic, b"earlier", partition=0, timestamp_ms=now - 20_000)
        kp.commit_transaction()  # its marker is stamped now
        chunks = _chunk_records(os.urandom(3 * KiB), "obj-behind-marker", KiB)
        kp.begin_transaction()
        for value, headers in chunks:  # written at home 10 s ago, copied only now
            kp.send(topic, value, partition=0, headers=headers, timestamp_ms=now - 10_000)
        kp.commit_transaction()
    finally:
        kp.close()
    manifest = _manifest_elsewhere("obj-behind-marker", topic, chunks, now - 10_000)
    manifest = ChunkManifest(manifest.object_id, topic, manifest.total_bytes, manifest.digest, manifest.chunks,
                             first_timestamp_ms=now - 10_000, last_timestamp_ms=now - 10_000)
    with ChunkReader(bootstrap, poll_timeout_ms=500, arrival_timeout_s=5) as reader:
        assert reader.read(manifest) == b"".join(v for v, _ in chunks)
        assert reader.located == len(chunks)


# -- through a real MirrorMaker 2 --------------------------------------------------------

def test_weights_published_at_home_are_verified_from_the_regions_mirror(bootstrap, region, mirrored_job, mirror):
    history = [weights(1)]
    for v in range(1, 4):
        history.append(step(history[-1], 100 + v))
    pub = WeightPublisher(bootstrap, mirrored_job, "policy", snapshot_every=2, chunk_size=CHUNK)
    try:
        for v, named in enumerate(history):
            pub.publish(named, v)
            pub.flush(60)
            time.sleep(0.3)  # separate publishes: MirrorMaker copies them in separate transactions
    finally:
        pub.close()
    lags = mirror.wait_caught_up(90)
    weights_tp = TopicPartition(mirrored_job.weights("policy"), 0)
    assert lags[weights_tp].mirrored == lags[weights_tp].source_end > 0
    # transaction markers take offsets on the mirror: its log is longer than the home one
    assert lags[weights_tp].target_end > lags[weights_tp].source_end

    head = read_latest_announcement(region.bootstrap_servers, mirrored_job.versions, "policy")
    assert head is not None and head.version == 3
    chain = [head.snapshot_manifest, *head.deltas, head.manifest]
    with ChunkReader(region.bootstrap_servers, poll_timeout_ms=1000) as there, \
            ChunkReader(bootstrap, poll_timeout_ms=1000) as home:
        for m in chain:
            assert there.read(m) == home.read(m)
        assert home.located == 0  # at home every offset holds: the fast path
        assert there.located > 0  # on the mirror some do not: found by time and headers

    # a node of the region that joins now loads the newest version from its own cluster
    late = WeightSubscriber(region.bootstrap_servers, mirrored_job, "policy", node_id="late-b").start()
    try:
        assert late.wait_for(3, timeout=90), late.faults
        assert late.digest() == weights_digest(history[3])
        assert not late.faults
    finally:
        late.close()


def test_an_aborted_transaction_at_home_never_crosses(bootstrap, region, mirrored_job, mirror):
    topic = mirrored_job.weights("policy")
    tag = uuid.uuid4().hex.encode()
    producer = Producer(bootstrap, transactional_id=f"mirror-test-{tag.decode()}", compression_type=None)
    try:
        with pytest.raises(RuntimeError, match="abort me"):
            with producer.transaction():
                for i in range(3):
                    producer.send_raw(topic, b"aborted-" + tag + str(i).encode(), partition=0)
                producer.flush(10)
                raise RuntimeError("abort me")
        with producer.transaction():
            producer.send_raw(topic, b"committed-" + tag, partition=0)
    finally:
        producer.close()
    mirror.wait_caught_up(90)
    for level in ("read_committed", "read_uncommitted"):
        values = [r.value for r in records(region.bootstrap_servers, topic, level) if r.value and tag in r.value]
        assert values == [b"committed-" + tag], level  # the aborted ones were never even copied
    at_home = [r.value for r in records(bootstrap, topic, "read_uncommitted") if r.value and tag in r.value]
    assert len(at_home) == 4  # they are in the home log, only aborted


def test_the_mirrored_weights_topic_has_its_own_retention(region, mirrored_job, mirror):
    admin = security.admin(bootstrap_servers=region.bootstrap_servers, client_id="mirror-test")
    try:
        cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, mirrored_job.weights("policy"))])
    finally:
        admin.close()
    entries = cfg["topic"][mirrored_job.weights("policy")]
    assert entries["retention.ms"]["value"] == str(3 * 3600 * 1000)
    assert entries["retention.bytes"]["value"] == str(4 * SNAPSHOT_BYTES)  # keep_snapshots x snapshot


@pytest.mark.slow
def test_sigkill_of_mirrormaker_mid_stream_loses_nothing(bootstrap, region, mirrored_job, mirror):
    topic = mirrored_job.weights("policy")
    producer = Producer(bootstrap, compression_type=None)
    manifests: list[tuple[ChunkManifest, bytes]] = []
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set() and i < 200:
            payload = os.urandom(6 * CHUNK + 17)
            manifests.append((write_chunks(producer, topic, payload, chunk_size=CHUNK,
                                           object_id=f"chaos-{i}"), payload))
            i += 1
            time.sleep(0.05)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(3)
        mirror.kill()  # SIGKILL mid-stream: what it had not committed is copied again
        time.sleep(2)  # ... and the home cluster goes on taking weights meanwhile
    finally:
        stop.set()
        writer.join(60)
        producer.close()
    mirror.start()
    assert mirror.starts == 2 and len(manifests) > 20
    mirror.wait_caught_up(120)
    with ChunkReader(region.bootstrap_servers, poll_timeout_ms=1000, arrival_timeout_s=30) as reader:
        for m, payload in manifests:
            assert reader.read(m) == payload, m.object_id
    # every chunk record on the mirror, by object and digest: copies there are only read once
    seen: dict[tuple[bytes, bytes], int] = {}
    for r in records(region.bootstrap_servers, topic, "read_committed"):
        obj = dict(r.headers or []).get(H_OBJECT, b"")
        if obj.startswith(b"chaos-"):
            key = (obj, dict(r.headers).get(H_DIGEST, b""))
            seen[key] = seen.get(key, 0) + 1
    assert len(seen) == sum(len({c.digest for c in m.chunks}) for m, _ in manifests)
    duplicates = sum(n - 1 for n in seen.values())
    print(f"mirror duplicates after SIGKILL: {duplicates} (exactly-once source: expected 0); "
          f"reader skipped {reader.duplicates}")
