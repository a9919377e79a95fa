"""Large binary payloads as a sequence of <= 1 MiB records plus a manifest.

:func:`write_chunks` splits a payload, sends every chunk with its index and BLAKE3 digest
in headers, waits until all are acknowledged (``acks=all``: durable), and returns a
:class:`~.messages.ChunkManifest` with each chunk's partition, offset and digest.
:class:`ChunkReader` seeks to those offsets, verifies each chunk against the manifest, and
raises :class:`~.exceptions.MissingChunkError` / :class:`~.exceptions.CorruptChunkError`
so callers can refetch or fall back (e.g. to a weight snapshot). Records stay within
stock clusters' default 1 MiB limit.

One integrity pass per side: every byte is hashed once when written and once when read
(per chunk). The manifest's own digest covers the chunk list (sizes and digests, in
order), so it is computed without a second pass over the payload: a payload whose every
chunk matches a manifest that matches its digest is the payload the writer hashed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from blake3 import blake3
from kafka import KafkaConsumer, TopicPartition

from .client import Producer, wait
from .codec import Headers, header
from .exceptions import CorruptChunkError, MissingChunkError
from .messages import ChunkManifest, ChunkRef

DEFAULT_CHUNK_SIZE = 1024 * 1024 - 4096  # headroom for record headers under a 1 MiB limit

H_OBJECT = "af-object"
H_INDEX = "af-chunk"
H_COUNT = "af-chunks"
H_DIGEST = "af-blake3"
CHUNK_TYPE = b"chunk"


def iter_slices(payload: bytes | bytearray | memoryview, chunk_size: int) -> Iterable[memoryview]:
    view = memoryview(payload).cast("B")
    if len(view) == 0:
        yield view
        return
    for start in range(0, len(view), chunk_size):
        yield view[start:start + chunk_size]


def manifest_digest(chunks: Sequence[ChunkRef]) -> str:
    """BLAKE3 (hex) over the chunks' sizes and digests, in payload order."""
    h = blake3(b"astraflow-chunks-v2\n")
    for ref in chunks:
        h.update(f"{ref.size} {ref.digest}\n".encode())
    return h.hexdigest()


def write_chunks(producer: Producer, topic: str, payload: bytes | bytearray | memoryview, *,
                 key: str | bytes | None = None, object_id: str | None = None,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, partition: int | None = 0,
                 headers: Headers | None = None, timeout: float = 120.0) -> ChunkManifest:
    """Write ``payload`` as chunks and return the manifest once every chunk is acknowledged."""
    object_id = object_id or uuid.uuid4().hex
    slices = list(iter_slices(payload, chunk_size))
    futures, sent = [], []
    for i, piece in enumerate(slices):
        digest = blake3(piece).hexdigest()
        hdrs: Headers = [("af-type", CHUNK_TYPE), (H_OBJECT, object_id.encode()),
                         (H_INDEX, str(i).encode()), (H_COUNT, str(len(slices)).encode()),
                         (H_DIGEST, digest.encode())]
        hdrs.extend(headers or [])
        futures.append(producer.send_raw(topic, bytes(piece), key=key, partition=partition, headers=hdrs))
        sent.append((len(piece), digest))
    refs = []
    for fut, (size, digest) in zip(futures, sent):
        md = wait(fut, timeout, topic)
        refs.append(ChunkRef(md.partition, md.offset, size, digest))
    return ChunkManifest(object_id=object_id, topic=topic, total_bytes=sum(size for size, _ in sent),
                         digest=manifest_digest(refs), chunks=refs)


class ChunkReader:
    """Reads chunked payloads back by manifest; keeps one unassigned-group consumer."""

    def __init__(self, bootstrap_servers: str, *, isolation_level: str = "read_committed",
                 poll_timeout_ms: int = 5000) -> None:
        self._kc = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None,
                                 enable_auto_commit=False, isolation_level=isolation_level,
                                 max_partition_fetch_bytes=8 * 1024 * 1024,
                                 fetch_max_bytes=64 * 1024 * 1024, client_id="astraflow-chunks")
        self.poll_timeout_ms = poll_timeout_ms

    def read(self, manifest: ChunkManifest) -> bytearray:
        """The verified payload, or a :class:`ChunkError` naming the bad chunk."""
        if manifest_digest(manifest.chunks) != manifest.digest:
            raise CorruptChunkError(f"manifest of object {manifest.object_id} on {manifest.topic}: its chunk "
                                    f"list does not match its digest {manifest.digest[:16]}…")
        by_tp: dict[TopicPartition, dict[int, int]] = {}
        for i, ref in enumerate(manifest.chunks):
            by_tp.setdefault(TopicPartition(manifest.topic, ref.partition), {})[ref.offset] = i
        out = bytearray(manifest.total_bytes)
        starts = _starts(manifest)
        for tp, wanted in by_tp.items():
            self._fetch_partition(manifest, tp, dict(wanted), out, starts)
        return out

    def _fetch_partition(self, manifest: ChunkManifest, tp: TopicPartition, wanted: dict[int, int],
                         out: bytearray, starts: list[int]) -> None:
        self._kc.assign([tp])
        first, last = min(wanted), max(wanted)
        log_start = self._kc.beginning_offsets([tp])[tp]
        if first < log_start:
            i = wanted[first]
            raise MissingChunkError(
                f"chunk {i} of object {manifest.object_id} at {tp.topic}[{tp.partition}]@{first} "
                f"was deleted (log starts at {log_start})")
        end = self._kc.end_offsets([tp])[tp]
        self._kc.seek(tp, first)
        while wanted:
            batch = self._kc.poll(timeout_ms=self.poll_timeout_ms)
            records = batch.get(tp, [])
            if not records and self._kc.position(tp) >= min(end, last + 1):
                break
            if not records and not batch:
                break
            for r in records:
                i = wanted.pop(r.offset, None)
                if i is None:
                    continue
                self._check(manifest, i, r, tp)
                out[starts[i]:starts[i] + len(r.value)] = r.value
            if self._kc.position(tp) > last:
                break
        if wanted:
            off, i = next(iter(wanted.items()))
            raise MissingChunkError(
                f"chunk {i} of object {manifest.object_id} not found at {tp.topic}[{tp.partition}]@{off}")

    @staticmethod
    def _check(manifest: ChunkManifest, i: int, record, tp: TopicPartition) -> None:
        ref = manifest.chunks[i]
        where = f"chunk {i} of object {manifest.object_id} at {tp.topic}[{tp.partition}]@{record.offset}"
        obj = header(record.headers, H_OBJECT)
        if obj is None or obj.decode() != manifest.object_id:
            raise CorruptChunkError(f"{where}: record belongs to object {obj!r}")
        value = record.value or b""
        if len(value) != ref.size:
            raise CorruptChunkError(f"{where}: {len(value)} bytes, manifest says {ref.size}")
        digest = blake3(value).hexdigest()
        if digest != ref.digest:
            raise CorruptChunkError(f"{where}: BLAKE3 digest {digest[:16]}… != manifest {ref.digest[:16]}…")

    def close(self) -> None:
        self._kc.close()

    def __enter__(self) -> "ChunkReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _starts(manifest: ChunkManifest) -> list[int]:
    starts, pos = [], 0
    for ref in manifest.chunks:
        starts.append(pos)
        pos += ref.size
    if pos != manifest.total_bytes:
        raise CorruptChunkError(f"manifest of {manifest.object_id}: chunk sizes sum to {pos}, "
                                f"total_bytes is {manifest.total_bytes}")
    return starts
