"""A process's own memory, as a benchmark child reports it.

Two traps this module keeps a benchmark out of:

* ``resource.getrusage(...).ru_maxrss`` survives ``execve``: a child started by a benchmark
  reports its parent's peak when that was higher (a parent that loaded a model reads as the
  child's). ``/proc/self/status``'s ``VmHWM`` belongs to the child's own address space.
* glibc raises its mmap threshold each time a large block it mapped is freed (up to 32 MiB),
  so after the first step a process's big tensors come from the heap, which it keeps: the peak
  then depends on the order the allocator saw sizes in, not on what was alive at once (a LoRA
  trainer of SmolLM2 read higher than full fine-tuning that way, lower with the threshold
  pinned: docs/weight-transfer.md). :data:`PINNED_MALLOC` pins it for a child whose memory is
  compared.
"""

from __future__ import annotations

#: the environment that makes every allocation of >= 128 KiB its own mapping, returned at free
#: (glibc's ``M_MMAP_THRESHOLD``, which also stops its dynamic adjustment)
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def vm_mb(field: str = "VmHWM") -> float:
    """This process's ``/proc/self/status`` ``field`` in MB (``VmHWM``: peak resident set,
    ``VmRSS``: resident set now)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    raise KeyError(f"/proc/self/status has no {field}")
