"""The polls of tasks a RaaS node has in flight, oldest first.

A node rolls out up to ``rollout.polls_in_flight`` polls at once, each on a thread of its own
(the engine batches their calls), and commits them in the order they were polled: a poll's
offsets only after every earlier poll's. One poll in flight is the same pipeline with depth 1.
This module owns that order, the room for another poll, the deliveries held back for the
weights they were scheduled at, and the time at least one poll was in flight (the node's
``raas.busy_s``). It knows nothing about Kafka transactions, weights or metrics: the node
(:mod:`.rollout`) polls, commits and reports.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

from astraflow.topics import Delivery, Task, TrajectoryGroup

#: ``roll_out(tasks, spans, metrics_out=...)``: per task its groups (``EpisodeRunner.roll_out``)
RollOut = Callable[..., list[list[TrajectoryGroup]]]


class Poll(NamedTuple):
    """One poll's tasks, rolling out or rolled out."""

    tasks: list[Task]  #: the poll's tasks, in the order they were handed out
    spans: list  #: one ``raas.rollout`` span per task
    offsets: dict  #: the consumer's pending offsets at this poll: committed with it
    membership: Any  #: the group membership they were handed out in: committed under it or not at all
    future: Future  #: per task its groups, once the rollout ends
    metrics: list[dict]  #: the poll's episode metrics, filled by the rollout


class PollsInFlight:
    """Up to ``depth`` polls rolling out at once; finished ones come out in poll order."""

    def __init__(self, depth: int, roll_out: RollOut | None, name: str) -> None:
        self.depth = depth
        self.held: list[Delivery] | None = None  #: a poll's deliveries waiting for the weights they were scheduled at
        self._roll_out = roll_out
        self._polls: deque[Poll] = deque()
        self._threads = ThreadPoolExecutor(depth, thread_name_prefix=f"{name}-poll")
        self._busy_from = 0.0

    def __len__(self) -> int:
        return len(self._polls)

    def room(self) -> bool:
        """Room to start another poll (nothing held back, fewer than ``depth`` in flight)."""
        return len(self._polls) < self.depth and self.held is None

    def tasks(self) -> int:
        """Tasks rolling out or rolled out, not committed yet."""
        return sum(len(p.tasks) for p in self._polls)

    def start(self, tasks: list[Task], spans: list, offsets: dict, membership: Any) -> None:
        """Roll ``tasks`` out on a thread of the pipeline's own."""
        if not self._polls:
            self._busy_from = time.monotonic()
        metrics: list[dict] = []
        future = self._threads.submit(self._roll_out, tasks, spans, metrics_out=metrics)
        self._polls.append(Poll(tasks, spans, offsets, membership, future, metrics))

    def finished(self) -> Iterator[Poll]:
        """The polls that finished, oldest first (a later poll waits for every earlier one)."""
        while self._polls and self._polls[0].future.done():
            yield self._polls.popleft()

    def lap(self) -> float:
        """Seconds of at least one poll in flight since the last lap (a committed poll's
        ``raas.busy_s``; a fenced poll's time goes to the next one committed)."""
        now = time.monotonic()
        busy, self._busy_from = now - self._busy_from, now
        return busy

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the oldest poll to finish (at once when none is in flight)."""
        if self._polls:
            wait([self._polls[0].future], timeout=timeout_s)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
