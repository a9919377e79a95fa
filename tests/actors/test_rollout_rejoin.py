"""A RaaS node recreates a task consumer the broker no longer lists (the consumer wedge).

Seen in CI: a node's task consumer sat outside its group (the broker had no such group)
while the node kept polling and the client reported a generation, so the node idled with
tasks waiting. The node's watchdog asks the broker when the consumer has been idle or
unsettled too long and recreates it when the broker does not list it; the new one joins
and gets the waiting task from the committed offset. Real broker, real consumers and
producers; the wedge's signature is entered by stopping the consumer's heartbeats (the
client's own switch) until the broker expels it while the client still says "stable".
"""

import threading
import time
import types

from astraflow.actors import rollout
from astraflow.actors.engine_weights import EngineWeights
from astraflow.actors.polls import PollsInFlight
from astraflow.actors.telemetry import MetricsEmitter
from astraflow.config import load_config
from astraflow.topics import Producer, Task
from astraflow.topics.membership import MembershipWatch
from tests.topics.groups import settle
from tests.waiting import wait_until


def test_a_task_consumer_the_broker_dropped_is_recreated_and_gets_the_waiting_task(
        bootstrap, job_topics, tmp_path, monkeypatch, expel_silently):
    cfg = load_config("examples/arithmetic_grpo.yaml")
    node = rollout.RolloutActor.__new__(rollout.RolloutActor)  # only the parts the watchdog uses
    node.bootstrap, node.topics, node.cfg, node.node_id = bootstrap, job_topics, cfg, "raas-w"
    node.plain = Producer(bootstrap, client_id="raas-w")
    node.metrics = MetricsEmitter(node.plain, job_topics.metrics, "raas-w")
    node.engine = types.SimpleNamespace(version=0)  # read for the metric's step only
    node.watch = MembershipWatch(bootstrap, "raas-w", unsettled_s=rollout.CONSUMER_REJOIN_S, idle_s=1.0)
    monkeypatch.setattr(rollout, "TASK_SESSION_TIMEOUT_MS", 6_000)  # the broker's minimum: expelled sooner
    node.consumer = node._task_consumer()
    feeder = Producer(bootstrap, client_id="feeder")
    group = job_topics.rollout_group(cfg.policy)
    try:
        for _ in range(40):
            node.consumer.poll(250)
            if node.consumer.group_metadata().generation_id >= 0 and node.consumer.seconds_outside_group() == 0:
                break
        node._rejoin_if_stuck()
        assert node.watch.renewals == 0  # a fresh member: nothing asked
        stuck = node.consumer
        expel_silently(stuck, group, timeout_s=30, pause_s=1)
        assert stuck.group_metadata().generation_id >= 0  # the client still thinks it is a member
        task = Task("task-1", "p-1", cfg.policy, "1+1=", "2", 2)
        feeder.send_sync(job_topics.tasks(cfg.policy), task, key="task-1")
        time.sleep(1.1)
        node._rejoin_if_stuck()
        assert node.watch.renewals == 1 and node.consumer is not stuck
        got = []
        for _ in range(40):
            got += node.consumer.poll(500)
            if got:
                break
        assert [d.message.task_id for d in got] == ["task-1"]
        assert node.consumer.group_metadata().group_id == group
        node.watch.saw_records()
        node._rejoin_if_stuck()
        assert node.watch.renewals == 1  # a member that just got records: left alone
    finally:
        node.consumer.close()
        node.watch.close()
        feeder.close()
        node.plain.close()


def _stepping_node(bootstrap, job_topics, node_id: str) -> rollout.RolloutActor:
    """A RaaS node with only the parts ``step()`` uses when it polls no task (an undecodable
    one is dead-lettered): its task consumer, dead letters, metrics, watch and (empty)
    pipeline of polls; no engine."""
    node = rollout.RolloutActor.__new__(rollout.RolloutActor)
    node.bootstrap, node.topics, node.node_id = bootstrap, job_topics, node_id
    node.cfg = load_config("examples/arithmetic_grpo.yaml")
    node.multi, node.server = False, None
    node.plain = Producer(bootstrap, client_id=node_id)
    node.metrics = MetricsEmitter(node.plain, job_topics.metrics, node_id)
    node.engine = types.SimpleNamespace(version=0)
    subscriber = types.SimpleNamespace(apply_to=lambda engine: None, held_by=lambda engine: None, version=0, epoch=0,
                                       close=lambda: None)
    node.weights = EngineWeights(subscriber, node.engine, threading.Lock(), node_id)
    node._polls = PollsInFlight(1, None, node_id)
    node._heartbeat = lambda force=False: None
    node.watch = MembershipWatch(bootstrap, node_id, unsettled_s=rollout.CONSUMER_REJOIN_S, idle_s=600)
    node.consumer = node._task_consumer()
    return node


def test_a_commit_refused_by_a_rebalance_does_not_crash_the_node(bootstrap, job_topics, monkeypatch, expel_silently):
    """A node polls only an undecodable task (dead-lettered) and commits past it with a plain
    commit; the group rebalanced between that poll and the commit (its session expired: the
    broker expelled it while the client still says "stable"), so kafka-python raises
    CommitFailedError. The node must
    go on (the task path's fencing: nothing of its own to keep), rejoin, be handed the record
    again and commit past it once, without a second letter for it."""
    from kafka import TopicPartition

    from astraflow.topics import DeadLetter

    monkeypatch.setattr(rollout, "TASK_SESSION_TIMEOUT_MS", 6_000)  # the broker's minimum: expelled sooner
    node = _stepping_node(bootstrap, job_topics, "raas-f")
    cfg = node.cfg
    group = job_topics.rollout_group(cfg.policy)
    topic = job_topics.tasks(cfg.policy)
    try:
        for _ in range(40):
            node.consumer.poll(250)
            if node.consumer.group_metadata().generation_id >= 0 and node.consumer.assignment():
                break
        consumer = node.consumer
        real_poll = consumer.poll

        def poll_then_expelled(timeout_ms=1000, max_records=None):
            """The rebalance lands between the poll that handed the record out and the commit:
            the member goes silent until the broker expels it (its session expired)."""
            out = real_poll(timeout_ms, max_records)
            if consumer.pending_offsets() and not expelled:
                expelled.append(expel_silently(consumer, group, timeout_s=30, pause_s=0.5))
            return out
        expelled: list = []
        consumer.poll = poll_then_expelled
        node.plain.send_raw(topic, b"\x00garbage", key=b"bad", partition=0,
                            headers=[("af-type", b"task")]).get(10)
        letters = node.consumer.dead_letters
        # node.step: before the fix, CommitFailedError out of here, and the actor crashes
        wait_until(lambda: letters.count, 30, "the undecodable task never arrived", step=node.step)
        assert expelled and node.consumer.pending_offsets() == {}
        tp = TopicPartition(topic, 0)
        # rejoined, handed the record again, committed past it
        wait_until(lambda: node.consumer.committed(tp) == 1, 60,
                   "the node never committed past the record after rejoining", step=node.step)
        assert node.consumer.group_metadata().generation_id >= 0
        assert (letters.count, letters.repeats) == (1, 1)
    finally:
        node.consumer.close()
        node.watch.close()
    # handed out twice, dead-lettered once (the second time its letter was recalled), committed past once
    from astraflow.topics.replay import read_topic
    try:
        got = [m for _, _, m in read_topic(bootstrap, job_topics.dlq)]  # the whole topic, to its end
        assert [(m.source_topic, m.partition, m.offset) for m in got if isinstance(m, DeadLetter)] == \
               [(topic, 0, 0)]
    finally:
        node.plain.close()


def test_a_client_left_rebalancing_with_no_rejoin_pending_rejoins_instead_of_refusing_every_commit(
        bootstrap, job_topics):
    """Seen in CI (this file's test above, once in ~40 runs of the suite): after its rejoin the
    client said "rebalancing" (so kafka-python refuses every commit itself, without asking the
    broker) while it had no rejoin pending (so every poll hands the record out again instead of
    joining). The node dead-lettered nothing new, committed nothing, and redid the same record
    for a minute. The signature is entered with the client's own state; the node must rejoin
    and commit past the record."""
    from kafka import TopicPartition
    from kafka.coordinator.base import MemberState

    node = _stepping_node(bootstrap, job_topics, "raas-r")
    cfg = node.cfg
    topic = job_topics.tasks(cfg.policy)
    try:
        consumer = node.consumer
        coordinator = consumer.raw._coordinator
        settle(consumer)  # assigned on the topic's whole metadata, no rejoin pending
        real_poll = consumer.poll
        wedged: list = []

        def poll_then_wedged(timeout_ms=1000, max_records=None):
            out = real_poll(timeout_ms, max_records)
            if consumer.pending_offsets() and not wedged:
                with coordinator._lock:
                    coordinator.state = MemberState.REBALANCING
                    coordinator.rejoin_needed = False  # no join requested (the group may have moved on)
                wedged.append(coordinator.need_rejoin())
            return out
        consumer.poll = poll_then_wedged
        node.plain.send_raw(topic, b"\x00garbage", key=b"bad", partition=0,
                            headers=[("af-type", b"task")]).get(10)
        letters = consumer.dead_letters
        tp = TopicPartition(topic, 0)
        # 40 s: below the watch's 45 s, the consumer itself must recover
        wait_until(lambda: consumer.committed(tp) == 1, 40, "the node never committed past the record",
                   step=node.step)
        assert wedged == [False]  # the wedge was entered: rebalancing, no rejoin pending
        assert node.consumer is consumer and node.watch.renewals == 0
        assert coordinator.state is MemberState.STABLE
        assert letters.count == 1  # dead-lettered once, however often it was handed out
    finally:
        node.consumer.close()
        node.watch.close()
        node.plain.close()
