"""A node with polls in flight loads new weights beside them, and goes on polling meanwhile.

A load needs the engine idle (every row of a call from one version), so it waits for the
calls in flight; on an emulated or GPU engine that is a long call's time. A node that waited
on its own thread stopped polling for that long, and every rebalance of its task group
waited for it (a join waits for each member's poll) and then fenced every node's polls in
flight: ~130 group generations in 6 steps at 64 emulated devices. Real broker, real
publisher and subscriber, real CPU engine; the call in flight is held open by the test.
"""

from __future__ import annotations

import threading

from transformers import Qwen3ForCausalLM

from astraflow.actors import rollout
from astraflow.actors.engine_weights import EngineWeights
from astraflow.engines.cpu import CpuEngine
from astraflow.engines.gate import EngineGate
from astraflow.topics import Consumer, Producer, Task
from astraflow.weights import WeightPublisher, WeightSubscriber
from tests.weights.test_weight_transfer import CHUNK, WAIT, Trainer, tiny_config


def test_a_load_waits_for_the_call_in_flight_on_its_own_thread_and_the_step_returns(bootstrap, job_topics):
    trainer = Trainer(seed=11)
    pub = WeightPublisher(bootstrap, job_topics, "policy", snapshot_every=100, chunk_size=CHUNK)
    sub = WeightSubscriber(bootstrap, job_topics, "policy", node_id="raas-load").start()
    # a node's weights: its engine, the gate its calls share, its subscriber
    weights = EngineWeights(sub, CpuEngine(Qwen3ForCausalLM(tiny_config()), version=0), EngineGate(concurrent=True),
                         "raas-load")
    call = weights.engine_lock.call()
    try:
        pub.resume(trainer.named_weights(), 0)
        assert sub.wait_for(0, WAIT)  # the engine starts at version 0
        trainer.step()
        pub.publish(trainer.named_weights(), 1)
        assert sub.wait_for(1, WAIT)
        call.__enter__()  # an episode's generate call in flight
        stepped = threading.Thread(target=weights.load_beside, daemon=True)  # the step's load
        stepped.start()
        stepped.join(WAIT)
        assert not stepped.is_alive(), "the step waited for the call in flight instead of polling on"
        assert weights.engine.version == 0  # the load waits for the call ...
        assert weights._loading is not None and not weights._loading.done()
        weights.load_beside()  # ... and a second turn does not start another
        with weights.engine_lock.try_exclusive() as alone:
            assert not alone
        call.__exit__(None, None, None)  # the call ends: the load takes the idle engine
        weights._loading.result(WAIT)
        assert weights.engine.version == 1
        weights.load_beside()  # collects the finished load; nothing newer to load
        assert weights._loading is None and weights.engine.version == 1
    finally:
        weights.close()  # (the subscriber too)
        pub.close()


def test_a_held_consumer_keeps_polling_but_hands_out_nothing_until_let_go(bootstrap, job_topics):
    """``Consumer.hold``: what a node at its limit of polls (or of served calls) does instead of
    not polling: the records wait in Kafka, uncommitted, and come once it lets go."""
    topic = job_topics.tasks("policy")
    feeder = Producer(bootstrap, client_id="feeder-hold")
    consumer = Consumer(bootstrap, topics=[topic], group_id=f"{job_topics.job}.hold", client_id="held",
                        expect=(Task,))
    try:
        for _ in range(60):  # joined, with every partition assigned
            consumer.poll(200)
            if len(consumer.assignment()) == 4:
                break
        consumer.hold(True)
        for i in range(4):
            feeder.send_sync(topic, Task(f"t{i}", f"p{i}", "policy", "1+1=", "2", 1), key=f"t{i}")
        held = [d for _ in range(10) for d in consumer.poll(200)]
        assert held == [] and consumer.pending_offsets() == {}
        consumer.hold(True)  # idempotent
        consumer.hold(False)
        got = []
        for _ in range(60):
            got += consumer.poll(200)
            if len(got) == 4:
                break
        assert sorted(d.message.task_id for d in got) == ["t0", "t1", "t2", "t3"]
    finally:
        consumer.close()
        feeder.close()


def test_bounds_on_device_work_stretch_with_an_emulated_jobs_dilation():
    """A role call's reply bound and a call's wait for the others are device seconds: on
    devices held 2.4 wall seconds per modelled one (64 emulated devices), a 200-s verdict call
    is 480 s of wall time, past the 300-s reply bound, and every episode failed."""
    from astraflow.config import load_config
    dev = {"kind": "emulated", "profile": "h100-qwen3-8b", "dilation": 2.4}
    node = rollout.RolloutActor.__new__(rollout.RolloutActor)
    node.cfg, node.multi = load_config("examples/solver_verifier.yaml", {"policies.verifier.rollout.device": dev}), True
    assert node._emulation_stretch() == 2.4  # the largest of the job's pools: the verifier's calls are waited on
    node.cfg = load_config("examples/solver_verifier.yaml", {"policies.verifier.rollout.device": {**dev, "dilation": 0.3}})
    assert node._emulation_stretch() == 1.0  # faster than the device: the bounds stay as they are
    node.cfg, node.multi = load_config("examples/arithmetic_grpo.yaml"), False
    assert node._emulation_stretch() == 1.0  # a real device
