"""What a job recorded on its topics, read back for replay and export; nothing is written.

Owns the read-only view of a job that ``astraflow replay`` and ``astraflow export`` need:
whether the job exists, its training batches by offset (naming the offsets retention
deleted), and the weights digest the trainer announced for every version the log still
holds. Digests come from three places, because compaction and the publisher's trimming
each keep only part of the history: every announcement left on ``versions``; the
headers of the weight payloads left on ``weights.<policy>`` (which add per-tensor
hashes, so a divergence can name its tensor); and the ``weights_digest`` labels of the
trainer's and evaluator's metrics. Clients here join no consumer group and commit
nothing. It knows nothing about training.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from astraflow.errors import FatalError
from astraflow.topics import Batch, JobTopics, Message, Metric, TopicPartition, VersionAnnouncement
from astraflow.topics.chunking import H_INDEX, H_OBJECT
from astraflow.topics.codec import decode, header
from astraflow.topics.exceptions import DecodeError
from astraflow.topics.replay import read_topic
from astraflow.weights.format import HEADER_NBYTES, TensorEntry, WeightCodecError, read_header
from astraflow.topics import security

__all__ = ["RecordError", "RecordedVersion", "batch_span", "check_job", "check_kept", "end_offsets", "iter_records",
           "policies", "read_batches", "recorded_metrics", "recorded_versions"]


class RecordError(FatalError):
    """What a job recorded cannot serve the request (unknown job, trimmed topic, foreign
    checkpoint); one line that names the job, topic or offsets and what to do."""


@dataclass(frozen=True)
class RecordedVersion:
    """The weights a job announced for one policy version."""

    version: int
    digest: str  #: ``weights_digest`` of the full weights at this version
    epoch: int = -1  #: lineage epoch (-1: known only from a payload whose announcement was compacted)
    #: BLAKE3 (hex) of every tensor's bits, when a payload of this version is still on ``weights.<policy>``
    tensors: dict[str, str] | None = None
    sources: tuple[str, ...] = field(default=())  #: where the digest was read: versions, weights, metrics


def _consumer(bootstrap: str, client_id: str) -> security.KafkaConsumer:
    return security.consumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed", client_id=client_id,
                             max_partition_fetch_bytes=16 * 1024 * 1024)


def check_job(bootstrap: str, topics: JobTopics, policy: str | None) -> None:
    """Raise :class:`RecordError` unless the job's ``batches.<policy>`` (or, without a
    policy, its ``trajectories``) exists.

    Asks the admin API, not a consumer: on clusters that auto-create topics, a consumer's
    metadata request for a missing topic would create it."""
    names = _topic_names(bootstrap)
    wanted = topics.batches(policy) if policy is not None else topics.trajectories
    if wanted in names:
        return
    jobs = sorted({n[3:].rsplit(".", 1)[0] for n in names if n.startswith("af.") and n.endswith(".trajectories")})
    if policy is not None and topics.trajectories in names:
        raise RecordError(f"job {topics.job!r} has no policy {policy!r} on {bootstrap} (its policies: "
                          f"{', '.join(policies(bootstrap, topics)) or 'none'}); pass --policy")
    raise RecordError(f"no job {topics.job!r} on {bootstrap}: topic {wanted} does not exist "
                      f"(jobs there: {', '.join(jobs) or 'none'})")


def policies(bootstrap: str, topics: JobTopics) -> list[str]:
    """The policies that have a ``batches.<policy>`` topic in the job."""
    head = topics.prefix + "batches."
    return sorted(n[len(head):] for n in _topic_names(bootstrap) if n.startswith(head))


def _topic_names(bootstrap: str) -> set[str]:
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-record")
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def end_offsets(bootstrap: str, topics: JobTopics) -> dict[str, dict[int, int]]:
    """End offset of every partition of every topic of the job: what a read-only client must leave as it found."""
    names = sorted(n for n in _topic_names(bootstrap) if n.startswith(topics.prefix))
    c = _consumer(bootstrap, "astraflow-record")
    try:
        tps = [TopicPartition(n, p) for n in names for p in sorted(c.partitions_for_topic(n) or [])]
        ends = c.end_offsets(tps) if tps else {}
    finally:
        c.close()
    out: dict[str, dict[int, int]] = {}
    for tp, off in ends.items():
        out.setdefault(tp.topic, {})[tp.partition] = off
    return out


def batch_span(bootstrap: str, topic: str) -> tuple[int, int, int | None]:
    """``(first offset kept, end offset, step of the last batch or None)`` of ``batches.<policy>``."""
    tp = TopicPartition(topic, 0)
    c = _consumer(bootstrap, "astraflow-replay-batches")
    try:
        c.assign([tp])
        begin, end = c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp]
        last = None
        # The last records may be transaction markers: look a few offsets back.
        c.seek(tp, max(begin, end - 8))
        idle = 0
        while c.position(tp) < end and idle < 5:
            records = c.poll(timeout_ms=1000).get(tp, [])
            idle = 0 if records else idle + 1
            for r in records:
                try:
                    b = decode(r.value, r.headers)
                except DecodeError:
                    continue
                if isinstance(b, Batch):
                    last = b.step
        return begin, end, last
    finally:
        c.close()


def check_kept(topic: str, offset: int, begin: int, step: int) -> None:
    if offset < begin:
        raise RecordError(f"{topic}: offsets {offset}..{begin - 1} were deleted by retention (the log starts at "
                          f"{begin}), so step {step} and the ones after it up to that offset cannot be replayed; "
                          f"start from a checkpoint whose batch offset is >= {begin} (--from-checkpoint)")


def read_batches(bootstrap: str, topic: str, *, offset: int, step: int,
                 to_step: int | None = None) -> Iterator[tuple[int, Batch]]:
    """``(offset, batch)`` from ``offset`` on, whose first batch must be ``step``, up to (not
    including) step ``to_step`` or the end of the topic as it was when reading began.

    Batches must follow one another step by step: any other record there means the
    offset (a checkpoint's, say) belongs to another job or lineage.
    """
    tp = TopicPartition(topic, 0)
    c = _consumer(bootstrap, "astraflow-replay-batches")
    try:
        c.assign([tp])
        begin, end = c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp]
        check_kept(topic, offset, begin, step)
        c.seek(tp, offset)
        expected = step
        while c.position(tp) < end and (to_step is None or expected < to_step):
            for r in c.poll(timeout_ms=1000, max_records=1).get(tp, []):
                try:
                    b = decode(r.value, r.headers)
                except DecodeError as e:
                    raise RecordError(f"{topic}@{r.offset} does not decode ({e}); it cannot be replayed") from None
                if not isinstance(b, Batch) or b.step != expected:
                    what = f"step {b.step}" if isinstance(b, Batch) else f"a {b.TYPE} record"
                    raise RecordError(f"{topic}@{r.offset} holds {what} where step {expected} was expected: the "
                                      f"starting offset {offset} does not belong to this job's batches")
                yield r.offset, b
                expected += 1
                if to_step is not None and expected >= to_step:
                    return
    finally:
        c.close()


def iter_records(bootstrap: str, topic: str) -> Iterator[tuple[int, int, Message]]:
    """``(partition, offset, message)`` of every committed record up to the end offsets as
    reading began, streamed (a topic may not fit in memory); records that do not decode
    raise :class:`RecordError` naming them, since an export must not silently lose any."""
    c = _consumer(bootstrap, "astraflow-export")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or [])]
        if not tps:
            return
        c.assign(tps)
        ends = c.end_offsets(tps)
        c.seek_to_beginning(*tps)
        idle = 0
        while any(c.position(tp) < ends[tp] for tp in tps) and idle < 5:
            batch = c.poll(timeout_ms=1000)
            idle = 0 if batch else idle + 1
            for tp, records in batch.items():
                for r in records:
                    if r.offset >= ends[tp]:
                        continue
                    try:
                        yield r.partition, r.offset, decode(r.value, r.headers)
                    except DecodeError as e:
                        raise RecordError(f"{topic}[{r.partition}]@{r.offset} does not decode: {e}") from None
            for tp in tps:  # records past the end as reading began belong to a later export
                if c.position(tp) >= ends[tp]:
                    c.pause(tp)
    finally:
        c.close()


def recorded_versions(bootstrap: str, topics: JobTopics, policy: str) -> dict[int, RecordedVersion]:
    """Every version whose digest the log still holds (see the module docstring).

    Where epochs disagree on a version (a trainer resumed behind the announced head), the
    highest epoch wins: the job's surviving history. Payloads are matched to a version by
    the digest their header gives, so a payload's tensor hashes are only attached where
    they describe the announced weights.
    """
    out: dict[int, RecordedVersion] = {}
    for _, _, a in read_topic(bootstrap, topics.versions):
        if isinstance(a, VersionAnnouncement) and a.policy == policy:
            known = out.get(a.version)
            if known is None or a.epoch >= known.epoch:
                out[a.version] = RecordedVersion(a.version, a.checksum, a.epoch, sources=("versions",))
    for version, digest, tensors in _payload_tables(bootstrap, topics.weights(policy)):
        known = out.get(version)
        if known is None:
            out[version] = RecordedVersion(version, digest, -1, tensors, ("weights",))
        elif known.digest == digest and known.tensors is None:
            out[version] = RecordedVersion(version, digest, known.epoch, tensors, (*known.sources, "weights"))
    for m in recorded_metrics(bootstrap, topics, policy, names=("trainer.done", "eval.accuracy")):
        digest = str(m.labels.get("weights_digest") or "")
        if digest and m.step not in out:
            out[m.step] = RecordedVersion(m.step, digest, int(m.labels.get("epoch", -1)), sources=("metrics",))
    return out


def recorded_metrics(bootstrap: str, topics: JobTopics, policy: str,
                     names: tuple[str, ...] | None = None) -> list[Metric]:
    """The policy's trainer and evaluator metrics (all, or those named)."""
    wanted = (f"trainer.{policy}", f"eval.{policy}")
    return [m for _, _, m in read_topic(bootstrap, topics.metrics)
            if isinstance(m, Metric) and m.component in wanted and (names is None or m.name in names)]


def _payload_tables(bootstrap: str, topic: str) -> Iterator[tuple[int, str, dict[str, str]]]:
    """``(version, digest, tensor hashes)`` of every weight payload still on ``topic``.

    Only the first chunks of a payload are kept, until its header and tensor table are
    complete: the tensor data is not needed to learn what the tensors were.
    """
    tp = TopicPartition(topic, 0)
    c = _consumer(bootstrap, "astraflow-replay-weights")
    prefixes: dict[str, bytearray] = {}
    done: set[str] = set()
    try:
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        c.seek_to_beginning(tp)
        idle = 0
        while c.position(tp) < end and idle < 5:
            records = c.poll(timeout_ms=1000).get(tp, [])
            idle = 0 if records else idle + 1
            for r in records:
                obj, index = header(r.headers, H_OBJECT), header(r.headers, H_INDEX)
                if obj is None or index is None or obj in done:
                    continue
                if int(index) == 0:
                    prefixes[obj] = bytearray()
                elif obj not in prefixes:  # its first chunk was trimmed
                    continue
                buf = prefixes[obj]
                buf += r.value or b""
                try:
                    parsed = _table(buf)
                except (WeightCodecError, ValueError, KeyError, TypeError):
                    parsed = False  # not a payload this build reads: the digests on versions still apply
                if parsed is not None:
                    done.add(obj)
                    del prefixes[obj]
                    if parsed:
                        yield parsed
    finally:
        c.close()


def _table(prefix: bytearray) -> tuple[int, str, dict[str, str]] | None:
    """The version, digest and tensor hashes in a payload's leading bytes; None until they suffice."""
    if len(prefix) < HEADER_NBYTES:
        return None
    h = read_header(prefix)
    if len(prefix) < h.data_offset:
        return None
    entries = [TensorEntry.from_json(d) for d in json.loads(bytes(prefix[HEADER_NBYTES:h.data_offset]))]
    return h.version, h.digest, {e.name: e.hash.hex() for e in entries}
