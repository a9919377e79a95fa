"""Fixtures for the engine tests: one bootstrapped tiny model shared by the session."""

from __future__ import annotations

import os

import pytest
import torch

# DeepSpeed chooses its accelerator at import; these tests run on CPU.
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def tiny_model_path():
    """The cached warm-started tiny model (built once, ~1 min on 2 cores, then reused)."""
    from astraflow.models.bootstrap import ensure_tiny_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path))


@pytest.fixture(scope="session")
def cpu_engine(tiny_model_path):
    from astraflow.engines.cpu import CpuEngine

    engine = CpuEngine(tiny_model_path)
    yield engine
    engine.close()
