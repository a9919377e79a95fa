"""A RaaS node that fell out of its consumer group must not commit the tasks it holds.

After a broker restart (or a long pause) a member's session can expire: the group
rebalances, another node gets the partition, fetches the committed offset and redoes the
task. kafka-python, once it learns it was removed, resets itself to generation -1, and the
broker accepts a transactional offset commit that names no generation. Without the
client-side check the old holder commits too, and the task is answered twice.
"""

import time

import pytest
from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from astraflow.topics import Prompt, StaleMembershipError

from .samples import GROUP


def _drain(consumer, want: int, polls: int = 8):
    got = []
    for _ in range(polls):
        got.extend(consumer.poll(1500))
        if len(got) >= want:
            break
    return got


def _tasks_on_partition_0(job_topics, make_producer, n: int) -> tuple[str, TopicPartition]:
    """``n`` tasks t0, t1, ... on partition 0 of the tasks topic."""
    src = job_topics.tasks("policy")
    feeder = make_producer()
    for i in range(n):
        feeder.send(src, Prompt(f"t{i}", "x", "y"), partition=0)
    feeder.flush()
    return src, TopicPartition(src, 0)


def test_a_member_that_fell_out_cannot_commit_what_the_new_owner_redoes(job_topics, make_producer,
                                                                          make_consumer):
    src, dst = job_topics.tasks("policy"), job_topics.trajectories
    feeder = make_producer()
    feeder.send(src, Prompt("t0", "x", "y"), partition=0)
    feeder.flush()
    tp = TopicPartition(src, 0)

    a = make_consumer(topics=[src], group_id="fence", client_id="node-a")
    assert [d.message.prompt_id for d in _drain(a, 1)] == ["t0"]
    # What kafka-python does when its heartbeat learns the member was removed: generation -1.
    a.raw._coordinator.maybe_leave_group()
    assert a.group_metadata().generation_id < 0

    b = make_consumer(topics=[src], group_id="fence", client_id="node-b")
    assert [d.message.prompt_id for d in _drain(b, 1)] == ["t0"]  # the new owner redoes it

    late = make_producer(transactional_id=f"{job_topics.job}-node-a")
    with pytest.raises(StaleMembershipError, match="membership changed"):
        with late.transaction():
            late.send(dst, GROUP, key="t0")
            late.send_offsets(a)
    assert b.committed(tp) in (None, -1)  # nothing of node-a's was committed
    assert a.pending_offsets() == {tp: 1}  # still pending: a later poll voids it after the rejoin

    owner = make_producer(transactional_id=f"{job_topics.job}-node-b")
    with owner.transaction():
        owner.send(dst, GROUP, key="t0")
        owner.send_offsets(b)
    assert b.committed(tp) == 1
    out = make_consumer(topics=[dst], group_id="fence-out")
    assert len(_drain(out, 2, polls=4)) == 1  # one answer for the task

    # Why the check is ours to make: the broker takes a transactional commit under generation -1.
    raw = make_producer(transactional_id=f"{job_topics.job}-raw")
    with raw.transaction():
        raw._kp.send_offsets_to_transaction({tp: OffsetAndMetadata(0, "", -1)}, a.group_metadata())
    assert b.committed(tp) == 0


def test_a_rejoined_member_drops_pending_offsets_of_its_old_generation(job_topics, make_producer, make_consumer):
    src, tp = _tasks_on_partition_0(job_topics, make_producer, 2)
    a = make_consumer(topics=[src], group_id="rejoin", client_id="node-a", max_poll_records=1)
    assert [d.message.prompt_id for d in _drain(a, 1)] == ["t0"]
    a.raw._coordinator.maybe_leave_group()
    again = _drain(a, 2)  # rejoins, restarts from the committed offset (none: the beginning)
    assert [d.message.prompt_id for d in again][:1] == ["t0"]
    assert a.group_metadata().generation_id >= 0
    p = make_producer(transactional_id=f"{job_topics.job}-rejoin")
    with p.transaction():
        p.send_offsets(a)  # what this generation handed out, nothing older
    assert a.committed(tp) == len(again)


def test_a_consumer_reports_how_long_it_has_been_outside_its_group(job_topics, make_consumer):
    """The signal a RaaS node's watchdog acts on (actors/rollout.py: _rejoin_if_stuck)."""
    import time

    c = make_consumer(topics=[job_topics.tasks("policy")], group_id="outside", client_id="node-o")
    time.sleep(0.2)
    assert c.seconds_outside_group() >= 0.2  # created, never joined: counts from creation
    for _ in range(20):
        c.poll(500)
        if c.group_metadata().generation_id >= 0:
            break
    assert c.group_metadata().generation_id >= 0 and c.seconds_outside_group() == 0.0
    # A consumer with manual assignment has no group to be outside of.
    manual = make_consumer(partitions=[TopicPartition(job_topics.tasks("policy"), 0)], group_id=None)
    assert manual.seconds_outside_group() == 0.0


def test_a_plain_commit_after_falling_out_is_stale_membership_and_forgets_the_void_offsets(
        job_topics, make_producer, make_consumer):
    """The synchronous commit (generation servers, a node moving past dead letters) fences like
    the transactional one: StaleMembershipError, not kafka-python's CommitFailedError, and the
    void offsets are dropped, so the next commit does not try them again."""
    src = job_topics.tasks("policy")
    make_producer().send(src, Prompt("t0", "x", "y"), partition=0).get(10)
    tp = TopicPartition(src, 0)
    a = make_consumer(topics=[src], group_id="fence-sync", client_id="node-a")
    assert [d.message.prompt_id for d in _drain(a, 1)] == ["t0"]
    a.raw._coordinator.maybe_leave_group()  # what a poll-interval expiry makes kafka-python do
    with pytest.raises(StaleMembershipError, match="membership changed"):
        a.commit()
    assert a.pending_offsets() == {}
    a.commit()  # nothing left to commit: no error
    b = make_consumer(topics=[src], group_id="fence-sync", client_id="node-b")
    assert [d.message.prompt_id for d in _drain(b, 1)] == ["t0"]  # the new owner redoes it
    b.commit()
    assert b.committed(tp) == 1


def test_records_of_a_lost_membership_are_handed_out_again_when_the_member_keeps_the_partition(
        job_topics, make_producer, make_consumer):
    """The stall seen under load: a RaaS node's commit was refused after the group rebalanced,
    and the node kept its partitions; kafka-python keeps a kept partition's fetch position, so
    the node went on past the tasks it never committed and nobody ever redid them. The records
    of the lost membership must come again to the member that still holds them.

    The rebalance is the member's own rejoin (what kafka-python does when the coordinator asks it
    to): alone in its group it keeps every partition, with no second member whose timing under
    load decides who ends up holding what."""
    src, tp = _tasks_on_partition_0(job_topics, make_producer, 3)

    def rebalanced_once_more(redo: bool) -> tuple[list[str], object]:
        a = make_consumer(topics=[src], group_id=f"keep-{redo}", client_id="node-a", max_poll_records=1,
                          redo_lost=redo)
        assert [d.message.prompt_id for d in _drain(a, 1)] == ["t0"]  # handed out, not committed
        before = a.group_metadata().generation_id
        assert before >= 0
        a.raw._coordinator.request_rejoin()  # a new generation; a keeps partition 0 and its position
        # got: what the current generation handed out (an older one's records are void: the list
        # starts over); since: everything handed out after the rejoin was asked for (a record
        # buffered before the rejoin completed may come under the old generation)
        got, since, gen, committed, polls_in_gen = [], [], None, False, 0
        deadline = time.monotonic() + 150  # (under CI's load kafka-python's event loop stalled 2-3 s at a time)
        while time.monotonic() < deadline:
            records = a.poll(300)
            now = a.group_metadata().generation_id
            if now != gen:
                got, gen, polls_in_gen = [], now, 0
            polls_in_gen += 1
            got.extend(d.message.prompt_id for d in records)
            since.extend(d.message.prompt_id for d in records)
            # commit once the generation has held for a poll after the one that handed the last
            # record out: a commit sent while the join of the generation is still settling is
            # refused, and each refusal asks for another rejoin (Consumer.commit)
            if now > before and a.seconds_outside_group() == 0.0 and polls_in_gen >= 2 and not records \
                    and len(got if redo else since) >= (3 if redo else 2):
                assert tp in a.assignment()  # a kept the partition of t0
                try:
                    a.commit()
                    committed = True
                    break
                except StaleMembershipError:
                    # a further rebalance this test did not ask for (seen in CI: the client's event
                    # loop stalled for seconds on a loaded box): what this generation handed out is
                    # void. With redo it comes again in the next one (and the list starts over);
                    # without, what was skipped has been seen already.
                    if not redo:
                        break
                    got, gen = [], None
        assert a.group_metadata().generation_id > before, "the member never rejoined"
        assert committed or not redo, f"never committed; handed out last: {got}"
        return (got if redo else since), a

    got, a = rebalanced_once_more(redo=True)
    assert got[:1] == ["t0"] and a.redone >= 1, f"the task of the lost membership was skipped: {got}"
    assert a.committed(tp) == 3
    # What a reader that commits its own offsets keeps (and what the task consumer did before):
    # the position, past the record of the lost membership.
    skipped, a = rebalanced_once_more(redo=False)
    assert skipped == ["t1", "t2"] and a.redone == 0
