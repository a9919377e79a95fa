"""A group join that finishes after the poll that started it gave up is kept, once the
coordinator confirms its generation is still the group's.

kafka-python 3.0.12 runs a consumer's JoinGroup + SyncGroup as a task on its network loop
and lets ``poll(timeout_ms)`` return while that task is still in flight, so that the next
poll waits on the same task. But when the task *finishes* between two polls, the next poll
finds it done while the member still "needs a rejoin" (only the poll that sees the join
through clears that flag) and sends a new JoinGroup, dropping the assignment it just got.
A leader's new JoinGroup opens a new rebalance; the other members' SyncGroup then fails and
they rejoin, and so on: two members polling every few milliseconds went through ~300
generations in 20 s, and a single member rebalances on every such poll (its commits refused
with "the group rebalanced"). Our nodes poll with short timeouts while engine calls run, so
every start-up races it (the emulated team at 16 and 32 devices trained nothing for minutes).

:func:`keep_completed_joins` wraps one consumer's coordinator. Before kafka-python looks at
its join task, a task that finished with an assignment is checked with one Heartbeat for the
generation it joined:

- the coordinator answers without error: the generation is still the group's, so the task is
  handed back to the library as a still-pending task yielding the same assignment, and the
  library completes that join by its own success path (rejoin flag cleared, heartbeat on,
  assignment applied) instead of starting another;
- any error (the group is rebalancing again, the generation is gone, the member is unknown,
  the coordinator moved): the join is stale and is left as the library would leave it, so a
  new JoinGroup follows, which is then the right thing to send.

A finished join is never applied on trust: the first version of this fix (stop 43) did, and
under load both members of a group ended up holding every partition, the first with the
assignment of a generation the group had already left.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["keep_completed_joins"]


def keep_completed_joins(kc: Any) -> Any:
    """Make ``kc`` (a ``KafkaConsumer``) complete a join whose task finished between polls,
    if the coordinator confirms its generation, instead of sending another JoinGroup; returns
    ``kc``. A consumer without a group coordinator, or a kafka-python whose coordinator lacks
    what this relies on, is returned unchanged (the library's own behaviour).

    Counters on the coordinator: ``kept_joins`` (confirmed and completed) and
    ``stale_joins`` (refused by the coordinator, redone)."""
    coord = getattr(kc, "_coordinator", None)
    original = getattr(coord, "join_group_async", None)
    needed = ("_join_task", "_manager", "_generation", "_send_heartbeat_request")
    if coord is None or original is None or not all(hasattr(coord, a) for a in needed):
        return kc

    async def join_group_async(timeout_ms=None):
        task = coord._join_task
        if task is not None and task.is_done and task.exception is None and coord.need_rejoin():
            generation = coord._generation
            if generation.generation_id >= 0 and await _still_current(coord):
                assignment = task.value
                coord.kept_joins += 1
                log.debug("group %s: generation %s confirmed; keeping the join that finished between polls",
                          coord.group_id, generation.generation_id)

                async def finished():
                    return assignment
                coord._join_task = coord._manager.call_soon(finished)
            else:
                coord.stale_joins += 1
                log.debug("group %s: the join of generation %s finished between polls but is no longer "
                          "the group's; joining again", coord.group_id, generation.generation_id)
        return await original(timeout_ms=timeout_ms)

    coord.join_group_async = join_group_async
    coord.kept_joins = 0
    coord.stale_joins = 0
    return kc


async def _still_current(coord: Any) -> bool:
    """One Heartbeat for the member's generation: True when the coordinator accepts it.
    The library's response handler applies an error's side effect (rejoin requested,
    generation reset, coordinator marked dead) and raises; any error means stale."""
    try:
        await coord._send_heartbeat_request()
    except Exception as exc:  # noqa: BLE001 - every refusal, and a lost request, means "do not keep it"
        log.debug("group %s: heartbeat for a finished join refused: %r", coord.group_id, exc)
        return False
    return True
