"""Atomic training checkpoints on a local disk: step-tagged directories and one pointer file.

:class:`CheckpointStore` owns the layout of a trainer's checkpoint directory::

    <root>/step_00000012/        one complete checkpoint: the engine's files + state.json
    <root>/step_00000016/
    <root>/LATEST                {"step": 16, "dir": "step_00000016"}: the checkpoint to resume from

A save writes the engine's files into ``step_N.partial``, adds ``state.json`` (the caller's
state: consumed offsets, lineage), fsyncs every file, renames the directory to
``step_N`` and only then replaces ``LATEST`` atomically (write a temporary file, fsync,
``os.replace``, fsync the directory). A process killed at any point of a save therefore
leaves ``LATEST`` naming the previous complete checkpoint; :meth:`CheckpointStore.latest`
reads only what ``LATEST`` names, never a half-written directory. After the pointer moves,
all but the newest ``keep`` complete checkpoints and every leftover of an interrupted save
are deleted.

It knows nothing about DeepSpeed: the engine writes and reads its own files in the
directory it is given. One trainer writes a store at a time; a trainer of N ranks saves
together (``leader`` and ``barrier``): the leader (rank 0) prepares ``step_N.partial``,
every rank writes and fsyncs its own files (its DeepSpeed shards) there, and only after a
barrier — every rank's files are durable — does the leader add ``state.json``, rename and
move the pointer. A rank killed mid-save therefore leaves the previous checkpoint in force
as a killed single trainer does. Ranks on several hosts need the store on a shared
filesystem (every rank writes into the same directory).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CheckpointStore", "Checkpoint", "CheckpointError", "PAUSE_ENV"]

log = logging.getLogger(__name__)

POINTER = "LATEST"
STATE_FILE = "state.json"
#: Test hook: ``<seconds>`` (every save) or ``<seconds>@<step>`` (that step's save) to sleep in
#: the middle of a save, after the engine wrote its files and before the checkpoint is
#: complete, so a chaos test can SIGKILL the trainer inside a save deterministically.
#: Never set it in production.
PAUSE_ENV = "ASTRAFLOW_TEST_CHECKPOINT_PAUSE_S"
_STEP_DIR = re.compile(r"^step_(\d+)(\.partial)?$")


class CheckpointError(RuntimeError):
    """The checkpoint directory is not in a state this store wrote; names the path and the fix."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, its directory and the caller's state saved with it."""

    step: int
    path: Path
    state: dict[str, Any]


class CheckpointStore:
    """Step-tagged checkpoints under ``root``, published by an atomic pointer (see the module docstring).

    Args:
        root: the directory (created on the first save).
        keep: complete checkpoints to keep (>= 1); the one ``LATEST`` names is always kept.
    """

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (the checkpoint to resume from), got {keep}")
        self.root, self.keep = Path(root), keep

    def latest(self) -> Checkpoint | None:
        """The checkpoint ``LATEST`` names, or None when nothing was ever published."""
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        try:
            ref = json.loads(pointer.read_text())
            step, path = int(ref["step"]), self.root / str(ref["dir"])
            state = json.loads((path / STATE_FILE).read_text())
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{pointer} names no readable checkpoint ({type(e).__name__}: {e}); the store "
                                  "only ever points at complete directories, so the disk was changed by hand "
                                  f"or lost data: restore {self.root} or remove it to train from scratch") from e
        return Checkpoint(step, path, state)

    def save(self, step: int, write: Callable[[Path], None], state: Mapping[str, Any], *, leader: bool = True,
             barrier: Callable[[], None] | None = None) -> Checkpoint:
        """Write checkpoint ``step``: ``write(directory)`` stores the engine's files, ``state`` goes beside them.

        Across ranks every rank calls it with the same ``step``; ``leader`` is true on one
        of them and ``barrier`` blocks until all have reached it. Returns when this rank's
        part is done; on the leader, when the checkpoint is durable and ``LATEST`` names it.
        """
        barrier = barrier or (lambda: None)
        final = self.root / _dir_name(step)
        partial = final.with_name(final.name + ".partial")
        if leader:
            current = self.latest()
            if current is not None and step <= current.step:
                raise CheckpointError(f"checkpoint {step} is not newer than the published checkpoint {current.step} "
                                      f"in {self.root}; a trainer only saves steps after the one it resumed from")
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in (partial, final):  # from a save of this step that was interrupted
                if leftover.exists():
                    shutil.rmtree(leftover)
            partial.mkdir()
        barrier()  # the directory exists and is empty before any rank writes
        write(partial)
        _fsync_tree(partial)  # this rank's files (on a shared filesystem, only this host can sync them)
        barrier()  # every rank's files are durable
        if not leader:
            return Checkpoint(step, final, dict(state))
        _test_pause(step)
        _write_json(partial / STATE_FILE, dict(state))
        _fsync_tree(partial)
        os.replace(partial, final)
        _write_json(self.root / POINTER, {"step": step, "dir": final.name})  # the commit point
        self._prune(step)
        return Checkpoint(step, final, dict(state))

    def _prune(self, published: int) -> None:
        complete, leftovers = [], []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m is None or not p.is_dir():
                continue
            step = int(m.group(1))
            (leftovers if m.group(2) or step > published else complete).append((step, p))
        doomed = sorted(complete)[:-self.keep] + leftovers
        for _, p in doomed:
            shutil.rmtree(p, ignore_errors=True)


def _dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _write_json(path: Path, data: Any) -> None:
    """Replace ``path`` atomically and durably: a reader sees the old or the new content, whole."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    # The engine's writer (torch.save) does not fsync; the pointer must never outlive the data.
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _test_pause(step: int) -> None:
    value = os.environ.get(PAUSE_ENV)
    if not value:
        return
    text, _, at = value.partition("@")
    seconds = float(text)
    if (not at or int(at) == step) and seconds > 0:
        log.warning("checkpoint %d: pausing %.1fs inside the save (%s is set: a test hook)", step, seconds, PAUSE_ENV)
        time.sleep(seconds)
