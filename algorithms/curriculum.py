"""Curriculum: schedule easy prompts first, widening to harder ones as accuracy rises.

Rule: each prompt has a difficulty — the operand digit count of an arithmetic prompt
(``key: digits``) or a numeric column of the dataset (``key: <column>``, carried in the
prompt's metadata). ``levels`` are ascending difficulty bounds; at level ``i`` only
prompts with difficulty ``<= levels[i]`` are scheduled (the last level admits
everything). The running accuracy is an EWMA (weight ``alpha``) of ``mean(reward > 0)``
over groups of the frontier band (difficulty above the previous bound); once at least
``min_groups`` of them finished and the EWMA reaches ``threshold``, the curriculum moves
to the next level and the running accuracy starts over. State: level, EWMA, count. It
knows nothing about Kafka.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from astraflow.errors import DataError
from astraflow.topics.messages import Prompt
from astraflow.typed_config import Bounds

from .base import Outcome, PromptCurator, param

_NUMBER = re.compile(r"\d+")


class CurriculumError(DataError, ValueError):
    """A prompt has no usable difficulty (the dataset lacks the configured column)."""


@dataclass(frozen=True)
class CurriculumParams:
    key: str = param("digits", "difficulty: 'digits' (operand digit count of an arithmetic prompt) or a numeric "
                               "dataset column")
    levels: tuple[float, ...] = param((1.0, 2.0, 3.0), "ascending difficulty bounds; level i schedules difficulty <= levels[i]",
                                      bounds=Bounds(-1e12, 1e12))
    threshold: float = param(0.6, "running accuracy on the frontier band that opens the next level",
                             bounds=Bounds(0, 1, lo_open=True))
    alpha: float = param(0.1, "weight of the newest group in the running accuracy EWMA",
                         bounds=Bounds(0, 1, lo_open=True))
    min_groups: int = param(16, "frontier groups finished before a level may open the next", bounds=Bounds(1, 10**6))

    def __post_init__(self) -> None:
        if not self.levels or list(self.levels) != sorted(set(self.levels)):
            raise ValueError(f"curriculum.levels must be a non-empty, strictly ascending list, got {list(self.levels)}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"curriculum.threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"curriculum.alpha must be in (0, 1], got {self.alpha}")
        if self.min_groups < 1:
            raise ValueError(f"curriculum.min_groups must be >= 1, got {self.min_groups}")


class Curriculum(PromptCurator):
    name = "curriculum"
    Params = CurriculumParams

    def __init__(self, params: CurriculumParams, ctx) -> None:
        super().__init__(params, ctx)
        self.level = 0
        self.accuracy: float | None = None  #: EWMA on the frontier band (None: nothing finished there yet)
        self.count = 0

    def difficulty(self, prompt: Prompt) -> float:
        if self.params.key == "digits":
            operands = _NUMBER.findall(prompt.text)
            if not operands:
                raise CurriculumError(f"prompt {prompt.prompt_id} has no operand to count digits of "
                                      f"(curriculum.key 'digits' fits arithmetic prompts): {prompt.text!r:.80}")
            return float(max(len(n) for n in operands))
        value = prompt.metadata.get(self.params.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CurriculumError(f"prompt {prompt.prompt_id} (source {prompt.source!r}) has no numeric "
                                  f"{self.params.key!r} column (curriculum.key), got {value!r}")
        return float(value)

    @property
    def bound(self) -> float:
        return float("inf") if self.level >= len(self.params.levels) - 1 else self.params.levels[self.level]

    def should_schedule(self, prompt: Prompt, version: int) -> bool:
        return self.difficulty(prompt) <= self.bound

    def tags(self, prompt: Prompt) -> dict[str, Any]:
        return {"difficulty": self.difficulty(prompt)}

    def update(self, outcome: Outcome) -> None:
        d = outcome.tags.get("difficulty")
        last = self.level >= len(self.params.levels) - 1
        lower = self.params.levels[self.level - 1] if self.level > 0 else float("-inf")
        if d is None or last or not lower < d <= self.bound:
            return
        self.count += 1
        a = self.params.alpha
        self.accuracy = outcome.solved if self.accuracy is None else (1 - a) * self.accuracy + a * outcome.solved
        if self.count >= self.params.min_groups and self.accuracy >= self.params.threshold:
            self.level += 1
            self.accuracy, self.count = None, 0

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "accuracy": self.accuracy, "count": self.count}

    def load_state(self, state: dict[str, Any]) -> None:
        self.level = int(state.get("level", 0))
        acc = state.get("accuracy")
        self.accuracy = None if acc is None else float(acc)
        self.count = int(state.get("count", 0))

    def stats(self) -> dict[str, float]:
        return {"level": float(self.level), "accuracy": self.accuracy if self.accuracy is not None else 0.0}
