"""A group join that finishes after the poll that started it gave up is kept, not redone.

kafka-python 3.0.12 runs a consumer's JoinGroup + SyncGroup as a task on its network loop
and lets ``poll(timeout_ms)`` return while that task is still in flight, so that the next
poll waits on the same task. But when the task *finishes* between two polls, the next poll
finds it done while the member still "needs a rejoin" (that flag is cleared only by the
poll that sees the join through) and starts a new JoinGroup, dropping the assignment it
just received. A leader's new JoinGroup opens a new rebalance; the other members' SyncGroup
then fails ("coordinator rebalance") and they rejoin, and so on: with two members polling
every few milliseconds the group went through ~300 generations in 20 s (``tests/topics/
test_group_join.py``), and two RaaS nodes of one pool, whose loops poll with short timeouts
while an engine call runs, spent minutes in such a storm, their first polls' work fenced as
handed out in a generation long gone (the emulated team at 16 and 32 devices, two nodes per
pool, trained nothing for 4-27 minutes).

:func:`keep_completed_joins` wraps one consumer's coordinator: before kafka-python looks at
its join task, a task that finished with an assignment nobody has taken is handed back to
it as a new, still-pending task that yields the same assignment, so the library completes
that join (its own success path: rejoin flag cleared, heartbeat on, assignment applied)
instead of starting another. A task that failed is left as it is (the library retries as
before), and so is a finished join whose generation has since been reset.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["keep_completed_joins"]


def keep_completed_joins(kc: Any) -> Any:
    """Make ``kc`` (a ``KafkaConsumer``) complete a join whose task finished between polls,
    instead of sending another JoinGroup; returns ``kc``. A consumer without a group
    coordinator, or a kafka-python whose coordinator lacks what this relies on, is returned
    unchanged (the library's own behaviour)."""
    coord = getattr(kc, "_coordinator", None)
    original = getattr(coord, "join_group_async", None)
    if coord is None or original is None or not hasattr(coord, "_join_task") or not hasattr(coord, "_manager"):
        return kc

    async def join_group_async(timeout_ms=None):
        task = coord._join_task
        generation = getattr(coord, "_generation", None)
        if (task is not None and task.is_done and task.exception is None
                and getattr(generation, "generation_id", -1) >= 0):
            assignment = task.value
            coord.kept_joins = getattr(coord, "kept_joins", 0) + 1
            log.debug("group %s: keeping the join of generation %s that finished between polls",
                      coord.config.get("group_id"), generation.generation_id)

            async def finished():
                return assignment
            coord._join_task = coord._manager.call_soon(finished)
        return await original(timeout_ms=timeout_ms)

    coord.join_group_async = join_group_async
    coord.kept_joins = 0
    return kc
