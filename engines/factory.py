"""The one place an engine implementation is chosen from config.

``make_rollout_engine(cfg)`` returns the CPU engine (``kind: cpu``, the embedded default)
or the SGLang engine (``kind: sglang``); ``make_train_engine(cfg)`` returns the DeepSpeed
trainer. ``cfg`` is a ``RolloutConfig`` / ``TrainerConfig`` or the equivalent mapping
(the ``rollout:`` / ``trainer:`` section of a job config; keys documented on those
classes, unknown keys rejected). An empty ``model_path`` means the bootstrapped tiny
model (built and cached on first use).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import RolloutEngine, TrainEngine
from .config import RolloutConfig, SGLangConfig, TrainerConfig, from_dict

__all__ = ["make_rollout_engine", "make_train_engine", "resolve_model_path", "RolloutConfig", "TrainerConfig", "SGLangConfig"]


def resolve_model_path(model_path: str, seed: int = 0, task: str = "arithmetic") -> Path:
    """``model_path`` if set, else the cached tiny model warm-started on ``task``
    (``engines/warm_start.py``; built on first use)."""
    if model_path:
        path = Path(model_path).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model_path {path} has no config.json; run `astraflow model init --out {path}` or fix the path")
        return path
    from .bootstrap import ensure_tiny_model

    return ensure_tiny_model(seed=seed, task=task)


def make_rollout_engine(cfg: RolloutConfig | Mapping[str, Any] | None = None) -> RolloutEngine:
    cfg = from_dict(RolloutConfig, cfg, "rollout")
    path = resolve_model_path(cfg.model_path, cfg.seed)
    if cfg.kind == "cpu":
        from .cpu import CpuEngine

        return CpuEngine(path, threads=cfg.threads or None)
    from .sglang import SGLangEngine

    return SGLangEngine(path, cfg.sglang)


def make_train_engine(cfg: TrainerConfig | Mapping[str, Any] | None = None) -> TrainEngine:
    cfg = from_dict(TrainerConfig, cfg, "trainer")
    from .deepspeed_trainer import DeepSpeedTrainer

    return DeepSpeedTrainer(resolve_model_path(cfg.model_path, cfg.seed), cfg)
