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


@pytest.fixture
def bad_param_is_a_config_error(tmp_path):
    """``check(example, key, value, good)``: ``value`` for ``workflow.params.<key>`` in the example
    config ``example`` is a ConfigError naming the key, the file and the value; with the params
    ``good`` instead it loads. Returns the loaded config."""
    import yaml

    from astraflow.config import load_config
    from astraflow.typed_config import ConfigError

    def check(example, key: str, value, good: dict):
        data = yaml.safe_load(example.read_text())
        data["workflow"]["params"][key] = value
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError) as e:
            load_config(path)
        assert str(path) in str(e.value) and f"workflow.params.{key}" in str(e.value) and repr(value) in str(e.value)
        data["workflow"]["params"].update(good)
        path.write_text(yaml.safe_dump(data))
        return load_config(path)
    return check
