"""A secured 3-node embedded cluster: SASL_SSL (SCRAM-SHA-512) between clients and brokers and
between brokers, mutual TLS between the controllers, ACLs enforced on every node; losing one
broker leaves the principals' clients working under the same ACLs."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import TopicPartition

from astraflow.topics import Consumer, EmbeddedCluster, JobTopics, Producer, ensure_topics, security
from astraflow.topics.acls import apply, plan
from astraflow.topics.messages import Metric
from astraflow.topics.secured import SecureSetup, add_users

pytestmark = pytest.mark.slow  # three TLS broker JVMs


def _values(consumer: Consumer, n: int) -> list[float]:
    got: list[float] = []
    for _ in range(120):
        got += [d.message.value for d in consumer.poll(timeout_ms=500)]
        if len(got) >= n:
            break
    return got


def _wait_for_new_leader(bootstrap: str, sup, topic: str, dead: int, timeout_s: float = 120.0) -> None:
    """Until a live broker leads ``topic`` (the controller fences the dead one after its session
    timeout; on a loaded machine that is what takes time, not the clients)."""
    admin = security.admin(bootstrap_servers=bootstrap, client_id="sc-watch", security=sup)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                (t,) = admin.describe_topics([topic])
                if t["partitions"][0]["leader_id"] not in (dead, -1):
                    return
            except Exception:  # the dead node was the one asked: ask again
                pass
            assert time.monotonic() < deadline, f"no new leader of {topic} within {timeout_s:.0f} s"
            time.sleep(0.5)
    finally:
        admin.close()


def test_a_secured_cluster_keeps_its_principals_working_under_their_acls_across_a_broker_loss(tmp_path):
    setup = SecureSetup.create(tmp_path / "secure")
    cluster = EmbeddedCluster(tmp_path / "data", nodes=3, heap="384m", startup_timeout=300, secure=setup)
    clients: list = []
    try:
        cluster.start()
        bootstrap = cluster.bootstrap_servers
        sup = setup.client_security()
        security.install(sup)
        topics = JobTopics(job="sc" + uuid.uuid4().hex[:8], policies=("p",), task_partitions=1,
                           trajectory_partitions=1)
        ensure_topics(bootstrap, topics.specs())
        admin = security.admin(bootstrap_servers=bootstrap, client_id="sc-admin")
        try:
            (weights,) = admin.describe_topics([topics.weights("p")])
        finally:
            admin.close()
        (partition,) = weights["partitions"]
        assert sorted(partition["replica_nodes"]) == [1, 2, 3]
        users = {"trainer": "sc-trainer", "raas": "sc-raas"}
        passwords = {u: uuid.uuid4().hex for u in users.values()}
        add_users(bootstrap, passwords)
        apply(bootstrap, plan(topics, users))

        def as_role(role: str) -> None:
            security.install(security.with_credentials(sup, users[role], passwords[users[role]]))

        as_role("trainer")  # long-lived clients, as the publisher and a RaaS node hold them
        producer = Producer(bootstrap, client_id="sc-trainer")
        clients.append(producer)
        as_role("raas")
        reader = Consumer(bootstrap, partitions=[TopicPartition(topics.weights("p"), 0)], client_id="sc-raas")
        clients.append(reader)
        for i in range(3):
            producer.send_sync(topics.weights("p"), Metric(component="trainer", name="w", value=float(i)))
        assert _values(reader, 3) == [0.0, 1.0, 2.0]
        with Producer(bootstrap, client_id="sc-raas-w") as p:  # the ACLs hold on the cluster
            with pytest.raises(Exception) as refused:
                p.send_sync(topics.weights("p"), Metric(component="raas", name="w", value=9.0))
            assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}"

        cluster.kill(partition["leader_id"])  # the broker leading the weights partition
        _wait_for_new_leader(bootstrap, sup, topics.weights("p"), partition["leader_id"])
        for i in range(3, 6):
            producer.send_sync(topics.weights("p"), Metric(component="trainer", name="w", value=float(i)))
        assert _values(reader, 3) == [3.0, 4.0, 5.0]
        with Producer(bootstrap, client_id="sc-raas-w2") as p:  # a new client, still refused
            with pytest.raises(Exception) as refused:
                p.send_sync(topics.versions, Metric(component="raas", name="v", value=9.0), key="p")
            assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}"
        security.install(security.ClientSecurity())
        with pytest.raises(security.KafkaAuthError, match="the listener wants TLS"):
            Producer(bootstrap, client_id="sc-plain")
    finally:
        for c in clients:
            c.close()
        security.uninstall()
        cluster.close()
