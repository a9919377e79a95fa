"""The dataflow's ledger: which tasks are still owed a result, and the compact record of it.

Every task the dataflow schedules stays *open* until its trajectory group is *settled*:
put in a batch, or dropped with a reason (a :class:`GroupDrop`). The ledger keeps the
counts and sets that the schedule depends on (tasks scheduled, slots freed by drops, the
next batch step) and turns them into a :class:`DataflowState`, which every dataflow
transaction writes next to the offsets it covers. A restart then reads one record
(:func:`read_state`) instead of the whole ``batches`` history.

It knows nothing about batching rules or transactions; those stay in the dataflow actor.
"""

from __future__ import annotations

import time
from typing import Iterable

from astraflow.topics import DeadLetters, DecodeError, Delivery, SourceOffset, TopicPartition, TrajectoryGroup, decode
from astraflow.topics.messages import DROP_REASONS, DataflowState, GroupDrop
from astraflow.topics import security


class Ledger:
    """Open tasks, settled groups and the drops not yet written, for one policy."""

    def __init__(self, policy: str, state: DataflowState | None = None) -> None:
        s = state or DataflowState(policy, next_step=0, tasks_scheduled=0, groups_dropped=0)
        self.policy = policy
        self.next_step = s.next_step
        self.tasks_scheduled = s.tasks_scheduled
        self.dropped = s.groups_dropped  #: slots freed by drops (each lets one more task be scheduled)
        self.prompt_epoch = s.prompt_epoch  #: passes over the prompts topic begun
        self.algorithms = s.algorithms  #: the data algorithms' state as of this record (read at start-up)
        self.open: set[str] = set(s.open_tasks)
        self.waiting: set[str] = set()  #: open tasks whose group waits for its batch
        # Settled records the committed offsets have not passed yet; a restart re-reads them.
        self._ahead: set[tuple[str, int, int]] = {(a.topic, a.partition, a.offset) for a in s.settled_ahead}
        self._drops: list[GroupDrop] = []

    # -- scheduling ----------------------------------------------------------------------
    def scheduled(self, task_ids: Iterable[str]) -> None:
        for tid in task_ids:
            self.open.add(tid)
            self.tasks_scheduled += 1

    # -- groups --------------------------------------------------------------------------
    def already_settled(self, d: Delivery) -> bool:
        """True for a record settled before a restart (batched or dropped, offset not yet committed)."""
        return (d.topic, d.partition, d.offset) in self._ahead

    def verdict(self, d: Delivery) -> str | None:
        """The drop reason for a newly read group, or None when it may wait for a batch."""
        g: TrajectoryGroup = d.message
        if g.group_key not in self.open or g.group_key in self.waiting:
            return "duplicate"
        if g.status != "ok" or not g.samples:
            return "failed"
        return None

    def wait(self, d: Delivery) -> None:
        self.waiting.add(d.message.group_key)

    def drop(self, d: Delivery, reason: str, step: int, detail: str = "") -> GroupDrop:
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; expected one of {sorted(DROP_REASONS)}")
        g: TrajectoryGroup = d.message
        if DROP_REASONS[reason]:
            self._settle(g.group_key)
            self.dropped += 1
        self._ahead.add((d.topic, d.partition, d.offset))
        record = GroupDrop(self.policy, g.group_key, d.source, reason, step, detail, time.time())
        self._drops.append(record)
        return record

    def batched(self, members: list[Delivery]) -> None:
        for d in members:
            self._settle(d.message.group_key)
            self._ahead.add((d.topic, d.partition, d.offset))
        self.next_step += 1

    def _settle(self, task_id: str) -> None:
        self.open.discard(task_id)
        self.waiting.discard(task_id)

    # -- what the next transaction writes -----------------------------------------------
    @property
    def pending_drops(self) -> bool:
        return bool(self._drops)

    def take_drops(self) -> list[GroupDrop]:
        drops, self._drops = self._drops, []
        return drops

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        """Forget settled records the committed offsets have passed: a restart never re-reads them."""
        self._ahead = {(t, p, o) for t, p, o in self._ahead
                       if o >= offsets.get(TopicPartition(t, p), -1)}

    def state(self, algorithms: dict | None = None) -> DataflowState:
        """The record a transaction writes; ``algorithms`` is the data algorithms' state as of it."""
        return DataflowState(self.policy, self.next_step, self.tasks_scheduled, self.dropped,
                             sorted(self.open), [SourceOffset(*a) for a in sorted(self._ahead)], time.time(),
                             self.prompt_epoch, algorithms or {})


def read_state(bootstrap_servers: str, topic: str, policy: str, *, idle_polls: int = 5,
               dead_letters: DeadLetters | None = None) -> tuple[DataflowState | None, int]:
    """The newest committed state of ``policy`` on ``topic`` and how many records it took to find it.

    Reads backwards from the end in growing windows: each transaction ends with its state
    record, so the first window (two offsets: the record and its commit marker) almost
    always holds it; aborted transactions at the tail only widen the window. A record that
    does not decode is none of the dataflow's (its states are written by this code, in
    its transactions): it goes to ``dead_letters`` and the search goes on behind it,
    instead of a restart that fails on it forever; without ``dead_letters`` it raises.
    """
    c = security.consumer(bootstrap_servers=bootstrap_servers, isolation_level="read_committed",
                          enable_auto_commit=False, client_id=f"dataflow-state.{policy}")
    tp = TopicPartition(topic, 0)
    try:
        c.assign([tp])
        begin, end = c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp]
        window, read = 2, 0
        while True:
            start = max(begin, end - window)
            c.seek(tp, start)
            newest: DataflowState | None = None
            idle = 0
            while c.position(tp) < end and idle < idle_polls:
                records = c.poll(1000).get(tp, [])
                idle = 0 if records else idle + 1
                for r in records:
                    if r.offset >= end:
                        break
                    read += 1
                    try:
                        msg = decode(r.value, r.headers)
                    except DecodeError as e:
                        if dead_letters is None:
                            raise DecodeError(f"{topic}@{r.offset}: the dataflow's state record does not decode "
                                              f"({e}); restore the topic or start a new job") from e
                        dead_letters.put(r.topic, r.partition, r.offset, r.key, r.value, r.headers, e)
                        continue
                    if isinstance(msg, DataflowState) and msg.policy == policy:
                        newest = msg
            if newest is not None or start == begin:
                return newest, read
            window *= 2
    finally:
        c.close()
