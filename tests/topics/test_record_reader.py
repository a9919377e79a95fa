"""The C record reader (topics/_recordreader.c, topics/records.py) against kafka-python's own:
the same ConsumerRecords from the same fetches of a real broker (compressed, transactional,
aborted, one record a poll), the same verdict on damaged batch bodies, no leaked references,
and kafka-python's reading wherever the reader must not be used."""

from __future__ import annotations

import random
import sys
import uuid

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.serializer import Deserializer

from astraflow.topics import TopicSpec, ensure_topics, records, security
from astraflow.topics.producer import Producer


def test_the_reader_is_built_and_used():
    assert records.available(), "topics/_recordreader.c was not built: reinstall (make install) with a C compiler"


def _records(null_header_values: bool = False) -> list[tuple]:
    """(key, value, headers): null keys and values, no headers, a non-ASCII header key,
    repeated and changing header values, a large value, and (which kafka-python's producer
    refuses to send) null header values."""
    rng = random.Random(7)
    out = []
    for i in range(300):
        key = None if i % 7 == 0 else f"k-{i}".encode()
        value = None if i % 31 == 5 and key is not None else bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 3, 200))))
        if i == 17:
            value = rng.randbytes(300_000)
        headers = [] if i % 5 == 0 else [("af-type", b"trajectory-group"), ("af-schema", b"3"),
                                         ("traceparent", f"00-{i:032x}-01".encode())]
        if i % 9 == 0:
            headers = headers + [("schlüssel", "wert-ü".encode())]
            if null_header_values:
                headers.append(("null-value", None))
        out.append((key, value, headers))
    return out


def _read(bootstrap: str, topic: str, n: int, reader: bool, max_records: int = 500) -> tuple[list, int]:
    """Every record of ``topic``'s partition 0 (read_committed) and the position after them."""
    kc = security.consumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                           isolation_level="read_committed", record_reader=reader)
    assert (kc._fetcher.PartitionRecords is records._PartitionRecords) == reader
    try:
        tp = TopicPartition(topic, 0)
        kc.assign([tp])
        kc.seek_to_beginning()
        got: list = []
        for _ in range(2000):
            for recs in kc.poll(2000, max_records=max_records).values():
                got += recs
            if len(got) >= n and kc.position(tp) >= kc.end_offsets([tp])[tp]:
                break
        return got, kc.position(tp)
    finally:
        kc.close()


@pytest.mark.parametrize("compression", ["zstd", None])
def test_the_reader_hands_out_what_kafka_python_does(bootstrap, compression):
    topic = f"af.rr{uuid.uuid4().hex[:8]}.{compression}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1, max_message_bytes=4 * 1024 * 1024)])
    kp = security.producer(bootstrap_servers=bootstrap, compression_type=compression, linger_ms=20,
                           max_request_size=4 * 1024 * 1024)
    sent = _records()
    for key, value, headers in sent:
        kp.send(topic, key=key, value=value, headers=headers, partition=0)
    kp.flush()
    kp.close()
    ours, ours_pos = _read(bootstrap, topic, len(sent), reader=True)
    theirs, their_pos = _read(bootstrap, topic, len(sent), reader=False)
    assert len(ours) == len(sent) and ours_pos == their_pos == len(sent)
    assert all(type(r) is ConsumerRecord for r in ours)
    assert ours == theirs  # all 13 fields: offsets, timestamps, keys, values, headers, sizes
    assert [(r.key, r.value, r.headers) for r in ours] == [(k, v, h) for k, v, h in sent]


def test_aborted_transactions_and_markers_are_skipped_as_kafka_python_skips_them(bootstrap):
    topic = f"af.rr{uuid.uuid4().hex[:8]}.txn"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    with Producer(bootstrap, transactional_id=f"rr-{uuid.uuid4().hex[:6]}") as p:
        for round_ in range(4):
            try:
                with p.transaction():
                    for i in range(25):
                        p.send_raw(topic, f"{round_}-{i}".encode(), key=f"k{i}", partition=0,
                                   headers=[("round", str(round_).encode())])
                    if round_ % 2:
                        raise RuntimeError("abort this one")
            except RuntimeError:
                pass
    ours, ours_pos = _read(bootstrap, topic, 50, reader=True, max_records=7)
    theirs, their_pos = _read(bootstrap, topic, 50, reader=False, max_records=7)
    assert ours == theirs and ours_pos == their_pos
    assert [r.value for r in ours] == [f"{r}-{i}".encode() for r in (0, 2) for i in range(25)]
    assert ours_pos > ours[-1].offset + 1  # past the last commit marker, which is never handed out


# -- batch bodies read directly: the same verdict as kafka-python's ---------------------------

def _batch(rows: list[tuple], compression: int = 0) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (key, value, headers) in enumerate(rows):
        b.append(i, timestamp=1_700_000_000_000 + 3 * i, key=key, value=value, headers=headers)
    return bytes(b.build())


def _theirs(batch: DefaultRecordBatch) -> tuple[list, str | None]:
    """kafka-python's reading of a batch: its records as (offset, timestamp, key, value, headers, size),
    and whether it ended in CorruptRecordError."""
    out = []
    try:
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value, r.headers, r.size_in_bytes))
    except CorruptRecordError as e:
        return out, str(e)
    return out, None


def _ours(batch: DefaultRecordBatch, topic="t", partition=0, epoch=-1) -> tuple[list, str | None]:
    batch._maybe_uncompress()
    rows, sizes, error = records._recordreader.read_records(
        ConsumerRecord, batch._buffer, batch._pos, batch.records_count, batch.base_offset, batch.first_timestamp,
        batch.max_timestamp, batch.timestamp_type == 1, topic, partition, epoch)
    return [(r.offset, r.timestamp, r.key, r.value, r.headers, s) for r, s in zip(rows, sizes)], error


def test_a_batch_body_reads_to_the_records_kafka_python_reads():
    body = _batch(_records(null_header_values=True)[:60])
    ours, error = _ours(DefaultRecordBatch(body))
    assert error is None
    assert ours == _theirs(DefaultRecordBatch(body))[0] and len(ours) == 60


def test_a_damaged_body_hands_out_the_records_before_the_damage_and_names_it():
    rows = [(b"k", b"v" * 10, [("h", b"x")]) for _ in range(5)]
    body = bytearray(_batch(rows))
    header = DefaultRecordBatch.HEADER_STRUCT.size
    truncated = DefaultRecordBatch(bytes(body[:-3]))
    ours, error = _ours(truncated)
    assert len(ours) == 4 and error == "record length runs past the end of its batch"
    assert ours == _theirs(DefaultRecordBatch(bytes(body[:-3])))[0]

    trailing = DefaultRecordBatch(bytes(body) + b"\x00\x00")
    ours, error = _ours(trailing)
    assert len(ours) == 5 and error == "bytes left after the batch's last record"
    assert _theirs(DefaultRecordBatch(bytes(body) + b"\x00\x00"))[1] is not None

    bad_key = bytearray(body)
    at = bad_key.index(b"h", header)  # the first record's header key
    bad_key[at] = 0xFF
    ours, error = _ours(DefaultRecordBatch(bytes(bad_key)))
    assert ours == [] and error == "header key is not UTF-8"
    theirs, their_error = _theirs(DefaultRecordBatch(bytes(bad_key)))
    assert theirs == [] and their_error is not None


def test_random_damage_never_crashes_and_agrees_with_kafka_python():
    rng = random.Random(11)
    body = _batch(_records(null_header_values=True)[:40])
    header = DefaultRecordBatch.HEADER_STRUCT.size
    disagreements = []
    for trial in range(3000):
        damaged = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(header, len(damaged))] = rng.getrandbits(8)
        if rng.random() < 0.2:
            damaged = damaged[:rng.randrange(header, len(damaged))]
        ours, our_error = _ours(DefaultRecordBatch(bytes(damaged)))
        theirs, their_error = _theirs(DefaultRecordBatch(bytes(damaged)))
        # (kafka-python reads a record's int8 attributes as a varint, the reader as the int8 the
        # protocol says; none of these damages falls where that would part them)
        if ours != theirs[:len(ours)] or (our_error is None) != (their_error is None):
            disagreements.append(trial)
    assert disagreements == []


def test_no_reference_is_leaked_on_success_or_damage():
    topic, epoch = "t-" + uuid.uuid4().hex, int("1234567890123")
    body = _batch(_records()[:30])
    before = sys.getrefcount(topic), sys.getrefcount(epoch)
    for cut in (0, 7, 400):
        for _ in range(50):
            out = _ours(DefaultRecordBatch(body[:len(body) - cut]), topic=topic, epoch=epoch)
            assert out[0] and (out[1] is None) == (cut == 0)
    del out
    assert (sys.getrefcount(topic), sys.getrefcount(epoch)) == before


def test_repeated_header_values_are_shared_not_copied():
    rows = [(None, b"v", [("af-type", b"trajectory-group"), ("traceparent", f"{i}".encode())]) for i in range(4)]
    ours, error = _ours(DefaultRecordBatch(_batch(rows)))
    assert error is None
    first, second = ours[0][4], ours[1][4]
    assert first[0][1] is second[0][1] and first[0][0] is second[0][0]  # the same af-type bytes and key str
    assert first[1][1] == b"0" and second[1][1] == b"1"


def test_kafka_python_reads_where_the_reader_must_not(bootstrap, monkeypatch):
    class Reversed(Deserializer):
        def deserialize(self, topic, headers, data):
            return data[::-1]

    topic = f"af.rr{uuid.uuid4().hex[:8]}.deser"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    with Producer(bootstrap) as p:
        for i in range(3):
            p.send_raw(topic, f"value-{i}".encode(), key=f"k{i}", partition=0).get(10)
    with_deserializer = security.consumer(bootstrap_servers=bootstrap, group_id=None, value_deserializer=Reversed(),
                                          key_deserializer=lambda b: b.decode())
    try:
        tp = TopicPartition(topic, 0)
        with_deserializer.assign([tp])
        with_deserializer.seek_to_beginning()
        got: list = []
        for _ in range(50):
            got += [r for recs in with_deserializer.poll(500).values() for r in recs]
            if len(got) >= 3:
                break
        # the C reader hands out bytes only: records a consumer deserializes are kafka-python's
        assert [(r.key, r.value) for r in got] == [(f"k{i}", f"value-{i}".encode()[::-1]) for i in range(3)]
    finally:
        with_deserializer.close()
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "0")
    assert not records.available()
    off = security.consumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        assert off._fetcher.PartitionRecords is not records._PartitionRecords
    finally:
        off.close()
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "1")
    monkeypatch.setattr(records, "KAFKA_PYTHON", "0.0.0")  # another kafka-python than the one it was checked on
    assert not records.available()
