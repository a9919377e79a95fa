"""Process-wide memory settings that decide how fast large buffers are.

numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every
allocation of 4 MiB or more. Where the kernel cannot hand out a huge page (fragmented
memory, or a VM without huge pages, like the machines this project is built on: the
``AnonHugePages`` line of ``/proc/meminfo`` stays at 0), every page fault of such a
buffer first tries direct compaction, and first touch falls from ~1.9 GB/s to ~0.25 GB/s
(measured with ``numpy.empty(4e8).fill``). The weight codec, the trainer's weight copies
and the engines allocate fresh buffers of that size every version, so AstraFlow turns the
hint off when it is imported. Our buffers are written once and streamed, so huge pages
would buy little TLB reach in return.

Set ``NUMPY_MADVISE_HUGEPAGE=1`` to keep numpy's default (it reads the variable itself).
"""

from __future__ import annotations

import os

_ENV = "NUMPY_MADVISE_HUGEPAGE"


def configure_numpy_hugepages() -> bool | None:
    """Turn numpy's huge-page hint off unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise.

    Returns the setting before the call, or None when the environment decides (or this
    numpy has no such switch).
    """
    if os.environ.get(_ENV) is not None:
        return None
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2: the switch lives elsewhere; leave numpy's default
        return None
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    return None if setter is None else bool(setter(False))
