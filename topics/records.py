"""A consumer's fetched record batches, read by the C record reader (``_recordreader.c``).

kafka-python (3.0.12) turns each fetched batch into records in Python: for a record with four
headers, some fifteen varint calls, a ``DefaultRecord`` and a ``ConsumerRecord`` (~8 µs of the
~12.5 a plain kafka-python consumer spends on a 5 KB record). :func:`install` gives one
``KafkaConsumer`` a fetcher whose batches are checked as kafka-python checks them (the batch
CRC, aborted transactions under ``read_committed``, control batches skipped) and whose
message-format-v2 records are then read in one C pass into the same ``ConsumerRecord``
tuples: same offsets, timestamps, keys, values, headers and sizes, and the same fetch
position, counters and ``CorruptRecordError`` after the records before a broken one
(tests/topics/test_record_reader.py compares both readers on the same fetches).

It is used only where it was checked: the kafka-python version it was written against, a
consumer without deserializers, the reader built (``pip install`` compiles it; without a C
compiler it is skipped), and ``ASTRAFLOW_NATIVE`` not ``0``. Anywhere else kafka-python
reads the records itself. Every consumer :func:`~.security.consumer` makes is given it.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import kafka
from kafka.consumer.fetcher import ConsumerRecord, Fetcher
from kafka.errors import CorruptRecordError
from kafka.protocol.consumer import IsolationLevel

try:
    from . import _recordreader
except ImportError:  # built without a C compiler
    _recordreader = None

__all__ = ["available", "install"]

#: The kafka-python release whose fetcher internals (``PartitionRecords``, the record batch's
#: ``_buffer``/``_pos``) this module relies on.
KAFKA_PYTHON = "3.0.12"
_ABI = 1


def available() -> bool:
    """True when the C reader is built for this code and may be used here."""
    return (_recordreader is not None and getattr(_recordreader, "ABI", None) == _ABI
            and kafka.__version__ == KAFKA_PYTHON and os.environ.get("ASTRAFLOW_NATIVE", "1") != "0")


def install(kc: Any) -> Any:
    """Make ``kc`` (a ``KafkaConsumer``) read fetched batches with the C reader; returns
    ``kc``. Unchanged (kafka-python's own reading) when the reader is not :func:`available`
    or the fetcher is not the one this was written for. A consumer with deserializers gets it
    too: their records are read by kafka-python (:meth:`_PartitionRecords._unpack_records`)."""
    fetcher = getattr(kc, "_fetcher", None)
    if not available() or fetcher is None or getattr(fetcher, "PartitionRecords", None) is not Fetcher.PartitionRecords:
        return kc
    fetcher.PartitionRecords = _PartitionRecords  # the fetcher builds each fetch's reader as self.PartitionRecords
    return kc


class _PartitionRecords(Fetcher.PartitionRecords):
    """kafka-python's per-fetch reader, with records of v2 batches read by the C reader."""

    def _unpack_records(self, tp, records, key_deserializer, value_deserializer) -> Iterator[ConsumerRecord]:
        if key_deserializer is not None or value_deserializer is not None:  # the reader hands out bytes only
            yield from super()._unpack_records(tp, records, key_deserializer, value_deserializer)
            return
        read = _recordreader.read_records
        committed_only = self.isolation_level == IsolationLevel.READ_COMMITTED
        topic, partition = tp.topic, tp.partition
        last = None
        batch = records.next_batch()
        while batch is not None:
            last = batch
            if self.check_crcs and not batch.validate_crc():
                raise CorruptRecordError(
                    f"Record batch for partition {tp} at offset {batch.base_offset} failed crc check")
            if batch.magic < 2:
                yield from self._legacy(tp, batch)
                batch = records.next_batch()
                continue
            self.leader_epoch = batch.leader_epoch
            if committed_only and batch.has_producer_id():
                # transactions aborted before this batch ends: their producers' batches are dropped
                self._consume_aborted_transactions_up_to(batch.last_offset)
                if self._contains_abort_marker(batch):
                    self.aborted_producer_ids.discard(batch.producer_id)
                elif self._is_batch_aborted(batch):
                    self.next_fetch_offset = batch.next_offset
                    batch = records.next_batch()
                    continue
            if batch.is_control_batch:  # a transaction marker: never handed out
                self.next_fetch_offset = batch.next_offset
                batch = records.next_batch()
                continue
            batch._maybe_uncompress()
            rows, sizes, error = read(
                ConsumerRecord, batch._buffer, batch._pos, batch.records_count, batch.base_offset,
                batch.first_timestamp, batch.max_timestamp, batch.timestamp_type == batch.LOG_APPEND_TIME,
                topic, partition, self.leader_epoch)
            for record, size in zip(rows, sizes):
                self.records_read += 1
                self.bytes_read += size
                self.next_fetch_offset = record.offset + 1
                yield record
            if error is not None:
                raise CorruptRecordError(f"Found invalid record structure in partition {tp}: {error}")
            batch = records.next_batch()
        if last is not None and last.magic == 2:
            # v2 keeps a batch's last offset even when compaction removed its last records
            self.next_fetch_offset = last.next_offset
        self.drain()

    def _legacy(self, tp, batch) -> Iterator[ConsumerRecord]:
        """The records of a message format v0/v1 batch (brokers before Kafka 4), read by kafka-python."""
        for record in batch:
            if self.check_crcs and not record.validate_crc():
                raise CorruptRecordError(f"Record for partition {tp} at offset {record.offset} failed crc check")
            key, value = record.key, record.value
            self.records_read += 1
            self.bytes_read += record.size_in_bytes
            self.next_fetch_offset = record.offset + 1
            yield ConsumerRecord(tp.topic, tp.partition, self.leader_epoch, record.offset, record.timestamp,
                                 record.timestamp_type, key, value, record.headers, record.checksum,
                                 -1 if key is None else len(key), -1 if value is None else len(value), -1)
