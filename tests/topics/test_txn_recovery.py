"""kafka-python's transactional requests are retried, not dropped or fatal (``topics/txn_recovery.py``).

The coordinator-loss half (a dead coordinator's broker, on the 3-node cluster) is
``test_cluster.py::test_a_transaction_follows_its_coordinator_to_a_new_broker``. Here, on
the session's broker: a transactional request that times out on the client (the broker
stopped, not dead) is retried once the broker answers again, and the transaction commits
with the same producer; and the patch is installed only over the kafka-python it was
written for.
"""

from __future__ import annotations

import os
import signal
import threading

import kafka
import pytest
from kafka import TopicPartition
from kafka.producer import sender, transaction_manager

from astraflow.topics import Prompt, StaleMembershipError, txn_recovery

PAUSE_S = 5.0  #: the broker stays stopped this long: past the producer's request timeout, inside every session
REQUEST_TIMEOUT_MS = 1500


def test_importing_topics_installs_the_fix():
    assert txn_recovery.installed()
    assert sender.Sender.__init__.__qualname__ == "astraflow_sender_init"
    assert transaction_manager.TxnRequestHandler.on_complete.__qualname__ == "astraflow_txn_on_complete"


def test_it_installs_only_over_the_kafka_python_it_was_written_for(monkeypatch):
    txn_recovery.uninstall()
    try:
        assert sender.Sender.__init__.__qualname__ == "Sender.__init__"
        monkeypatch.setattr(kafka, "__version__", "9.9.9")
        assert txn_recovery.install() is False and not txn_recovery.installed()
        monkeypatch.undo()
        monkeypatch.setenv("ASTRAFLOW_KAFKA_STOCK_TXN", "1")
        assert txn_recovery.install() is False and not txn_recovery.installed()
        monkeypatch.undo()
    finally:
        assert txn_recovery.install() and txn_recovery.installed()


def test_a_timed_out_transactional_request_is_retried_and_the_transaction_commits(
        kafka_broker, bootstrap, job_topics, make_producer, make_consumer):
    """The broker stops (SIGSTOP) just before a node commits its offsets inside its
    transaction: ``AddOffsetsToTxn``/``TxnOffsetCommit`` time out on the client after
    ``request_timeout_ms``. kafka-python 3.0.12 makes that a fatal producer error; with
    the fix it is retried like a disconnect and commits once the broker runs again."""
    if kafka_broker is None:
        pytest.skip("stops the embedded broker; ASTRAFLOW_TEST_BOOTSTRAP names a cluster this test must not stop")
    tasks_topic = job_topics.tasks("policy")
    group = f"{job_topics.job}-raas"
    tasks = make_producer(client_id="scheduler")
    producer = make_producer(client_id="node", transactional_id=f"{job_topics.job}-tx",
                             request_timeout_ms=REQUEST_TIMEOUT_MS)
    consumer = make_consumer(topics=[tasks_topic], group_id=group, client_id="node")

    def poll_for(want: str):
        got = []
        for _ in range(60):
            got += consumer.poll(500)
            if want in [d.message.prompt_id for d in got]:
                return got
        raise AssertionError(f"task {want} never arrived")

    tasks.send_sync(tasks_topic, Prompt("t0", "x", "1"), key="t0")
    got = poll_for("t0")
    with producer.transaction():  # coordinators found and connected
        producer.send(job_topics.trajectories, Prompt("out-t0", "y", "1"), key="t0")
        producer.send_offsets(consumer)
    tasks.send_sync(tasks_topic, Prompt("t1", "x", "1"), key="t1")
    got = poll_for("t1")
    resume = threading.Timer(PAUSE_S, os.kill, (kafka_broker.pid, signal.SIGCONT))
    try:
        with producer.transaction():
            producer.send(job_topics.trajectories, Prompt("out-t1", "y", "1"), key="t1")
            producer.flush()
            os.kill(kafka_broker.pid, signal.SIGSTOP)
            resume.start()
            producer.send_offsets(consumer)  # stock kafka-python: KafkaError "... for unknown reasons"
    finally:
        resume.cancel()
        os.kill(kafka_broker.pid, signal.SIGCONT)
    assert not producer._kp._transaction_manager.has_error()
    reader = make_consumer(topics=[job_topics.trajectories], group_id=f"{job_topics.job}-audit")
    out = []
    for _ in range(20):
        out += [d.message.prompt_id for d in reader.poll(1000)]
        if len(out) >= 2:
            break
    assert sorted(out) == ["out-t0", "out-t1"]
    partitions = [TopicPartition(tasks_topic, p) for p in range(job_topics.task_partitions)]
    assert sum(consumer.committed(tp) or 0 for tp in partitions) == 2  # t1's offset in the transaction


def test_a_membership_the_coordinator_refuses_is_stale_membership_not_a_failed_producer(
        job_topics, make_producer, make_consumer, expel_silently):
    """The coordinator dropped the member before the client noticed (its session expired while
    the coordinator moved): the broker refuses the transactional commit (UNKNOWN_MEMBER_ID),
    kafka-python raises CommitFailedError. That is :class:`StaleMembershipError`, as the
    client-side check raises it: the transaction aborts and the same producer goes on (a RaaS
    node counts fenced tasks instead of its actor failing and restarting)."""
    src, group = job_topics.tasks("policy"), f"{job_topics.job}-raas"
    make_producer().send(src, Prompt("t0", "x", "1"), partition=0).get(10)
    node = make_consumer(topics=[src], group_id=group, client_id="node", session_timeout_ms=6000)
    got = []
    for _ in range(20):
        got += node.poll(500)
        if got:
            break
    assert [d.message.prompt_id for d in got] == ["t0"]
    expel_silently(node, group)  # the broker dropped it; the client still says stable, same generation
    producer = make_producer(client_id="node", transactional_id=f"{job_topics.job}-tx")
    with pytest.raises(StaleMembershipError, match="refused the offsets"):
        with producer.transaction():
            producer.send(job_topics.trajectories, Prompt("out-t0", "y", "1"), key="t0")
            producer.send_offsets(node)
    with producer.transaction():  # aborted, not fatal: the producer keeps working
        producer.send(job_topics.trajectories, Prompt("other", "y", "1"), key="other")
    assert node.committed(TopicPartition(src, 0)) in (None, -1)
    assert node.group_metadata().generation_id < 0  # told it is out: its next poll rejoins
    redone = []
    for _ in range(40):  # rejoined, it is handed the uncommitted task again
        redone += node.poll(500)
        if redone:
            break
    assert [d.message.prompt_id for d in redone] == ["t0"]
    with producer.transaction():
        producer.send(job_topics.trajectories, Prompt("out-t0", "y", "1"), key="t0")
        producer.send_offsets(node)
    assert node.committed(TopicPartition(src, 0)) == 1
