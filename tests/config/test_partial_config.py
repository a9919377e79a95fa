"""``rollout.partial`` and ``rollout.max_versions_per_trajectory``: accepted where the engine can
continue rows across versions, refused with the key and the file elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "arithmetic_grpo.yaml"


def test_partial_on_the_cpu_and_sglang_engines_loads():
    cfg = load_config(DEMO, {"rollout.partial": True, "rollout.max_versions_per_trajectory": 2})
    assert cfg.rollout.partial and cfg.rollout.max_versions_per_trajectory == 2
    assert load_config(DEMO, {"rollout.partial": True, "rollout.engine.kind": "sglang"}).rollout.partial
    # an emulated device with a cost profile cuts its held calls' rows at a load (emulation/partial.py)
    emulated = {"kind": "emulated", "profile": "h100-qwen3-8b", "token_scale": 64}
    assert load_config(DEMO, {"rollout.partial": True, "rollout.device": emulated}).rollout.partial


@pytest.mark.parametrize("sets,match", [
    ({"rollout.max_versions_per_trajectory": 2}, "set rollout.partial: true"),
    ({"rollout.partial": True, "rollout.device": {"kind": "emulated", "slowdown": 2.0}}, "an emulated slowdown device holds whole calls"),
    ({"rollout.partial": True, "trainer.engine.lora": {"rank": 4}}, "partial rollouts need full fine-tuning"),
])
def test_refused_naming_the_key_and_file(sets, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(DEMO, sets)
    assert "arithmetic_grpo.yaml" in str(e.value)
