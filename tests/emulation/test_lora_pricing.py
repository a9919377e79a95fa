"""A LoRA policy on an emulated device (issue 59's arm (d)): the adapter on the modelled shape,
and what it changes in the price of training, loading a version and fitting on devices.
Hand-computed on Qwen3-8B's shape (emulation/profiles.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.emulation import CostModel, DeviceConfig, EmulatedDevice
from astraflow.emulation.profile import load_profile
from astraflow.engines.config import LoraConfig

ALL7 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_the_adapter_is_counted_on_the_modelled_shape_per_module_and_layer():
    m = load_profile("h100-qwen3-8b").model
    # hidden 4096, 32 heads x 128 = 4096, 8 kv heads x 128 = 1024, intermediate 12288, 36 layers:
    # r x (in + out) per module: q 8192, k 5120, v 5120, o 8192, gate 16384, up 16384, down 16384
    assert m.adapter_params(8, ALL7) == 36 * 8 * (8192 + 5120 + 5120 + 8192 + 3 * 16384) == 21_823_488
    assert m.adapter_params(16, ("q_proj", "v_proj")) == 36 * 16 * (8192 + 5120)
    assert m.adapter_params(8, ("q_proj", "q_proj")) == m.adapter_params(8, ("q_proj",))  # a module once
    with pytest.raises(ValueError, match="qkv_proj not in qwen3-8b"):
        m.adapter_params(8, ("qkv_proj",))


def test_a_lora_step_skips_the_bases_weight_gradients_and_a_version_moves_the_adapter_alone():
    full = CostModel(load_profile("h100-qwen3-8b"))
    lora = CostModel(load_profile("h100-qwen3-8b"), lora_rank=8, lora_targets=ALL7)
    n, p = full.params, 21_823_488
    f = full.profile.efficiency.train_flops_per_token_per_param
    assert lora.adapter_params == p and full.adapter_params == 0
    # per trained token: forward 2N + activation gradients 2N of the frozen base, the adapter's f·P
    assert lora.train_step_s(4096) == pytest.approx(full.train_step_s(4096) * ((f - 2) * n + f * p) / (f * n))
    assert lora.train_step_s(0, forward_only_tokens=4096) == pytest.approx(
        full.train_step_s(0, forward_only_tokens=4096) * (n + p) / n)
    assert lora.weight_load_s() == pytest.approx(full.weight_load_s() * p / n)
    # states: the frozen base in bf16 and the adapter's 16 bytes a parameter: one H100, not two
    assert lora.train_state_bytes == 2 * n + 16 * p and full.train_state_bytes == 16 * n
    assert (full.min_train_devices(), lora.min_train_devices()) == (2, 1)
    link = full.profile.device.host_link_bytes_per_s * full.profile.efficiency.offload_bandwidth
    assert lora.swap_s(2) == pytest.approx(2 * ((2 * n + 16 * p) / 2 + 2 * n) / link)


def test_a_half_stated_adapter_is_refused():
    for rank, targets in ((8, ()), (0, ("q_proj",)), (-1, ("q_proj",))):
        with pytest.raises(ValueError, match="needs a rank >= 1 and its target modules"):
            CostModel(load_profile("h100-qwen3-8b"), lora_rank=rank, lora_targets=targets)


def test_an_emulated_device_prices_the_policys_adapter_from_its_lora_config():
    cfg = DeviceConfig(kind="emulated", profile="h100-qwen3-8b", count=1)
    lora = LoraConfig(rank=32, alpha=64.0, target_modules=["q_proj", "v_proj"])
    assert EmulatedDevice(cfg, "trainer.solver", lora=lora).cost.adapter_params == 36 * 32 * (8192 + 5120)
    assert EmulatedDevice(cfg, "trainer.solver").cost.adapter_params == 0


def test_a_shared_pool_on_an_emulated_device_prices_every_adapters_rows_and_loads_on_one_clock(
        tiny_model_path, tmp_path):
    """The LoRA team's pool on an emulated device (what arm (d) runs): each policy's engine is an
    adapter of ONE emulated host, so a call mixing both policies' rows is one generate on its
    clock, and each adapter's version load is held for its own adapter's bytes on the shape."""
    import yaml

    from astraflow.actors.common import make_pool_engines
    from astraflow.config import load_config
    from astraflow.emulation import EmulatedRolloutEngine
    from astraflow.engines.base import SamplingParams
    from tests.engines.test_lora import random_adapter

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" /
                           "solver_verifier_lora_shared.yaml").read_text())
    data["rollout"]["device"] = {"kind": "emulated", "profile": "h100-qwen3-8b", "count": 1, "dilation": 0.0001,
                                 "token_scale": 4}
    data["policies"]["verifier"]["trainer"]["engine"]["lora"] = {"rank": 16, "alpha": 32,
                                                                 "target_modules": ["q_proj", "v_proj"]}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    engines = make_pool_engines(cfg, tiny_model_path, name="raas-solver-0", run_dir=tmp_path)
    host = engines["solver"].host
    assert isinstance(host, EmulatedRolloutEngine) and engines["verifier"].host is host
    # what the node reports as its device's totals (telemetry's emit_device reads engine.device):
    # the pool's one account, not nothing (a run's summary then missed the shared pool's work)
    assert engines["solver"].device is host.device and engines["verifier"].device is host.device
    try:
        gens = host.generate([[1, 2, 3], [1, 2, 4]], SamplingParams(max_new_tokens=3, temperature=1.0), seeds=[1, 2],
                             adapters=["solver", "verifier"])
        assert len(gens) == 2 and host.device.stats["generate"].calls == 1
        lora = cfg.view("verifier").trainer.engine.lora
        engines["verifier"].load_weights(random_adapter(tiny_model_path, lora, seed=0), 3)
        assert engines["verifier"].version == 3 and engines["solver"].version == 0
        load = host.device.stats["weight_load"]
        m = host.device.cost.profile.model
        expected = 2 * m.adapter_params(16, ("q_proj", "v_proj")) / host.device.cost.profile.efficiency.weight_sync_bytes_per_s
        assert load.calls == 1 and load.modelled_s == pytest.approx(expected)
    finally:
        host.close()


def _lora_team(tmp_path, mutate=None):
    """examples/solver_verifier_lora_shared.yaml with both trainers on the same 2 emulated devices."""
    import yaml

    from astraflow.config import load_config
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" /
                           "solver_verifier_lora_shared.yaml").read_text())
    dev = {"kind": "emulated", "profile": "h100-qwen3-8b", "count": 2, "dilation": 0.0001, "share": "lora"}
    data["policies"]["solver"]["trainer"] = {"device": dict(dev)}
    data["policies"]["verifier"]["trainer"]["device"] = dict(dev)
    if mutate:
        mutate(data)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_trainers_of_lora_adapters_of_one_base_take_turns_on_their_devices_and_swap_nothing(tiny_model_path,
                                                                                            tmp_path):
    """Arm (d)'s one trainer: the two policies' trainers name one share (no pool does), so their
    steps take turns on the devices, and a step pays no swap: the base and both adapters' states
    stay on the devices (one trainer process training each adapter in turn)."""
    from astraflow.actors.common import make_train_engine
    cfg = _lora_team(tmp_path)
    assert cfg.pool_device_shares() == set()
    engine = make_train_engine(cfg.view("verifier"), tiny_model_path, run_dir=tmp_path)
    try:
        assert engine.swap is False and engine.device.share is not None
        model = engine.device.cost.profile.model  # the example's adapter on the modelled shape
        assert engine.device.cost.adapter_params == model.adapter_params(8, ("q_proj", "v_proj", "up_proj"))
    finally:
        engine.device.share.close()


def test_a_trainers_share_needs_lora_adapters_of_one_base_and_a_partner(tmp_path):
    from astraflow.config import ConfigError
    with pytest.raises(ConfigError, match=r"policies.verifier.trainer.device.share: trainers share devices \('lora'\) "
                                          r"as LoRA adapters of one base only .* 'verifier' is full fine-tuning"):
        _lora_team(tmp_path, lambda d: (d["policies"]["verifier"]["rollout"].pop("pool"),
                                        d["policies"]["verifier"]["trainer"]["engine"].update(lora=None)))
    with pytest.raises(ConfigError, match="policies.solver.trainer.device.share: 'lora' is named by this component "
                                          "only"):
        _lora_team(tmp_path, lambda d: d["policies"]["verifier"]["trainer"]["device"].pop("share"))
