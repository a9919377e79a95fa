"""A local 3-node KRaft cluster: everything replicated, and one SIGKILLed broker stops nothing."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from astraflow.topics import Consumer, EmbeddedCluster, JobTopics, ProduceError, Producer, Prompt, ensure_topics

pytestmark = pytest.mark.slow  # three broker JVMs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = EmbeddedCluster(tmp_path_factory.mktemp("cluster"), nodes=3, heap="384m").start()
    try:
        yield c
    finally:
        c.stop()


def _describe(bootstrap: str, names: list[str]) -> dict[str, tuple[list[list[int]], str]]:
    """Per topic: the replicas of each partition, and its min.insync.replicas."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        topics = {t["name"]: t for t in admin.describe_topics(names)}
        # "all": the value in effect, inherited from the broker's defaults or the topic's own
        cfgs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names],
                                      config_filter="all")["topic"]
        return {n: ([sorted(p["replica_nodes"]) for p in topics[n]["partitions"]],
                    cfgs[n]["min.insync.replicas"]["value"]) for n in names}
    finally:
        admin.close()


def _round_trip(bootstrap: str, topic: str, job: str, text: str) -> list[str]:
    """A transactional write with a group's offset commit, read back read_committed."""
    p = Producer(bootstrap, client_id="tx", transactional_id=f"{job}-tx")
    try:
        with p.transaction():
            p.send(topic, Prompt(text, text, "1"))
    finally:
        p.close()
    c = Consumer(bootstrap, topics=[topic], group_id=f"{job}-reader")
    try:
        got: list[str] = []
        for _ in range(20):
            got += [d.message.prompt_id for d in c.poll(1000)]
            if text in got:
                break
        c.commit()
        return got
    finally:
        c.close()


def test_job_topics_and_internal_topics_have_three_replicas(cluster):
    topics = JobTopics(job="c" + uuid.uuid4().hex[:8])
    ensure_topics(cluster.bootstrap_servers, topics.specs())
    assert _round_trip(cluster.bootstrap_servers, topics.prompts, topics.job, "first") == ["first"]
    described = _describe(cluster.bootstrap_servers,
                          [s.name for s in topics.specs()] + ["__consumer_offsets", "__transaction_state"])
    for name, (replicas, min_isr) in described.items():
        assert all(r == [1, 2, 3] for r in replicas), (name, replicas)
        assert min_isr == "2", name  # one copy may be missing and acks=all still succeeds


def _coordinator(bootstrap: str, group: str) -> int:
    """The broker coordinating ``group``: the leader of its ``__consumer_offsets`` partition,
    chosen by Kafka as abs(Java hashCode of the group id) mod the partition count."""
    h = 0
    for ch in group:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        partitions = admin.describe_topics(["__consumer_offsets"])[0]["partitions"]
    finally:
        admin.close()
    index = (0 if h == -(1 << 31) else abs(h)) % len(partitions)
    return next(p["leader_id"] for p in partitions if p["partition_index"] == index)


def test_a_sigkilled_coordinator_loses_and_duplicates_nothing(cluster):
    """Long-lived clients, as an actor holds them, across the death of their group's coordinator."""
    topics = JobTopics(job="k" + uuid.uuid4().hex[:8])
    ensure_topics(cluster.bootstrap_servers, topics.specs())
    bootstrap, group, tid = cluster.bootstrap_servers, f"{topics.job}-raas", f"{topics.job}-tx"
    tasks = Producer(bootstrap, client_id="scheduler")

    def member():  # what an actor's setup builds (and its supervisor rebuilds after a failure)
        return (Producer(bootstrap, client_id="node", transactional_id=tid),
                Consumer(bootstrap, topics=[topics.tasks("policy")], group_id=group, client_id="node"))

    def answer(producer, consumer, want: str) -> bool:
        """Consume-transform-produce until ``want`` is answered; False if the producer gave up."""
        for _ in range(60):
            got = consumer.poll(500)
            if not got:
                continue
            try:
                with producer.transaction():
                    for d in got:
                        producer.send(topics.trajectories, Prompt("out-" + d.message.prompt_id, "y", "1"), key=d.key)
                    producer.send_offsets(consumer)
            except ProduceError:
                return False
            if want in [d.message.prompt_id for d in got]:
                return True
        raise AssertionError(f"task {want} never arrived")

    producer, consumer = member()
    victim = None
    try:
        for i in range(6):
            if i == 2:
                victim = _coordinator(bootstrap, group)  # it also leads partitions of the job's topics
                cluster.kill(victim)
            tasks.send_sync(topics.tasks("policy"), Prompt(f"t{i}", "x", "1"), key=f"t{i}")
            while not answer(producer, consumer, f"t{i}"):
                # the supervisor's answer: new clients; the transactional id fences the old
                # producer and aborts its transaction, the group redelivers uncommitted tasks
                producer.close(timeout=0)
                consumer.close()
                producer, consumer = member()
        reader = Consumer(bootstrap, topics=[topics.trajectories], group_id=f"{topics.job}-audit")
        out: list[str] = []
        for _ in range(20):
            out += [d.message.prompt_id for d in reader.poll(1000)]
            if len(out) >= 6:
                break
        reader.close()
        assert sorted(out) == [f"out-t{i}" for i in range(6)]  # each task answered exactly once
    finally:
        producer.close(timeout=0)
        consumer.close()
        tasks.close()
        if victim is not None:
            cluster.restart(victim)
