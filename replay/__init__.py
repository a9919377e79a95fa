"""Replay and export: what a job recorded on its topics, read back (nothing is written there).

* :mod:`.recorded` — the read-only view of a job's topics: batches by offset, the digest
  announced for every version, the end offsets; no consumer group, no commit.
* :mod:`.retrain` — ``astraflow replay``: the recorded batches re-trained with the recorded
  settings (checked bit for bit against every announced version) or with changed ones (a
  what-if lineage with its own run directory); :mod:`.outputs` writes that directory.
* :mod:`.export` — ``astraflow export``: the recorded trajectories as a Parquet dataset.

It sits above the components (it runs the trainer engine and the evaluator's held-out
measure in-process) and knows nothing about how the job was launched. The package is named
after the ``astraflow replay`` command it serves; the data algorithm that retrains groups
inside a job is experience replay (:mod:`astraflow.algorithms.experience_replay`).
"""

from .export import export_trajectories
from .recorded import RecordError
from .retrain import WHAT_IF_PREFIXES, ReplayRequest, replay

__all__ = ["ReplayRequest", "replay", "WHAT_IF_PREFIXES", "RecordError", "export_trajectories"]
