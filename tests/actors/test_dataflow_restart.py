"""The dataflow restarts from one state record and schedules exactly what the log owes.

The dataflow actor runs in the test's thread (``setup`` / ``step`` / ``teardown``, the
calls its pykka loop makes) against the real broker; the test plays the RaaS node and
the trainer by writing their records (trajectory groups, version announcements), so
failures, stale groups and restarts land exactly where the scenario needs them.
"""

from __future__ import annotations

import uuid

import pytest

from astraflow.actors.dataflow import DataflowActor
from astraflow.actors.ledger import read_state
from astraflow.chaos.invariants import audit
from astraflow.topics import Batch, Producer, job_topics
from astraflow.topics.messages import DataflowState
from astraflow.topics.replay import read_topic

from .conftest import B, STEPS, Peers, drive, start_dataflow


def test_restart_after_drops_schedules_exactly_what_the_log_owes(cfg, bootstrap):
    peers = Peers(cfg, bootstrap)
    actor = start_dataflow(cfg, bootstrap)
    try:
        assert actor.state_records_read == 0  # a new job: nothing to resume
        drive(actor, lambda: len(peers.tasks()) == 4, "4 tasks (version 0, staleness 1, B 2)")
        t = peers.tasks()
        # t2 waits behind batch 0 while the failed t3 after it is dropped: the committed
        # offset stays at t2, so a restart re-reads t3, which must not free a slot twice.
        for tid, ok in ((t[0], True), (t[1], True), (t[2], True), (t[3], False)):
            peers.answer(tid, ok=ok)
        drive(actor, lambda: actor.lead.ledger.next_step == 1 and len(peers.tasks()) == 5,
              "batch 0 and one task replacing the failed one")
        actor.teardown()

        actor = start_dataflow(cfg, bootstrap)
        assert actor.state_records_read == 1
        assert (actor.lead.ledger.next_step, actor.lead.ledger.tasks_scheduled, actor.lead.ledger.dropped) == (1, 5, 1)
        t = peers.tasks()
        drive(actor, lambda: [d.message.task_id for d in actor.lead.partial] == [t[2]], "t2 re-read")
        for _ in range(3):  # each step schedules first: a double count would schedule here
            actor.step()
        assert len(peers.tasks()) == 5

        peers.announce(1)  # trainer at version 1: room for 2 more (bound (1 + 1 + 1) * 2 + 1)
        drive(actor, lambda: len(peers.tasks()) == 7, "7 tasks after version 1")
        t = peers.tasks()
        peers.answer(t[4], partition=1)
        drive(actor, lambda: actor.lead.ledger.next_step == 2, "batch 1")
        peers.answer(t[5], partition=1, version=0)  # at step 2 a version-0 token is 2 > 1 stale
        drive(actor, lambda: len(peers.tasks()) == 8, "a task replacing the stale group")
        actor.teardown()

        actor = start_dataflow(cfg, bootstrap)
        assert actor.state_records_read == 1
        assert (actor.lead.ledger.next_step, actor.lead.ledger.tasks_scheduled, actor.lead.ledger.dropped) == (2, 8, 2)
        t = peers.tasks()
        peers.answer(t[6], partition=0, version=1)
        peers.answer(t[7], partition=1, version=1)
        drive(actor, lambda: actor.lead.ledger.next_step == STEPS, "the last batch")
        for _ in range(3):
            actor.step()
    finally:
        actor.teardown()
        peers.close()

    topics = job_topics(cfg)
    assert len(peers.tasks()) == STEPS * B + 2  # exactly: the horizon plus one task per freed slot
    report = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations
    assert report.batches == STEPS and report.drops == {"failed": 1, "stale": 1}


def test_a_duplicate_group_is_recorded_and_frees_nothing(cfg, bootstrap):
    """A second answer to a task is dropped as a duplicate; another policy's group is not ours."""
    peers = Peers(cfg, bootstrap)
    actor = start_dataflow(cfg, bootstrap)
    try:
        drive(actor, lambda: len(peers.tasks()) == 4, "4 tasks")
        t = peers.tasks()
        peers.answer(t[0])
        peers.answer(t[0], partition=1)  # a second answer while the first waits for its batch
        peers.answer(t[2], policy="verifier")  # the verifier's dataflow settles this one
        peers.answer(t[1])
        drive(actor, lambda: actor.lead.ledger.next_step == 1 and len(peers.drops()) == 1, "batch 0 and a drop")
        for _ in range(3):
            actor.step()
    finally:
        actor.teardown()
        peers.close()
    assert len(peers.tasks()) == 4
    assert [(d.task_id, d.reason) for d in peers.drops()] == [(t[0], "duplicate")]
    (batch,) = [m for _, _, m in read_topic(bootstrap, job_topics(cfg).batches(cfg.policy))]
    assert sorted(g.task_id for g in batch.groups) == [t[0], t[1]]
    report = audit(bootstrap, job_topics(cfg), cfg.policy, cfg.effective_staleness)
    assert report.drops == {"duplicate": 1}
    # the duplicate is settled by its drop record; what stays wrong is the task with two
    # results, and the tasks nobody answered yet
    assert f"task {t[0]} has 2 committed trajectory groups" in report.violations
    assert not [v for v in report.violations if "settled" in v or "neither" in v]


def test_restart_reads_one_state_record_however_long_the_history(bootstrap, job_topics):
    topic = job_topics.dataflow_state("policy")
    assert read_state(bootstrap, topic, "policy") == (None, 0)
    producer = Producer(bootstrap, client_id="state-test", transactional_id=f"state-test-{uuid.uuid4().hex}")
    try:
        for i in range(40):
            with producer.transaction():
                producer.send(topic, DataflowState("policy", i, 2 * i, i), key="policy")
        assert read_state(bootstrap, topic, "policy") == (DataflowState("policy", 39, 78, 39), 1)
        # an aborted transaction at the tail widens the window, it does not restart the scan
        with pytest.raises(RuntimeError):
            with producer.transaction():
                producer.send(topic, DataflowState("policy", 99, 99, 99), key="policy")
                producer.flush()
                raise RuntimeError("crash before commit")
        state, read = read_state(bootstrap, topic, "policy")
        assert state == DataflowState("policy", 39, 78, 39) and read <= 2
    finally:
        producer.close()


def test_a_job_with_batches_but_no_state_is_refused(cfg, bootstrap):
    producer = Producer(bootstrap, client_id="old-job")
    try:
        producer.send_sync(job_topics(cfg).batches(cfg.policy), Batch(cfg.policy, 0, [], []), key="0")
    finally:
        producer.close()
    actor = DataflowActor(None, "dataflow", cfg, bootstrap)
    try:
        with pytest.raises(RuntimeError, match="has no dataflow state"):
            actor.setup()
    finally:
        actor.teardown()
