"""Fixtures of the workflow tests: the cached tiny model's tokenizer and one CPU engine."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module")
def tokenizer_and_engine():
    """``(tokenizer, CpuEngine)`` of the cached warm-started tiny model (built once)."""
    from transformers import AutoTokenizer

    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.engines.cpu import CpuEngine

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    path = ensure_tiny_model()
    engine = CpuEngine(path)
    yield AutoTokenizer.from_pretrained(str(path)), engine
    engine.close()
