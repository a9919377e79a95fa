"""The one place an engine implementation is chosen from config.

``make_rollout_engine(cfg)`` returns the CPU engine (``kind: cpu``, the embedded default)
or the SGLang engine (``kind: sglang``); ``make_train_engine(cfg)`` returns the DeepSpeed
trainer. ``cfg`` is a ``RolloutConfig`` / ``TrainerConfig`` or the equivalent mapping
(the ``rollout:`` / ``trainer:`` section of a job config; keys documented on those
classes, unknown keys rejected) with ``model_path`` a Hugging Face model directory; which
one a job uses (its configured path, or the cached tiny model) is decided in
:mod:`astraflow.models.bootstrap`, above the engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import RolloutEngine, TrainEngine
from .config import LoraConfig, RolloutConfig, SGLangConfig, TrainerConfig, from_dict

__all__ = ["make_adapter_host", "make_rollout_engine", "make_train_engine", "model_dir", "RolloutConfig", "TrainerConfig", "SGLangConfig"]


def model_dir(model_path: str | Path) -> Path:
    """``model_path`` as a Hugging Face model directory (it must hold a ``config.json``).

    Engines load a directory they are given; which model a job uses (its configured path or
    the cached tiny model) is decided above them (:func:`astraflow.models.bootstrap.resolve_model_path`)."""
    if not str(model_path):
        raise FileNotFoundError("model_path is empty: give the engine a Hugging Face model directory (a job "
                                "resolves its `model` section to one; `astraflow model init --out DIR` builds one)")
    path = Path(model_path).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model_path {path} has no config.json; run `astraflow model init --out {path}` or fix the path")
    return path


def make_rollout_engine(cfg: RolloutConfig | Mapping[str, Any] | None = None,
                        lora: LoraConfig | None = None) -> RolloutEngine:
    """``lora``: the policy is a LoRA adapter of the model (``trainer.engine.lora``): the
    engine loads the model as the base once and takes adapters as versions."""
    cfg = from_dict(RolloutConfig, cfg, "rollout")
    path = model_dir(cfg.model_path)
    if cfg.kind == "cpu":
        from .cpu import CpuEngine

        return CpuEngine(path, threads=cfg.threads or None, lora=lora, dtype=cfg.dtype)
    from .sglang import SGLangEngine

    return SGLangEngine(path, cfg.sglang, lora=lora)


def make_adapter_host(cfg: RolloutConfig | Mapping[str, Any] | None, adapters: Mapping[str, LoraConfig]) -> RolloutEngine:
    """One engine holding the model once as the base of several LoRA adapters (``adapters``:
    name -> settings; a shared pool's policies): the CPU engine or one SGLang server. Each
    adapter is served through ``host.adapter(name)``; a call may mix their rows."""
    cfg = from_dict(RolloutConfig, cfg, "rollout")
    path = model_dir(cfg.model_path)
    if cfg.kind == "cpu":
        from .cpu import CpuEngine

        return CpuEngine(path, threads=cfg.threads or None, dtype=cfg.dtype, adapters=adapters)
    from .sglang import SGLangEngine

    return SGLangEngine(path, cfg.sglang, adapters=adapters)


def make_train_engine(cfg: TrainerConfig | Mapping[str, Any] | None = None) -> TrainEngine:
    cfg = from_dict(TrainerConfig, cfg, "trainer")
    from .deepspeed_trainer import DeepSpeedTrainer

    return DeepSpeedTrainer(model_dir(cfg.model_path), cfg)
