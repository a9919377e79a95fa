"""The model cache: where built and fetched models live, and the lock that makes a build happen once.

``$ASTRAFLOW_CACHE/models`` (default ``~/.cache/astraflow/models``) holds one directory per
tiny-model build (:mod:`.bootstrap`) and per fetched pretrained model (:mod:`.pretrained`);
:func:`file_lock` serialises the processes of a job that all resolve a model on first use.
It knows nothing about what the directories hold.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["cache_root", "file_lock"]


def cache_root() -> Path:
    env = os.environ.get("ASTRAFLOW_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "astraflow"
    return base / "models"


@contextmanager
def file_lock(path: Path):
    """An exclusive lock on ``path`` (created) for the ``with`` block, across processes."""
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
