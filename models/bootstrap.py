"""Which model a job uses: its configured directory, a fetched pretrained model, or the cached tiny model.

Owns :func:`resolve_model_path` (a job's model: its configured directory, checked; the
pretrained model it names, fetched on first use; or the tiny model warm-started on the
job's task), :func:`ensure_tiny_model` (the cached build, made once: builds are atomic and
serialised by a file lock) and :func:`model_shape` (what a sequence must fit of that model,
read from its ``config.json`` or, for a model not built or fetched yet, its spec or
catalogue entry).

Cache: ``$ASTRAFLOW_CACHE/models`` (default ``~/.cache/astraflow/models``), one directory
per :meth:`~.spec.TinyModelSpec.key`. Looking a model up needs no torch (every launcher
and node does it); only a build (:mod:`.build`) does. It knows nothing about how a build
trains or what makes it good.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from astraflow.engines.factory import model_dir

from . import char_tokenizer
from .cache import cache_root, file_lock
from .pretrained import MARKER as PRETRAINED_MARKER
from .pretrained import fetch_pretrained, fetched_path, pretrained
from .spec import MARKER, TinyModelSpec, default_spec
from .warm_start import DEFAULT_TASK, get_task

__all__ = ["ModelShape", "cache_root", "ensure_tiny_model", "model_shape", "resolve_model_path", "shape_of_config"]


def resolve_model_path(model_path: str, seed: int = 0, task: str = DEFAULT_TASK,
                       max_positions: int | None = None, name: str | None = None) -> Path:
    """``model_path`` if set (checked: :func:`astraflow.engines.factory.model_dir`), else the
    pretrained model ``name`` (fetched into the cache on first use: :mod:`.pretrained`), else
    the cached tiny model warm-started on ``task`` with a window of ``max_positions`` (None: the
    default) (built on first use)."""
    if model_path:
        return model_dir(model_path)
    if name:
        return fetch_pretrained(name, cache_root())
    return ensure_tiny_model(seed=seed, task=task, spec=default_spec(task, max_positions))


def ensure_tiny_model(cache_dir: str | Path | None = None, seed: int = 0, spec: TinyModelSpec | None = None,
                      task: str = DEFAULT_TASK) -> Path:
    """Path of the cached tiny model warm-started on ``task`` for ``seed``, building it
    first if absent. ``spec`` defaults to :func:`~.spec.default_spec` of the task."""
    get_task(task)  # an unknown task fails here, before the cache is touched
    spec = spec or default_spec(task)
    key = spec.key(seed, task)
    root = Path(cache_dir) if cache_dir else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    if (final / MARKER).exists():
        return final
    with file_lock(root / f".{key}.lock"):
        if (final / MARKER).exists():  # another process built it while we waited
            return final
        # Imported here: the build imports torch and transformers (seconds, ~300 MB), which a
        # lookup of a cached model (the launcher, every node) must not pay.
        from .build import build_tiny_model

        # what a build killed before its rename left (this lock's holder is the only builder of the key)
        for stale in root.glob(f".tmp-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".tmp-{key}-{os.getpid()}"
        build_tiny_model(tmp, seed=seed, spec=spec, task=task)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


class ModelShape(NamedTuple):
    """What a sequence must fit of a model, read cheaply (its ``config.json``, never its weights)."""

    vocab_size: int  #: token ids are in ``[0, vocab_size)``
    max_positions: int | None  #: the longest sequence (context + completion); None: not declared


def shape_of_config(cfg: dict, where: str) -> ModelShape:
    """The :class:`ModelShape` in a Hugging Face ``config.json`` (``text_config`` for a
    multimodal one); ``ValueError`` naming ``where`` when it names no vocabulary size."""
    text = cfg.get("text_config") or {}
    vocab = cfg.get("vocab_size") or text.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        raise ValueError(f"{where} names no vocab_size (a positive int): token ids cannot be bounded")
    positions = cfg.get("max_position_embeddings") or text.get("max_position_embeddings")
    return ModelShape(vocab, positions if isinstance(positions, int) and positions > 0 else None)


def model_shape(model_path: str | None, seed: int = 0, task: str = DEFAULT_TASK,
                max_positions: int | None = None, name: str | None = None) -> ModelShape:
    """The shape of the model a job configures: ``model_path``'s ``config.json``, or the cached
    tiny model's (of window ``max_positions``, None: the default); a tiny model not built yet is
    described by its spec (what its build writes), so a reader of the shape never builds or
    loads a model."""
    if model_path:
        path = model_dir(model_path) / "config.json"
        return shape_of_config(json.loads(path.read_text()), str(path))
    if name:  # the catalogue says what a fetch will write
        fetched = fetched_path(name, cache_root()) / "config.json"
        if (fetched.parent / PRETRAINED_MARKER).exists():
            return shape_of_config(json.loads(fetched.read_text()), str(fetched))
        entry = pretrained(name)
        return ModelShape(entry.vocab_size, entry.max_positions)
    spec = default_spec(task, max_positions)
    built = cache_root() / spec.key(seed, task) / "config.json"
    if (built.parent / MARKER).exists():
        return shape_of_config(json.loads(built.read_text()), str(built))
    return ModelShape(int(math.ceil(len(char_tokenizer.vocab()) / 8) * 8), spec.max_positions)
