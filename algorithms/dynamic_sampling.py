"""Dynamic sampling (DAPO): drop groups whose samples were all rewarded alike.

Rule: a finished group whose rewards are all equal (all solved or all failed) has a
zero GRPO advantage everywhere, so it costs a training slot and teaches nothing; it is
dropped with reason ``zero_variance``. The drop frees a scheduling slot, so the dataflow
keeps scheduling until the batch is full of groups with signal. ``oversample`` lets that
many groups per group a batch needs be in flight under the staleness bound (DAPO's
over-sampling), so batches fill without waiting for replacements; extra groups wait for
later batches, or are dropped ``stale`` when they age past the bound. The training
horizon is not over-sampled: the last batches fill by replacements, so no task is left
unneeded when training ends. It knows nothing about Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.topics.messages import TrajectoryGroup
from astraflow.typed_config import Bounds

from .base import GroupFilter, param


@dataclass(frozen=True)
class DynamicSamplingParams:
    oversample: float = param(1.0, "groups rolled out per group a batch needs (>= 1; 1: replace drops only)",
                              bounds=Bounds(1, 4))

    def __post_init__(self) -> None:
        if not 1.0 <= self.oversample <= 4.0:
            raise ValueError(f"dynamic_sampling.oversample must be in [1, 4], got {self.oversample}")


class DynamicSampling(GroupFilter):
    name = "dynamic_sampling"
    Params = DynamicSamplingParams
    reason = "zero_variance"

    def __init__(self, params: DynamicSamplingParams, ctx) -> None:
        if ctx.n_samples < 2:
            raise ValueError(f"dynamic_sampling needs rollout.n_samples >= 2 (a single sample always has zero "
                             f"variance), got {ctx.n_samples}")
        super().__init__(params, ctx)
        self.dropped = self.kept = 0

    @property
    def oversample(self) -> float:
        return self.params.oversample

    def keep(self, group: TrajectoryGroup) -> bool:
        keep = len({s.reward for s in group.samples}) > 1
        if keep:
            self.kept += 1
        else:
            self.dropped += 1
        return keep

    def stats(self) -> dict[str, float]:
        seen = self.kept + self.dropped
        return {"zero_variance_frac": self.dropped / seen} if seen else {}
