"""Export of trained weights as a Hugging Face model directory.

Owns the directory's layout: the model's config and the given weights as safetensors
(``save_pretrained``), and the tokenizer of the model the trainer started from when that
directory has one; and :class:`HFExports`, a run's exports of one policy
(``<root>/v<version>/`` each, written into a temporary directory and renamed into place,
so a reader never sees half a model; ``final`` names the last one). A peft model (a LoRA
policy, given its adapter's tensors under peft's names) writes peft's adapter directory
(``adapter_config.json``, ``adapter_model.safetensors``) the same way, and so do
:func:`export_adapter` (an adapter's published tensors and its settings, no model needed) and
:func:`export_merged` (the base with the adapter merged in: a plain HF model).

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

from .config import LoraConfig

__all__ = ["FINAL", "HFExports", "export_adapter", "export_hf", "export_hf_atomic", "export_merged"]

#: The link in a policy's export directory that names its final (end of run) version.
FINAL = "final"


def export_hf(directory: str | Path, module, weights: Mapping[str, torch.Tensor], tokenizer_from: str | Path) -> Path:
    """Write ``module``'s config with ``weights`` into ``directory`` (created if needed) as
    safetensors, beside the tokenizer of the model directory ``tokenizer_from``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(str(out), state_dict=dict(weights), safe_serialization=True)
    _save_tokenizer(tokenizer_from, out)
    return out


def export_hf_atomic(directory: str | Path, module, weights: Mapping[str, torch.Tensor],
                     tokenizer_from: str | Path) -> Path:
    """:func:`export_hf` into a sibling temporary directory, renamed to ``directory`` once
    complete; an existing ``directory`` is replaced (a crash leaves it whole, or a stray
    ``.tmp-*`` sibling beside it)."""
    return _atomic(directory, lambda tmp: export_hf(tmp, module, weights, tokenizer_from))


def export_adapter(directory: str | Path, lora: LoraConfig, weights: Mapping[str, torch.Tensor],
                   base_model: str | Path) -> Path:
    """peft's adapter directory (atomically, like :func:`export_hf_atomic`): ``lora``'s
    settings naming ``base_model`` in ``adapter_config.json``, ``weights`` (an adapter's
    published tensors: peft's saved names) in ``adapter_model.safetensors``, and the base's
    tokenizer. ``peft.PeftModel.from_pretrained(base, directory)`` loads it."""
    from peft import LoraConfig as PeftLora  # peft imports transformers' trainer stack (~1 s): exports only
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        PeftLora(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
                 bias="none", task_type="CAUSAL_LM", base_model_name_or_path=str(base_model)).save_pretrained(str(tmp))
        save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(tmp / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        _save_tokenizer(base_model, tmp)
    return _atomic(directory, write)


def export_merged(directory: str | Path, lora: LoraConfig, weights: Mapping[str, torch.Tensor],
                  base_model: str | Path) -> Path:
    """The base model with the adapter ``weights`` merged into its weights (float32), as a
    plain HF model directory (atomically): ``AutoModelForCausalLM.from_pretrained`` loads it,
    no peft needed. ValueError when the tensors are not an adapter of ``lora`` on this base."""
    from peft import set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from .lora import wrap

    model = wrap(AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32), lora)
    loaded = set_peft_model_state_dict(model, dict(weights))
    if loaded.unexpected_keys:
        raise ValueError(f"the adapter does not fit {base_model} with trainer.engine.lora {lora}: "
                         f"{loaded.unexpected_keys[0]!r} names no module of it")
    module = model.merge_and_unload()
    return _atomic(directory, lambda tmp: export_hf(tmp, module, module.state_dict(), base_model))


def _save_tokenizer(model_dir: str | Path, out: Path) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
    except (OSError, ValueError):
        pass  # a model directory without a tokenizer exports without one


def _atomic(directory: str | Path, write) -> Path:
    """``write(tmp)`` fills a sibling temporary directory, renamed to ``directory`` once complete."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
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
