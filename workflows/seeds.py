"""Rollout seeds: which random stream each sample of a task draws from.

A sample's seed is a stable hash of (job seed, task id, sample index) and nothing else, so
its randomness does not depend on which node rolls the task out, which tasks share a poll,
or how often the task was redelivered (a redelivered task reproduces the same samples).
BLAKE2b rather than ``hash()``: Python salts string hashes per process.
"""

from __future__ import annotations

import hashlib

__all__ = ["sample_seed", "task_seeds"]


def sample_seed(job_seed: int, task_id: str, index: int) -> int:
    """The seed of sample ``index`` of task ``task_id`` in a job seeded ``job_seed`` (63 bits)."""
    key = f"{int(job_seed)}\x1f{task_id}\x1f{int(index)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def task_seeds(job_seed: int, task_id: str, n: int) -> list[int]:
    """Seeds of samples ``0 .. n-1`` of a task."""
    return [sample_seed(job_seed, task_id, i) for i in range(n)]
