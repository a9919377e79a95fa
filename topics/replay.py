"""Read a topic from its beginning (or its last records) as a plain ``read_committed`` client.

For audits, status and tools: no consumer group, no commits; only what was committed
exists. Records that do not decode are skipped here — consumers on the hot path send them
to the dead-letter topic instead.
"""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition

from .codec import decode
from .exceptions import DecodeError
from .messages import Message


def read_topic(bootstrap_servers: str, topic: str, *, tail: int | None = None,
               idle_polls: int = 5, uncommitted: bool = False, timestamps: bool = False) -> list[tuple]:
    """``(partition, offset, message)`` of every committed record (or of the last ``tail`` per
    partition); ``uncommitted`` also reads records of open and aborted transactions,
    ``timestamps`` adds each record's timestamp (ms): ``(partition, offset, ts, message)``."""
    c = KafkaConsumer(bootstrap_servers=bootstrap_servers,
                      isolation_level="read_uncommitted" if uncommitted else "read_committed",
                      enable_auto_commit=False, client_id="astraflow-replay",
                      max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        if not tps:
            return []
        c.assign(tps)
        ends = c.end_offsets(tps)
        begins = c.beginning_offsets(tps)
        for tp in tps:
            c.seek(tp, max(begins[tp], ends[tp] - tail) if tail else begins[tp])
        out: list[tuple] = []
        idle = 0
        while any(c.position(tp) < ends[tp] for tp in tps) and idle < idle_polls:
            batch = c.poll(1000)
            idle = 0 if batch else idle + 1
            for records in batch.values():
                for r in records:
                    try:
                        msg = decode(r.value, r.headers)
                        out.append((r.partition, r.offset, r.timestamp, msg) if timestamps else
                                   (r.partition, r.offset, msg))
                    except DecodeError:
                        pass
        return out
    finally:
        c.close()
