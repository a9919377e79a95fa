"""Large binary payloads as a sequence of <= 1 MiB records plus a manifest.

:func:`write_chunks` splits a payload, sends every chunk with its index and BLAKE3 digest
in headers, waits until all are acknowledged (``acks=all``: durable), and returns a
:class:`~.messages.ChunkManifest` with each chunk's partition, offset and digest.
:class:`ChunkReader` seeks to those offsets — or, on a mirror where offsets differ, finds
each chunk by its record timestamp and headers — verifies each chunk against the manifest, and
raises :class:`~.exceptions.MissingChunkError` / :class:`~.exceptions.CorruptChunkError`
so callers can refetch or fall back (e.g. to a weight snapshot). Records stay within
stock clusters' default 1 MiB limit.

One integrity pass per side: every byte is hashed once when written and once when read
(per chunk). The manifest's own digest covers the chunk list (sizes and digests, in
order), so it is computed without a second pass over the payload: a payload whose every
chunk matches a manifest that matches its digest is the payload the writer hashed.
"""

from __future__ import annotations

import mmap
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from blake3 import blake3
from kafka import TopicPartition

from . import security
from .producer import Producer, wait
from .codec import Headers, header
from .exceptions import CorruptChunkError, MissingChunkError
from .messages import ChunkManifest, ChunkRef

DEFAULT_CHUNK_SIZE = 1024 * 1024 - 4096  # headroom for record headers under a 1 MiB limit

H_OBJECT = "af-object"
H_INDEX = "af-chunk"  # index in the payload (of a head chunk, with head_last)
H_DATA_INDEX = "af-data-chunk"  # index among the data chunks sent before the head
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


class ChunkWriter:
    """Sends a payload as chunks while it is still being produced; :meth:`close` returns the manifest.

    :meth:`write` takes the payload's bytes in order, in pieces of any size, and sends each
    chunk as soon as it is full (the producer batches and sends in the background), so a
    payload encoded piece by piece is on the wire while the rest is being encoded.
    With ``head_last=True``, ``close(head)`` sends ``head`` last but places it *first* in
    the payload: a format whose header describes the data behind it (a weight payload's
    tensor table) is streamed without holding the data back. The manifest lists chunks in
    payload order; their offsets need not ascend. Head chunks carry their index in
    ``af-chunk`` (0 first, as in a payload written in order), data chunks written before
    the head carry theirs among the data in ``af-data-chunk``, so a reader scanning the
    log for payload heads (replay) never mistakes data for a head.
    """

    def __init__(self, producer: Producer, topic: str, *, key: str | bytes | None = None,
                 object_id: str | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE, partition: int | None = 0,
                 headers: Headers | None = None, timeout: float = 120.0, head_last: bool = False) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self._producer, self.topic, self._key = producer, topic, key
        self.object_id = object_id or uuid.uuid4().hex
        self.chunk_size, self._partition, self._timeout = chunk_size, partition, timeout
        self._headers = list(headers or [])
        self._head_last = head_last
        self._data_index = H_DATA_INDEX if head_last else H_INDEX  # the header data chunks number in
        self._buf = bytearray()
        self._data: list[tuple[object, int, str]] = []  # (future, size, digest) of data chunks, in order
        self._closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            if not self._buf and len(view) >= self.chunk_size:  # a whole chunk: no staging copy
                piece, view = view[: self.chunk_size], view[self.chunk_size :]
                self._send(bytes(piece), self._data, self._data_index)
                continue
            take = min(len(view), self.chunk_size - len(self._buf))
            self._buf += view[:take]
            view = view[take:]
            if len(self._buf) == self.chunk_size:
                self._send(bytes(self._buf), self._data, self._data_index)
                self._buf.clear()

    def close(self, head: bytes | bytearray | memoryview | None = None) -> ChunkManifest:
        """Send what is left (and ``head``), wait for every acknowledgement, return the manifest."""
        if self._closed:
            raise RuntimeError(f"chunk writer of {self.object_id} is closed")
        if head is not None and not self._head_last:
            raise ValueError("close(head=...) needs a writer made with head_last=True")
        self._closed = True
        if self._buf or (not self._data and not head):
            self._send(bytes(self._buf), self._data, self._data_index)  # the tail; or one empty chunk
            self._buf.clear()
        head_sent: list[tuple[object, int, str]] = []
        for piece in iter_slices(head, self.chunk_size) if head else ():
            self._send(bytes(piece), head_sent, H_INDEX)  # head chunks are numbered from 0 in af-chunk
        refs, stamps = [], []
        for fut, size, digest in [*head_sent, *self._data]:
            md = wait(fut, self._timeout, self.topic)
            refs.append(ChunkRef(md.partition, md.offset, size, digest))
            stamps.append(md.timestamp if md.timestamp is not None else -1)
        known = [t for t in stamps if t >= 0]
        return ChunkManifest(object_id=self.object_id, topic=self.topic, total_bytes=sum(r.size for r in refs),
                             digest=manifest_digest(refs), chunks=refs,
                             first_timestamp_ms=min(known) if len(known) == len(stamps) and known else -1,
                             last_timestamp_ms=max(known) if len(known) == len(stamps) and known else -1)

    def _send(self, piece: bytes, sent: list[tuple[object, int, str]], index_header: str) -> None:
        digest = blake3(piece).hexdigest()
        hdrs: Headers = [("af-type", CHUNK_TYPE), (H_OBJECT, self.object_id.encode()),
                         (index_header, str(len(sent)).encode()), (H_DIGEST, digest.encode()), *self._headers]
        fut = self._producer.send_raw(self.topic, piece, key=self._key, partition=self._partition, headers=hdrs)
        sent.append((fut, len(piece), digest))


def write_chunks(producer: Producer, topic: str, payload: bytes | bytearray | memoryview, *,
                 key: str | bytes | None = None, object_id: str | None = None,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, partition: int | None = 0,
                 headers: Headers | None = None, timeout: float = 120.0) -> ChunkManifest:
    """Write ``payload`` as chunks and return the manifest once every chunk is acknowledged."""
    writer = ChunkWriter(producer, topic, key=key, object_id=object_id, chunk_size=chunk_size,
                         partition=partition, headers=headers, timeout=timeout)
    writer.write(payload)
    return writer.close()


class ChunkReader:
    """Reads chunked payloads back by manifest; keeps one unassigned-group consumer.

    Two ways to a chunk. On the cluster it was written to, the manifest's offset holds it:
    one seek and one read of the range. On a mirror (:mod:`.mirror`) offsets differ —
    MirrorMaker's transaction markers take offsets and the mirror starts from what it first
    copied — but record timestamps, headers and order are copied as they are: a chunk the
    offset does not hold is *located* from the manifest's first chunk timestamp
    (``offsets_for_times``), scanning forward for records of the object whose ``af-blake3``
    header names a chunk still missing, and verifying their bytes. An announcement may be
    mirrored before its chunks, so a chunk not there yet is waited for, up to
    ``arrival_timeout_s``, then :class:`~.exceptions.MissingChunkError` says so. Copies of a
    chunk already placed (at-least-once mirroring) are skipped and counted. When other
    chunks of the partition did sit at their offsets (the writer's cluster), a chunk found
    neither way is missing or corrupt at once, as the offset path reports it.

    Args:
        bootstrap_servers: the cluster to read from (the home cluster, or a region's mirror).
        isolation_level: ``read_committed``: never an aborted copy.
        poll_timeout_ms: one poll's wait.
        arrival_timeout_s: how long a chunk that is not there yet is waited for (a mirror's lag).
        slack_ms: how much newer than the manifest's last timestamp a record must be to show the
            chunks will not come (writers' clocks may differ).
        security_setting: the client setting on that cluster (None: the process's).
    """

    def __init__(self, bootstrap_servers: str, *, isolation_level: str = "read_committed",
                 poll_timeout_ms: int = 5000, arrival_timeout_s: float = 60.0, slack_ms: int = 2000,
                 security_setting: security.ClientSecurity | None = None) -> None:
        self._kc = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None,
                                     enable_auto_commit=False, isolation_level=isolation_level,
                                     max_partition_fetch_bytes=8 * 1024 * 1024,
                                     fetch_max_bytes=64 * 1024 * 1024, client_id="astraflow-chunks",
                                     security=security_setting)
        self.poll_timeout_ms = poll_timeout_ms
        self.arrival_timeout_s, self.slack_ms = arrival_timeout_s, slack_ms
        self.located = 0  #: chunks found by timestamp, not at their offset (read from a mirror)
        self.duplicates = 0  #: extra copies of chunks already placed, skipped (at-least-once mirroring)

    def read(self, manifest: ChunkManifest, *, into: bytearray | memoryview | None = None,
             on_progress: Callable[[int], None] | None = None,
             cached: Mapping[int, tuple[bytes, str]] | None = None) -> bytearray | memoryview:
        """The verified payload, or a :class:`ChunkError` naming the bad chunk.

        ``into``: a writable buffer of ``manifest.total_bytes`` to fill (a ``bytearray``, or
        a :class:`ReleasableBuffer`'s view), else a new ``bytearray``. With
        ``on_progress``, the first chunk (a payload's head) is fetched before the others,
        and ``on_progress(n)`` is called whenever the verified prefix ``[0, n)`` grows: a
        decoder on another thread can work on what is there while the rest arrives.
        ``cached``: chunk records of this object already read (a prefetcher's), by the
        offset they were read at, with the BLAKE3 digest of the bytes; each fills the chunks
        whose digest and size it has (so offsets need not be the manifest's: a mirror's
        prefetcher offers its own), and only the others are fetched.
        """
        if manifest_digest(manifest.chunks) != manifest.digest:
            raise CorruptChunkError(f"manifest of object {manifest.object_id} on {manifest.topic}: its chunk "
                                    f"list does not match its digest {manifest.digest[:16]}…")
        starts = _starts(manifest)
        if into is not None and len(into) != manifest.total_bytes:
            raise ValueError(f"buffer of {len(into)} bytes for a payload of {manifest.total_bytes}")
        out = bytearray(manifest.total_bytes) if into is None else into
        prefix = _Prefix(starts, manifest.total_bytes, on_progress)
        placed: set[int] = set()
        if cached:
            slots = _slots(manifest, range(len(manifest.chunks)))
            for value, digest in cached.values():
                for i in slots.pop((digest, len(value)), ()):
                    self._place(i, value, out, starts, prefix, placed)
        if on_progress is not None and manifest.chunks and 0 not in placed:
            first = manifest.chunks[0]
            self._fetch_partition(manifest, TopicPartition(manifest.topic, first.partition), {first.offset: 0},
                                  out, starts, prefix, placed)
        by_tp: dict[TopicPartition, dict[int, int]] = {}
        for i, ref in enumerate(manifest.chunks):
            if i not in placed:  # (a located head brings the chunks its scan passed)
                by_tp.setdefault(TopicPartition(manifest.topic, ref.partition), {})[ref.offset] = i
        for tp, wanted in by_tp.items():
            self._fetch_partition(manifest, tp, dict(wanted), out, starts, prefix, placed)
        return out

    def _fetch_partition(self, manifest: ChunkManifest, tp: TopicPartition, wanted: dict[int, int],
                         out: bytearray, starts: list[int], prefix: "_Prefix", placed: set[int]) -> None:
        """Place the chunks ``wanted`` ({offset: index}): at their offsets, else located by time."""
        self._kc.assign([tp])
        log_start = self._kc.beginning_offsets([tp])[tp]
        end = self._kc.end_offsets([tp])[tp]
        # Why each chunk the offset path did not place was not there: (offset, reason), by index.
        unplaced: dict[int, tuple[int, str]] = {}
        native = False  # whether some chunk sat at its offset: the manifest's offsets hold here
        inside = {off: i for off, i in wanted.items() if log_start <= off < end}
        for off, i in wanted.items():
            if off < log_start:
                unplaced[i] = (off, f"was deleted (log starts at {log_start})")
            elif off >= end:
                unplaced[i] = (off, "not found")
        if inside:
            last = max(inside)
            self._kc.seek(tp, min(inside))
            while inside:
                batch = self._kc.poll(timeout_ms=self.poll_timeout_ms)
                records = batch.get(tp, [])
                if not records and (self._kc.position(tp) >= min(end, last + 1) or not batch):
                    break
                for r in records:
                    i = inside.pop(r.offset, None)
                    if i is None:
                        continue
                    why = self._other(manifest, i, r)
                    if why is not None:
                        unplaced[i] = (r.offset, why)
                        if not native:  # the offsets do not hold here (a mirror): find them all by time
                            inside.clear()
                            break
                        continue
                    self._check(manifest, i, r, tp)
                    self._place(i, r.value or b"", out, starts, prefix, placed)
                    native = True
                if not inside or self._kc.position(tp) > last:
                    break
            for off, i in wanted.items():
                if i not in placed and i not in unplaced:
                    unplaced[i] = (off, "not found")
        if unplaced:
            self._locate(manifest, tp, unplaced, native, out, starts, prefix, placed)

    @staticmethod
    def _other(manifest: ChunkManifest, i: int, record) -> str | None:
        """Why ``record`` (at chunk ``i``'s offset) is some other record; None when it claims to be chunk ``i``."""
        obj = header(record.headers, H_OBJECT)
        if obj is None or obj.decode("utf-8", "replace") != manifest.object_id:
            return f"record belongs to object {obj!r}"
        digest = header(record.headers, H_DIGEST)
        if digest is not None and digest.decode("ascii", "replace") != manifest.chunks[i].digest and \
                any(ref.digest == digest.decode("ascii", "replace") for ref in manifest.chunks):
            return "record is another chunk of the object"
        return None

    def _locate(self, manifest: ChunkManifest, tp: TopicPartition, unplaced: dict[int, tuple[int, str]],
                native: bool, out: bytearray, starts: list[int], prefix: "_Prefix", placed: set[int]) -> None:
        """Find the chunks ``unplaced`` by time; wait for those not there yet (a mirror's lag).

        Other chunks of the partition not placed yet that the scan passes are placed too (a
        head sent last is found after the data: the data need no second scan)."""
        slots = _slots(manifest, unplaced)
        passing = _slots(manifest, (i for i, ref in enumerate(manifest.chunks) if ref.partition == tp.partition
                                    and i not in placed and i not in unplaced))
        digests = {ref.digest for ref in manifest.chunks}
        past = manifest.last_timestamp_ms + self.slack_ms if manifest.last_timestamp_ms >= 0 else None
        overtaken = False  # a record newer than the object's chunks was seen: the missing ones will not come
        if manifest.first_timestamp_ms >= 0:
            # The earliest offset with a timestamp at or after the object's first chunk: never
            # after that chunk, whatever the clocks of earlier writers said (no slack needed).
            found = self._kc.offsets_for_times({tp: manifest.first_timestamp_ms})[tp]
            start = found.offset if found is not None else self._kc.end_offsets([tp])[tp]
        else:  # a manifest written before timestamps: the whole log
            start = self._kc.beginning_offsets([tp])[tp]
        self._kc.seek(tp, start)
        deadline = time.monotonic() + self.arrival_timeout_s
        first = True  # the first record read from there (a data record: the lookup may name a marker)
        while slots:
            end = self._kc.end_offsets([tp])[tp]
            if self._kc.position(tp) >= end:
                if native or overtaken or time.monotonic() >= deadline:
                    break
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            records = self._kc.poll(timeout_ms=self.poll_timeout_ms).get(tp, [])
            if not records and time.monotonic() >= deadline:
                break
            for r in records:
                # The first record from the object's time on is newer than all its chunks: the
                # log holds nothing of that time, they were deleted (a trim, retention). Scan on:
                # an earlier writer's clock may have run ahead.
                if past is not None and (r.timestamp > past or (first and r.timestamp > manifest.last_timestamp_ms)):
                    overtaken = True
                first = False
                obj = header(r.headers, H_OBJECT)
                if obj is None or obj.decode("utf-8", "replace") != manifest.object_id:
                    continue
                raw = header(r.headers, H_DIGEST)
                digest = raw.decode("ascii", "replace") if raw is not None else None
                value = r.value or b""
                indices = slots.pop((digest, len(value)), None)
                if indices is None:
                    extra = passing.pop((digest, len(value)), None)
                    if extra is not None and blake3(value).hexdigest() == digest:
                        for i in extra:
                            self._place(i, value, out, starts, prefix, placed)
                        self.located += len(extra)
                    elif digest in digests:
                        self.duplicates += 1  # a copy of a chunk already placed
                    continue
                self._verify(f"chunk {indices[0]} of object {manifest.object_id} at {tp.topic}[{tp.partition}]@"
                             f"{r.offset} (located by time)", manifest.chunks[indices[0]], len(value),
                             blake3(value).hexdigest())
                for i in indices:
                    self._place(i, value, out, starts, prefix, placed)
                self.located += len(indices)
                if not slots:
                    break
        if slots:
            i = min(i for indices in slots.values() for i in indices)
            off, why = unplaced[i]
            where = f"chunk {i} of object {manifest.object_id} at {tp.topic}[{tp.partition}]@{off}"
            if native and why.startswith("record belongs"):
                raise CorruptChunkError(f"{where}: {why}")
            if native or overtaken:
                raise MissingChunkError(f"{where} {why}" if not why.startswith("record") else f"{where}: {why}, "
                                        "and no record of the object carries it")
            n = sum(len(v) for v in slots.values())
            raise MissingChunkError(
                f"{where}: {n} chunk(s) of object {manifest.object_id} did not arrive on {tp.topic}[{tp.partition}] "
                f"within {self.arrival_timeout_s:.0f}s (its offset does not hold it here, as on a mirror; its "
                "announcement may have been mirrored before its chunks: is MirrorMaker running?)")

    @staticmethod
    def _place(i: int, value: bytes, out: bytearray, starts: list[int], prefix: "_Prefix", placed: set[int]) -> None:
        out[starts[i]:starts[i] + len(value)] = value
        prefix.add(i)
        placed.add(i)

    @staticmethod
    def _check(manifest: ChunkManifest, i: int, record, tp: TopicPartition) -> None:
        ref = manifest.chunks[i]
        where = f"chunk {i} of object {manifest.object_id} at {tp.topic}[{tp.partition}]@{record.offset}"
        value = record.value or b""
        if len(value) != ref.size:  # before hashing: a wrong size needs no digest to be refused
            raise CorruptChunkError(f"{where}: {len(value)} bytes, manifest says {ref.size}")
        ChunkReader._verify(where, ref, len(value), blake3(value).hexdigest())

    @staticmethod
    def _verify(where: str, ref: ChunkRef, size: int, digest: str) -> None:
        if size != ref.size:
            raise CorruptChunkError(f"{where}: {size} bytes, manifest says {ref.size}")
        if digest != ref.digest:
            raise CorruptChunkError(f"{where}: BLAKE3 digest {digest[:16]}… != manifest {ref.digest[:16]}…")

    def close(self) -> None:
        self._kc.close()

    def __enter__(self) -> "ChunkReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _slots(manifest: ChunkManifest, indices: Iterable[int]) -> dict[tuple[str, int], list[int]]:
    """(digest, size) -> the chunks among ``indices`` with those bytes (equal chunks share a digest)."""
    slots: dict[tuple[str, int], list[int]] = {}
    for i in indices:
        ref = manifest.chunks[i]
        slots.setdefault((ref.digest, ref.size), []).append(i)
    return slots


class ReleasableBuffer:
    """A payload's bytes in memory that can be given back to the OS range by range.

    For a reader that consumes a large payload while it arrives (a weight snapshot decoded
    tensor by tensor): :class:`ChunkReader` fills :attr:`view` (``into=``), and
    :meth:`release` drops the whole pages inside a consumed range, so the payload is never
    held whole — a snapshot needs its tensors' memory plus what is in flight, not that plus
    the payload again. An anonymous private mapping: pages are taken on first write (no
    zero-filled copy of the payload up front) and ``MADV_DONTNEED`` frees them; a released
    page reads back as zeros. Pages shared with an unreleased neighbour stay. The mapping
    goes when the last view of it does.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._map = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self._map)[:nbytes]  #: the payload's bytes
        self.released = 0  #: bytes given back so far (whole pages)

    def release(self, start: int, end: int) -> None:
        """Give back the whole pages inside ``[start, end)``: the caller is done with those bytes."""
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, min(end, self.nbytes) // page * page
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            self.released += hi - lo


class _Prefix:
    """Tracks the chunks placed so far and reports the contiguous verified prefix as it grows."""

    def __init__(self, starts: list[int], total: int, report: Callable[[int], None] | None) -> None:
        self._ends = [*starts[1:], total]
        self._have: set[int] = set()
        self._next = 0  # the first chunk not yet in the prefix
        self._report = report

    def add(self, i: int) -> None:
        if self._report is None:
            return
        self._have.add(i)
        grew = False
        while self._next in self._have:
            self._have.discard(self._next)
            self._next += 1
            grew = True
        if grew:
            self._report(self._ends[self._next - 1])


def _starts(manifest: ChunkManifest) -> list[int]:
    starts, pos = [], 0
    for ref in manifest.chunks:
        starts.append(pos)
        pos += ref.size
    if pos != manifest.total_bytes:
        raise CorruptChunkError(f"manifest of {manifest.object_id}: chunk sizes sum to {pos}, "
                                f"total_bytes is {manifest.total_bytes}")
    return starts
