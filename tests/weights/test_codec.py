"""Property tests of the weight snapshot/delta codec: every round trip must be bit-exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from astraflow.weights import codec as d
from astraflow.weights import format as weight_format
from astraflow.weights.format import HEADER_NBYTES, read_table, tensor_bits

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
BITS = {torch.bfloat16: np.uint16, torch.float16: np.uint16, torch.float32: np.uint32}
PATTERNS = {"none": 0.0, "one": None, "1%": 0.01, "50%": 0.5, "all": 1.0}
EXPECTED_ENCODING = {
    "none": d.Encoding.SAME, "one": d.Encoding.VARINT, "1%": d.Encoding.VARINT,
    "50%": d.Encoding.BITMAP, "all": d.Encoding.FULL,
}


def random_tensor(rng: np.random.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Uniformly random bits, so NaNs, infinities, subnormals and -0.0 all occur."""
    bits = BITS[dtype]
    raw = rng.integers(0, np.iinfo(bits).max, size=shape, dtype=bits, endpoint=True)
    signed = raw.view(np.int16 if bits == np.uint16 else np.int32)
    return torch.from_numpy(np.ascontiguousarray(signed)).view(dtype)


def change(rng: np.random.Generator, t: torch.Tensor, pattern: str) -> tuple[torch.Tensor, int]:
    """A copy of t with the pattern's share of elements set to different random bits."""
    out = t.clone()
    bits = tensor_bits(out)
    n = bits.size
    k = 1 if pattern == "one" else round(PATTERNS[pattern] * n)
    pos = rng.choice(n, size=k, replace=False)
    # xor with a non-zero mask guarantees every chosen element really changes
    flip = rng.integers(1, np.iinfo(bits.dtype).max, size=k, dtype=bits.dtype, endpoint=True)
    bits[pos] ^= flip
    return out, k


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(tensor_bits(a), tensor_bits(b))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(sorted(a)) == list(sorted(b))
    for k in a:
        assert_bits_equal(a[k], b[k])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_delta_round_trip_is_bitwise(dtype: torch.dtype, pattern: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = {"w": random_tensor(rng, dtype, (97, 211)), "b": random_tensor(rng, dtype, (211,))}
    new = {name: change(rng, t, pattern)[0] for name, t in base.items()}
    k_w = int(np.count_nonzero(tensor_bits(base["w"]) != tensor_bits(new["w"])))

    payload, stats = d.encode_delta(base, new, base_version=3, version=4)
    assert_same_weights(d.decode(payload, base), new)
    live = {name: t.clone() for name, t in base.items()}
    storage = live["w"].data_ptr()
    hashes = d.apply_in_place(payload, live)
    assert_same_weights(live, new)
    assert live["w"].data_ptr() == storage  # overwritten where it lives, not replaced
    assert hashes == d.tensor_hashes(new)

    assert stats.encodings["w"] == EXPECTED_ENCODING[pattern]
    assert stats.tensors[0].changed == k_w
    assert stats.encoded_nbytes == len(payload)
    header = d.read_header(payload)
    assert (header.kind, header.base_version, header.version) == (d.PayloadKind.DELTA, 3, 4)
    assert header.digest == d.weights_digest(new)
    assert header.base_digest == d.weights_digest(base)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_bit_patterns_round_trip(dtype: torch.dtype) -> None:
    # Values that compare equal (0.0 / -0.0) or unequal to themselves (NaN) must still be
    # diffed and restored by their bits.
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 1.0]
    base = {"x": torch.tensor([0.0, 0.0, 1.0, 1.0, float("nan"), 0.0, 1.0], dtype=dtype)}
    new = {"x": torch.tensor(specials, dtype=dtype)}
    nan_payloads = {torch.bfloat16: [0x7FC1, 0xFFFF], torch.float16: [0x7E01, 0xFC01],
                    torch.float32: [0x7F800001, 0xFFC00001]}[dtype]
    tensor_bits(new["x"])[[4, 6]] = nan_payloads  # signalling/negative NaN with payloads
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.changed_elements == int(np.count_nonzero(tensor_bits(base["x"]) != tensor_bits(new["x"])))
    assert stats.changed_elements >= 5  # -0.0, inf, -inf, the two NaN payloads at least
    assert_same_weights(d.decode(payload, base), new)
    assert_same_weights(d.decode(d.encode_snapshot(new, 1)), new)


SHAPES = [(), (0,), (0, 5), (3, 0, 2), (1,), (7,), (1, 1, 1), (3, 5, 7)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shapes_including_scalar_and_empty(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(7)
    base = {f"t{i}": random_tensor(rng, dtype, s) for i, s in enumerate(SHAPES)}
    new = {name: change(rng, t, "50%")[0] if t.numel() else t.clone() for name, t in base.items()}
    snap = d.encode_snapshot(base, version=1)
    assert d.read_header(snap).kind == d.PayloadKind.SNAPSHOT
    assert_same_weights(d.decode(snap), base)
    payload, _ = d.encode_delta(base, new, 1, 2)
    assert_same_weights(d.decode(payload, base), new)
    live = {k: v.clone() for k, v in base.items()}
    d.apply_in_place(payload, live)
    assert_same_weights(live, new)


def test_snapshot_round_trip_and_in_place_load() -> None:
    rng = np.random.default_rng(3)
    named = {"emb": random_tensor(rng, torch.bfloat16, (300, 64)), "norm": random_tensor(rng, torch.float32, (64,)),
             "mask": torch.tensor([True, False, True]), "pos": torch.arange(10, dtype=torch.int64)}
    snap = d.encode_snapshot(named, version=9)
    header = d.read_header(snap)
    assert (header.version, header.base_version, header.base_digest) == (9, -1, "")
    assert_same_weights(d.decode(snap), named)
    # Loading a snapshot into stale tensors: same-shape ones are overwritten in place,
    # others replaced, extra names dropped.
    live = {"emb": torch.zeros(300, 64, dtype=torch.bfloat16), "norm": torch.zeros(3), "old": torch.zeros(2)}
    d.apply_in_place(snap, live)
    assert_same_weights(live, named)


def test_tensor_set_changes_in_a_delta() -> None:
    rng = np.random.default_rng(4)
    base = {"keep": random_tensor(rng, torch.float16, (50,)), "gone": random_tensor(rng, torch.float16, (5,)),
            "grow": random_tensor(rng, torch.float32, (4,)), "cast": random_tensor(rng, torch.float32, (6,))}
    new = {"keep": change(rng, base["keep"], "one")[0], "grow": random_tensor(rng, torch.float32, (8,)),
           "cast": base["cast"].to(torch.bfloat16), "added": random_tensor(rng, torch.bfloat16, (3, 3))}
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings == {"keep": d.Encoding.VARINT, "grow": d.Encoding.FULL,
                               "cast": d.Encoding.FULL, "added": d.Encoding.FULL}
    assert_same_weights(d.decode(payload, base), new)
    live = {k: v.clone() for k, v in base.items()}
    d.apply_in_place(payload, live)
    assert_same_weights(live, new)


def test_wrong_base_is_detected_before_anything_is_written() -> None:
    rng = np.random.default_rng(5)
    v0 = {"a": random_tensor(rng, torch.bfloat16, (64, 64)), "b": random_tensor(rng, torch.bfloat16, (64,))}
    v1 = {k: change(rng, t, "1%")[0] for k, t in v0.items()}
    v2 = {k: change(rng, t, "1%")[0] for k, t in v1.items()}
    delta_12, _ = d.encode_delta(v1, v2, 1, 2)

    with pytest.raises(d.BaseMismatchError) as err:
        d.decode(delta_12, v0)
    assert set(err.value.tensors) == {"a", "b"}
    with pytest.raises(d.BaseMismatchError):
        d.decode(delta_12)  # a delta without any base
    with pytest.raises(d.BaseMismatchError):
        d.decode(delta_12, {**v1, "extra": torch.zeros(1)})  # the tensor set is part of the base

    live = {k: t.clone() for k, t in v0.items()}
    with pytest.raises(d.BaseMismatchError):
        d.apply_in_place(delta_12, live)
    assert_same_weights(live, v0)
    # Trusted hashes that lie about the base are caught too: the digest is over the hashes.
    with pytest.raises(d.BaseMismatchError):
        d.apply_in_place(delta_12, live, base_hashes=d.tensor_hashes(v0))


def test_corrupted_payload_is_detected() -> None:
    rng = np.random.default_rng(6)
    base = {"a": random_tensor(rng, torch.float32, (1000,))}
    new = {"a": change(rng, base["a"], "1%")[0]}
    payload, _ = d.encode_delta(base, new, 0, 1)
    header = d.read_header(payload)
    cases = {
        "data byte": header.data_offset + header.data_nbytes // 2,
        "table byte": HEADER_NBYTES + 5,
        "header version": 10,
        "header check": HEADER_NBYTES - 1,
        "magic": 0,
    }
    for at in cases.values():
        bad = bytearray(payload)
        bad[at] ^= 0x40
        live = {"a": base["a"].clone()}
        with pytest.raises(d.DeltaFormatError):
            d.apply_in_place(bytes(bad), live)
        assert_same_weights(live, base)  # nothing written before the check failed
    with pytest.raises(d.DeltaFormatError):
        d.decode(payload[:-1], base)
    with pytest.raises(d.DeltaFormatError):
        d.decode(payload + b"\0", base)
    with pytest.raises(d.DeltaFormatError):
        d.read_header(payload[:20])


def test_digest_is_stable_and_covers_names_dtypes_shapes_and_bits() -> None:
    named = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.tensor([1.0, -0.0], dtype=torch.bfloat16)}
    digest = d.weights_digest(named)
    # Pinned: subscribers and trainers of different builds must agree on this value.
    assert digest == PINNED_DIGEST
    assert d.weights_digest(dict(reversed(list(named.items())))) == digest
    assert d.weights_digest({k: v.clone() for k, v in named.items()}) == digest
    assert d.weights_digest(named, d.tensor_hashes(named)) == digest
    variants = [
        {**named, "a": torch.tensor([1.0, 0.0], dtype=torch.bfloat16)},  # one bit (the sign of zero)
        {**named, "a": named["a"].view(torch.float16)},  # same bits, other dtype
        {**named, "b": named["b"].reshape(3, 2)},  # same bits, other shape
        {"c": named["b"], "a": named["a"]},  # other name
        {"a": named["a"]},  # fewer tensors
    ]
    assert len({d.weights_digest(v) for v in variants} | {digest}) == len(variants) + 1


# Format 2 (BLAKE3); recomputed independently of the codec from the documented line format
# (blake3 over "astraflow-weights-v2\n" and one JSON line per tensor, in name order).
PINNED_DIGEST = "fc20cf47a1e87c4f7568583dbf68623b3a4436f1238d75ba0c4dc206948181ba"


def test_chained_deltas_with_cached_hashes_and_streaming_decode() -> None:
    rng = np.random.default_rng(8)
    versions = [{"w": random_tensor(rng, torch.bfloat16, (128, 40)), "v": random_tensor(rng, torch.float32, (40,))}]
    for _ in range(3):
        versions.append({k: change(rng, t, "1%")[0] for k, t in versions[-1].items()})
    live = {k: t.clone() for k, t in versions[0].items()}
    trainer_hashes = d.tensor_hashes(versions[0])
    subscriber_hashes = dict(trainer_hashes)
    for i in range(1, len(versions)):
        ev = d.encode_version(versions[i], i, base=versions[i - 1], base_version=i - 1,
                              base_hashes=trainer_hashes, threads=2)
        trainer_hashes = dict(ev.tensor_hashes)
        payload = ev.to_bytes()
        # tensor-by-tensor decode, as a subscriber bounding memory would do it
        streamed = {enc.entry.name: d.decode_tensor(enc.entry, enc.frame, live[enc.entry.name])
                    for enc in d.iter_encoded_tensors(payload)}
        assert_same_weights(streamed, versions[i])
        subscriber_hashes = d.apply_in_place(payload, live, base_hashes=subscriber_hashes)
        assert_same_weights(live, versions[i])


def test_encoding_is_deterministic_and_thread_count_independent() -> None:
    rng = np.random.default_rng(9)
    base = {f"t{i}": random_tensor(rng, torch.bfloat16, (256,)) for i in range(6)}
    new = {k: change(rng, t, "50%")[0] for k, t in base.items()}
    one, _ = d.encode_delta(base, new, 0, 1, threads=1)
    two, _ = d.encode_delta(base, new, 0, 1, threads=2)
    assert one == two == d.encode_delta(base, new, 0, 1)[0]


def test_non_contiguous_tensors() -> None:
    rng = np.random.default_rng(10)
    base = {"t": random_tensor(rng, torch.float32, (40, 30)).t()}
    new = {"t": change(rng, base["t"].contiguous(), "1%")[0].t().contiguous().t()}
    payload, _ = d.encode_delta(base, new, 0, 1)
    assert_same_weights({"t": d.decode(payload, base)["t"]}, {"t": new["t"].contiguous()})
    live = {"t": base["t"].clone()}  # clone keeps the transposed strides
    assert not live["t"].is_contiguous()
    d.apply_in_place(payload, live)
    assert_bits_equal(live["t"].contiguous(), new["t"].contiguous())


def test_varint_positions_across_byte_boundaries() -> None:
    # Gaps of 0, 127, 128, 16383, 16384, 2**21 ... exercise 1- to 4-byte varints.
    n = 3 * 2**21
    positions = np.cumsum([0, 1, 128, 129, 16384, 16385, 2**21, 2**21 + 1]).astype(np.int64)
    positions = positions[positions < n]
    base = {"big": torch.zeros(n, dtype=torch.bfloat16)}
    new = {"big": base["big"].clone()}
    tensor_bits(new["big"])[positions] = 0x3F80
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings["big"] == d.Encoding.VARINT
    assert_same_weights(d.decode(payload, base), new)
    gaps = np.array([0, 1, 127, 128, 16383, 16384, 2**32, 2**63 - 1], dtype=np.uint64)
    lens = d._varint_lengths(gaps)
    encoded = d._varint_encode(gaps, lens)
    assert list(lens) == [1, 1, 1, 2, 2, 3, 5, 9]
    assert np.array_equal(d._varint_decode(encoded, gaps.size), gaps)


def test_entropy_bound() -> None:
    assert d.entropy_bound_bytes(100, 0, 2) == 0
    assert d.entropy_bound_bytes(100, 100, 2) == 200
    assert d.entropy_bound_bytes(8, 4, 2) == math.ceil(math.log2(70) / 8) + 8
    n, k = 10**9, 10**7
    bits = math.log2(math.e) * (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1))
    assert d.entropy_bound_bytes(n, k, 2) == math.ceil(bits / 8) + 2 * k


@pytest.mark.parametrize("pattern", ["1%", "50%", "all"])
def test_block_boundaries(monkeypatch: pytest.MonkeyPatch, pattern: str) -> None:
    # Small blocks so the block-wise compare, bitmap and scatter paths cross many boundaries.
    monkeypatch.setattr(d, "_CHUNK", 64)
    rng = np.random.default_rng(11)
    base = {"t": random_tensor(rng, torch.bfloat16, (1001,))}
    new = {"t": change(rng, base["t"], pattern)[0]}
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings["t"] == {"1%": d.Encoding.VARINT, "50%": d.Encoding.BITMAP, "all": d.Encoding.FULL}[pattern]
    assert_same_weights(d.decode(payload, base), new)


def test_bitmap_chosen_when_gaps_cost_as_much() -> None:
    # 127 changes among 1024: 126 adjacent (1 byte each) and one 300 further (2 bytes) make
    # 128 varint bytes, equal to the bitmap, so the bitmap is used.
    base = {"t": torch.zeros(1024, dtype=torch.float16)}
    new = {"t": base["t"].clone()}
    tensor_bits(new["t"])[np.r_[0:126, 426]] = 0x3C00
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings["t"] == d.Encoding.BITMAP and stats.changed_elements == 127
    assert_same_weights(d.decode(payload, base), new)


def test_stream_version_writes_the_same_payload_as_encode_version() -> None:
    rng = np.random.default_rng(7)
    base = {f"t{i}": random_tensor(rng, torch.bfloat16, (300, 41)) for i in range(5)}
    new = {k: change(rng, v, "1%")[0] for k, v in base.items()}
    for kw in ({}, {"base": base, "base_version": 3}):
        frames: list[bytes] = []
        sv = d.stream_version(new, 4, frames.append, threads=2, **kw)
        assert sv.head + b"".join(frames) == d.encode_version(new, 4, threads=1, **kw).to_bytes()
        assert sv.nbytes == len(sv.head) + sum(map(len, frames))


def test_decode_streaming_decodes_while_bytes_arrive_and_checks_like_decode() -> None:
    import threading

    rng = np.random.default_rng(8)
    named = {f"t{i}": random_tensor(rng, torch.float32, (257, 33)) for i in range(6)}
    payload = d.encode_snapshot(named, 9)
    buf, have, cond = bytearray(len(payload)), [0], threading.Condition()
    asked: list[int] = []

    def ready(n: int) -> None:
        asked.append(n)
        with cond:
            assert cond.wait_for(lambda: have[0] >= n, 10)

    def arrive() -> None:  # in 1000-byte steps, as chunks would
        for start in range(0, len(payload), 1000):
            buf[start : start + 1000] = payload[start : start + 1000]
            with cond:
                have[0] = min(len(payload), start + 1000)
                cond.notify_all()

    released: list[tuple[int, int]] = []

    def release(start: int, end: int) -> None:  # what a ReleasableBuffer gives back: zero it here
        released.append((start, end))
        buf[start:end] = bytes(end - start)

    feeder = threading.Thread(target=arrive)
    feeder.start()
    out = d.decode_streaming(buf, ready, threads=2, release=release)
    feeder.join()
    assert_same_weights(out, named)
    assert len(set(asked)) > len(named)  # header, table, then one wait per tensor: not one wait for all
    # every tensor's frame was released once, after it was decoded and checksummed (the bytes
    # were zeroed on release and every tensor and the data checksum still came out right)
    header, entries = read_table(payload)
    assert sorted(released) == [(header.data_offset + e.offset, header.data_offset + e.offset + e.length)
                                for e in entries]
    # a flipped data byte: the tensor check or the data checksum refuses it
    bad = bytearray(payload)
    bad[-10] ^= 1
    with pytest.raises(d.DeltaFormatError):
        d.decode_streaming(bad, lambda n: None)
    # a delta is refused: it must be checked against its base before anything is written
    delta = d.encode_version({k: v + 1 for k, v in named.items()}, 10, base=named, base_version=9).to_bytes()
    with pytest.raises(d.DeltaFormatError, match="snapshots"):
        d.decode_streaming(delta, lambda n: None)


def optimizer_step(t: torch.Tensor, seed: int, lr: float = 2e-4) -> torch.Tensor:
    """An AdamW-like update: every element moves by about ``lr`` (every fp32 element changes)."""
    g = torch.Generator().manual_seed(seed)
    step = lr * torch.sign(torch.randn(t.shape, generator=g)) * (0.2 + torch.rand(t.shape, generator=g))
    return (t.float() - step).to(t.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_small_dense_update_is_stored_as_its_difference(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    base = {"w": (0.02 * torch.randn(300, 211, generator=g)).to(dtype)}
    new = {"w": optimizer_step(base["w"], 1, lr=2e-4 if dtype == torch.float32 else 5e-4)}
    # bits where the integer difference wraps around, and where it crosses sign and exponent
    specials = {0: (0, -1), 1: (-1, 0), 2: (0x7F80, -0x7F81) if dtype != torch.float32 else (0x7F800000, -0x7F800001)}
    for i, (a, b) in specials.items():
        tensor_bits(base["w"]).view(tensor_bits(base["w"]).dtype.str.replace("u", "i"))[i] = a
        tensor_bits(new["w"]).view(tensor_bits(new["w"]).dtype.str.replace("u", "i"))[i] = b
    changed = int(np.count_nonzero(tensor_bits(base["w"]) != tensor_bits(new["w"])))
    assert changed > 0.9 * base["w"].numel()

    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings == {"w": d.Encoding.FULL} and stats.value_codings == {"w": d.ValueCoding.DIFF}
    assert stats.changed_elements == changed
    full = d.encode_version(new, 1).stats.tensors[0].encoded_nbytes  # the same tensor stored in full
    assert stats.tensors[0].encoded_nbytes < 0.8 * full
    assert_same_weights(d.decode(payload, base), new)
    live = {"w": base["w"].clone()}
    storage = live["w"].data_ptr()
    d.apply_in_place(payload, live)
    assert_same_weights(live, new)
    assert live["w"].data_ptr() == storage
    with pytest.raises(d.BaseMismatchError):  # a difference means nothing on another base
        d.decode(payload, {"w": new["w"]})


def test_a_wholesale_change_is_stored_in_full_when_that_is_smaller() -> None:
    rng = np.random.default_rng(5)
    base = {"w": random_tensor(rng, torch.float32, (20_000,))}
    new = {"w": torch.ones(20_000)}  # compresses to almost nothing; its difference from random bits does not
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.value_codings == {"w": d.ValueCoding.BITS} and stats.encoded_nbytes < 2_000
    assert_same_weights(d.decode(payload, base), new)


def _new_bits_only(level, positions, values, base_values):  # what format 2 wrote
    return d.ValueCoding.BITS, d._compress(level, *(() if positions is None else (positions,)), d._planes(values))


def test_format_2_payloads_are_still_read_and_cannot_hold_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(2)
    base = {"w": torch.randn(4000, generator=g), "s": torch.randn(4000, generator=g)}
    new = {"w": optimizer_step(base["w"], 3), "s": base["s"].clone()}
    new["s"][::100] = optimizer_step(new["s"][::100], 4)
    monkeypatch.setattr(weight_format, "FORMAT_VERSION", 2)
    inconsistent, _ = d.encode_delta(base, new, 0, 1)  # format 2 in the header, differences inside
    monkeypatch.setattr(d, "_values_frame", _new_bits_only)
    old, stats = d.encode_delta(base, new, 0, 1)  # what the previous build wrote
    assert stats.encodings == {"w": d.Encoding.FULL, "s": d.Encoding.VARINT}
    monkeypatch.setattr(weight_format, "FORMAT_VERSION", 1)
    format_1 = d.encode_snapshot(base, 0)
    monkeypatch.undo()
    assert d.read_header(old).format_version == 2
    assert_same_weights(d.decode(old, base), new)
    with pytest.raises(d.DeltaFormatError, match="format-2 payload cannot hold values stored as differences"):
        d.decode(inconsistent, base)
    with pytest.raises(d.DeltaFormatError, match="format 1; this build reads formats 2, 3"):
        d.decode(format_1)
    current, stats = d.encode_delta(base, new, 0, 1)
    assert d.read_header(current).format_version == weight_format.FORMAT_VERSION >= 3
    assert stats.value_codings == {"w": d.ValueCoding.DIFF, "s": d.ValueCoding.DIFF}
    assert len(current) < 0.8 * len(old)
    assert_same_weights(d.decode(current, base), new)


@pytest.mark.parametrize(("share", "encoding"), [(0.01, d.Encoding.VARINT), (0.35, d.Encoding.BITMAP)])
def test_sparse_changes_store_their_values_as_differences(monkeypatch: pytest.MonkeyPatch, share: float,
                                                          encoding: d.Encoding) -> None:
    # bf16 after a small step: a share of the weights moved by a unit or two in the last place
    g = torch.Generator().manual_seed(1)
    base = {"w": (0.02 * torch.randn(400, 300, generator=g)).to(torch.bfloat16)}
    new = {"w": base["w"].clone()}
    bits = tensor_bits(new["w"])
    pos = np.random.default_rng(0).choice(bits.size, round(share * bits.size), replace=False)
    bits[pos] += np.where(np.arange(pos.size) % 3 == 0, 0xFFFF, 1).astype(np.uint16)  # -1 or +1, wrapping
    payload, stats = d.encode_delta(base, new, 0, 1)
    assert stats.encodings == {"w": encoding} and stats.value_codings == {"w": d.ValueCoding.DIFF}
    assert stats.changed_elements == pos.size
    assert_same_weights(d.decode(payload, base), new)
    live = {"w": base["w"].clone()}
    d.apply_in_place(payload, live)
    assert_same_weights(live, new)
    monkeypatch.setattr(d, "_values_frame", _new_bits_only)
    as_bits, _ = d.encode_delta(base, new, 0, 1)
    assert len(payload) < 0.8 * len(as_bits)


def gaussian(seed: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    """Weights as a model holds them (the sign/exponent byte compresses, the mantissa does not)."""
    return (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.02).to(dtype)


def _one_frame(level, values):  # what formats 2 and 3 wrote for a full tensor of new bits
    return (), (d._compress(level, d._planes(values)),)


def test_a_full_tensor_stores_its_mantissa_planes_raw_and_compresses_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 3 * d._PLANE_PROBE + 5  # past the probe: the whole plane follows the probe's decision
    named = {"bf16": gaussian(1, torch.bfloat16, n), "fp32": gaussian(2, torch.float32, n),
             "ones": torch.ones(n, dtype=torch.bfloat16), "tiny": gaussian(3, torch.float16, 3)}
    snap = d.encode_snapshot(named, 4)
    header, entries = d.read_table(snap)
    planes = {e.name: e.planes for e in entries}
    assert header.format_version == 4
    assert planes["bf16"][0] == n and planes["bf16"][1] < 0.5 * n  # mantissa raw, sign/exponent compressed
    assert planes["fp32"][:2] == (n, n) and planes["fp32"][3] < 0.5 * n
    assert all(p < 0.01 * n for p in planes["ones"])  # every plane of a constant tensor compresses
    assert planes["tiny"] == (3, 3)  # a frame would be bigger than 3 bytes: stored raw
    assert_same_weights(d.decode(snap), named)
    live = {k: torch.zeros_like(v) for k, v in named.items()}
    d.apply_in_place(snap, live)
    assert_same_weights(live, named)
    assert_same_weights(d.decode_streaming(snap, lambda _n: None, threads=2), named)
    # no bigger than one zstd frame of all planes (what format 3 wrote), and read like it
    monkeypatch.setattr(d, "_plane_sections", _one_frame)
    monkeypatch.setattr(weight_format, "FORMAT_VERSION", 3)
    format_3 = d.encode_snapshot(named, 4)
    monkeypatch.undo()
    assert all(not e.planes for e in d.read_table(format_3)[1])
    assert_same_weights(d.decode(format_3), named)
    assert len(snap) <= 1.01 * len(format_3)


def test_a_corrupt_raw_plane_or_plane_table_is_refused() -> None:
    n = 5000
    named = {"w": gaussian(4, torch.bfloat16, n)}
    snap = d.encode_snapshot(named, 1)
    header, (entry,) = d.read_table(snap)
    frame = memoryview(snap)[header.data_offset : header.data_offset + entry.length]
    assert entry.planes[0] == n
    bad = bytearray(frame)
    bad[n // 2] ^= 0x01  # one mantissa bit of the raw plane: no zstd checksum covers it
    with pytest.raises(d.DeltaFormatError, match="decoded bits do not match"):
        d.decode_tensor(entry, memoryview(bytes(bad)))
    bad = bytearray(frame)
    bad[n + 5] ^= 0x40  # inside the zstd frame of the sign/exponent plane
    with pytest.raises(d.DeltaFormatError, match="plane 1"):
        d.decode_tensor(entry, memoryview(bytes(bad)))

    def repacked(e, fmt: int = weight_format.FORMAT_VERSION) -> bytes:
        import dataclasses
        old = weight_format.FORMAT_VERSION
        weight_format.FORMAT_VERSION = fmt
        try:
            head = weight_format.pack_header_and_table(header, [dataclasses.replace(entry, **e)])
        finally:
            weight_format.FORMAT_VERSION = old
        return head + bytes(memoryview(snap)[header.data_offset :])

    assert_same_weights(d.decode(repacked({})), named)  # the repacking itself is sound
    for change, message in [({"planes": (n, entry.planes[1] - 1)}, "do not fit"),
                            ({"planes": (n,)}, "do not fit"),
                            ({"planes": (entry.length, 0)}, "do not fit")]:
        with pytest.raises(d.DeltaFormatError, match=message):
            d.decode(repacked(change))
    with pytest.raises(d.DeltaFormatError, match="format-3 payload"):
        d.decode(repacked({}, fmt=3))
