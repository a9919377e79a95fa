"""A job on a 3-node Kafka cluster survives one broker SIGKILLed mid-run, with nothing lost."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaAdminClient, TopicPartition

from astraflow.chaos.invariants import audit
from astraflow.launcher import run_job
from astraflow.topics import Consumer, EmbeddedCluster, Metric, job_topics

pytestmark = pytest.mark.slow


def _leader(bootstrap: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_topics([topic])[0]["partitions"][0]["leader_id"]
    finally:
        admin.close()


def _replicas(bootstrap: str, topics: list[str]) -> dict[str, set[int]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {t["name"]: {len(p["replica_nodes"]) for p in t["partitions"]} for t in admin.describe_topics(topics)}
    finally:
        admin.close()


def _kill_when(cluster: EmbeddedCluster, topics, policy: str, step: int, killed: dict, done: threading.Event):
    """Once the trainer has trained ``step`` versions, SIGKILL the broker leading ``batches``."""
    metrics = Consumer(cluster.bootstrap_servers, partitions=[TopicPartition(topics.metrics, 0)],
                       client_id="broker-killer")
    try:
        while not done.is_set():
            for d in metrics.poll(500):
                m = d.message
                if isinstance(m, Metric) and m.name == "trainer.samples" and m.step >= step:
                    # the leader of the ordered record of training: the dataflow's transactions
                    # and the trainer's reads both have to move to a new leader
                    victim = _leader(cluster.bootstrap_servers, topics.batches(policy))
                    cluster.kill(victim)
                    killed.update(node=victim, at_step=m.step)
                    return
    finally:
        metrics.close()


@pytest.mark.timeout(1200)  # three brokers and four component processes on two cores
def test_a_job_survives_a_sigkilled_broker(make_job_config, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 6}}, name="broker-loss")
    topics = job_topics(cfg)
    killed: dict = {}
    done = threading.Event()
    with EmbeddedCluster(tmp_path / "kafka", nodes=3, heap="384m") as cluster:
        killer = threading.Thread(target=_kill_when, args=(cluster, topics, cfg.policy, 2, killed, done), daemon=True)
        killer.start()
        try:
            summary = run_job(cfg, bootstrap=cluster.bootstrap_servers, run_dir=tmp_path / "run", progress=False,
                              timeout_s=900)
        finally:
            done.set()
            killer.join(30)
        assert killed, "the run ended before a broker was killed"
        assert killed["at_step"] < cfg.trainer.steps  # the kill was mid-run
        assert cluster.node(killed["node"]).pid is None  # and the broker stayed dead to the end
        print(f"\nbroker {killed['node']} SIGKILLed after version {killed['at_step']}; the run finished "
              f"{summary['steps_trained']} versions in {summary['wall_s']:.0f}s, restarts {summary['restarts']}")
        assert summary["steps_trained"] == cfg.trainer.steps and not summary["error"]
        report = audit(cluster.bootstrap_servers, topics, cfg.policy, cfg.effective_staleness)
        assert report.ok, report.violations[:10]
        assert report.batches == cfg.trainer.steps
        # every job topic and the internal ones had a copy on each broker, so none was lost
        names = [s.name for s in topics.specs()] + ["__consumer_offsets", "__transaction_state"]
        assert set().union(*_replicas(cluster.bootstrap_servers, names).values()) == {3}
