"""Read a topic from its beginning (or its last records) as a plain ``read_committed`` client.

For audits, status and tools: no consumer group, no commits; only what was committed
exists. Records that do not decode are skipped here — consumers on the hot path send them
to the dead-letter topic instead.
"""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition

from . import security
from .codec import decode
from .exceptions import DecodeError
from .messages import Message


def read_topic(bootstrap_servers: str, topic: str, *, tail: int | None = None,
               idle_polls: int = 5, uncommitted: bool = False, timestamps: bool = False,
               headers: bool = False) -> list[tuple]:
    """``(partition, offset, message)`` of every committed record (or of the last ``tail`` per
    partition); ``uncommitted`` also reads records of open and aborted transactions,
    ``timestamps`` adds each record's timestamp (ms): ``(partition, offset, ts, message)``;
    ``headers`` adds the record's headers last: ``(partition, offset, message, headers)``."""
    c = security.consumer(bootstrap_servers=bootstrap_servers,
                          isolation_level="read_uncommitted" if uncommitted else "read_committed",
                          enable_auto_commit=False, client_id="astraflow-replay",
                          max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        if not tps:
            return []
        ends = c.end_offsets(tps)
        begins = c.beginning_offsets(tps)
        if not tail:
            return _drain(c, {tp: begins[tp] for tp in tps}, ends, idle_polls, timestamps, headers)
        # Transaction markers take offsets too (a transactional topic's last offset is one), so
        # the last `tail` offsets can hold fewer records: widen the window until they are found.
        out: list[tuple] = []
        for tp in tps:
            span = tail
            while True:
                start = max(begins[tp], ends[tp] - span)
                got = _drain(c, {tp: start}, ends, idle_polls, timestamps, headers)
                if len(got) >= tail or start == begins[tp]:
                    out.extend(got[-tail:])
                    break
                span *= 2
        return out
    finally:
        c.close()


def _drain(c: KafkaConsumer, starts: dict[TopicPartition, int], ends: dict[TopicPartition, int],
           idle_polls: int, timestamps: bool, headers: bool = False) -> list[tuple]:
    """Read ``starts``' partitions from those offsets to ``ends``, decoding what decodes."""
    c.assign(list(starts))
    for tp, offset in starts.items():
        c.seek(tp, offset)
    out: list[tuple] = []
    idle = 0
    while any(c.position(tp) < ends[tp] for tp in starts) and idle < idle_polls:
        batch = c.poll(1000)
        idle = 0 if batch else idle + 1
        for records in batch.values():
            for r in records:
                try:
                    msg = decode(r.value, r.headers)
                    row = (r.partition, r.offset, r.timestamp, msg) if timestamps else (r.partition, r.offset, msg)
                    out.append((*row, list(r.headers or ())) if headers else row)
                except DecodeError:
                    pass
    return out
