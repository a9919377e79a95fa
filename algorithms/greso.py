"""GRESO: skip prompts whose recent rollouts carried no learning signal, probabilistically.

Rule (GRESO, "Act only when it pays"): per prompt, ``z`` counts its consecutive
zero-variance groups (all samples rewarded alike) and ``kind`` says whether the last one
was *easy* (mean reward > 0.5) or *hard*. A prompt with ``z = 0`` is always scheduled;
otherwise it is scheduled with probability ``max(p_kind ** z, floor_kind)``. Once per new
policy version, each ``p_kind`` moves by ``step`` towards its target skip share: up (skip
less) when the share of prompts of that kind skipped since the previous version exceeds
``target_kind``, down otherwise, clamped to ``[p_min, p_max]``. A version with no decision
since the previous one moves nothing.

State: the streaks (only prompts with ``z > 0``), both probabilities, the counts of the
current window and a decision counter that seeds each coin. It knows nothing about Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from astraflow.topics.messages import Prompt
from astraflow.typed_config import Bounds

from .base import Outcome, PromptCurator, param, uniform

KINDS = ("easy", "hard")


@dataclass(frozen=True)
class GresoParams:
    p0: float = param(0.5, "initial base of the schedule probability p_kind ** z, for both kinds", bounds=Bounds(0, 1))
    target_easy: float = param(0.083, "target share of considered prompts skipped as easy", bounds=Bounds(0, 1))
    target_hard: float = param(0.167, "target share of considered prompts skipped as hard", bounds=Bounds(0, 1))
    floor_easy: float = param(0.10, "an easy prompt is scheduled with at least this probability", bounds=Bounds(0, 1))
    floor_hard: float = param(0.40, "a hard prompt is scheduled with at least this probability", bounds=Bounds(0, 1))
    step: float = param(0.01, "how far p_easy / p_hard move per policy version",
                        bounds=Bounds(0, 1, lo_open=True, hi_open=True))
    p_min: float = param(0.01, "lower clamp of p_easy / p_hard", bounds=Bounds(0, 1))
    p_max: float = param(0.99, "upper clamp of p_easy / p_hard", bounds=Bounds(0, 1))

    def __post_init__(self) -> None:
        for key in ("p0", "target_easy", "target_hard", "floor_easy", "floor_hard", "p_min", "p_max"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"greso.{key} must be in [0, 1], got {getattr(self, key)}")
        if not 0.0 < self.step < 1.0:
            raise ValueError(f"greso.step must be in (0, 1), got {self.step}")
        if self.p_min > self.p_max:
            raise ValueError(f"greso.p_min ({self.p_min}) must not exceed p_max ({self.p_max})")


class Greso(PromptCurator):
    name = "greso"
    Params = GresoParams

    def __init__(self, params: GresoParams, ctx) -> None:
        super().__init__(params, ctx)
        self.streaks: dict[str, tuple[int, str]] = {}  #: prompt id -> (z, kind), only z > 0
        self.p = {k: params.p0 for k in KINDS}
        self.window = {"considered": 0, "easy": 0, "hard": 0}  #: decisions since the last version
        self.decisions = 0
        self.last_version = -1

    def schedule_probability(self, prompt_id: str) -> float:
        z, kind = self.streaks.get(prompt_id, (0, "hard"))
        if z == 0:
            return 1.0
        floor = self.params.floor_easy if kind == "easy" else self.params.floor_hard
        return max(self.p[kind] ** z, floor)

    def should_schedule(self, prompt: Prompt, version: int) -> bool:
        self.decisions += 1
        self.window["considered"] += 1
        prob = self.schedule_probability(prompt.prompt_id)
        if prob >= 1.0 or uniform(self.ctx.seed, "greso", prompt.prompt_id, self.decisions) < prob:
            return True
        self.window[self.streaks[prompt.prompt_id][1]] += 1
        return False

    def update(self, outcome: Outcome) -> None:
        if outcome.zero_variance:
            z, _ = self.streaks.get(outcome.prompt_id, (0, "hard"))
            self.streaks[outcome.prompt_id] = (z + 1, "easy" if outcome.mean > 0.5 else "hard")
        else:
            self.streaks.pop(outcome.prompt_id, None)

    def on_version(self, version: int) -> None:
        if version <= self.last_version:
            return
        self.last_version = version
        considered = self.window["considered"]
        if considered == 0:
            return
        targets = {"easy": self.params.target_easy, "hard": self.params.target_hard}
        for kind in KINDS:
            move = self.params.step if self.window[kind] / considered > targets[kind] else -self.params.step
            self.p[kind] = round(min(self.params.p_max, max(self.params.p_min, self.p[kind] + move)), 9)
        self.window = {"considered": 0, "easy": 0, "hard": 0}

    def state(self) -> dict[str, Any]:
        return {"streaks": {pid: [z, kind] for pid, (z, kind) in sorted(self.streaks.items())},
                "p": dict(self.p), "window": dict(self.window), "decisions": self.decisions,
                "last_version": self.last_version}

    def load_state(self, state: dict[str, Any]) -> None:
        self.streaks = {pid: (int(z), str(kind)) for pid, (z, kind) in state.get("streaks", {}).items()}
        self.p = {k: float(v) for k, v in state.get("p", self.p).items()}
        self.window = {k: int(v) for k, v in state.get("window", self.window).items()}
        self.decisions = int(state.get("decisions", 0))
        self.last_version = int(state.get("last_version", -1))

    def stats(self) -> dict[str, float]:
        return {"p_easy": self.p["easy"], "p_hard": self.p["hard"], "streaks": float(len(self.streaks))}
