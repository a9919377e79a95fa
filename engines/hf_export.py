"""Export of trained weights as a Hugging Face model directory.

Owns the directory's layout: the model's config and the given weights as safetensors
(``save_pretrained``), and the tokenizer of the model the trainer started from when that
directory has one; and :class:`HFExports`, a run's exports of one policy
(``<root>/v<version>/`` each, written into a temporary directory and renamed into place,
so a reader never sees half a model; ``final`` names the last one). A peft model (a LoRA
policy, given its adapter's tensors under peft's names) writes peft's adapter directory
(``adapter_config.json``, ``adapter_model.safetensors``) the same way.

It does not gather the weights: the trainer hands over full, unsharded tensors
(``DeepSpeedTrainer.named_weights``), and ``astraflow export --model`` the ones it
rebuilt from the log.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["FINAL", "HFExports", "export_hf", "export_hf_atomic"]

#: The link in a policy's export directory that names its final (end of run) version.
FINAL = "final"


def export_hf(directory: str | Path, module, weights: Mapping[str, torch.Tensor], tokenizer_from: str | Path) -> Path:
    """Write ``module``'s config with ``weights`` into ``directory`` (created if needed) as
    safetensors, beside the tokenizer of the model directory ``tokenizer_from``."""
    from transformers import AutoTokenizer

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(str(out), state_dict=dict(weights), safe_serialization=True)
    try:
        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(out))
    except (OSError, ValueError):
        pass  # a model directory without a tokenizer exports without one
    return out


def export_hf_atomic(directory: str | Path, module, weights: Mapping[str, torch.Tensor],
                     tokenizer_from: str | Path) -> Path:
    """:func:`export_hf` into a sibling temporary directory, renamed to ``directory`` once
    complete; an existing ``directory`` is replaced (a crash leaves it whole, or a stray
    ``.tmp-*`` sibling beside it)."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf(tmp, module, weights, tokenizer_from)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
    return out


class HFExports:
    """One policy's HF exports in a run directory: ``<root>/v<k>/`` and the ``final`` link."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, version: int) -> Path:
        return self.root / f"v{version}"

    def write(self, version: int, module, weights: Mapping[str, torch.Tensor], tokenizer_from: str | Path) -> Path:
        """Export ``weights`` as version ``version`` (atomically; an earlier export of it is replaced)."""
        return export_hf_atomic(self.path(version), module, weights, tokenizer_from)

    def mark_final(self, version: int) -> Path:
        """Point ``final`` at version ``version``'s export (a relative symlink, swapped atomically)."""
        link, tmp = self.root / FINAL, self.root / f".{FINAL}.tmp-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(self.path(version).name)
        os.replace(tmp, link)
        return link

    def final(self) -> Path | None:
        """The final export's directory (resolved), or None before the run has one."""
        link = self.root / FINAL
        return link.resolve() if link.is_dir() else None

    def versions(self) -> list[int]:
        """The versions exported so far, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in self.root.iterdir()
                      if p.is_dir() and not p.is_symlink() and p.name[:1] == "v" and p.name[1:].isdigit())
