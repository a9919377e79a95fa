"""The delta encoder's native kernel (weights/_deltakernel.c), loaded with ctypes.

Built by ``pip install`` (setup.py, as ``astraflow.weights._deltakernel`` next to this
file; optional: without a C compiler it is skipped). When it is missing, or
``ASTRAFLOW_NATIVE=0`` is set, :func:`sparse_diff` returns ``None`` and the encoder
(:mod:`.codec`) takes its numpy path, which writes the same bytes (tests/weights/test_native.py
checks both paths against each other). This module only loads the library and wraps its
calls over numpy arrays; it knows nothing about the payload format, tensors or Kafka.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_ABI = 5
_WIDTHS = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
_FUNCS = {w: f"af_sparse_diff_{s}" for w, s in _WIDTHS.items()}
_COUNT = {w: f"af_count_diff_{s}" for w, s in _WIDTHS.items()}
_DIFF = {w: f"af_diff_planes_{s}" for w, s in _WIDTHS.items()}
_ADD_DIFF = {w: f"af_add_diff_planes_{s}" for w, s in _WIDTHS.items()}
_SPLIT = {w: f"af_split_planes_{s}" for w, s in _WIDTHS.items() if w > 1}
_JOIN = {w: f"af_join_planes_{s}" for w, s in _WIDTHS.items() if w > 1}
_lib: ctypes.CDLL | None = None
_tried = False


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_deltakernel{suffix}"
        if not path.exists():
            continue
        try:
            lib = ctypes.CDLL(str(path))
            lib.af_kernel_abi.restype = ctypes.c_int64
            if lib.af_kernel_abi() != _ABI:
                log.warning("%s was built from another version of the kernel; using numpy (reinstall to rebuild)",
                            path)
                return None
        except OSError as e:
            log.warning("could not load %s (%s); the delta encoder uses numpy", path, e)
            return None
        for name in _FUNCS.values():
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, ctypes.c_void_p]
        for name in _COUNT.values():
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        for name in _DIFF.values():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        for name in _ADD_DIFF.values():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        lib.af_set_simd.restype = ctypes.c_int64
        lib.af_set_simd.argtypes = [ctypes.c_int64]
        for name in _SPLIT.values():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        for name in _JOIN.values():
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_void_p]
        _lib = lib
        return lib
    return None


def available() -> bool:
    """True when the kernel is built and not switched off (``ASTRAFLOW_NATIVE=0``)."""
    return os.environ.get("ASTRAFLOW_NATIVE", "1") != "0" and _load() is not None


def _check(base: np.ndarray, new: np.ndarray) -> None:
    if base.shape != new.shape or base.dtype != new.dtype or not (base.flags.c_contiguous and new.flags.c_contiguous):
        raise ValueError("the kernel needs two contiguous arrays of one dtype and size")


def count_diff(base: np.ndarray, new: np.ndarray) -> int | None:
    """How many elements of ``base`` and ``new`` differ (one pass); ``None`` without the kernel."""
    if not available() or new.itemsize not in _COUNT:
        return None
    _check(base, new)
    return int(getattr(_lib, _COUNT[new.itemsize])(base.ctypes.data, new.ctypes.data, new.size))


def diff_planes(base: np.ndarray, new: np.ndarray) -> np.ndarray | None:
    """Values stored as differences (``ValueCoding.DIFF``): zigzag(new - base mod 2^w) as byte
    planes, one pass (``uint8``, ``new.nbytes`` long); ``None`` without the kernel."""
    if not available() or new.itemsize not in _DIFF:
        return None
    _check(base, new)
    out = np.empty(new.nbytes, np.uint8)
    getattr(_lib, _DIFF[new.itemsize])(base.ctypes.data, new.ctypes.data, new.size, out.ctypes.data)
    return out


def add_diff_planes(planes: np.ndarray, inout: np.ndarray) -> bool:
    """``inout += unzigzag(planes)`` modulo 2^w in place (the inverse of :func:`diff_planes`);
    False without the kernel (the caller does it with numpy)."""
    if not available() or inout.itemsize not in _ADD_DIFF:
        return False
    if not (inout.flags.c_contiguous and inout.flags.writeable and planes.flags.c_contiguous
            and planes.dtype == np.uint8 and planes.size == inout.nbytes):
        raise ValueError("the kernel needs contiguous uint8 planes of the output's byte size and a writeable output")
    getattr(_lib, _ADD_DIFF[inout.itemsize])(planes.ctypes.data, inout.size, inout.ctypes.data)
    return True


def set_simd(on: bool) -> bool:
    """Let :func:`sparse_diff` use its AVX-512 pass where the CPU has one (the default) or not
    (tests of the portable pass); returns whether it is on. False without the kernel."""
    lib = _load()
    return bool(lib.af_set_simd(int(on))) if lib is not None else False


def split_planes(values: np.ndarray) -> np.ndarray | None:
    """Byte planes of ``values`` (``uint8``, ``values.nbytes`` long: every element's byte 0,
    then every byte 1, ...), one pass; ``None`` without the kernel or for 1-byte elements."""
    if not available() or values.itemsize not in _SPLIT:
        return None
    if not values.flags.c_contiguous:
        raise ValueError("the kernel needs a contiguous array")
    out = np.empty(values.nbytes, np.uint8)
    getattr(_lib, _SPLIT[values.itemsize])(values.ctypes.data, values.size, out.ctypes.data)
    return out


def join_planes(planes: list[np.ndarray], out: np.ndarray) -> bool:
    """``out[i]`` = the bytes ``planes[j][i]``, byte j from plane j (the inverse of
    :func:`split_planes`; each plane its own buffer); False without the kernel."""
    if not available() or out.itemsize not in _JOIN:
        return False
    if not (out.flags.c_contiguous and out.flags.writeable and len(planes) == out.itemsize
            and all(p.dtype == np.uint8 and p.flags.c_contiguous and p.size == out.size for p in planes)):
        raise ValueError("the kernel needs one contiguous uint8 plane per byte of a writeable output's elements")
    pointers = (ctypes.c_void_p * len(planes))(*(p.ctypes.data for p in planes))
    getattr(_lib, _JOIN[out.itemsize])(pointers, out.size, out.ctypes.data)
    return True


def sparse_diff(base: np.ndarray, new: np.ndarray, limit: int, gaps_cap: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | int | None:
    """One pass over ``base`` and ``new`` (equal-size contiguous unsigned arrays).

    Returns ``(gap_bytes, values, base_values)`` — the LEB128 gaps between changed
    positions, the new bits there and the base's — when fewer than ``limit`` elements
    changed and the gaps take fewer than ``gaps_cap`` bytes; ``-1`` when ``limit`` or more changed; ``-2`` when the gaps
    would take ``gaps_cap`` bytes or more; ``None`` when the kernel is not available.
    """
    if not available() or new.itemsize not in _FUNCS:
        return None
    _check(base, new)
    values = np.empty(max(limit, 0), new.dtype)
    base_values = np.empty(max(limit, 0), new.dtype)
    gaps = np.empty(max(gaps_cap, 0), np.uint8)
    used = ctypes.c_int64(0)
    k = getattr(_lib, _FUNCS[new.itemsize])(base.ctypes.data, new.ctypes.data, new.size, limit, gaps.ctypes.data,
                                             gaps_cap, ctypes.byref(used), values.ctypes.data,
                                             base_values.ctypes.data)
    if k < 0:
        return int(k)
    return gaps[: used.value], values[:k], base_values[:k]
