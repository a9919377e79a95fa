"""Bit-exact sparse weight deltas and full snapshots, as pure functions over tensors.

After one RL optimizer step most bf16 weights are bit-identical to the previous version, so
a delta stores, per tensor, only the positions whose *bits* changed and their values. Per
tensor it picks the smaller position encoding (LEB128 gaps or a bitmap), falls back to every
element (fp32 after AdamW changes them all) when that is not smaller, and zstd-compresses
the result. The values are stored as the difference of the bit patterns as integers
(`ValueCoding.DIFF`, modulo 2^width: exact for any bits, NaN payloads and -0.0 included):
an optimizer step moves a weight by a few units in the last place, so the high byte planes
are almost all zero — measured on the demo model's AdamW steps, 0.66x the bytes of storing
the new bits for fp32 and 0.26x for bf16's changed values — unless storing the new bits
compresses smaller (values replaced wholesale). Snapshots hold every tensor's new bits.

This module owns encoding and decoding/applying; the byte layout and checksums live in
`weights/format.py`, the optional C kernel of its hot passes in `weights/native.py`. It
knows nothing about Kafka, chunking or version announcements (that is the publisher and
the subscriber beside it): it takes tensors and returns bytes, and takes bytes and
returns tensors.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

import numpy as np
import torch
import zstandard as zstd
from blake3 import blake3

from . import native
from .format import (
    HEADER_NBYTES,
    BaseMismatchError,
    Buffer,
    DeltaFormatError,
    Encoding,
    PayloadHeader,
    PayloadKind,
    TensorEntry,
    ValueCoding,
    WeightCodecError,
    _DTYPES,
    bits_to_tensor,
    digest_from_entries,
    dtype_name,
    hash_bits,
    pack_header_and_table,
    read_header,
    read_table,
    tensor_bits,
    weights_digest,
)

__all__ = [
    "BaseMismatchError", "DeltaFormatError", "DeltaStats", "EncodedTensor", "EncodedVersion",
    "Encoding", "PayloadHeader", "PayloadKind", "TensorStats", "ValueCoding", "WeightCodecError",
    "apply_in_place", "decode", "decode_streaming", "decode_tensor", "encode_delta", "encode_snapshot",
    "encode_version", "entropy_bound_bytes", "StreamedVersion", "stream_version", "iter_encoded_tensors", "read_header",
    "tensor_hashes", "weights_digest",
]

DEFAULT_LEVEL: int | None = None  # None: _WEIGHT_PARAMS below; an int: that zstd level

# Weight bits have almost no repeated strings: what zstd gains on them is the entropy coding
# of the sign/exponent plane. Level 1's 16 K-entry match table mostly costs cache misses;
# with a 64-entry table the same frames come out slightly smaller (bf16 planes: 0.670 of raw
# vs 0.685) and compress ~1.8x faster (0.6-0.7 vs 0.33-0.36 GB/s per thread, measured
# here on a 1e8-parameter model); decompression is as fast as level 1's.
_WEIGHT_PARAMS = zstd.ZstdCompressionParameters(
    window_log=17, chain_log=6, hash_log=6, search_log=1, min_match=7, target_length=0,
    strategy=zstd.STRATEGY_FAST, write_checksum=True)

_T = TypeVar("_T")
_R = TypeVar("_R")


# ---------------------------------------------------------------- results and metadata


@dataclass(frozen=True)
class TensorStats:
    name: str
    encoding: Encoding
    numel: int
    changed: int
    raw_nbytes: int  # the tensor's size in memory
    encoded_nbytes: int  # its zstd frame
    entropy_bound_nbytes: int  # entropy_bound_bytes(numel, changed, itemsize); raw size for snapshots
    values: ValueCoding = ValueCoding.BITS

    @property
    def label(self) -> str:
        """``full``, ``bitmap+diff``, ...: the encoding, and the value coding unless new bits."""
        return self.encoding.value + ("" if self.values == ValueCoding.BITS else f"+{self.values.value}")


@dataclass(frozen=True)
class DeltaStats:
    kind: PayloadKind
    total_elements: int
    changed_elements: int
    raw_nbytes: int  # the new version's weights in memory
    encoded_nbytes: int  # the whole payload, header and table included
    entropy_bound_nbytes: int  # sum over tensors
    tensors: tuple[TensorStats, ...]

    @property
    def encodings(self) -> dict[str, Encoding]:
        return {t.name: t.encoding for t in self.tensors}

    @property
    def value_codings(self) -> dict[str, ValueCoding]:
        return {t.name: t.values for t in self.tensors}

    @property
    def changed_fraction(self) -> float:
        return self.changed_elements / max(self.total_elements, 1)


@dataclass(frozen=True)
class EncodedVersion:
    """An encoded payload kept as parts so a caller can stream it without one big join."""

    header: PayloadHeader
    parts: tuple[Buffer, ...]  # header+table, then each stored tensor's frame (one or more parts)
    stats: DeltaStats
    tensor_hashes: Mapping[str, bytes]  # pass as base_hashes when encoding the next delta

    @property
    def nbytes(self) -> int:
        return self.header.nbytes

    def to_bytes(self) -> bytes:
        return b"".join(self.parts)


class EncodedTensor(NamedTuple):
    entry: TensorEntry
    frame: memoryview  # the tensor's zstd frame inside the payload (no copy)


def entropy_bound_bytes(n: int, k: int, value_bytes: int) -> int:
    """Bytes any encoding needs for k changed positions among n plus their raw values.

    ceil(log2 C(n, k) / 8) + k * value_bytes, with log2 C(n, k) from lgamma.
    """
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got n={n} k={k}")
    bits = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)
    return math.ceil(max(bits, 0.0) / 8) + k * value_bytes


# ---------------------------------------------------------------- vectorised primitives


def _varint_lengths(v: np.ndarray) -> np.ndarray:
    lens = np.ones(v.shape, np.uint8)
    for shift in range(7, 64, 7):
        ge = v >= np.uint64(1 << shift)
        if not ge.any():
            break
        lens += ge
    return lens


def _varint_encode(v: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """LEB128 of every value in `v` (uint64), concatenated; one numpy pass per byte index."""
    ends = np.cumsum(lens, dtype=np.int64)
    starts = ends - lens
    out = np.empty(int(ends[-1]) if ends.size else 0, np.uint8)
    sel = np.arange(v.size)
    for j in range(int(lens.max(initial=0))):
        if j:
            sel = sel[lens[sel] > j]
        byte = ((v[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        byte[lens[sel] > j + 1] |= 0x80  # continuation bit: more bytes follow
        out[starts[sel] + j] = byte
    return out


def _varint_decode(buf: np.ndarray, count: int) -> np.ndarray:
    ends = np.flatnonzero(buf < 0x80)  # the last byte of each varint has no continuation bit
    if ends.size != count or (buf.size and ends[-1] != buf.size - 1):
        raise DeltaFormatError(f"varint section holds {ends.size} values, table says {count}")
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max(initial=0) > 10:
        raise DeltaFormatError("varint longer than 10 bytes")
    vals = (buf[starts] & 0x7F).astype(np.uint64)
    sel = np.arange(count)
    for j in range(1, int(lens.max(initial=0))):
        sel = sel[lens[sel] > j]
        vals[sel] |= (buf[starts[sel] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return vals


def _planes(values: np.ndarray) -> np.ndarray:
    """Byte planes: every element's byte 0 (least significant), then every byte 1, ...

    Putting the low-entropy sign/exponent bytes together makes bf16 weights ~12 % smaller
    under zstd and faster to decompress than interleaved bytes. The native kernel splits
    them in one pass; numpy (the same bytes) with shifts, which stream through memory,
    rather than a strided transpose (measured 4x slower).
    """
    fast = native.split_planes(values)
    if fast is not None:
        return fast
    k, item = values.size, values.itemsize
    out = np.empty(k * item, np.uint8)
    for j in range(item):
        np.copyto(out[j * k : (j + 1) * k], values >> (8 * j) if j else values, casting="unsafe")
    return out


def _diff_planes(base: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Values as differences (`ValueCoding.DIFF`): zigzag(new - base, modulo 2^width) as byte planes.

    Bit-exact for any bits (an integer difference of the bit patterns, not of the floats).
    The native kernel does it in one pass; numpy (the same bytes) in four.
    """
    fast = native.diff_planes(base, new)
    if fast is not None:
        return fast
    d = (new - base).view(np.dtype(f"i{new.itemsize}"))  # unsigned subtraction wraps
    z = ((d << 1) ^ (d >> (8 * new.itemsize - 1))).view(new.dtype)
    return _planes(z)


def _add_diff_planes(raw: np.ndarray, out: np.ndarray) -> None:
    """``out`` (the base bits) += the difference ``raw`` holds: the inverse of `_diff_planes`."""
    if native.add_diff_planes(raw, out):
        return
    z = np.empty_like(out)
    _unplanes_into(raw, z)
    out += (z >> 1) ^ np.negative(z & 1)  # unzigzag; unsigned addition wraps


def _unplanes_into(raw: np.ndarray, out: np.ndarray) -> None:
    k = out.size
    _join_planes([raw[j * k : (j + 1) * k] for j in range(out.itemsize)], out)


def _join_planes(planes: list[np.ndarray], out: np.ndarray) -> None:
    """``out`` from its byte planes, each its own buffer (least significant first)."""
    if out.itemsize > 1 and native.join_planes(planes, out):
        return
    np.copyto(out, planes[-1], casting="unsafe")
    for p in planes[-2::-1]:
        out <<= 8
        out |= p


# A plane whose first bytes zstd cannot shrink below this share is stored raw without
# compressing the rest: a bf16/fp16 weight's low byte and an fp32 weight's two low bytes are
# mantissa bits, near-random (zstd: 1.0000 of raw), and passing them through zstd anyway cost
# a third of a snapshot's compression time here. Measured on bf16 weights: the probe of the
# mantissa plane gives 1.0, of the sign/exponent plane 0.34.
_RAW_PLANE_ABOVE = 0.95
_PLANE_PROBE = 1 << 16


def _plane_sections(level: int | None, values: np.ndarray) -> tuple[tuple[int, ...], tuple[Buffer, ...]]:
    """A full tensor's frame in format 4: its byte planes, each zstd-compressed or raw.

    Returns the sections' lengths (`TensorEntry.planes`) and the sections; a raw one is a
    view of the planes buffer (no copy), so the sink streams it straight out.
    """
    n, zc = values.size, _compressor(level)
    planes = _planes(values)
    sections: list[Buffer] = []
    for j in range(values.itemsize):
        plane = planes[j * n : (j + 1) * n]
        section: Buffer = memoryview(plane)
        probe = plane[:_PLANE_PROBE]
        if len(zc.compress(probe)) <= _RAW_PLANE_ABOVE * probe.size:
            frame = zc.compress(plane)
            if len(frame) < n:
                section = frame
        sections.append(section)
    return tuple(len(x) for x in sections), tuple(sections)


_local = threading.local()  # a compressor per thread and level: zstd contexts are not thread-safe


def _compressor(level: int | None) -> zstd.ZstdCompressor:
    cache = _local.__dict__.setdefault("compressors", {})
    c = cache.get(level)
    if c is None:  # making one allocates its context (~45 us): once per thread, not per tensor
        c = cache[level] = (zstd.ZstdCompressor(compression_params=_WEIGHT_PARAMS) if level is None
                            else zstd.ZstdCompressor(level=level, write_checksum=True))
    return c


def _compress(level: int | None, *sections: np.ndarray) -> bytes:
    total = sum(s.nbytes for s in sections)
    cobj = _compressor(level).compressobj(size=total)
    chunks = [cobj.compress(s) for s in sections if s.nbytes]
    chunks.append(cobj.flush())
    return b"".join(chunks)


def _decompress(frame: memoryview, expected: int, name: str) -> np.ndarray:
    size = zstd.frame_content_size(frame)
    if size != expected and not (expected == 0 and size == -1):
        raise DeltaFormatError(f"tensor {name!r}: frame holds {size} bytes, table implies {expected}")
    try:
        raw = zstd.ZstdDecompressor().decompress(frame, max_output_size=expected)
    except zstd.ZstdError as e:
        raise DeltaFormatError(f"tensor {name!r}: zstd frame is corrupted: {e}") from e
    return np.frombuffer(raw, np.uint8)


def _map(fn: Callable[[_T], _R], items: Iterable[_T], threads: int) -> list[_R]:
    return list(_imap(fn, items, threads))


def _imap(fn: Callable[[_T], _R], items: Iterable[_T], threads: int) -> Iterator[_R]:
    """``fn`` over ``items`` on ``threads`` threads; results in order, each as soon as it and those
    before it are done (all items are submitted at once, so workers run ahead of the consumer)."""
    # numpy, blake3 and zstd release the GIL on large buffers, so tensors encode in parallel.
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="weight-codec") as pool:
        yield from pool.map(fn, items)


# ---------------------------------------------------------------- encoding


class _Encoded(NamedTuple):
    entry: TensorEntry  # offset still 0
    parts: tuple[Buffer, ...]  # the frame: one zstd frame, or (format 4) one section per byte plane
    stats: TensorStats


def _encode_tensor(name: str, new_t: torch.Tensor, base_t: torch.Tensor | None,
                   base_hash: bytes | None, level: int | None) -> _Encoded:
    dtype, shape = dtype_name(new_t.dtype), tuple(new_t.shape)
    new = tensor_bits(new_t)
    n, item = new.size, new.itemsize
    new_hash = hash_bits(new)
    enc, k, pos_nbytes, frame, vals = Encoding.FULL, n, 0, b"", ValueCoding.BITS
    planes: tuple[int, ...] = ()
    if base_t is not None:
        base = tensor_bits(base_t)
        base_hash = base_hash or hash_bits(base)
        if base_t.dtype == new_t.dtype and tuple(base_t.shape) == shape:
            enc, k, sections = _choose(base, new, base_hash == new_hash)
            if enc in (Encoding.VARINT, Encoding.BITMAP):
                pos_nbytes = sections[0].nbytes
                vals, frame = _values_frame(level, *sections)
            elif enc == Encoding.FULL:
                vals, frame = _values_frame(level, None, new, base)
    parts: tuple[Buffer, ...] = (frame,)
    if enc == Encoding.FULL and not frame:  # a snapshot, or a tensor new or reshaped in this version
        if n:
            planes, parts = _plane_sections(level, new)
        else:
            parts = (_compress(level, _planes(new)),)
    length = sum(len(p) for p in parts)
    entry = TensorEntry(name, dtype, shape, enc, 0, length, k, pos_nbytes, new_hash, base_hash or b"", vals, planes)
    bound = n * item if base_t is None else entropy_bound_bytes(n, k, item)
    return _Encoded(entry, parts, TensorStats(name, enc, n, k, n * item, length, bound, vals))


# A frame with the values as differences that is at most this share of its raw sections is
# kept without also compressing the new bits: an optimizer step gives ~0.57 for fp32 (new
# bits ~0.86) and ~0.26 for bf16's changed values (new bits ~0.67); values replaced
# wholesale give ~1, and then both are compressed and the smaller frame kept.
_DIFF_SURE = 0.75


def _values_frame(level: int | None, positions: np.ndarray | None, values: np.ndarray,
                  base_values: np.ndarray) -> tuple[ValueCoding, bytes]:
    """The zstd frame of a delta tensor: its position section (none for FULL), then the stored
    elements' values as differences from the base's, or as new bits where that is smaller."""
    head = () if positions is None else (positions,)
    raw_nbytes = sum(h.nbytes for h in head) + values.nbytes
    diff = _compress(level, *head, _diff_planes(base_values, values))
    if len(diff) <= _DIFF_SURE * raw_nbytes:
        return ValueCoding.DIFF, diff
    bits = _compress(level, *head, _planes(values))
    return (ValueCoding.BITS, bits) if len(bits) <= len(diff) else (ValueCoding.DIFF, diff)


_CHUNK = 1 << 20  # elements per compare/scatter block; a multiple of 8 so bitmaps split on bytes
_DENSE_PROBE = 1 << 14  # elements counted first: a prefix with 1/8 or more changed looks dense


def _sparse_positions(base: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """Changed positions, or None as soon as they reach one per 8 elements (a bitmap wins).

    Block-wise so the boolean mask stays in cache and a dense tensor is abandoned early
    instead of materialising 8 bytes of position per changed element.
    """
    n = new.size
    limit, k, parts = (n + 7) // 8, 0, []
    mask = np.empty(min(n, _CHUNK), bool)
    for c0 in range(0, n, _CHUNK):
        m = mask[: min(n - c0, _CHUNK)]
        np.not_equal(base[c0 : c0 + m.size], new[c0 : c0 + m.size], out=m)
        p = np.flatnonzero(m)
        k += p.size
        if k and k >= limit:
            return None
        if p.size:
            p += c0
            parts.append(p)
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _dense_diff(base: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bitmap, changed values, the base's values there) block by block."""
    n = new.size
    bitmap = np.empty((n + 7) // 8, np.uint8)
    mask = np.empty(min(n, _CHUNK), bool)
    values, base_values = [], []
    for c0 in range(0, n, _CHUNK):
        m = mask[: min(n - c0, _CHUNK)]
        np.not_equal(base[c0 : c0 + m.size], new[c0 : c0 + m.size], out=m)
        bitmap[c0 // 8 : (c0 + m.size + 7) // 8] = np.packbits(m, bitorder="little")
        values.append(new[c0 : c0 + m.size][m])
        base_values.append(base[c0 : c0 + m.size][m])
    if not values:
        return bitmap, new[:0], base[:0]
    return bitmap, np.concatenate(values), np.concatenate(base_values)


def _choose(base: np.ndarray, new: np.ndarray, same_hash: bool) -> tuple[Encoding, int, tuple[np.ndarray, ...]]:
    if same_hash:  # equal BLAKE3 of the bits: skip the compare pass (frozen tensors)
        return Encoding.SAME, 0, ()
    n, item = new.size, new.itemsize
    bitmap_nbytes = (n + 7) // 8
    # With the native kernel (weights/_deltakernel.c): a count when a prefix says most elements
    # changed (fp32 after AdamW: the full tensor wins and nothing needs gathering), else one
    # pass that writes the varint sections. The numpy passes below write the same bytes.
    probe = min(n, _DENSE_PROBE)
    head = native.count_diff(base[:probe], new[:probe])
    k = native.count_diff(base, new) if head is not None and head * 8 >= probe > 0 else None
    fast = -1 if k is not None and k >= bitmap_nbytes else \
        native.sparse_diff(base, new, limit=bitmap_nbytes, gaps_cap=bitmap_nbytes)
    if isinstance(fast, tuple):  # (gaps, new values, base values)
        k = fast[1].size
        return (Encoding.VARINT, k, fast) if k else (Encoding.SAME, 0, ())
    if fast == -1:  # n/8 or more changed: the full tensor if it is not bigger than bitmap + values
        k = native.count_diff(base, new) if k is None else k
        if bitmap_nbytes + k * item >= n * item:
            return Encoding.FULL, k, ()
    pos = None if fast == -1 else _sparse_positions(base, new)
    if pos is not None:
        if pos.size == 0:
            return Encoding.SAME, 0, ()
        gaps = (np.diff(pos, prepend=-1) - 1).astype(np.uint64)
        lens = _varint_lengths(gaps)
        if int(lens.sum(dtype=np.int64)) < bitmap_nbytes:
            # Fewer than n/8 changes: gaps + values are always below the full tensor's size.
            return Encoding.VARINT, pos.size, (_varint_encode(gaps, lens), new[pos], base[pos])
        mask = np.zeros(n, bool)
        mask[pos] = True
        bitmap, values, base_values = np.packbits(mask, bitorder="little"), new[pos], base[pos]
    else:
        bitmap, values, base_values = _dense_diff(base, new)
    k = values.size
    # Decided on raw sizes: compressing both candidates would double the encode cost, and
    # the values (the bulk) compress alike either way.
    if bitmap_nbytes + k * item >= n * item:
        return Encoding.FULL, k, ()
    return Encoding.BITMAP, k, (bitmap, values, base_values)


def tensor_hashes(named: Mapping[str, torch.Tensor], threads: int = 1) -> dict[str, bytes]:
    """SHA-256 of every tensor's bits (the per-tensor hashes the payload table records)."""
    names = list(named)
    return dict(zip(names, _map(lambda k: hash_bits(tensor_bits(named[k])), names, threads)))


@dataclass(frozen=True)
class StreamedVersion:
    """What :func:`stream_version` returns once every tensor frame went to the sink."""

    header: PayloadHeader
    head: bytes  # header + tensor table: the payload is ``head`` followed by the frames sent
    stats: DeltaStats
    tensor_hashes: Mapping[str, bytes]

    @property
    def nbytes(self) -> int:
        return self.header.nbytes


def stream_version(new: Mapping[str, torch.Tensor], version: int, sink: Callable[[bytes], None], *,
                   base: Mapping[str, torch.Tensor] | None = None, base_version: int = -1,
                   base_hashes: Mapping[str, bytes] | None = None,
                   level: int | None = DEFAULT_LEVEL, threads: int = 1) -> StreamedVersion:
    """Encode like :func:`encode_version`, handing each tensor's frame to ``sink`` as soon as it
    (and every frame before it) is ready; the header and table come back at the end.

    The payload is ``result.head`` followed by the frames in the order ``sink`` got them.
    Tensors are encoded ``threads`` at a time while ``sink`` runs on the caller's thread, so
    a sink that writes to the network overlaps the encoding of the tensors after.
    """
    kind = PayloadKind.SNAPSHOT if base is None else PayloadKind.DELTA
    base_digest, bh = "", dict(base_hashes or {})
    if base is not None:
        missing = {k: v for k, v in base.items() if k not in bh}
        bh.update(tensor_hashes(missing, threads))
        base_digest = weights_digest(base, bh)
    names = list(new)
    entries, stats, offset, data_hash = [], [], 0, blake3()
    for e in _imap(lambda k: _encode_tensor(
            k, new[k], None if base is None else base.get(k), bh.get(k), level), names, threads):
        entries.append(replace(e.entry, offset=offset))
        stats.append(e.stats)
        offset += e.entry.length
        for part in e.parts:
            if len(part):
                data_hash.update(part)
                sink(part)
    digest = digest_from_entries([(e.name, e.dtype, e.shape, e.hash) for e in entries])
    header = PayloadHeader(kind, version, base_version if base is not None else -1, len(entries),
                           0, offset, digest, base_digest, data_hash.digest())
    head = pack_header_and_table(header, entries)
    header = replace(header, table_nbytes=len(head) - HEADER_NBYTES)
    delta_stats = DeltaStats(
        kind=kind, total_elements=sum(t.numel for t in stats), changed_elements=sum(t.changed for t in stats),
        raw_nbytes=sum(t.raw_nbytes for t in stats), encoded_nbytes=header.nbytes,
        entropy_bound_nbytes=sum(t.entropy_bound_nbytes for t in stats), tensors=tuple(stats),
    )
    return StreamedVersion(header, head, delta_stats, {e.name: e.hash for e in entries})


def encode_version(new: Mapping[str, torch.Tensor], version: int, *,
                   base: Mapping[str, torch.Tensor] | None = None, base_version: int = -1,
                   base_hashes: Mapping[str, bytes] | None = None,
                   level: int | None = DEFAULT_LEVEL, threads: int = 1) -> EncodedVersion:
    """Encode `new` as a snapshot (`base=None`) or as a delta against `base`.

    `base_hashes`, when given, must be the hashes of exactly these base tensors (the
    `tensor_hashes` of the previous `EncodedVersion`); they save a pass over the base.
    Tensors missing from `base`, or whose dtype/shape changed, are stored in full.
    """
    frames: list[Buffer] = []
    sv = stream_version(new, version, frames.append, base=base, base_version=base_version,
                        base_hashes=base_hashes, level=level, threads=threads)
    return EncodedVersion(sv.header, (sv.head, *frames), sv.stats, sv.tensor_hashes)


def encode_snapshot(named: Mapping[str, torch.Tensor], version: int, *,
                    level: int | None = DEFAULT_LEVEL, threads: int = 1) -> bytes:
    return encode_version(named, version, level=level, threads=threads).to_bytes()


def encode_delta(base: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor],
                 base_version: int, version: int, *, base_hashes: Mapping[str, bytes] | None = None,
                 level: int | None = DEFAULT_LEVEL, threads: int = 1) -> tuple[bytes, DeltaStats]:
    ev = encode_version(new, version, base=base, base_version=base_version,
                        base_hashes=base_hashes, level=level, threads=threads)
    return ev.to_bytes(), ev.stats


# ---------------------------------------------------------------- decoding


def _open(payload: Buffer) -> tuple[PayloadHeader, tuple[TensorEntry, ...], memoryview]:
    header, entries = read_table(payload)
    data = memoryview(payload)[header.data_offset :]
    # Checked before anything is applied, so a corrupted payload never half-updates weights.
    if blake3(data).digest() != header.data_hash:
        raise DeltaFormatError("weight payload data checksum mismatch (corrupted or truncated)")
    _check_table(header, entries)
    return header, entries, data


def _check_table(header: PayloadHeader, entries: tuple[TensorEntry, ...]) -> None:
    """The table must produce the header's version digest; a snapshot holds full tensors only."""
    if digest_from_entries([(e.name, e.dtype, e.shape, e.hash) for e in entries]) != header.digest:
        raise DeltaFormatError("tensor table does not match the header's version digest")
    if header.kind == PayloadKind.SNAPSHOT and any(e.needs_base for e in entries):
        raise DeltaFormatError("a snapshot may only hold full tensors of new bits")


def iter_encoded_tensors(payload: Buffer) -> Iterator[EncodedTensor]:
    """The payload's tensors one by one, still compressed; decode each with `decode_tensor`."""
    _, entries, data = _open(payload)
    for e in entries:
        yield EncodedTensor(e, data[e.offset : e.offset + e.length])


def _decode_into(entry: TensorEntry, frame: memoryview, out: np.ndarray) -> None:
    """Write the entry's new bits into `out`, which holds the base bits for delta encodings."""
    n, item, k = entry.numel, entry.itemsize, entry.changed
    if entry.encoding == Encoding.SAME:
        return
    diff = entry.values == ValueCoding.DIFF
    if entry.encoding == Encoding.FULL and entry.planes:  # format 4: a section per byte plane
        planes, at = [], 0
        for j, size in enumerate(entry.planes):
            section = frame[at : at + size]
            at += size
            planes.append(np.frombuffer(section, np.uint8) if size == n
                          else _decompress(section, n, f"{entry.name}, plane {j}"))
        _join_planes(planes, out)
        return
    if entry.encoding == Encoding.FULL:
        raw = _decompress(frame, n * item, entry.name)
        _add_diff_planes(raw, out) if diff else _unplanes_into(raw, out)
        return
    raw = _decompress(frame, entry.positions_nbytes + k * item, entry.name)
    values = np.zeros(k, out.dtype) if diff else np.empty(k, out.dtype)
    if diff:  # the differences themselves (added to zeros), added to the base's values below
        _add_diff_planes(raw[entry.positions_nbytes :], values)
    else:
        _unplanes_into(raw[entry.positions_nbytes :], values)
    if entry.encoding == Encoding.VARINT:
        gaps = _varint_decode(raw[: entry.positions_nbytes], k)
        if gaps.size and int(gaps.max()) >= n:
            raise DeltaFormatError(f"tensor {entry.name!r}: position gap beyond the tensor")
        positions = np.cumsum(gaps + np.uint64(1)) - np.uint64(1)
        if positions.size and int(positions[-1]) >= n:
            raise DeltaFormatError(f"tensor {entry.name!r}: position beyond the tensor")
        if diff:
            out[positions] += values  # positions are distinct (gaps >= 0); unsigned addition wraps
        else:
            out[positions] = values
    else:
        if entry.positions_nbytes != (n + 7) // 8:
            raise DeltaFormatError(f"tensor {entry.name!r}: bitmap of {entry.positions_nbytes} bytes for {n}")
        bitmap, at = raw[: entry.positions_nbytes], 0
        for c0 in range(0, n, _CHUNK):  # block-wise: no n-byte mask for a huge tensor
            size = min(n - c0, _CHUNK)
            mask = np.unpackbits(bitmap[c0 // 8 : (c0 + size + 7) // 8], count=size, bitorder="little").view(bool)
            cnt = int(np.count_nonzero(mask))
            if at + cnt > k:
                break
            block = out[c0 : c0 + size]
            if diff:
                block[mask] += values[at : at + cnt]
            else:
                block[mask] = values[at : at + cnt]
            at += cnt
        if at != k:
            raise DeltaFormatError(f"tensor {entry.name!r}: bitmap marks a different count than {k}")


def _check_result(entry: TensorEntry, bits: np.ndarray, verify: bool) -> None:
    if verify and hash_bits(bits) != entry.hash:
        raise DeltaFormatError(
            f"tensor {entry.name!r}: decoded bits do not match the trainer's checksum "
            "(codec bug or base modified during apply); reload the latest snapshot")


def _usable_base(entry: TensorEntry, t: torch.Tensor | None) -> bool:
    return t is not None and dtype_name(t.dtype) == entry.dtype and tuple(t.shape) == entry.shape


def decode_tensor(entry: TensorEntry, frame: memoryview, base: torch.Tensor | None = None,
                  *, verify: bool = True) -> torch.Tensor:
    """Decode one tensor into a new tensor; delta encodings need its base tensor.

    Does not check the base's checksum (`decode` does, over the whole version).
    """
    if not entry.needs_base:
        out = np.empty(entry.numel, _DTYPES[entry.dtype].bits)
    elif _usable_base(entry, base):
        out = tensor_bits(base).copy()  # type: ignore[arg-type]
    else:
        raise BaseMismatchError("(this tensor's base)", "(missing, or another dtype/shape)", (entry.name,))
    _decode_into(entry, frame, out)
    _check_result(entry, out, verify)
    return bits_to_tensor(out, entry.dtype, entry.shape)


def _check_base(header: PayloadHeader, entries: tuple[TensorEntry, ...],
                base: Mapping[str, torch.Tensor] | None, base_hashes: Mapping[str, bytes] | None,
                threads: int) -> None:
    if header.kind != PayloadKind.DELTA:
        return
    if base is None:
        raise BaseMismatchError(header.base_digest, "(no base given)", ())
    hashes = dict(base_hashes or {})
    hashes.update(tensor_hashes({k: v for k, v in base.items() if k not in hashes}, threads))
    actual = weights_digest(base, hashes)
    if actual != header.base_digest:
        differing = tuple(e.name for e in entries if e.base_hash and hashes.get(e.name) != e.base_hash)
        raise BaseMismatchError(header.base_digest, actual, differing)


def decode(payload: Buffer, base: Mapping[str, torch.Tensor] | None = None, *,
           base_hashes: Mapping[str, bytes] | None = None, verify: bool = True,
           threads: int = 1) -> dict[str, torch.Tensor]:
    """The version a payload describes, as new tensors (a snapshot needs no base).

    For a delta, `base` must be exactly the base version (checked against the header's base
    digest; `base_hashes` are trusted per-tensor hashes that skip re-hashing it). With
    `verify`, every result tensor is checked against the trainer's checksum.
    """
    _, entries, data = _open(payload)
    _check_base(read_header(payload), entries, base, base_hashes, threads)
    tensors = _map(lambda e: decode_tensor(e, data[e.offset : e.offset + e.length],
                                           None if base is None else base.get(e.name), verify=verify),
                   entries, threads)
    return {e.name: t for e, t in zip(entries, tensors)}


def decode_streaming(payload: Buffer, ready: Callable[[int], None], *, verify: bool = True,
                     threads: int = 1, release: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
    """Decode a snapshot while its bytes are still arriving in ``payload``.

    ``ready(n)`` must return once ``payload[:n]`` holds the payload's first ``n`` bytes (and
    raise if they never will). Each tensor is decoded on one of ``threads`` workers as soon
    as its frame is there, so decoding overlaps the transfer. The checks are those of
    :func:`decode`: the data checksum and the table's version digest before returning, and
    each tensor against the trainer's checksum. Only snapshots: a delta is checked against
    its base before anything is written, which needs the whole payload.

    ``release(start, end)``, if given, is called once a tensor is decoded with its frame's
    byte range in ``payload``: nothing reads those bytes again (the data checksum took them
    before the decode), so a caller may free them (:class:`~astraflow.topics.ReleasableBuffer`).
    """
    ready(HEADER_NBYTES)
    header = read_header(memoryview(payload)[:HEADER_NBYTES])
    ready(header.data_offset)
    header, entries = read_table(memoryview(payload)[: header.data_offset], head_only=True)
    if header.kind != PayloadKind.SNAPSHOT:
        raise DeltaFormatError("decode_streaming takes snapshots (full tensors only); use decode for deltas")
    _check_table(header, entries)
    data = memoryview(payload)[header.data_offset : header.nbytes]
    data_hash = blake3()

    def frames() -> Iterator[TensorEntry]:
        for e in entries:  # handed to the workers in order, each once its bytes are in
            ready(header.data_offset + e.offset + e.length)
            data_hash.update(data[e.offset : e.offset + e.length])
            yield e

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="weight-codec") as pool:
        futures = []
        for e in frames():
            futures.append(f := pool.submit(decode_tensor, e, data[e.offset : e.offset + e.length], verify=verify))
            if release is not None:
                start = header.data_offset + e.offset
                f.add_done_callback(lambda _, a=start, b=start + e.length: release(a, b))
        tensors = [f.result() for f in futures]
    if data_hash.digest() != header.data_hash:
        raise DeltaFormatError("weight payload data checksum mismatch (corrupted or truncated)")
    return {e.name: t for e, t in zip(entries, tensors)}


def apply_in_place(payload: Buffer, tensors: MutableMapping[str, torch.Tensor], *,
                   base_hashes: Mapping[str, bytes] | None = None, verify: bool = True,
                   threads: int = 1) -> dict[str, bytes]:
    """Apply a delta (or load a snapshot) into existing tensors; returns the new tensor hashes.

    Tensors whose dtype and shape are unchanged are overwritten in their existing storage (so
    an engine holding them sees the new weights); new or reshaped ones are replaced in
    `tensors`, and names absent from the new version are removed. Base mismatch and payload
    corruption are detected before anything is written. Pass the returned hashes as
    `base_hashes` next time to skip re-hashing the base.
    """
    header, entries, data = _open(payload)
    _check_base(header, entries, tensors, base_hashes, threads)

    def apply_one(e: TensorEntry) -> torch.Tensor | None:
        t = tensors.get(e.name)
        if not _usable_base(e, t):  # only entries that need no base get here: the base check passed
            return decode_tensor(e, data[e.offset : e.offset + e.length], None, verify=verify)
        assert t is not None
        if e.encoding == Encoding.SAME:
            return None
        shared = t.device.type == "cpu" and t.is_contiguous()
        bits = tensor_bits(t)  # a view of t's storage when shared, else a copy
        _decode_into(e, data[e.offset : e.offset + e.length], bits)
        _check_result(e, bits, verify)
        if not shared:
            t.copy_(bits_to_tensor(bits, e.dtype, e.shape))
        return None

    replaced = _map(apply_one, entries, threads)
    for e, t in zip(entries, replaced):
        if t is not None:
            tensors[e.name] = t
    for name in set(tensors) - {e.name for e in entries}:
        del tensors[name]
    return {e.name: e.hash for e in entries}
