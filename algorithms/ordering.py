"""The order fresh groups enter batches: FIFO (arrival) or EDF (earliest deadline first).

A group's deadline is the last batch step its oldest token may train at under the
staleness bound (``oldest token version + max_staleness``). FIFO takes groups as they
arrived; EDF takes those closest to their deadline first (ties by arrival), so fewer
groups age past the bound and are dropped ``stale``, and the batch trains the least
stale data it has no later chance for (the reference found EDF helped early accuracy at
equal steps). Stateless. It knows nothing about Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import BatchComposer, BatchPlan


@dataclass(frozen=True)
class NoParams:
    pass


class Fifo(BatchComposer):
    name = "fifo"
    Params = NoParams


class EarliestDeadlineFirst(BatchComposer):
    name = "edf"
    Params = NoParams

    def compose(self, plan: BatchPlan) -> None:
        plan.fresh.sort(key=lambda c: (c.deadline, c.arrival))
