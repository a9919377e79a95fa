"""The emulated scale benchmark's layouts: the same work per device at every device count,
and job configs the loader accepts (every key it sets exists and is in range)."""

from __future__ import annotations

import argparse

import pytest

from astraflow.benchmarks import emulated_scale as es
from astraflow.config import load_config


@pytest.mark.parametrize("n", [8, 16, 32, 64])
def test_every_device_count_keeps_the_work_per_device_and_loads_as_a_job(n):
    lay = es.layout(n, 8)
    assert lay["rollout_devices"] + lay["trainer_devices"] == n
    assert lay["nodes"] * lay["devices_per_node"] == lay["rollout_devices"] and lay["devices_per_node"] <= 8
    assert lay["groups_per_batch"] / n == es.GROUPS_PER_8 / 8  # weak scaling: a batch's share per device
    assert lay["tasks_per_call"] * lay["nodes"] == lay["groups_per_batch"]
    args = argparse.Namespace(profile="h100-qwen3-8b", dilation=0.3, token_scale=512, prompt_token_scale=16,
                              steps=4)
    ov = es.overrides(args, lay, f"scale-{n}")
    cfg = load_config(es.CONFIG, ov)
    assert cfg.rollout.nodes == lay["nodes"] and cfg.rollout.device.count == lay["devices_per_node"]
    assert cfg.trainer.device.count == lay["trainer_devices"] and cfg.rollout.device.emulated
    assert cfg.rollout.device.dilation == pytest.approx(0.3 * n / 8)  # the real work's share stays small


def test_a_layout_that_cannot_split_evenly_is_refused():
    with pytest.raises(ValueError, match="do not split evenly"):
        es.layout(40, 8)  # 20 rollout devices over 3 nodes
