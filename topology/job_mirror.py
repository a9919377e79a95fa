"""What every runner of a job's regional mirror agrees on: its claim and the bound of its copies.

A job's weights reach a regional cluster through one MirrorMaker 2, started by ``astraflow
launch`` on one machine (:mod:`.launch`) or by ``astraflow mirror`` on a multi-host deployment
(:mod:`.mirror_run`). Both take the same claim on the regional cluster (:func:`claim_group`),
so two runners never copy the same job into it, and both bound the mirrored weight topics by
the size of one full snapshot (:func:`snapshot_bytes`). This module knows the job config and
the model's files; no processes, no Kafka clients.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.actors.common import model_path
from astraflow.config import JobConfig

#: The smallest bound of a region's mirrored weights, whatever the model's files weigh.
MIN_SNAPSHOT_BYTES = 64 * 1024 * 1024


def claim_group(job: str) -> str:
    """The consumer group on a region's cluster whose member runs the job's mirror into it."""
    return f"astraflow.mirror.{job}"


def snapshot_bytes(cfg: JobConfig) -> int:
    """A full snapshot's size, for the bound of a region's mirrored weights: the model's weight files."""
    path = Path(model_path(cfg))
    size = sum(f.stat().st_size for f in path.glob("*") if f.suffix in (".safetensors", ".bin", ".pt"))
    return max(size, MIN_SNAPSHOT_BYTES)
