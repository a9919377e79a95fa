"""Which base model an adapter version applies to: the base's digest, and refusing a mismatch.

A LoRA policy's versions carry its adapter's tensors only; each announcement names the base
they apply to by :func:`base_digest` (``VersionAnnouncement.base_model``), and a full-weights
policy's name none (``""``). A reader serving another base, or full weights, refuses the
version with :class:`WrongBaseError` (the subscriber dead-letters it like a bad signature).

The digest is :func:`~.format.weights_digest` over the tensors of the model directory's
safetensors files (names, dtypes, shapes and bits, in name order), so it names the
directory's weights however they are sharded, and every process that loads the same
directory computes the same one without loading a model. It is computed once per
process and directory.

It knows nothing about peft, engines or Kafka.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from safetensors import safe_open

from .format import digest_from_entries, dtype_name, hash_bits, tensor_bits

__all__ = ["WRONG_BASE", "WrongBaseError", "base_digest", "check_base"]

#: The refusal reason (``Rejection.reason``, the subscriber's ``rejected`` counts).
WRONG_BASE = "wrong_base"


class WrongBaseError(Exception):
    """An announcement whose tensors are not for the base (or the kind of weights) this reader serves."""

    reason = WRONG_BASE


def base_digest(model_dir: str | Path) -> str:
    """The content digest of the weights in ``model_dir`` (its ``*.safetensors`` files)."""
    path = Path(model_dir).expanduser().resolve()
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors file: a LoRA policy names its base by the digest of "
                                "the base's safetensors weights; save the model with safe_serialization")
    stamp = tuple((f.name, os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files)
    return _digest(str(path), stamp)


@functools.lru_cache(maxsize=8)
def _digest(path: str, stamp: tuple) -> str:
    lines = []
    for name, _, _ in stamp:
        with safe_open(str(Path(path) / name), framework="pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)  # one tensor at a time: never the whole model in memory twice
                lines.append((key, dtype_name(t.dtype), tuple(t.shape), hash_bits(tensor_bits(t))))
    return digest_from_entries(lines)


def check_base(announced: str, served: str) -> None:
    """Raise :class:`WrongBaseError` unless a version naming base ``announced`` ("": full
    weights) fits a reader serving ``served`` (the base's digest, or "" for full weights)."""
    if announced == served:
        return
    if not served:
        why = f"it is a LoRA adapter of base {announced[:16]}…, and this reader serves full weights"
    elif not announced:
        why = f"it is full weights, and this reader serves adapters of base {served[:16]}…"
    else:
        why = (f"it is a LoRA adapter of base {announced[:16]}…, and this reader's base is {served[:16]}… "
               "(another model directory: give the rollout nodes the trainer's model)")
    raise WrongBaseError(f"{WRONG_BASE}: version refused: {why}")
