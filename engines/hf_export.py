"""Export of trained weights as a Hugging Face model directory.

Owns the directory's layout: the model's config and the given weights as safetensors
(``save_pretrained``), and the tokenizer of the model the trainer started from when that
directory has one.

It does not gather the weights: the trainer hands over full, unsharded tensors
(``DeepSpeedTrainer.named_weights``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["export_hf"]


def export_hf(directory: str | Path, module, weights: Mapping[str, torch.Tensor], tokenizer_from: str | Path) -> Path:
    """Write ``module``'s config with ``weights`` into ``directory`` (created if needed) as
    safetensors, beside the tokenizer of the model directory ``tokenizer_from``."""
    from transformers import AutoTokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(str(out), state_dict=weights, safe_serialization=True)
    try:
        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(out))
    except (OSError, ValueError):
        pass  # a model directory without a tokenizer exports without one
    return out
