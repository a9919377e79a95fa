"""Two members of one group that poll with short timeouts settle in a couple of rebalances.

kafka-python 3.0.12 drops a join that finished between two polls and sends another
JoinGroup; a leader's new JoinGroup opens a new rebalance, and the group never settles
(``topics/group_join.py``). The same two members without the fix are the control: the
storm must show there, or this test would pass whatever the fix does.
"""

from __future__ import annotations

import time
import uuid

from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient, NewTopic

from astraflow.topics import security
from astraflow.topics.group_join import keep_completed_joins

PARTITIONS = 8


def _storm(bootstrap: str, make) -> tuple[list[int], list[int]]:
    """Two members polling every ~20 ms with a 5 ms timeout for 12 s: their generations and
    how many partitions each holds at the end."""
    topic = f"join-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    admin.close()
    members = [make(bootstrap, f"g-{topic}") for _ in range(2)]
    try:
        for c in members:
            c.partitions_for_topic(topic)
            c.subscribe([topic])
        end = time.monotonic() + 12
        while time.monotonic() < end:
            for c in members:
                c.poll(timeout_ms=5)
                time.sleep(0.02)
        return ([c._coordinator._generation.generation_id for c in members],
                [len(c.assignment()) for c in members])
    finally:
        for c in members:
            c.close()


def _plain(bootstrap: str, group: str) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         session_timeout_ms=10_000, heartbeat_interval_ms=2_000)


def test_short_polls_rebalance_without_end_in_kafka_python_and_settle_with_kept_joins(bootstrap):
    gens, held = _storm(bootstrap, _plain)
    assert max(gens) > 20, f"the control did not storm ({gens}): the fix is not tested"

    gens, held = _storm(bootstrap, lambda b, g: keep_completed_joins(_plain(b, g)))
    assert max(gens) <= 4, gens
    assert sorted(held) == [PARTITIONS // 2, PARTITIONS // 2]  # both members work, the partitions split


def test_every_consumer_the_project_builds_keeps_its_joins(bootstrap):
    c = security.consumer(bootstrap_servers=bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}")
    try:
        assert hasattr(c._coordinator, "kept_joins")
    finally:
        c.close()
