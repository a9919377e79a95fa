"""A local 3-node KRaft cluster: everything replicated, and one SIGKILLed broker stops nothing."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from astraflow.topics import Consumer, EmbeddedCluster, JobTopics, Producer, Prompt, ensure_topics

pytestmark = pytest.mark.slow  # three broker JVMs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = EmbeddedCluster(tmp_path_factory.mktemp("cluster"), nodes=3, heap="384m").start()
    try:
        yield c
    finally:
        c.stop()


def _describe(bootstrap: str, names: list[str]) -> dict[str, tuple[list[list[int]], list[int], str]]:
    """Per topic: replicas and leaders of its partitions, and its min.insync.replicas."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        topics = {t["name"]: t for t in admin.describe_topics(names)}
        # "all": the value in effect, inherited from the broker's defaults or the topic's own
        cfgs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names],
                                      config_filter="all")["topic"]
        return {n: ([sorted(p["replica_nodes"]) for p in topics[n]["partitions"]],
                    [p["leader_id"] for p in topics[n]["partitions"]], cfgs[n]["min.insync.replicas"]["value"])
                for n in names}
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
    for name, (replicas, _, min_isr) in described.items():
        assert all(r == [1, 2, 3] for r in replicas), (name, replicas)
        assert min_isr == "2", name  # one copy may be missing and acks=all still succeeds


def test_a_sigkilled_broker_stops_nothing(cluster):
    topics = JobTopics(job="k" + uuid.uuid4().hex[:8])
    ensure_topics(cluster.bootstrap_servers, topics.specs())
    _, leaders, _ = _describe(cluster.bootstrap_servers, [topics.prompts])[topics.prompts]
    victim = leaders[0]
    cluster.kill(victim)
    try:
        # the leader of the partition written next is gone: a new leader takes writes,
        # transactions and group commits, with acks=all on the two copies left
        assert _round_trip(cluster.bootstrap_servers, topics.prompts, topics.job, "after-kill") == ["after-kill"]
        _, leaders, _ = _describe(cluster.bootstrap_servers, [topics.prompts])[topics.prompts]
        assert leaders[0] not in (victim, -1)
        tp = TopicPartition(topics.prompts, 0)
        probe = Consumer(cluster.bootstrap_servers, partitions=[tp])
        assert probe.raw.end_offsets([tp])[tp] == 2  # the record and its commit marker
        probe.close()
    finally:
        cluster.restart(victim)
