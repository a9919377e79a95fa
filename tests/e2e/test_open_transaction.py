"""A RaaS node SIGKILLed inside an open transaction, never to return: its open records block
``read_committed`` readers of ``trajectories`` (the last stable offset stops) only until the
broker aborts the transaction at ``kafka.transaction_timeout_ms``; the run then completes and
the conservation audit holds. The stall is measured and printed, not asserted on.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from astraflow.chaos.harness import JobHarness
from astraflow.chaos.hooks import HANG_IN_TXN, HANG_MARK
from astraflow.topics import ensure_topics, job_topics

pytestmark = pytest.mark.slow

TIMEOUT_MS = 10_000  # short, so the test is; the default is 30 s


def _describe(bootstrap: str, transactional_id: str):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_transactions([transactional_id])[transactional_id]
    finally:
        admin.close()


def _end_offsets(bootstrap: str, tps: list[TopicPartition], isolation: str) -> dict[TopicPartition, int]:
    """read_committed: the last stable offset (what readers can reach); read_uncommitted: the high watermark."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        return c.end_offsets(tps)
    finally:
        c.close()


def _wait(predicate, timeout: float, what: str, h: JobHarness):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} not seen within {timeout:.0f}s; logs in {h.run_dir / 'logs'}")


def test_open_transaction_of_a_killed_node_stops_blocking_readers(make_job_config, bootstrap, tmp_path, monkeypatch):
    cfg = make_job_config({"kafka": {"transaction_timeout_ms": TIMEOUT_MS}}, name="chaos-txn")
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    monkeypatch.setenv(HANG_IN_TXN, "raas-0")  # inherited by every node; only raas-0 answers to it
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    tid = topics.rollout_transactional_id(cfg.policy, "raas-0")
    # raas-0 alone first: it owns every task partition, so its first transaction is
    # certain to open (with two nodes, raas-1 could drain the job before raas-0 joins).
    for role, node in (("dataflow", "dataflow"), ("trainer", "trainer"), ("raas", "raas-0")):
        h.start(role, node)
    try:
        log = h.procs["raas-0"].log_path
        _wait(lambda: log.exists() and HANG_MARK in log.read_text(errors="replace"), 300, "raas-0 hanging", h)
        h.start("raas", "raas-1")

        def open_on_trajectories():
            txn = _describe(bootstrap, tid)
            tps = [tp for tp in txn.topic_partitions if tp.topic == topics.trajectories]
            if txn.state != "Ongoing" or not tps:
                return None
            lso = _end_offsets(bootstrap, tps, "read_committed")
            hw = _end_offsets(bootstrap, tps, "read_uncommitted")
            return (txn, lso) if all(hw[tp] > lso[tp] for tp in tps) else None
        txn, stuck = _wait(open_on_trajectories, 60, "raas-0's open records on trajectories", h)
        # the broker holds the configured bound, not kafka-python's 60 s default
        assert txn.transaction_timeout_ms == TIMEOUT_MS

        h.kill("raas-0")  # it never comes back: nobody will fence or finish its transaction
        killed_at = time.time()
        released = _wait(lambda: (lambda lso: lso if all(lso[tp] > stuck[tp] for tp in stuck) else None)(
            _end_offsets(bootstrap, list(stuck), "read_committed")), 300, "the last stable offset moving", h)
        released_at = time.time()
        # the broker aborted it on its own (timed out), so its records stay invisible
        assert _describe(bootstrap, tid).state in ("PrepareAbort", "CompleteAbort")
        stall = released_at - txn.transaction_start_time_ms / 1000
        print(f"\nread_committed readers of {topics.trajectories} stalled {stall:.1f}s on "
              f"{sorted(tp.partition for tp in stuck)} (open transaction of killed raas-0; "
              f"{released_at - killed_at:.1f}s after the kill; transaction_timeout_ms={TIMEOUT_MS}, "
              f"LSO {dict((tp.partition, o) for tp, o in stuck.items())} -> "
              f"{dict((tp.partition, o) for tp, o in released.items())})")

        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        # scheduling stops at the training horizon; raas-1 answers every task there is,
        # raas-0's aborted ones included
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    assert report.ok, report.violations[:10]
    assert report.batches == cfg.trainer.steps
