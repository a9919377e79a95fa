"""A topic batch becomes the same training batch whatever order its groups arrived in."""

from __future__ import annotations

from astraflow.actors.common import to_train_batch
from astraflow.topics import Batch, Sample, TrajectoryGroup


def group(task_id: str, token: int) -> TrajectoryGroup:
    return TrajectoryGroup(task_id, f"p-{task_id}", "policy", "raas-0", [5, 6],
                           [Sample([token, 1], [-0.5, -0.25], [0, 0], float(token % 2), "stop")])


def test_group_order_of_a_batch_does_not_change_the_training_batch():
    groups = [group("t0000002-c", 7), group("t0000000-a", 8), group("t0000001-b", 9)]
    a = to_train_batch(Batch("policy", 3, groups, []))
    b = to_train_batch(Batch("policy", 3, groups[::-1], []))
    assert a == b
    assert [s.group_id for s in a.samples] == ["t0000000-a", "t0000001-b", "t0000002-c"]
