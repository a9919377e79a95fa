"""The delta encoder's native kernel (engines/_deltakernel.c), loaded with ctypes.

Built by ``pip install`` (setup.py; optional: without a C compiler it is skipped). When it
is missing, or ``ASTRAFLOW_NATIVE=0`` is set, :func:`sparse_diff` returns ``None`` and the
encoder takes its numpy path, which writes the same bytes (tests/engines/test_native.py
checks both paths against each other).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_ABI = 2
_FUNCS = {1: "af_sparse_diff_u8", 2: "af_sparse_diff_u16", 4: "af_sparse_diff_u32", 8: "af_sparse_diff_u64"}
_COUNT = {1: "af_count_diff_u8", 2: "af_count_diff_u16", 4: "af_count_diff_u32", 8: "af_count_diff_u64"}
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
                           ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
        for name in _COUNT.values():
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int64
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
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


def sparse_diff(base: np.ndarray, new: np.ndarray, limit: int, gaps_cap: int
                ) -> tuple[np.ndarray, np.ndarray] | int | None:
    """One pass over ``base`` and ``new`` (equal-size contiguous unsigned arrays).

    Returns ``(gap_bytes, values)`` — the LEB128 gaps between changed positions and the
    new bits there — when fewer than ``limit`` elements changed and the gaps take fewer
    than ``gaps_cap`` bytes; ``-1`` when ``limit`` or more changed; ``-2`` when the gaps
    would take ``gaps_cap`` bytes or more; ``None`` when the kernel is not available.
    """
    if not available() or new.itemsize not in _FUNCS:
        return None
    _check(base, new)
    values = np.empty(max(limit, 0), new.dtype)
    gaps = np.empty(max(gaps_cap, 0), np.uint8)
    used = ctypes.c_int64(0)
    k = getattr(_lib, _FUNCS[new.itemsize])(base.ctypes.data, new.ctypes.data, new.size, limit, gaps.ctypes.data,
                                             gaps_cap, ctypes.byref(used), values.ctypes.data)
    if k < 0:
        return int(k)
    return gaps[: used.value], values[:k]
