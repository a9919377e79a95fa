"""What a tiny model is: its architecture, task knobs and warm-start schedule, and its cache key.

:class:`TinyModelSpec` holds every setting a build depends on; :meth:`TinyModelSpec.key`
hashes them with the seed and the warm-start task into the name of the model's cache
directory (``<name>[-<task>][-p<positions>]-s<seed>-<hash>``; the default task keeps the key
it had before tasks existed, and a build with the default window keeps the key it had
before windows were configurable). :func:`default_spec` is the spec a job gets for a task.
``MARKER`` names the report a finished build writes (``bootstrap.json``).

It needs no torch and knows nothing about building, caching or measuring a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from .warm_start import DEFAULT_TASK, get_task

__all__ = ["DEFAULT_POSITIONS", "FORMAT_VERSION", "MARKER", "MAX_POSITIONS", "MIN_POSITIONS", "TinyModelSpec",
           "check_positions", "default_spec"]

FORMAT_VERSION = 2  # bump when the build procedure changes, so old caches are not reused
MARKER = "bootstrap.json"
DEFAULT_POSITIONS = 128  #: the tiny model's window unless a job or ``--max-positions`` asks for another
MIN_POSITIONS, MAX_POSITIONS = 16, 32_768  #: the windows a build accepts (RoPE: no weights depend on it)


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture, task knobs and warm-start schedule of the tiny model (all hashed into
    the cache key, with the seed and the warm-start task)."""

    name: str = "tiny-qwen3"
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = DEFAULT_POSITIONS
    # Arithmetic knobs (workflows/arithmetic.py), used by the tasks built on arithmetic.
    max_digits: int = 2
    ops: str = "+"
    # Warm start.
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    max_steps: int = 2000
    eval_every: int = 25
    eval_problems: int = 200
    target_accuracy: float = 0.25
    heldout_problems: int = 400
    threads: int = 2  # fixed so a seed reproduces the same weights on this box

    def key(self, seed: int, task: str = DEFAULT_TASK) -> str:
        payload = {"spec": dataclasses.asdict(self), "seed": seed, "v": FORMAT_VERSION}
        name = self.name
        if task != DEFAULT_TASK:  # the default task keeps the key it had before tasks existed
            payload["task"], payload["task_revision"] = task, get_task(task).revision
            name = f"{self.name}-{task}"
        elif get_task(task).revision != 1:  # ... until its examples or their validation change
            payload["task_revision"] = get_task(task).revision
        if self.max_positions != DEFAULT_POSITIONS:  # a longer window says so in its name (the hash has it anyway)
            name = f"{name}-p{self.max_positions}"
        blob = json.dumps(payload, sort_keys=True)
        return f"{name}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def default_spec(task: str = DEFAULT_TASK, max_positions: int | None = None) -> TinyModelSpec:
    """The default spec with the task's own early-stop accuracy and spec fields;
    ``max_positions`` (None: the default, 128) sets the model's window. The window is part of
    the cache key, so a longer-context build is cached apart and the default keys stay."""
    warm = get_task(task)
    spec = dataclasses.replace(TinyModelSpec(), target_accuracy=warm.target_accuracy, **dict(warm.spec))
    if max_positions is not None:
        check_positions(max_positions)
        spec = dataclasses.replace(spec, max_positions=int(max_positions))
    return spec


def check_positions(max_positions: object) -> None:
    """``ValueError`` unless ``max_positions`` is an int in [MIN_POSITIONS, MAX_POSITIONS]."""
    if (not isinstance(max_positions, int) or isinstance(max_positions, bool)
            or not MIN_POSITIONS <= max_positions <= MAX_POSITIONS):
        raise ValueError(f"max_positions must be an int in [{MIN_POSITIONS}, {MAX_POSITIONS}], got {max_positions!r}")
