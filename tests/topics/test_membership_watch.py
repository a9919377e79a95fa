"""MembershipWatch asks the broker, not the client, whether a consumer is in its group.

The CI wedge it exists for: a task consumer kept polling while the broker had no such
group, and the client reported a generation and a member id. Its signature is entered here
for real: a member joins, its heartbeats stop (the client's heartbeat switch, the one part
touched from outside), the real broker expels it after the session timeout — and the
client still says generation ≥ 0, stable.
"""

import time

from astraflow.topics.membership import MembershipWatch


def _join(consumer, polls: int = 40) -> None:
    for _ in range(polls):
        consumer.poll(250)
        meta = consumer.group_metadata()
        if meta.generation_id >= 0 and consumer.seconds_outside_group() == 0.0:
            return
    raise AssertionError(f"{meta} never became a stable member")


def test_a_member_the_broker_dropped_is_reported_though_the_client_says_it_is_stable(
        bootstrap, job_topics, make_consumer, expel_silently):
    # The state under test is the client's blind spot: the broker dropped the member and the
    # client has not noticed. The client can notice on its own (seen once in a clean-clone CI:
    # it was rebalancing, generation 2, when the test looked), and then there is no blind spot
    # to report. Such a try proves nothing either way and is made again in a new group; the
    # test fails if no try reaches the blind spot, or if one reaches it and the watch is silent.
    noticed = []
    for attempt in range(3):
        group = f"watch-dropped-{attempt}"
        c = make_consumer(topics=[job_topics.tasks("policy")], group_id=group, client_id="node-d",
                          session_timeout_ms=6_000, heartbeat_interval_ms=1_000)
        _join(c)
        watch = MembershipWatch(bootstrap, "node-d", unsettled_s=1.0, idle_s=1.0)
        try:
            assert watch.check(c) is None and watch.probes == 0  # fresh: nothing to ask
            time.sleep(1.1)
            c.poll(100)
            assert watch.check(c) is None and watch.probes == 1  # idle: asked, and the broker lists it
            assert watch.check(c) is None and watch.probes == 1  # at most one question per idle_s

            member = expel_silently(c, group, timeout_s=30, pause_s=1)
            c.poll(100)
            meta = c.group_metadata()
            if not (meta.generation_id >= 0 and meta.member_id == member and c.seconds_outside_group() == 0.0):
                noticed.append(meta)
                continue
            time.sleep(1.1)
            reason = watch.check(c)
            assert reason is not None and f"does not list member {member}" in reason
            return
        finally:
            watch.close()
            c.close()
    raise AssertionError(f"the client noticed its own expulsion in every try, so the blind spot was never "
                         f"reached: {noticed}")


def test_a_member_waiting_in_a_rebalance_another_member_holds_up_is_left_alone(
        bootstrap, job_topics, make_consumer, group_members):
    topic = job_topics.tasks("policy")
    a = make_consumer(topics=[topic], group_id="watch-held", client_id="node-a", max_poll_interval_ms=60_000)
    _join(a)
    b = make_consumer(topics=[topic], group_id="watch-held", client_id="node-b", max_poll_interval_ms=60_000)
    watch = MembershipWatch(bootstrap, "node-b", unsettled_s=1.0, idle_s=1.0)
    try:
        # a does not poll, so the broker waits for it to rejoin; b sits in the rebalance.
        for _ in range(12):
            b.poll(250)
        assert b.seconds_outside_group() > 1.0 and b.group_metadata().member_id
        assert b.group_metadata().member_id in group_members("watch-held")
        assert watch.check(b) is None and watch.probes == 1  # unsettled, asked, listed: wait
        for _ in range(40):  # a rejoins; the rebalance completes for both
            a.poll(100)
            b.poll(100)
            if a.seconds_outside_group() == 0.0 and b.seconds_outside_group() == 0.0:
                break
        assert b.seconds_outside_group() == 0.0
    finally:
        watch.close()


def test_a_consumer_that_never_got_a_member_id_is_reported_without_asking(job_topics, make_consumer, bootstrap):
    c = make_consumer(topics=[job_topics.tasks("policy")], group_id="watch-never", client_id="node-n")
    asked = []
    watch = MembershipWatch(bootstrap, "node-n", unsettled_s=0.2, idle_s=0.2,
                            member_of=lambda g, m: asked.append((g, m)) or True)
    time.sleep(0.3)  # created, never polled: no member id
    reason = watch.check(c)
    assert reason is not None and "no member id" in reason and asked == []
