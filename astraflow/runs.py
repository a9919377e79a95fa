"""``astraflow runs prune``: bound the disk that finished run directories take.

A run directory holds its Kafka log (``kafka/``: what ``replay``, ``export`` and
``status --run-dir`` read), its checkpoints, its Hugging Face exports (``hf/``) and its
summary, metrics and plot. Pruning removes whole run directories beyond the newest
``--keep N`` or older than ``--older-than D``, or with ``--kafka-only`` only their Kafka
logs and checkpoints (the model, summary and plot stay; the run can no longer be
replayed or resumed). A run whose broker is still running is never touched. It knows
nothing about what a log holds.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import FatalError

__all__ = ["PruneError", "RunDir", "find_runs", "parse_age", "prune", "remove_trees"]

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: What ``--kafka-only`` removes: the log and the checkpoints (which resume from it).
HEAVY = ("kafka", "checkpoints")


class PruneError(FatalError, ValueError):
    """A bad ``--keep`` / ``--older-than``, or a root that holds no runs."""


@dataclass(frozen=True)
class RunDir:
    path: Path
    mtime: float  #: when the run last wrote its summary (else the directory's time)


def parse_age(text: str) -> float:
    """Seconds in ``30m``, ``12h``, ``7d``, ``2w`` (``--older-than``)."""
    m = _AGE.fullmatch(text.strip())
    if not m:
        raise PruneError(f"--older-than {text!r}: expected a number and a unit s, m, h, d or w (e.g. 7d)")
    return float(m[1]) * _UNIT_S[m[2]]


def find_runs(root: Path) -> list[RunDir]:
    """The run directories directly under ``root`` (a ``summary.json`` or ``kafka/`` inside), newest first."""
    runs = []
    for p in root.iterdir() if root.is_dir() else ():
        if p.is_dir() and not p.is_symlink() and ((p / "summary.json").is_file() or (p / "kafka").is_dir()):
            stamp = p / "summary.json" if (p / "summary.json").is_file() else p
            runs.append(RunDir(p, stamp.stat().st_mtime))
    return sorted(runs, key=lambda r: r.mtime, reverse=True)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) if path.exists() else 0


def remove_trees(paths, dry_run: bool = False) -> list[tuple[Path, int]]:
    """Remove (or, ``dry_run``, list) each of ``paths`` that exists, a directory and all it holds;
    returns ``(path, bytes)`` for each."""
    removed = []
    for t in paths:
        if t.exists():
            removed.append((t, _size(t)))
            if not dry_run:
                shutil.rmtree(t)
    return removed


def prune(root: Path, *, keep: int | None = None, older_than_s: float | None = None, kafka_only: bool = False,
          dry_run: bool = False, now: float | None = None) -> list[tuple[Path, int]]:
    """Remove (or, ``dry_run``, list) what the policy selects; returns ``(path removed, bytes)``."""
    from astraflow.offline import _in_use, kafka_dir

    if (keep is None) == (older_than_s is None):
        raise PruneError("runs prune: give one of --keep N or --older-than D")
    if keep is not None and keep < 0:
        raise PruneError(f"--keep {keep}: must be >= 0")
    if not root.is_dir():
        raise PruneError(f"{root}: no such directory (the run dirs' root; see run_dir in the job config)")
    now = time.time() if now is None else now
    runs = find_runs(root)
    chosen = runs[keep:] if keep is not None else [r for r in runs if now - r.mtime > older_than_s]
    removed = []
    for r in chosen:
        log = kafka_dir(r.path)
        if log is not None and _in_use(log):
            continue  # its broker is running: a live run, not ours to prune
        removed += remove_trees([r.path / name for name in HEAVY] if kafka_only else [r.path], dry_run)
    return removed
