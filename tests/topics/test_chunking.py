import dataclasses
import os

import pytest
from blake3 import blake3
from kafka import KafkaAdminClient, TopicPartition

from astraflow.topics import ChunkReader, CorruptChunkError, MissingChunkError, write_chunks
from astraflow.topics.chunking import manifest_digest

KiB = 1024


@pytest.fixture
def reader(bootstrap):
    r = ChunkReader(bootstrap, poll_timeout_ms=3000)
    yield r
    r.close()


def test_chunks_round_trip(job_topics, make_producer, reader):
    payload = os.urandom(3 * 256 * KiB + 123)
    topic = job_topics.weights("policy")
    m = write_chunks(make_producer(compression_type=None), topic, payload, chunk_size=256 * KiB, key="v1")
    assert len(m.chunks) == 4
    assert [c.size for c in m.chunks] == [256 * KiB] * 3 + [123]
    starts = [0, 256 * KiB, 512 * KiB, 768 * KiB]
    assert [c.digest for c in m.chunks] == [blake3(payload[s : s + c.size]).hexdigest() for s, c in zip(starts, m.chunks)]
    assert m.digest == manifest_digest(m.chunks)
    assert reader.read(m) == payload


def test_a_manifest_whose_chunk_list_was_altered_is_refused(job_topics, make_producer, reader):
    payload = os.urandom(3 * 40 * KiB)
    m = write_chunks(make_producer(compression_type=None), job_topics.weights("policy"), payload, chunk_size=40 * KiB)
    # Two chunks swapped: each still verifies on its own, the payload would come out scrambled.
    swapped = dataclasses.replace(m, chunks=[m.chunks[1], m.chunks[0], m.chunks[2]])
    with pytest.raises(CorruptChunkError, match="does not match its digest"):
        reader.read(swapped)
    assert reader.read(m) == payload


def test_default_chunks_fit_a_stock_1mib_record_limit(job_topics, make_producer, reader):
    payload = os.urandom(2 * 1024 * KiB + 5)
    m = write_chunks(make_producer(compression_type=None), job_topics.weights("policy"), payload)
    assert all(c.size < 1024 * KiB for c in m.chunks)
    assert reader.read(m) == payload


def test_empty_payload(job_topics, make_producer, reader):
    m = write_chunks(make_producer(), job_topics.weights("policy"), b"")
    assert reader.read(m) == b""


def test_corrupt_chunk_is_detected(job_topics, make_producer, reader):
    topic = job_topics.weights("policy")
    producer = make_producer(compression_type=None)
    payload = os.urandom(100 * KiB)
    good = write_chunks(producer, topic, payload, chunk_size=40 * KiB, key="v1", object_id="obj")
    # A record with the same key, object id and index but flipped bytes, as a bad writer would produce.
    bad_bytes = bytearray(payload[40 * KiB:80 * KiB])
    bad_bytes[7] ^= 0xFF
    md = producer.send_raw(topic, bytes(bad_bytes), key="v1", partition=0,
                           headers=[("af-object", b"obj"), ("af-chunk", b"1")]).get(10)
    tampered = dataclasses.replace(
        good, chunks=[good.chunks[0], dataclasses.replace(good.chunks[1], offset=md.offset), good.chunks[2]])
    with pytest.raises(CorruptChunkError, match=r"chunk 1 .*BLAKE3 digest"):
        reader.read(tampered)
    # a record from another object at the referenced offset is rejected too
    other = write_chunks(producer, topic, b"x" * (40 * KiB), object_id="other")
    foreign = dataclasses.replace(
        good, chunks=[good.chunks[0], dataclasses.replace(good.chunks[1], offset=other.chunks[0].offset),
                      good.chunks[2]])
    with pytest.raises(CorruptChunkError, match="belongs to object"):
        reader.read(foreign)
    assert reader.read(good) == payload  # the genuine chunks still read fine


def test_missing_chunks_are_detected(job_topics, bootstrap, make_producer, reader):
    topic = job_topics.weights("policy")
    producer = make_producer(compression_type=None)
    m = write_chunks(producer, topic, os.urandom(50 * KiB), chunk_size=20 * KiB)
    beyond = dataclasses.replace(m, chunks=[*m.chunks[:2], dataclasses.replace(m.chunks[2], offset=10_000)])
    with pytest.raises(MissingChunkError, match="chunk 2"):
        reader.read(beyond)
    # retention deleting the head of the log: the first chunk is gone
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): m.chunks[1].offset})
    finally:
        admin.close()
    with pytest.raises(MissingChunkError, match="was deleted"):
        reader.read(m)
