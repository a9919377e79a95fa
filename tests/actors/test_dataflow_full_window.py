"""A dataflow whose window stays full keeps its prompts consumer in the group.

While every slot under the staleness bound is taken (the trainer is slow), the dataflow
schedules nothing. It used to stop polling ``prompts`` then, so a window full for longer than
the consumer's ``max_poll_interval_ms`` got it expelled from its group (kafka-python leaves on
its own: "Consumer poll timeout has expired") and rejoined at the next step, a rebalance per slow
trainer step. Seen in the 64-device emulated team run (a window of ~300 s of wall time). The
real broker; the consumer's poll interval shortened to a few seconds.
"""

from __future__ import annotations

import time

import pytest

from astraflow.actors import dataflow as dataflow_module
from astraflow.topics import job_topics
from astraflow.topics.replay import read_topic

from .conftest import signed_job, start_dataflow

MAX_POLL_INTERVAL_MS = 6_500


@pytest.fixture
def short_poll_interval(monkeypatch):
    real = dataflow_module.Consumer

    def consumer(*args, **kw):
        kw.setdefault("max_poll_interval_ms", MAX_POLL_INTERVAL_MS)
        kw.setdefault("session_timeout_ms", 6_000)
        kw.setdefault("heartbeat_interval_ms", 1_000)
        return real(*args, **kw)

    monkeypatch.setattr(dataflow_module, "Consumer", consumer)


def test_a_window_full_longer_than_the_poll_interval_keeps_the_prompts_consumer_in_its_group(
        bootstrap, tmp_path, short_poll_interval):
    cfg = signed_job(bootstrap, tmp_path, "full", {"dataflow": {"groups_per_batch": 2, "max_staleness": 1},
                                                   "trainer": {"steps": 4}, "kafka": {"trajectory_partitions": 2}})
    topics = job_topics(cfg)
    actor = start_dataflow(cfg, bootstrap)
    try:
        for _ in range(100):  # schedule until the bound is reached (no group ever comes back)
            actor.step()
            if actor.capacity() <= 0:
                break
        assert actor.capacity() <= 0
        scheduled = sum(1 for _ in read_topic(bootstrap, topics.tasks(cfg.policy)))
        prompts = actor.prompts
        before = prompts.group_metadata()
        assert before.generation_id >= 0 and prompts.seconds_outside_group() == 0.0
        end = time.monotonic() + 2.0 * MAX_POLL_INTERVAL_MS / 1000
        while time.monotonic() < end:  # the trainer is slow: the window stays full
            actor.step()
        after = prompts.group_metadata()
        assert (after.generation_id, after.member_id) == (before.generation_id, before.member_id), (before, after)
        assert prompts.seconds_outside_group() == 0.0
        assert sum(1 for _ in read_topic(bootstrap, topics.tasks(cfg.policy))) == scheduled  # held: nothing new
    finally:
        actor.teardown()
