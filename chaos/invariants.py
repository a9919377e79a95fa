"""Audit a job's topics: nothing lost, nothing duplicated, staleness respected.

Reads ``tasks.<policy>``, ``trajectories`` and ``batches.<policy>`` as a plain
``read_committed`` consumer would (only what was committed exists) and checks:

* every task has exactly one committed trajectory group (an explicit ``failed`` group
  counts), and every group answers a task that exists;
* no trajectory group enters two batches, batches are numbered 0, 1, 2, ... without a gap,
  and each batch's ``sources`` point at records that hold its groups;
* every trained sample respects the staleness bound: a token generated at version ``v``
  is in a batch ``k`` with ``k - v <= max_staleness``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from astraflow.topics import Batch, JobTopics, Task, TrajectoryGroup
from astraflow.topics.replay import read_topic


@dataclass
class Audit:
    tasks: int = 0
    groups: int = 0
    batches: int = 0
    batched_groups: int = 0
    failed_groups: int = 0
    max_staleness_seen: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def audit(bootstrap: str, topics: JobTopics, policy: str, max_staleness: int, *,
          expect_all_tasks_done: bool = True) -> Audit:
    a = Audit()
    tasks = [m for _, _, m in read_topic(bootstrap, topics.tasks(policy)) if isinstance(m, Task)]
    traj = [(p, o, m) for p, o, m in read_topic(bootstrap, topics.trajectories) if isinstance(m, TrajectoryGroup)]
    batches = [m for _, _, m in read_topic(bootstrap, topics.batches(policy)) if isinstance(m, Batch)]
    a.tasks, a.groups, a.batches = len(tasks), len(traj), len(batches)
    a.failed_groups = sum(1 for _, _, g in traj if g.status != "ok")

    task_ids = Counter(t.task_id for t in tasks)
    for tid, n in task_ids.items():
        if n > 1:
            a.violations.append(f"task {tid} scheduled {n} times")
    group_ids = Counter(g.task_id for _, _, g in traj)
    for tid, n in group_ids.items():
        if n > 1:
            a.violations.append(f"task {tid} has {n} committed trajectory groups")
        if tid not in task_ids:
            a.violations.append(f"trajectory group for unknown task {tid}")
    if expect_all_tasks_done:
        for tid in task_ids:
            if tid not in group_ids:
                a.violations.append(f"task {tid} has no trajectory group")

    by_coord = {(p, o): g for p, o, g in traj}
    seen: dict[str, int] = {}
    for i, b in enumerate(batches):
        if b.step != i:
            a.violations.append(f"batch #{i} has step {b.step}")
        for g in b.groups:
            if g.task_id in seen:
                a.violations.append(f"group {g.task_id} in batches {seen[g.task_id]} and {b.step}")
            seen[g.task_id] = b.step
            for s in g.samples:
                if s.versions:
                    lag = b.step - min(s.versions)
                    a.max_staleness_seen = max(a.max_staleness_seen, lag)
                    if lag > max_staleness:
                        a.violations.append(f"batch {b.step}: group {g.task_id} has a token of version "
                                            f"{min(s.versions)} (staleness {lag} > {max_staleness})")
        for src, g in zip(b.sources, b.groups):
            held = by_coord.get((src.partition, src.offset))
            if held is None or held.task_id != g.task_id:
                a.violations.append(f"batch {b.step}: source {src} does not hold group {g.task_id}")
        a.batched_groups += len(b.groups)
    return a
