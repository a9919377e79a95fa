"""Experience replay: each batch retrains a fixed share of already-trained groups.

Rule: batch ``k`` takes ``r = round(ratio * B)`` groups from a bounded buffer of the most
recent ``capacity`` groups trained fresh (replayed groups never re-enter it), and
``B - r`` fresh groups. The buffer starts empty, so the first batches take
``min(r, buffer size)``; how many that is depends only on ``B``, ``r`` and ``capacity``
(:meth:`ExperienceReplay.replay_slots`), which lets the dataflow schedule exactly the fresh groups
the batches will take. ``sampling: recent`` replays the newest groups in the buffer;
``uniform`` draws without replacement with a coin seeded by (job seed, step).

Replayed groups are marked as such in the :class:`~astraflow.topics.Batch` (the audit
allows a group in several batches only with that mark, and exempts replays from the
staleness bound: they are stale by design). Their samples keep the behaviour log-probs
they were generated with, so the loss must correct for the policy lag: ``decoupled_ppo``
and ``m2po`` are the valid losses; ``grpo`` (PPO-clip around the behaviour policy) clips
most stale tokens away. The buffer is rebuilt after a restart from the last batches on
``batches.<policy>``. It knows nothing about Kafka.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from astraflow.typed_config import Bounds

from .base import BatchComposer, BatchPlan, Context, TrainedGroup, param


@dataclass(frozen=True)
class ExperienceReplayParams:
    ratio: float = param(0.5, "share of each batch taken from the replay buffer (round(ratio * B) groups)",
                         bounds=Bounds(0, 1, lo_open=True, hi_open=True))
    capacity: int | None = param(None, "groups the buffer holds (the newest trained fresh); null: 4 * B",
                                 bounds=Bounds(1, 10**7))
    sampling: Literal["recent", "uniform"] = param("recent", "recent: the newest groups in the buffer; uniform: "
                                                             "drawn without replacement")

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"replay.ratio must be in (0, 1), got {self.ratio}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"replay.capacity must be >= 1, got {self.capacity}")


class ExperienceReplay(BatchComposer):
    name = "replay"  # what users write in dataflow.algorithms
    Params = ExperienceReplayParams

    def __init__(self, params: ExperienceReplayParams, ctx: Context) -> None:
        super().__init__(params, ctx)
        B = ctx.groups_per_batch
        self.slots = round(params.ratio * B)
        if not 1 <= self.slots <= B - 1:
            raise ValueError(f"replay.ratio {params.ratio} x groups_per_batch {B} rounds to {self.slots} replayed "
                             f"groups per batch; it must leave between 1 and {B - 1}")
        self.capacity = params.capacity or 4 * B
        if self.capacity < self.slots:
            raise ValueError(f"replay.capacity {self.capacity} is below the {self.slots} groups each batch replays")
        # the batches whose fresh groups fill the buffer: each adds at least B - slots
        self.history = math.ceil(self.capacity / (B - self.slots))
        self.buffer: list[TrainedGroup] = []
        self._slots = [0]  #: replay slots of batches 0, 1, ... (memo of a pure recurrence)
        self._fresh_before = [0]  #: fresh groups trained before batch k

    def replay_slots(self, step: int) -> int:
        B = self.ctx.groups_per_batch
        while len(self._slots) <= step:
            k = len(self._slots) - 1
            fresh = self._fresh_before[k] + B - self._slots[k]
            self._fresh_before.append(fresh)
            self._slots.append(min(self.slots, self.capacity, fresh))
        return self._slots[step]

    def compose(self, plan: BatchPlan) -> None:
        n = min(plan.replay_slots, len(self.buffer))
        if self.params.sampling == "recent":
            plan.replay = list(reversed(self.buffer[-n:])) if n else []
        else:
            plan.replay = random.Random(f"{self.ctx.seed}-replay-{plan.step}").sample(self.buffer, n)

    def trained(self, step: int, fresh: list[TrainedGroup]) -> None:
        self.buffer = (self.buffer + fresh)[-self.capacity:]

    def restore(self, fresh: list[TrainedGroup]) -> None:
        self.buffer = list(fresh)[-self.capacity:]

    def stats(self) -> dict[str, float]:
        return {"buffer": float(len(self.buffer))}
