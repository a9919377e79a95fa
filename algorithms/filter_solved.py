"""FilterSolved: stop scheduling prompts the policy already solves reliably.

Rule: per prompt, an exponentially weighted success rate
``s <- (1 - alpha) * s + alpha * mean(reward > 0)`` over its finished groups (``s``
starts at ``initial``); a prompt with ``s >= threshold`` is skipped. With the defaults
(``alpha`` 0.1, ``threshold`` 0.95, ``initial`` 0) a prompt is skipped after 29
consecutive fully solved groups — a solved prompt costs rollouts long after it stopped
teaching anything. State: ``s`` per prompt seen. It knows nothing about Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astraflow.topics.messages import Prompt
from astraflow.typed_config import Bounds

from .base import Outcome, PromptCurator, param


@dataclass(frozen=True)
class FilterSolvedParams:
    threshold: float = param(0.95, "skip a prompt whose success-rate EWMA is at least this",
                             bounds=Bounds(0, 1, lo_open=True))
    alpha: float = param(0.1, "weight of the newest group in the EWMA (s <- (1-alpha) s + alpha mean(r > 0))",
                         bounds=Bounds(0, 1, lo_open=True))
    initial: float = param(0.0, "EWMA of a prompt never rolled out", bounds=Bounds(0, 1))

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"filter_solved.threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"filter_solved.alpha must be in (0, 1], got {self.alpha}")
        if not 0.0 <= self.initial < self.threshold:
            raise ValueError(f"filter_solved.initial must be in [0, threshold), got {self.initial}")


class FilterSolved(PromptCurator):
    name = "filter_solved"
    Params = FilterSolvedParams

    def __init__(self, params: FilterSolvedParams, ctx) -> None:
        super().__init__(params, ctx)
        self.success: dict[str, float] = {}
        self.skipped = 0

    def should_schedule(self, prompt: Prompt, version: int) -> bool:
        if self.success.get(prompt.prompt_id, self.params.initial) >= self.params.threshold:
            self.skipped += 1
            return False
        return True

    def update(self, outcome: Outcome) -> None:
        s = self.success.get(outcome.prompt_id, self.params.initial)
        self.success[outcome.prompt_id] = (1 - self.params.alpha) * s + self.params.alpha * outcome.solved

    def state(self) -> dict[str, Any]:
        return {"success": dict(sorted(self.success.items())), "skipped": self.skipped}

    def load_state(self, state: dict[str, Any]) -> None:
        self.success = {k: float(v) for k, v in state.get("success", {}).items()}
        self.skipped = int(state.get("skipped", 0))

    def stats(self) -> dict[str, float]:
        solved = sum(1 for s in self.success.values() if s >= self.params.threshold)
        return {"solved_prompts": float(solved)}
