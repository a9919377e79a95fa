"""A workload's response-length spread: each row's modelled length is token_scale x its real
length x a factor of mean 1 drawn from its sampling seed, capped at token_scale x its
max_new_tokens; a call that runs its rows to the end pays for its longest row, and the
spread comes from the profiles file with its source."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import yaml

from astraflow.emulation import CostModel, DeviceConfig, EmulatedDevice, ProfileError, load_profile
from astraflow.emulation.batching import BatchingClock
from astraflow.emulation.engines import EmulatedRolloutEngine, dealt_s
from astraflow.emulation.profile import PROFILES_FILE, load_workload, workload_names
from astraflow.engines.base import SamplingParams

PROFILE = load_profile("h100-qwen3-8b")


def test_a_rows_factor_is_log_normal_of_mean_one_and_fixed_by_its_seed():
    c = CostModel(PROFILE, token_scale=256, length_sigma=0.83)
    factors = [c.length_factor(i) for i in range(20_000)]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.03)
    assert statistics.pstdev(math.log(f) for f in factors) == pytest.approx(0.83, abs=0.02)
    assert c.length_factor(17) == CostModel(PROFILE, token_scale=16, length_sigma=0.83).length_factor(17)  # the seed's
    assert len({round(f, 9) for f in factors[:100]}) == 100
    assert CostModel(PROFILE, token_scale=256).length_factor(17) == 1.0  # no workload: the tiny model's lengths
    with pytest.raises(ValueError, match="length_sigma"):
        CostModel(PROFILE, length_sigma=-0.1)


def test_a_modelled_length_is_capped_at_the_emulated_models_cap_and_never_zero_for_a_row_that_wrote():
    c = CostModel(PROFILE, token_scale=256, length_sigma=0.83)
    assert c.modelled_length(4, 16, 1.0) == 1024
    assert c.modelled_length(4, 16, 2.5) == 2560
    assert c.modelled_length(4, 16, 9.0) == 16 * 256  # the cap: max_new_tokens x token_scale
    assert c.modelled_length(1, 16, 1e-6) == 1
    assert c.modelled_length(0, 16, 3.0) == 0


def test_a_call_run_to_its_end_waits_for_its_longest_row_at_the_batch_it_has_left():
    c = CostModel(PROFILE, token_scale=10)
    k = 10
    # four rows of 2 real tokens; one of them 4x as long as the rest
    got = c.generate_s([4] * 4, [2] * 4, factors=[1.0, 1.0, 1.0, 4.0], caps=[8] * 4)
    expected = c.prefill_s(4 * 4)  # prompt tokens are scaled inside prefill_s
    ctx = 4 * 4 * k  # the prompts' modelled context
    for j in range(2 * k):  # all four rows for the short rows' 20 modelled tokens
        expected += c.decode_step_s(4, ctx + 4 * j)
    for j in range(2 * k, 8 * k):  # then the long row alone for 60 more
        expected += c.decode_step_s(1, 4 * k + j)
    assert got == pytest.approx(expected, rel=1e-9)
    # the same rows without the spread: every row done after 20 tokens
    assert c.generate_s([4] * 4, [2] * 4) < 0.5 * got
    # dealt over two devices, the long row's device decides
    rows = [(4, 2, 1.0, 8), (4, 2, 1.0, 8), (4, 2, 1.0, 8), (4, 2, 4.0, 8)]
    assert dealt_s(c, rows, 2) == pytest.approx(max(c.generate_s([4, 4], [2, 2], [1.0, 1.0], [8, 8]),
                                                    c.generate_s([4, 4], [2, 2], [1.0, 4.0], [8, 8])))


def test_the_shared_schedule_holds_a_call_until_its_longest_row_is_decoded():
    c = CostModel(PROFILE, token_scale=64, prompt_token_scale=16)
    clock = BatchingClock(c, 1, 0.0005)
    arrived = clock.now()
    call = clock.admit([10, 10], 8, arrived, factors=[1.0, 3.0])
    timing = clock.run(call, [4, 4], arrived)
    assert timing.latency_s == pytest.approx(c.generate_s([10, 10], [4, 4], [1.0, 3.0], [8, 8]), rel=1e-6)
    assert timing.latency_s > 1.5 * c.generate_s([10, 10], [4, 4])


def test_the_same_seeds_get_the_same_lengths_on_every_emulated_engine(cpu_engine, tokenizer):
    """Two arms of a benchmark generate the same samples (seeds) and must price the same lengths."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    prompts = [tokenizer.encode(q, add_special_tokens=False) for q in ("12+7=", "3+40=", "55+5=", "9+9=")]

    def rows(count: int, order):
        dev = EmulatedDevice(DeviceConfig(kind="emulated", profile="h100-qwen3-8b", count=count, dilation=1e-4,
                                          token_scale=256, workload="reasoning"), "t")
        engine = EmulatedRolloutEngine(cpu_engine, dev)
        engine.rows = []
        engine.generate([prompts[i] for i in order], params, seeds=[100 + i for i in order])
        assert dev.summary()["workload"] == "reasoning" and dev.summary()["length_sigma"] == pytest.approx(0.83)
        return {i: r for i, r in zip(order, engine.rows[0])}

    a, b = rows(1, [0, 1, 2, 3]), rows(4, [3, 2, 1, 0])
    assert a == b  # each sample: its real lengths, its factor, its cap
    assert len({r[2] for r in a.values()}) == 4 and all(r[3] == 6 for r in a.values())


def test_the_workload_comes_from_the_profiles_file_and_a_bad_one_is_an_error_naming_it(tmp_path):
    assert "reasoning" in workload_names()
    shipped = yaml.safe_load(PROFILES_FILE.read_text())["workloads"]["reasoning"]["length_sigma"]
    w = load_workload("reasoning")
    assert w.length_sigma == shipped["value"] and w.sources["workloads.reasoning.length_sigma"] == shipped["source"]

    def edited(edit) -> Path:
        data = yaml.safe_load(PROFILES_FILE.read_text())
        edit(data)
        path = tmp_path / "profiles.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    with pytest.raises(ProfileError, match=r"profiles\.yaml: workloads\.reasoning\.length_sigma: required field"):
        load_workload("reasoning", edited(lambda d: d["workloads"]["reasoning"].pop("length_sigma")))
    with pytest.raises(ProfileError, match=r"workloads\.reasoning\.length_sigma\.source: every number needs its source"):
        load_workload("reasoning", edited(lambda d: d["workloads"]["reasoning"]["length_sigma"].pop("source")))
    with pytest.raises(ProfileError, match="unknown workload 'chat'.*reasoning"):
        load_workload("chat")


def test_a_device_names_its_workload_in_the_job_config(tmp_path):
    from astraflow.config import ConfigError, load_config
    bad = tmp_path / "job.yaml"
    bad.write_text(yaml.safe_dump({"job": "emu", "rollout": {"device": {"kind": "emulated", "profile": "h100-qwen3-8b",
                                                                       "workload": "poetry"}}}))
    with pytest.raises(ConfigError, match=r"job\.yaml: rollout\.device: .*'poetry'.*reasoning"):
        load_config(bad)
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(yaml.safe_dump({"job": "emu", "rollout": {"device": {"workload": "reasoning"}}}))
    with pytest.raises(ConfigError, match=r"cpu\.yaml: rollout\.device: .*need device\.kind: emulated"):
        load_config(cpu)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"job": "emu", "rollout": {"device": {"kind": "emulated", "profile": "h100-qwen3-8b",
                                                                      "workload": "reasoning"}}}))
    assert load_config(ok).rollout.device.workload == "reasoning"


def test_table_2s_arms_share_the_seeds_length_cap_the_workload_and_the_staleness_bound(tmp_path):
    """Every arm of the emulated Table 2 prices the same lengths: each policy's real cap is the
    seed's 4096 modelled tokens / token_scale, every device names the workload, and the
    staleness bound is the benchmark's, whatever the example config says."""
    import argparse

    from astraflow.benchmarks.multi_policy_emulated_arms import colocated_config, split_config
    from astraflow.config import load_config
    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "solver_verifier.yaml").read_text())
    assert base["policies"]["verifier"]["rollout"]["max_new_tokens"] != base["rollout"]["max_new_tokens"]
    args = argparse.Namespace(profile="h100-qwen3-8b", dilation=0.3, token_scale=256, prompt_token_scale=16,
                              workload="reasoning", max_new_tokens_modelled=4096, steps=5, eval_problems=10,
                              devices=8, polls_in_flight=4, max_staleness=3)
    split = {"solver": {"rollout": 3, "trainer": 2}, "verifier": {"rollout": 1, "trainer": 2}}
    for i, data in enumerate((colocated_config(base, args),
                              split_config(base, args, split, "async", "t", str(tmp_path)))):
        path = tmp_path / f"arm{i}.yaml"
        path.write_text(yaml.safe_dump({**data, "job": f"arm{i}"}))
        cfg = load_config(path)
        for p in ("solver", "verifier"):
            view = cfg.view(p)
            assert view.rollout.max_new_tokens == 16
            assert view.rollout.device.workload == "reasoning" and view.trainer.device.workload == "reasoning"
        assert cfg.dataflow.max_staleness == 3
        # (c) trains the iterations it is timed over; (a)/(b) train past their window's end
        # (step 5) so their pools still have work in flight when it closes
        assert cfg.trainer.steps == (5 if i == 0 else 5 + 3 + 1)
    args.token_scale = 8192
    with pytest.raises(ValueError, match="above the modelled cap"):
        colocated_config(base, args)
