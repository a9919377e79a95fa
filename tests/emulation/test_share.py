"""Devices a policy's pool and trainer take turns on (``device.share``): the trainer's claim
pauses the pool's continuous batch, the pool goes on after the step, prefilling its held
context again, and the step pays the swap of the states."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import yaml

from astraflow.config import ConfigError, load_config
from astraflow.emulation import CostModel, DeviceConfig, EmulatedDevice, EmulatedRolloutEngine, load_profile
from astraflow.emulation.batching import BatchingClock
from astraflow.emulation.share import DeviceShare
from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
from tests.waiting import wait_until

COST = CostModel(load_profile("h100-qwen3-8b"), token_scale=512, prompt_token_scale=16)
ROWS = [(20, 30)] * 8


def test_a_paused_batch_starts_no_step_and_prefills_its_context_again_when_it_goes_on():
    alone = COST.generate_s([p for p, _ in ROWS], [n for _, n in ROWS])
    dilation = 0.3 / alone  # the call alone holds 0.3 s of wall time
    clock = BatchingClock(COST, 1, dilation)
    out = []

    def run():
        arrived = clock.now()
        out.append(clock.run(clock.admit([p for p, _ in ROWS], 30, arrived), [n for _, n in ROWS], arrived))
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.1)  # a third of the way through
    clock.pause()
    held = clock._devices[0].batch.held_context()
    assert held > 8 * 16 * 20  # the prompts and what they generated so far
    time.sleep(0.3)  # the devices away for as long as the whole call takes
    clock.resume()
    t.join(10)
    paused, redo = clock.paused_s, clock.recompute_s
    assert paused == pytest.approx(alone, rel=0.25)
    assert redo == pytest.approx(COST.prefill_modelled_s(held), rel=0.05) and redo > 0
    latency = out[0].latency_s
    assert latency >= alone + paused + redo - 1e-6  # nothing decoded while the devices were away
    assert latency < alone + paused + redo + 0.1 * alone  # and it went on from where it stopped
    assert clock.busy_s == pytest.approx(alone + redo, rel=0.02)  # the pause is not device work; the redo is


def test_a_claim_waits_for_the_pool_to_pause_and_the_pool_goes_on_after_it(tmp_path):
    pool, trainer = DeviceShare(tmp_path, "v"), DeviceShare(tmp_path, "v")
    events: list[str] = []
    pool.yield_to_claims(lambda: events.append("pause"), lambda redo: events.append(f"resume {redo}"))
    # the devices held: the pool runs
    wait_until(lambda: events[-1:] == ["resume False"], 10.0, "timed out", interval_s=0.005)
    with trainer.claim():
        assert events == ["pause", "resume False", "pause"]  # the claim starts only once the pool paused
        time.sleep(0.05)
        assert events[-1] == "pause"  # and the pool stays paused while it holds the devices
    wait_until(lambda: events[-1] == "resume True", 10.0, "timed out", interval_s=0.005)
    assert pool.yields == 1 and trainer.claims == 1 and pool.yielded_s >= 0.05
    # a claimant alone (the pool gone: its files closed) gets the devices at once
    pool.close()
    assert not pool._watcher.is_alive()
    with trainer.claim():
        pass
    assert trainer.claims == 2


def test_a_pool_and_trainer_sharing_devices_take_turns_and_the_step_pays_the_swap(tmp_path, engine_1t, tokenizer,
                                                                                  tiny_model_path):
    from astraflow.emulation import EmulatedTrainEngine
    from astraflow.engines.config import TrainerConfig
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    prompts = [tokenizer.encode("12+7=", add_special_tokens=False)] * 8
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,), seed=3)
    cfg = DeviceConfig(kind="emulated", profile="h100-qwen3-8b", count=2, token_scale=400, share="verifier")
    cost = CostModel(load_profile("h100-qwen3-8b"), token_scale=400)
    alone = cost.generate_s([len(p) for p in prompts], [6] * 8)  # at most (rows may stop early)
    cfg = dataclasses.replace(cfg, dilation=1.0 / alone)  # a call of ~1 s
    pool = EmulatedRolloutEngine(engine_1t, EmulatedDevice(cfg, "raas-verifier-0", share_dir=tmp_path))
    inner = DeepSpeedTrainer(tiny_model_path, TrainerConfig(lr=1e-3, seed=0))
    trainer = EmulatedTrainEngine(inner, EmulatedDevice(cfg, "trainer.verifier", share_dir=tmp_path))
    gens = engine_1t.generate(prompts[:4], params)
    batch = TrainBatch(tuple(TrainSample(tuple(prompts[0]), g.tokens, g.logprobs, reward=float(i % 2), group_id=0)
                             for i, g in enumerate(gens)))
    try:
        # the pool holds the devices
        wait_until(lambda: pool.clock._paused_at is None, 10.0, "timed out", interval_s=0.005)
        done = []
        th = threading.Thread(target=lambda: done.append(pool.generate(prompts, params, seeds=list(range(8)))))
        th.start()
        time.sleep(0.2)
        trainer.train_step(batch)  # claims the devices in the middle of the pool's call
        th.join(30)
        assert len(done[0]) == 8  # the real tokens, after the step
        step = trainer.device.summary()
        tokens = cost.modelled_tokens(sum(len(s.prompt_ids) for s in batch.samples),
                                      sum(len(s.completion_ids) for s in batch.samples))
        assert step["train"]["modelled_s"] == pytest.approx(cost.train_step_s(tokens, devices=2) + cost.swap_s(2),
                                                            rel=1e-6)
        assert step["share"]["claims"] == 1
        ps = pool.device.summary()
        assert ps["share"]["yields"] == 1 and ps["share"]["yielded_s"] >= step["train"]["modelled_s"] * 0.95
        # the pool's call waited the step out: its hold covers its own decode and the claim
        assert ps["generate"]["held_s"] * cfg.dilation**-1 >= ps["share"]["yielded_s"]
        assert pool.clock.recompute_s > 0 and pool.clock.paused_s >= step["train"]["modelled_s"] * 0.95
    finally:
        trainer.close()
        pool.close()


def test_shared_devices_are_a_policys_pool_and_trainer_on_the_same_devices(tmp_path):
    base = yaml.safe_load(open("examples/solver_verifier.yaml"))
    dev = {"kind": "emulated", "profile": "h100-qwen3-8b", "count": 2, "share": "v"}

    def load(mutate):
        data = yaml.safe_load(yaml.safe_dump(base))
        data["policies"]["verifier"]["rollout"]["device"] = dict(dev)
        data["policies"]["verifier"].setdefault("trainer", {})["device"] = dict(dev)
        mutate(data)
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_config(path)

    cfg = load(lambda d: None)
    assert cfg.policies["verifier"].trainer.device.share == "v"
    cases = [
        (lambda d: d["policies"]["verifier"]["trainer"]["device"].update(count=3),
         "policies.verifier.trainer.device.share", "same devices"),
        (lambda d: d["policies"]["verifier"]["trainer"].pop("device"),
         "policies.verifier.rollout.device.share", "named by this component only"),
        (lambda d: d["policies"]["verifier"]["rollout"].update(nodes=2),
         "policies.verifier.rollout.device.share", "rollout.nodes must be 1"),
        (lambda d: d["policies"]["solver"].setdefault("trainer", {}).update(device=dict(dev)),
         "device.share", "a pool shares its devices with its own policy's trainer only"),
    ]
    for mutate, key, words in cases:
        with pytest.raises(ConfigError) as e:
            load(mutate)
        assert key in str(e.value) and words in str(e.value) and "job.yaml" in str(e.value)
    with pytest.raises(ValueError, match="device.share needs device.profile"):
        DeviceConfig(kind="emulated", slowdown=2.0, share="v")
    with pytest.raises(ValueError, match="need device.kind: emulated"):
        DeviceConfig(share="v")
    with pytest.raises(ValueError, match="needs the run directory"):
        EmulatedDevice(DeviceConfig(kind="emulated", profile="h100-qwen3-8b", share="v"), "raas")
