"""Read a topic to its end as a plain client: no consumer group, no commits.

For audits, status, tools and the dead letters' recall: :func:`read_topic` decodes every
committed record (or the last ones); :func:`read_headers` reads only some headers of each
record, decoding no value. Both read with one loop, :func:`_to_the_end`, from given offsets up
to the end offsets taken when the read began. Records that do not decode are skipped here —
consumers on the hot path send them to the dead-letter topic instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

from . import security
from .codec import decode
from .exceptions import DecodeError

__all__ = ["read_headers", "read_topic"]


def read_topic(bootstrap_servers: str, topic: str, *, tail: int | None = None,
               idle_polls: int = 5, uncommitted: bool = False, timestamps: bool = False,
               headers: bool = False) -> list[tuple]:
    """``(partition, offset, message)`` of every committed record (or of the last ``tail`` per
    partition); ``uncommitted`` also reads records of open and aborted transactions,
    ``timestamps`` adds each record's timestamp (ms): ``(partition, offset, ts, message)``;
    ``headers`` adds the record's headers last: ``(partition, offset, message, headers)``.
    A read stops early after ``idle_polls`` polls in a row that bring nothing."""
    c = security.consumer(bootstrap_servers=bootstrap_servers,
                          isolation_level="read_uncommitted" if uncommitted else "read_committed",
                          enable_auto_commit=False, client_id="astraflow-replay",
                          max_partition_fetch_bytes=16 * 1024 * 1024)
    try:
        tps = _partitions(c, topic)
        if not tps:
            return []
        ends = c.end_offsets(tps)
        begins = c.beginning_offsets(tps)

        def decoded(starts: dict[TopicPartition, int]) -> list[tuple]:
            return _decoded(_to_the_end(c, starts, ends, idle_polls=idle_polls), timestamps, headers)

        if not tail:
            return decoded({tp: begins[tp] for tp in tps})
        # Transaction markers take offsets too (a transactional topic's last offset is one), so
        # the last `tail` offsets can hold fewer records: widen the window until they are found.
        out: list[tuple] = []
        for tp in tps:
            span = tail
            while True:
                start = max(begins[tp], ends[tp] - span)
                got = decoded({tp: start})
                if len(got) >= tail or start == begins[tp]:
                    out.extend(got[-tail:])
                    break
                span *= 2
        return out
    finally:
        c.close()


def log_range(bootstrap_servers: str, topic: str, partition: int = 0) -> tuple[int, int]:
    """``(log start, end)`` offsets of one partition of ``topic``: what the broker still holds
    (a trim by ``delete_records`` or by retention moves the start)."""
    c = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                          client_id="astraflow-log-range")
    try:
        tp = TopicPartition(topic, partition)
        return c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp]
    finally:
        c.close()


def read_headers(bootstrap_servers: str, topic: str, names: tuple[str, ...], timeout_s: float = 30.0) -> list[tuple]:
    """For every record now on ``topic`` (all partitions, from the beginning): the values of
    its headers ``names`` (None where it has none); no value is decoded. Raises
    ``KafkaTimeoutError`` when the read takes over ``timeout_s``."""
    c = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                          client_id="astraflow-headers", isolation_level="read_committed")
    try:
        tps = _partitions(c, topic)
        out: list[tuple] = []
        if not tps:
            return out
        for r in _to_the_end(c, c.beginning_offsets(tps), c.end_offsets(tps), timeout_s=timeout_s):
            hs = dict(reversed(r.headers or []))  # the first of a name counts
            out.append(tuple(hs.get(n) for n in names))
        return out
    finally:
        c.close()


def _partitions(c: KafkaConsumer, topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]


def _to_the_end(c: KafkaConsumer, starts: dict[TopicPartition, int], ends: dict[TopicPartition, int], *,
                idle_polls: int | None = None, timeout_s: float | None = None) -> Iterator:
    """The records of ``starts``' partitions, from those offsets until every position reaches
    its offset in ``ends``; stops early after ``idle_polls`` empty polls in a row, raises
    ``KafkaTimeoutError`` past ``timeout_s``."""
    c.assign(list(starts))
    for tp, offset in starts.items():
        c.seek(tp, offset)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    idle = 0
    while any(c.position(tp) < ends[tp] for tp in starts) and (idle_polls is None or idle < idle_polls):
        if deadline is not None and time.monotonic() > deadline:
            topics = sorted({tp.topic for tp in starts})
            raise KafkaTimeoutError(f"reading {', '.join(topics)} to its end took over {timeout_s:.0f}s")
        batch = c.poll(1000)
        idle = 0 if batch else idle + 1
        for records in batch.values():
            yield from records


def _decoded(records: Iterator, timestamps: bool, headers: bool) -> list[tuple]:
    """The rows of :func:`read_topic` for ``records``, passing over what does not decode."""
    out: list[tuple] = []
    for r in records:
        try:
            msg = decode(r.value, r.headers)
        except DecodeError:
            continue
        row = (r.partition, r.offset, r.timestamp, msg) if timestamps else (r.partition, r.offset, msg)
        out.append((*row, list(r.headers or ())) if headers else row)
    return out
