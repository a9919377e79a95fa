"""The DeepSpeed trainer's files inside one checkpoint directory, and resuming from them.

Owns what a trainer writes into the directory it is given (DeepSpeed's checkpoint under
the tag ``CKPT_TAG``: every rank its own ZeRO optimizer/parameter shards, plus a client
state of the version, the caller's ``extra_state`` such as consumed Kafka offsets, and
the torch/CUDA RNG; and ``WORLD_FILE``, the world size, ZeRO stage, ZeRO-3
``sub_group_size`` and LoRA adapter settings it was saved with) and how a trainer loads them back: exactly with the
world size it was saved with, or, when the world size changed under ZeRO 1-3, by
consolidating the parameters from all shards with DeepSpeed's ``zero_to_fp32``
(resharding; the optimizer moments restart). A ZeRO-3 optimizer state split into other
sub-groups than the loading trainer's (another ``sub_group_size``) is a
:class:`CheckpointLayoutError` naming the value to set. A model whose frozen parameters are
a base loaded from its directory (a LoRA policy: ``adapter``, its settings) is saved
without them (the adapter and its optimizer state only), and resumes only under the same
adapter settings (another rank, other target modules or none is a
:class:`CheckpointLayoutError` naming ``trainer.engine.lora``).

It does not know where the directory comes from or when a save is complete:
``checkpoints.CheckpointStore`` owns the step-tagged directories, their atomic commit
and the pointer to the latest one.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch

from ..errors import FatalError
from .distributed import Ranks

__all__ = ["CKPT_TAG", "WORLD_FILE", "CheckpointLayoutError", "Restored", "save", "load"]

CKPT_TAG = "latest_step"
#: Beside DeepSpeed's files: the world size, ZeRO stage and sub_group_size a checkpoint was saved with.
WORLD_FILE = "astraflow_world.json"
#: What checkpoints saved before ``sub_group_size`` was recorded used: DeepSpeed's default.
DEEPSPEED_SUB_GROUP_SIZE = 1_000_000_000


class CheckpointLayoutError(FatalError, ValueError):
    """The checkpoint's optimizer state is laid out for another trainer config."""


class Restored(NamedTuple):
    """What ``load`` gives back to the trainer."""

    step: int  #: the trainer's version when it saved
    extra_state: dict[str, object]  #: the caller's state as given to ``save``
    resharded: bool  #: the world size changed: parameters consolidated, optimizer moments zero


def _saved_layout(directory: Path) -> dict | None:
    """``{"world", "zero_stage", "sub_group_size"}`` a checkpoint was saved with (None: saved
    before it was recorded; ``sub_group_size`` is absent from those saved before it was)."""
    try:
        return json.loads((directory / WORLD_FILE).read_text())
    except FileNotFoundError:
        return None


def save(engine, directory: str | Path, extra_state: Mapping[str, object], *, step: int, ranks: Ranks,
         zero_stage: int, device: torch.device, sub_group_size: int = DEEPSPEED_SUB_GROUP_SIZE,
         adapter: Mapping[str, object] | None = None) -> None:
    """DeepSpeed's checkpoint of this rank (a collective: every rank calls it with the
    same directory; under ZeRO each writes its own optimizer/parameter shards). With
    ``adapter`` (a LoRA policy's settings) the frozen parameters are left out (they are the
    model directory's)."""
    client = {
        "extra_state": dict(extra_state),
        "af_step": step,
        "af_world": ranks.world,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
    }
    if adapter is None:
        engine.save_checkpoint(str(directory), tag=CKPT_TAG, client_state=client)
    else:
        # DeepSpeed leaves out the frozen parameters named_parameters() lists, which names a
        # tied weight once: its alias (the lm_head of tied embeddings, the largest tensor of
        # a small model) would be saved whole. Only the trainable ones go in, for this save.
        trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
        full = type(engine).module_state_dict
        engine.module_state_dict = lambda **kw: {k: v for k, v in full(engine, **kw).items() if k in trainable}
        try:
            engine.save_checkpoint(str(directory), tag=CKPT_TAG, client_state=client, exclude_frozen_parameters=True)
        finally:
            del engine.module_state_dict
    if ranks.rank == 0:  # read before loading: a world-size change loads differently
        (Path(directory) / WORLD_FILE).write_text(json.dumps({"world": ranks.world, "zero_stage": zero_stage,
                                                              "adapter": adapter,
                                                              "sub_group_size": sub_group_size}))


def load(engine, directory: str | Path, *, ranks: Ranks, zero_stage: int, device: torch.device,
         sub_group_size: int = DEEPSPEED_SUB_GROUP_SIZE, adapter: Mapping[str, object] | None = None) -> Restored:
    """Resume from ``save``'s files. With the world size it was saved with, everything is
    restored exactly (DeepSpeed's own load: every rank its shards). With another world
    size, ZeRO 1-3 shards do not fit: the parameters are consolidated from all shards
    with DeepSpeed's ``zero_to_fp32`` and loaded, the step, extra state and RNG are
    restored, and the optimizer's moments start from zero (a warning says so;
    ``resharded`` is true). ZeRO-0 checkpoints hold no shards and load exactly at any
    world size. At the same world size, a ZeRO-3 optimizer state that another
    ``sub_group_size`` split into other sub-groups does not fit either: that is a
    :class:`CheckpointLayoutError` naming the value it was saved with. With ``adapter``
    the checkpoint holds no frozen parameter, and the model keeps the ones it has; the
    adapter settings must be the saved ones."""
    saved = _saved_layout(Path(directory))
    was = (saved or {}).get("adapter")
    if saved is not None and was != json.loads(json.dumps(adapter)):
        raise CheckpointLayoutError(
            f"{directory}: saved with trainer.engine.lora {_lora(was)}, and this trainer has {_lora(adapter)}: set "
            f"trainer.engine.lora as it was to resume, or train from scratch in a new run directory")
    resharded = bool(saved and saved["world"] != ranks.world and saved["zero_stage"] > 0)
    if resharded:
        client = _load_consolidated(engine, Path(directory), saved, ranks, zero_stage)
    else:
        try:
            path, client = engine.load_checkpoint(str(directory), tag=CKPT_TAG, load_module_strict=adapter is None)
        except ValueError as e:
            # torch's Optimizer.load_state_dict on DeepSpeed's per-sub-group flat partitions.
            if zero_stage != 3 or "parameter group" not in str(e):
                raise
            was = (saved or {}).get("sub_group_size", DEEPSPEED_SUB_GROUP_SIZE)
            raise CheckpointLayoutError(
                f"{directory}: its ZeRO-3 optimizer state is split into the sub-groups of "
                f"trainer.engine.sub_group_size {was}, not {sub_group_size}: set trainer.engine.sub_group_size: "
                f"{was} to resume from it") from e
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory} (tag {CKPT_TAG!r})")
    step = int(client["af_step"])
    torch.set_rng_state(client["torch_rng"])
    if client.get("cuda_rng") is not None and device.type == "cuda":
        torch.cuda.set_rng_state_all(client["cuda_rng"])
    return Restored(step, dict(client["extra_state"]), resharded)


def _lora(settings: Mapping[str, object] | None) -> str:
    return "null (full fine-tuning)" if settings is None else json.dumps(settings)


def _load_consolidated(engine, directory: Path, saved: dict, ranks: Ranks, zero_stage: int) -> dict:
    import logging

    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    logging.getLogger(__name__).warning(
        "checkpoint %s was saved by %d rank(s) under ZeRO-%d and is loaded by %d: parameters are consolidated "
        "from its shards; the optimizer moments restart from zero", directory, saved["world"],
        saved["zero_stage"], ranks.world)
    full = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=CKPT_TAG)
    module = engine.module
    for name, p in module.named_parameters():
        if name not in full and not p.requires_grad:
            continue  # a frozen base parameter, never saved: the model loaded it from its directory
        if name not in full:
            raise KeyError(f"{directory}: the consolidated checkpoint has no parameter {name!r}")
        partitioned = hasattr(p, "ds_id")
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0) if partitioned else contextlib.nullcontext():
            if not partitioned or ranks.rank == 0:
                with torch.no_grad():
                    p.data.copy_(full[name].to(p.device, p.dtype))
    if zero_stage > 0:
        engine.optimizer._restore_from_bit16_weights()  # the fp32 master partitions follow
    states = sorted((directory / CKPT_TAG).glob("*mp_rank_00_model_states.pt"))
    if not states:
        raise FileNotFoundError(f"no DeepSpeed model states under {directory / CKPT_TAG}")
    return torch.load(states[0], map_location="cpu", weights_only=False)
