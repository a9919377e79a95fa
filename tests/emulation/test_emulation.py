"""Emulated accelerators: the cost model reads its numbers from the profile file, a bad
profile is a clear error, and an emulated call is held for its modelled time while the real
work (the tiny model on CPU) costs a small share of it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import yaml

from astraflow.emulation import (CostModel, DeviceConfig, EmulatedDevice, EmulatedRolloutEngine,
                                 EmulatedTrainEngine, ProfileError, load_profile, profile_names)
from astraflow.emulation.profile import PROFILES_FILE
from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample


def _profiles(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(PROFILES_FILE.read_text())
    edit(data)
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_shipped_profiles_cover_h100_and_h200_for_both_model_shapes():
    assert {"h100-qwen3-8b", "h200-qwen3-8b", "h100-qwen3-1.7b", "h200-qwen3-1.7b"} <= set(profile_names())
    p = load_profile("h100-qwen3-8b")
    assert 8.1e9 < p.model.params < 8.3e9  # Qwen3-8B's 8.2 B parameters, from its shape
    assert 1.6e9 < load_profile("h100-qwen3-1.7b").model.params < 1.8e9
    assert all(s.strip() for s in p.sources.values())
    assert {"devices.H100-SXM.hbm_bytes_per_s", "models.qwen3-8b.num_kv_heads", "efficiency.train_flops"} <= set(p.sources)


def test_the_cost_model_takes_its_numbers_from_the_profile_file(tmp_path):
    base = CostModel(load_profile("h100-qwen3-8b"))
    faster = CostModel(load_profile("h100-qwen3-8b", _profiles(
        tmp_path, lambda d: d["devices"]["H100-SXM"]["hbm_bytes_per_s"].update(value=2 * 3.35e12))))
    overhead = base.profile.efficiency.decode_step_overhead_s
    # A memory-bound decode step: twice the bandwidth halves all but its fixed overhead.
    assert (faster.decode_step_s(8, 8 * 512) - overhead) == pytest.approx((base.decode_step_s(8, 8 * 512) - overhead) / 2)
    assert faster.train_step_s(1000) == base.train_step_s(1000)  # training is priced by FLOPs, not bandwidth
    # H200 differs from H100 by its bandwidth alone here: decode faster, training the same.
    h200 = CostModel(load_profile("h200-qwen3-8b", measured=None))  # the datasheets alone
    assert h200.decode_step_s(8, 4096) < base.decode_step_s(8, 4096) and h200.train_step_s(1000) == base.train_step_s(1000)


def test_decode_is_priced_at_the_batch_and_context_each_step_ran():
    c = CostModel(load_profile("h100-qwen3-8b"))
    # Two rows of a 4-token prompt: one stops after 1 token, the other runs 3 steps.
    expected = c.prefill_s(8) + c.decode_step_s(2, 4 + 4) + c.decode_step_s(1, 5) + c.decode_step_s(1, 6)
    assert c.generate_s([4, 4], [1, 3]) == pytest.approx(expected)
    # A real token standing for k modelled ones: k steps per real step, contexts scaled.
    k = CostModel(load_profile("h100-qwen3-8b"), token_scale=10)
    assert k.generate_s([4], [1]) == pytest.approx(c.prefill_s(40) + sum(c.decode_step_s(1, 40 + j) for j in range(10)))
    assert c.generate_s([], []) == 0.0
    # Prompts scaled apart from answers: prefill and the context every step holds.
    p = CostModel(load_profile("h100-qwen3-8b"), token_scale=10, prompt_token_scale=2)
    assert p.generate_s([4], [1]) == pytest.approx(c.prefill_s(8) + sum(c.decode_step_s(1, 8 + j) for j in range(10)))
    assert p.modelled_tokens(4, 1) == 18


def test_a_colocated_swap_moves_the_sharded_training_states_and_a_weight_replica_each_way():
    c = CostModel(load_profile("h100-qwen3-8b"))
    link = c.profile.device.host_link_bytes_per_s * c.profile.efficiency.offload_bandwidth
    assert c.profile.sources["devices.H100-SXM.host_link_bytes_per_s"].startswith("NVIDIA H100")
    assert c.swap_s(8) == pytest.approx(2 * (16 * c.params / 8 + 2 * c.params) / link)
    assert c.swap_s(1) > c.swap_s(8)


def test_training_on_k_devices_is_data_parallel_with_the_profiles_scaling():
    c = CostModel(load_profile("h100-qwen3-8b"))
    s = c.profile.efficiency.train_scaling
    assert c.train_step_s(4096, devices=4) == pytest.approx(c.train_step_s(4096) / (4 * s ** 2))
    assert c.train_step_s(4096, forward_only_tokens=4096) == pytest.approx(c.train_step_s(4096) * 8 / 6)
    assert c.weight_load_s() == pytest.approx(2 * c.params / c.profile.efficiency.weight_sync_bytes_per_s)


def test_a_profile_missing_a_field_or_a_source_is_an_error_naming_it(tmp_path):
    missing = _profiles(tmp_path, lambda d: d["devices"]["H100-SXM"].pop("hbm_bytes_per_s"))
    with pytest.raises(ProfileError, match=r"profiles\.yaml: devices\.H100-SXM\.hbm_bytes_per_s: required field"):
        load_profile("h100-qwen3-8b", missing)
    unsourced = _profiles(tmp_path, lambda d: d["efficiency"]["train_flops"].pop("source"))
    with pytest.raises(ProfileError, match=r"efficiency\.train_flops\.source: every number needs its source"):
        load_profile("h100-qwen3-8b", unsourced)
    with pytest.raises(ProfileError, match="unknown profile 'a100-x'.*h100-qwen3-8b"):
        load_profile("a100-x")


def test_an_unknown_profile_in_a_job_config_names_the_key_and_the_file(tmp_path):
    from astraflow.config import ConfigError, load_config
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"job": "emu", "rollout": {"device": {"kind": "emulated", "profile": "tpu-v9"}}}))
    with pytest.raises(ConfigError, match=r"job\.yaml: rollout\.device: .*'tpu-v9'"):
        load_config(job)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"job": "emu", "trainer": {"device": {"kind": "emulated", "profile": "h200-qwen3-8b",
                                                                       "count": 4}}}))
    cfg = load_config(ok)
    assert cfg.trainer.device.emulated and cfg.trainer.device.count == 4 and not cfg.rollout.device.emulated


def _device(profile: str = "h100-qwen3-8b", **kw) -> EmulatedDevice:
    return EmulatedDevice(DeviceConfig(kind="emulated", profile=profile, **kw), "test")


def test_an_emulated_generate_returns_the_real_tokens_held_for_their_modelled_time(engine_1t, tokenizer):
    cpu_engine = engine_1t
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("12+7=", "3+40=", "55+5=", "9+9=")]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    seeds = [1, 2, 3, 4]
    real = cpu_engine.generate(prompts, params, seeds=seeds)
    # Scaled so the hold is ~1 s, far above what the tiny model's call costs.
    probe = CostModel(load_profile("h100-qwen3-8b"), token_scale=50)
    modelled = probe.generate_s([len(p) for p in prompts], [len(g.tokens) for g in real])
    device = _device(token_scale=50, dilation=1.0 / modelled)
    engine = EmulatedRolloutEngine(cpu_engine, device)
    t0 = time.monotonic()
    out = engine.generate(prompts, params, seeds=seeds)
    held = time.monotonic() - t0
    assert [(g.tokens, g.logprobs) for g in out] == [(g.tokens, g.logprobs) for g in real]  # the real work
    stats = device.summary()["generate"]
    assert stats["calls"] == 1 and stats["modelled_s"] == pytest.approx(modelled, rel=1e-6)
    assert held >= 1.0 - 1e-6 and stats["held_s"] >= 1.0 - 1e-6  # never released before its modelled (dilated) time
    assert stats["cpu_s"] < 0.2 * stats["held_s"] and stats["cpu_fraction"] < 0.2  # the hold sleeps
    assert engine.version == cpu_engine.version


def test_a_call_whose_real_work_outweighs_its_hold_is_reported(cpu_engine, tokenizer, caplog):
    prompts = [tokenizer.encode("12+7=", add_special_tokens=False)] * 8
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), seed=3)
    # A hold of microseconds: the CPU is all there is. The warning's share is set low because
    # the share a call gets is the machine's to give: on 2 cores at load 80 a process gets a
    # few per cent of one, and 0.2 (the default) failed there (0.14).
    device = _device(dilation=1e-6, max_cpu_fraction=0.005)
    with caplog.at_level("WARNING", logger="astraflow.emulation.device"):
        EmulatedRolloutEngine(cpu_engine, device).generate(prompts, params)
    stats = device.summary()["generate"]
    assert stats["overruns"] == 1 and stats["cpu_fraction"] > 0.005
    assert any("measures the CPU, not the device" in r.message for r in caplog.records)


def test_an_emulated_train_step_learns_for_real_and_is_priced_on_k_devices(tiny_model_path, tokenizer, cpu_engine):
    from astraflow.engines.config import TrainerConfig
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    ids = tuple(tokenizer.encode("12+7=", add_special_tokens=False))
    gens = cpu_engine.generate([list(ids)] * 4, SamplingParams(temperature=1.0, max_new_tokens=4, seed=5))
    batch = TrainBatch(tuple(TrainSample(ids, g.tokens, g.logprobs, reward=float(i % 2), group_id=0)
                             for i, g in enumerate(gens)))
    one = CostModel(load_profile("h100-qwen3-8b"), token_scale=200)
    tokens = one.modelled_tokens(sum(len(s.prompt_ids) for s in batch.samples),
                                 sum(len(s.completion_ids) for s in batch.samples))
    assert tokens == 200 * sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)
    inner = DeepSpeedTrainer(tiny_model_path, TrainerConfig(lr=1e-3, seed=0))
    before = {k: v.clone() for k, v in inner.named_weights().items()}
    device = _device(token_scale=200, count=4, dilation=1.0)
    engine = EmulatedTrainEngine(inner, device)
    metrics = engine.train_step(batch)
    stats = device.summary()["train"]
    assert engine.step == 1 and "loss" in metrics
    assert any(not (before[k] == v).all() for k, v in engine.named_weights().items())  # the weights moved
    expected = one.train_step_s(tokens, devices=4)  # one epoch, one update: no forward-only pass
    assert stats["modelled_s"] == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(one.train_step_s(tokens) / (4 * one.profile.efficiency.train_scaling ** 2))
    assert stats["held_s"] >= expected and not math.isnan(stats["cpu_fraction"])
    engine.close()
    # Two updates per batch: the trainer scores the batch once without gradients first, and so does the price.
    two = EmulatedTrainEngine(DeepSpeedTrainer(tiny_model_path, TrainerConfig(lr=1e-3, seed=0, minibatches=2)),
                              _device(token_scale=200, count=4, dilation=1e-3))
    assert two.inner.proximal_pass and two.train_step(batch)["updates"] == 2
    assert two.device.stats["train"].modelled_s == pytest.approx(one.train_step_s(tokens, tokens, devices=4), rel=1e-9)
    two.close()


def test_efficiencies_measured_on_a_gpu_replace_the_estimates_for_its_device_kind(tmp_path):
    import json
    measured = tmp_path / "gpu_profile.json"
    measured.write_text(json.dumps({"gpu": "NVIDIA H200", "device_kind": "H200-SXM", "measured_at": "2026-12-01",
                                    "smoke": False, "efficiency": {"decode_bandwidth": 0.55, "train_flops": 0.31}}))
    h200 = load_profile("h200-qwen3-8b", measured=measured)
    assert (h200.efficiency.decode_bandwidth, h200.efficiency.train_flops) == (0.55, 0.31)
    assert h200.sources["efficiency.train_flops"].startswith("measured on NVIDIA H200 on 2026-12-01")
    estimate = load_profile("h200-qwen3-8b", measured=None).efficiency
    assert h200.efficiency.prefill_flops == estimate.prefill_flops  # not measured: the estimate stays
    h100 = load_profile("h100-qwen3-8b", measured=measured).efficiency
    assert h100 == load_profile("h100-qwen3-8b", measured=None).efficiency  # another device kind's measurements
    measured.write_text(json.dumps({"device_kind": "H200-SXM", "smoke": True, "efficiency": {"train_flops": 0.9}}))
    assert load_profile("h200-qwen3-8b", measured=measured).efficiency == estimate  # a CPU smoke run measures nothing


def test_the_shipped_h200_measurement_replaces_the_estimates_it_measured():
    """benchmarks/results/gpu_profile.json (measured on a lent H200): every H200 profile takes its
    five efficiencies, each a share of a datasheet peak in (0, 1] (bytes/s for weight sync), and
    says where they come from; the H100 profiles keep their estimates."""
    import json
    from astraflow.emulation.profile import MEASURED_FILE
    if not MEASURED_FILE.is_file():
        pytest.skip("no GPU measurement shipped")
    m = json.loads(MEASURED_FILE.read_text())
    assert not m["smoke"] and m["device_kind"] == "H200-SXM" and "H200" in m["gpu"]
    for name in ("h200-qwen3-8b", "h200-qwen3-1.7b"):
        p = load_profile(name)
        for key in ("decode_bandwidth", "prefill_flops", "train_flops", "offload_bandwidth"):
            assert getattr(p.efficiency, key) == pytest.approx(m["efficiency"][key]) and 0 < getattr(p.efficiency, key) <= 1
            assert p.sources[f"efficiency.{key}"].startswith(f"measured on {m['gpu']}")
        assert p.efficiency.weight_sync_bytes_per_s == pytest.approx(m["efficiency"]["weight_sync_bytes_per_s"])
    assert load_profile("h100-qwen3-8b").efficiency == load_profile("h100-qwen3-8b", measured=None).efficiency


def test_a_rollout_device_of_k_devices_deals_a_calls_rows_out_over_them(engine_1t, tokenizer):
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("12+7=", "3+40=", "55+5=", "9+9=", "1+1=")]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    one, three = _device(dilation=1e-3), _device(dilation=1e-3, count=3)
    out = EmulatedRolloutEngine(engine_1t, one).generate(prompts, params, seeds=[1, 2, 3, 4, 5])
    EmulatedRolloutEngine(engine_1t, three).generate(prompts, params, seeds=[1, 2, 3, 4, 5])
    cost = one.cost
    lens = [(len(p), len(g.tokens)) for p, g in zip(prompts, out)]
    shares = [lens[d::3] for d in range(3)]  # rows 0,3 | 1,4 | 2 on the three devices
    expected = max(cost.generate_s([p for p, _ in s], [n for _, n in s]) for s in shares)
    assert three.stats["generate"].modelled_s == pytest.approx(expected, rel=1e-9)
    assert expected < one.stats["generate"].modelled_s


def test_rows_beyond_the_kv_cache_wait_for_room_and_cost_more_than_rows_that_fit():
    c = CostModel(load_profile("h100-qwen3-8b"), token_scale=512, prompt_token_scale=16)
    per_row = 16 * 5 + 512 * 3  # a row's final context, modelled tokens
    fit = int(c.kv_capacity_tokens() // per_row)
    assert 0 < fit < 512
    # Within the capacity every row decodes at once; one row past it waits for a full second wave.
    one_wave = c.generate_s([5] * fit, [3] * fit)
    assert c.generate_s([5] * (fit + 1), [3] * (fit + 1)) > one_wave + c.generate_s([5], [3]) * 0.9
    assert c.kv_capacity_tokens() == pytest.approx(
        (c.profile.device.memory_bytes * c.profile.efficiency.usable_memory_fraction - 2 * c.params)
        / c.profile.model.kv_bytes_per_token)
    # An 8B policy's training states (16 bytes per parameter) do not fit one 80 GB device.
    assert c.min_train_devices() == 2


def test_the_device_split_balances_the_priced_stages_and_gives_every_trainer_room_for_its_states():
    from astraflow.benchmarks.multi_policy_emulated import choose_split
    from astraflow.emulation.engines import dealt_s

    c = CostModel(load_profile("h100-qwen3-8b"), token_scale=512, prompt_token_scale=16)
    rows = {"a": [[(5, 3)] * 256], "b": [[(5, 1)] * 256]}
    work = {"a": {"trainer": 40.0, "weight_load": 0.5}, "b": {"trainer": 1.0, "weight_load": 0.5}}
    out = choose_split(work, rows, 8, c, steps=1)
    apart = out["disjoint"]  # every pool and trainer on devices of its own
    split = apart["split"]
    assert sum(d for parts in split.values() for d in parts.values()) == 8
    assert min(parts["trainer"] for parts in split.values()) >= c.min_train_devices() == 2
    assert split["a"]["trainer"] > split["b"]["trainer"]  # the heavier trainer gets the devices
    assert apart["priced_bound_s_per_iter"] == pytest.approx(max(apart["priced_stage_s"].values()))
    # b's trainer is idle nearly all the iteration: its pool and trainer take turns on 2 devices
    # (both priced, and a swap), which frees a device for a's stages
    assert out["split"]["b"] == {"shared": 2} and sum(d for p in out["split"].values() for d in p.values()) == 8
    b_pool = sum(dealt_s(c, call, 2) for call in rows["b"]) + 0.5
    k = c.profile.efficiency.train_scaling  # s(8) = k^3, s(2) = k
    assert out["priced_stage_s"]["b.shared"] == pytest.approx(b_pool + 1.0 * 8 * k**3 / (2 * k) + c.swap_s(2))
    assert out["priced_bound_s_per_iter"] < 0.95 * apart["priced_bound_s_per_iter"]
    assert choose_split(work, rows, 5, c, steps=1)["split"]["b"] == {"shared": 2}  # 6 devices apart, 5 in turns
    with pytest.raises(ValueError, match="cannot hold"):
        choose_split(work, rows, 3, c, steps=1)  # two trainers of >= 2 need 4 even taking turns
