import dataclasses
import os

import pytest
from blake3 import blake3
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

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
    # a record from another object at the referenced offset: the offset does not hold the chunk
    # (as on a mirror), so the reader finds the genuine one by its timestamp and headers
    other = write_chunks(producer, topic, b"x" * (40 * KiB), object_id="other")
    foreign = dataclasses.replace(
        good, chunks=[good.chunks[0], dataclasses.replace(good.chunks[1], offset=other.chunks[0].offset),
                      good.chunks[2]])
    assert reader.read(foreign) == payload
    assert reader.located == 1
    # ... and when no record of the object carries that chunk, the foreign record is refused
    unknown = dataclasses.replace(good.chunks[1], offset=other.chunks[0].offset, digest="ee" * 32)
    chunks = [good.chunks[0], unknown, good.chunks[2]]
    nowhere = dataclasses.replace(good, chunks=chunks, digest=manifest_digest(chunks))
    with pytest.raises(CorruptChunkError, match="belongs to object"):
        reader.read(nowhere)
    assert reader.read(good) == payload  # the genuine chunks still read fine


def test_missing_chunks_are_detected(job_topics, bootstrap, make_producer, reader):
    topic = job_topics.weights("policy")
    producer = make_producer(compression_type=None)
    payload = os.urandom(50 * KiB)
    m = write_chunks(producer, topic, payload, chunk_size=20 * KiB)
    # a chunk written nowhere, named at an offset beyond the log (the others are at theirs: this
    # is the cluster the chunks were written to, so nothing is waited for)
    chunks = [*m.chunks[:2], dataclasses.replace(m.chunks[2], offset=10_000, digest="ee" * 32)]
    beyond = dataclasses.replace(m, chunks=chunks, digest=manifest_digest(chunks))
    with pytest.raises(MissingChunkError, match="chunk 2"):
        reader.read(beyond)
    # a chunk named at a wrong offset is found where it is
    moved = dataclasses.replace(m, chunks=[*m.chunks[:2], dataclasses.replace(m.chunks[2], offset=10_000)])
    assert reader.read(moved) == payload
    # retention deleting the head of the log: the first chunk is gone
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({TopicPartition(topic, 0): m.chunks[1].offset})
    finally:
        admin.close()
    with pytest.raises(MissingChunkError, match="was deleted"):
        reader.read(m)


def test_a_streamed_payload_with_its_head_sent_last_reads_back_in_payload_order(job_topics, make_producer, reader):
    from astraflow.topics import ChunkWriter
    from astraflow.topics.chunking import H_DATA_INDEX, H_INDEX
    from astraflow.topics.codec import header

    topic = job_topics.weights("policy")
    head, data = os.urandom(1000), os.urandom(5 * 40 * KiB + 17)
    writer = ChunkWriter(make_producer(compression_type=None), topic, chunk_size=40 * KiB, head_last=True,
                         object_id="streamed")
    for start in range(0, len(data), 7000):  # pieces that straddle chunk boundaries
        writer.write(data[start : start + 7000])
    m = writer.close(head=head)
    assert [c.size for c in m.chunks] == [1000] + [40 * KiB] * 5 + [17]
    assert m.chunks[0].offset > max(c.offset for c in m.chunks[1:])  # sent last, listed first
    assert reader.read(m) == head + data
    # Only the head chunk is numbered in af-chunk (replay scans the log for payload heads by it).
    kc = KafkaConsumer(bootstrap_servers=reader._kc.config["bootstrap_servers"], group_id=None)
    tp = TopicPartition(topic, 0)
    kc.assign([tp])
    kc.seek(tp, m.chunks[1].offset)
    seen = []
    while len(seen) < len(m.chunks):
        seen += [(header(r.headers, H_INDEX), header(r.headers, H_DATA_INDEX)) for r in kc.poll(3000).get(tp, [])]
    kc.close()
    assert seen[-1] == (b"0", None) and all(i is None and d is not None for i, d in seen[:-1])
    with pytest.raises(ValueError, match="head_last"):
        ChunkWriter(make_producer(), topic).close(head=b"x")


def test_a_releasable_buffer_is_filled_by_the_reader_and_gives_whole_pages_back(job_topics, make_producer, reader):
    import mmap

    from astraflow.topics import ReleasableBuffer

    payload = os.urandom(3 * 256 * KiB + 5000)
    m = write_chunks(make_producer(compression_type=None), job_topics.weights("policy"), payload,
                     chunk_size=256 * KiB)
    buf = ReleasableBuffer(len(payload))
    got = reader.read(m, into=buf.view)
    assert got is buf.view and bytes(buf.view) == payload
    page = mmap.PAGESIZE
    start, end = 100, 5 * page + 7  # pages 1..4 lie wholly inside; pages 0 and 5 are shared
    buf.release(start, end)
    assert buf.released == 4 * page
    after = bytes(buf.view)
    assert after[page : 5 * page] == bytes(4 * page)  # given back: reads as fresh zero pages
    assert after[:page] == payload[:page] and after[5 * page :] == payload[5 * page :]
    buf.release(len(payload) - 10, len(payload) + 10 * page)  # the tail page is partial: nothing to give
    assert buf.released == 4 * page
