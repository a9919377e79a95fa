"""The delta encoder's native kernel writes exactly what its numpy path writes.

weights/_deltakernel.c is built by the project's install (setup.py) and loaded with
ctypes; ``ASTRAFLOW_NATIVE=0`` switches it off. Every comparison below runs both paths on
the same arrays: sizes around the kernel's 64-byte blocks (its tail is handled apart),
every element width, densities either side of the VARINT/BITMAP/FULL thresholds, gaps of
1 to 4 LEB128 bytes, and the two early exits.
"""

import os
import platform

import numpy as np
import pytest
import torch

from astraflow.weights import codec, native


def _both(monkeypatch, base, new):
    """The kernel's choice (its AVX-512 pass where the CPU has one, and its portable pass must
    agree byte for byte) and numpy's."""
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "1")
    fast = codec._choose(base, new, False)
    native.set_simd(False)
    try:
        portable = codec._choose(base, new, False)
    finally:
        native.set_simd(True)
    assert _same(fast, portable), (fast[:2], portable[:2])
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "0")
    slow = codec._choose(base, new, False)
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "1")
    return fast, slow


def _same(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and len(a[2]) == len(b[2]) and all(
        x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a[2], b[2]))


def test_the_kernel_is_built_by_the_install():
    assert native.available(), "weights/_deltakernel.c was not built: reinstall (make install) with a C compiler"


def test_the_simd_pass_is_used_where_the_cpu_has_it():
    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    expected = platform.machine() == "x86_64" and "avx512f" in flags and "avx512bw" in flags
    assert native.set_simd(True) is expected
    assert native.set_simd(False) is False
    assert native.set_simd(True) is expected


@pytest.mark.parametrize("bits", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_native_and_numpy_choose_the_same_encoding_and_bytes(monkeypatch, bits):
    rng = np.random.default_rng(7)
    seen = set()
    for n in (0, 1, 3, 31, 32, 33, 63, 64, 65, 127, 1000, 40_001):
        for frac in (0.0, 0.0005, 0.01, 0.06, 0.12, 0.125, 0.2, 0.9):
            base = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True)
            new = base.copy()
            if n:
                new[rng.choice(n, int(n * frac), replace=False)] ^= bits(1)
                new[-1] ^= bits(2)  # the last element, in the tail or the last block
            fast, slow = _both(monkeypatch, base, new)
            assert _same(fast, slow), (bits, n, frac, fast[0], slow[0])
            seen.add(fast[0])
    assert seen >= {codec.Encoding.VARINT, codec.Encoding.BITMAP, codec.Encoding.FULL}


def test_long_gaps_and_the_gap_bytes_exit(monkeypatch):
    n = 1 << 23
    base = np.zeros(n, np.uint16)
    # gaps of 0, 127, 128, 16383, 16384, 2**21 - 1, 2**21 (1 to 4 LEB128 bytes)
    new = base.copy()
    pos, p = [], -1
    for g in (0, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21):
        p += g + 1
        pos.append(p)
    new[pos] = 1
    fast, slow = _both(monkeypatch, base, new)
    assert fast[0] == codec.Encoding.VARINT and _same(fast, slow)
    gaps = codec._varint_decode(fast[2][0], len(pos))
    assert list(gaps) == [0, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21]

    # Just under n/8 changes, but one long gap makes the LEB128 gaps reach the bitmap's size:
    # the kernel gives up (-2) and the bitmap is chosen, as numpy chooses it.
    n = 100_000
    base = np.zeros(n, np.uint16)
    new = base.copy()
    new[: n // 8 - 2] = 1
    new[-1] = 1
    assert native.sparse_diff(base, new, limit=(n + 7) // 8, gaps_cap=(n + 7) // 8) == -2
    fast, slow = _both(monkeypatch, base, new)
    assert fast[0] == codec.Encoding.BITMAP and _same(fast, slow)

    # n/8 changes or more: the kernel stops early (-1).
    new[: n // 4] = 1
    assert native.sparse_diff(base, new, limit=(n + 7) // 8, gaps_cap=(n + 7) // 8) == -1


def test_a_delta_payload_is_byte_identical_with_and_without_the_kernel(monkeypatch):
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(300, 257, generator=g).to(torch.bfloat16), "b": torch.randn(1001, generator=g),
            "e": torch.randn(64, 64, generator=g).half(), "d": torch.randn(5000, generator=g)}
    new = {k: v.clone() for k, v in base.items()}
    new["w"].view(-1)[::97] += 1
    new["b"][::5] *= 2
    new["d"] += 1e-4 * torch.randn(5000, generator=g)  # every element, a little: DIFF
    payloads = []
    for flag in ("1", "0"):
        monkeypatch.setenv("ASTRAFLOW_NATIVE", flag)
        payload, stats = codec.encode_delta(base, new, 0, 1)
        payloads.append(payload)
        assert stats.encodings["d"] == codec.Encoding.FULL and stats.encodings["b"] == codec.Encoding.BITMAP
        assert stats.value_codings["d"] == codec.ValueCoding.DIFF
    assert payloads[0] == payloads[1]
    out = codec.decode(payloads[0], base)
    assert all(torch.equal(out[k].view(torch.uint8), new[k].view(torch.uint8)) for k in new)


def test_a_dense_looking_prefix_still_gets_the_encoding_the_whole_tensor_needs(monkeypatch):
    n = 1 << 20
    base = np.arange(n, dtype=np.uint32)
    new = base.copy()
    new[: codec._DENSE_PROBE] += 1  # the probed prefix all changed, the rest not: sparse overall
    fast, slow = _both(monkeypatch, base, new)
    assert fast[0] == codec.Encoding.VARINT and _same(fast, slow)
    new[:] += 1  # every element changed (fp32 after AdamW): full tensor, counted, nothing gathered
    fast, slow = _both(monkeypatch, base, new)
    assert fast == (codec.Encoding.FULL, n, ()) and _same(fast, slow)
    assert native.count_diff(base, new) == n and native.count_diff(base, base) == 0


PLANE_SIZES = (0, 1, 7, 64, 1001)


def _random_bits(rng, bits, n, *, extremes=True):
    """n random elements of `bits`; with `extremes`, the first two its maximum and 0."""
    top = np.iinfo(bits).max
    a = rng.integers(0, top, size=n, dtype=bits, endpoint=True)
    if extremes:
        a[:2] = (top, 0)[: a.size]
    return a


@pytest.mark.parametrize("bits", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_diff_planes_native_and_numpy_write_the_same_bytes_and_invert(monkeypatch, bits):
    rng = np.random.default_rng(9)
    for n in PLANE_SIZES:
        base = _random_bits(rng, bits, n, extremes=False)
        step = rng.integers(-3, 4, size=n).astype(np.int64).astype(bits)  # small steps either way, wrapping
        for new in (base + step, _random_bits(rng, bits, n)):
            new[:2] = (np.iinfo(bits).max, 0)[: new.size]  # wrap-around differences
            out = []
            for flag in ("1", "0"):
                monkeypatch.setenv("ASTRAFLOW_NATIVE", flag)
                planes = codec._diff_planes(base, new)
                back = base.copy()
                codec._add_diff_planes(planes, back)
                assert np.array_equal(back, new)
                out.append(planes)
            assert out[0].dtype == np.uint8 and np.array_equal(out[0], out[1])
    # zigzag: a step of +1 is 2, -1 is 1, so a small update leaves the high planes zero
    monkeypatch.setenv("ASTRAFLOW_NATIVE", "1")
    planes = codec._diff_planes(np.array([5, 5, 5], bits), np.array([6, 4, 5], bits))
    assert list(planes[:3]) == [2, 1, 0] and not planes[3:].any()


@pytest.mark.parametrize("bits", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_byte_planes_native_and_numpy_write_the_same_bytes_and_invert(monkeypatch, bits):
    rng = np.random.default_rng(11)
    for values in (_random_bits(rng, bits, n) for n in PLANE_SIZES):
        n, out = values.size, []
        for flag in ("1", "0"):
            monkeypatch.setenv("ASTRAFLOW_NATIVE", flag)
            planes = codec._planes(values)
            # from separate buffers, as format 4 hands them over (some raw, inside the payload)
            back = np.empty_like(values)
            codec._join_planes([planes[j * n : (j + 1) * n].copy() for j in range(values.itemsize)], back)
            assert np.array_equal(back, values)
            out.append(planes)
        assert out[0].dtype == np.uint8 and np.array_equal(out[0], out[1])
        # plane j holds byte j of every element, least significant first
        assert np.array_equal(out[0][:n], (values & 0xFF).astype(np.uint8))
        if values.itemsize > 1:
            assert np.array_equal(out[0][-n:] if n else out[0][:0], (values >> (8 * (values.itemsize - 1))).astype(np.uint8))
