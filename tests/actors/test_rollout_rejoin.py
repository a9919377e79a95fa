"""A RaaS node recreates a task consumer that stays outside its group (the consumer wedge).

Seen in CI: a node's task consumer never joined its group while the node kept polling, so
the node idled with tasks waiting. The node's watchdog recreates the consumer once it has
been outside the group longer than any rebalance takes; the new one joins and gets the
waiting task from the committed offset. Real broker, real consumers and producers; the
stuck state is entered by backdating the consumer's own clock of it (the client bug itself
cannot be triggered on demand).
"""

import time
import types

from astraflow.actors import rollout
from astraflow.actors.telemetry import MetricsEmitter
from astraflow.config import load_config
from astraflow.topics import Producer, Task


def test_a_task_consumer_stuck_outside_its_group_is_recreated_and_gets_the_waiting_task(
        bootstrap, job_topics, tmp_path):
    cfg = load_config("examples/arithmetic_grpo.yaml")
    node = rollout.RolloutActor.__new__(rollout.RolloutActor)  # only the parts the watchdog uses
    node.bootstrap, node.topics, node.cfg, node.node_id = bootstrap, job_topics, cfg, "raas-w"
    node.plain = Producer(bootstrap, client_id="raas-w")
    node.metrics = MetricsEmitter(node.plain, job_topics.metrics, "raas-w")
    node.engine = types.SimpleNamespace(version=0)  # read for the metric's step only
    node.consumer, node._rejoins = node._task_consumer(), 0
    feeder = Producer(bootstrap, client_id="feeder")
    try:
        task = Task("task-1", "p-1", cfg.policy, "1+1=", "2", 2)
        feeder.send_sync(job_topics.tasks(cfg.policy), task, key="task-1")
        node._rejoin_if_stuck()
        assert node._rejoins == 0 and node.consumer is not None  # fresh: not stuck yet
        stuck = node.consumer
        stuck._outside_since = time.monotonic() - rollout.CONSUMER_REJOIN_S - 1
        node._rejoin_if_stuck()
        assert node._rejoins == 1 and node.consumer is not stuck
        got = []
        for _ in range(40):
            got += node.consumer.poll(500)
            if got:
                break
        assert [d.message.task_id for d in got] == ["task-1"]
        assert node.consumer.group_metadata().group_id == job_topics.rollout_group(cfg.policy)
        node._rejoin_if_stuck()
        assert node._rejoins == 1  # a member now: left alone
    finally:
        node.consumer.close()
        feeder.close()
        node.plain.close()
