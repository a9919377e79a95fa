"""Dataset mixing: several prompt sources with weights, and metrics per source.

Rule: ``sources`` maps a source (``arithmetic`` or a JSONL/Parquet path, as in
``data.source``; it replaces ``data.source``) to a weight; weights are normalised. The
dataflow publishes every source's prompts interleaved in proportion to the weights; this
curator then holds each source to its share of what is scheduled: a prompt of source
``s`` is scheduled only while ``scheduled[s] < weight[s] * (scheduled_total + 1)``, so
the running shares stay within one prompt of the weights whatever order prompts arrive
in. Prompts of a source it does not know are skipped. Per source it reports prompts
scheduled, groups finished and their mean reward. It knows nothing about Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.topics.messages import Prompt
from astraflow.typed_config import Bounds

from .base import Outcome, PromptCurator, param


def source_name(spec: str) -> str:
    """The ``Prompt.source`` a source's prompts carry (the loaders' naming)."""
    return "arithmetic" if spec == "arithmetic" else Path(spec).name


@dataclass(frozen=True)
class MixingParams:
    sources: dict[str, float] = param({}, "source (arithmetic or a dataset path, relative to the config file) -> "
                                          "weight; replaces data.source", bounds=Bounds(0, 1e6, lo_open=True))

    def __post_init__(self) -> None:
        if len(self.sources) < 2:
            raise ValueError(f"mixing.sources needs at least two sources, got {list(self.sources)}")
        for spec, w in self.sources.items():
            if not w > 0:
                raise ValueError(f"mixing.sources.{spec}: weight must be > 0, got {w}")
        names = [source_name(s) for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"mixing.sources: two sources share a file name ({names}); prompts name their source "
                             f"by file name, so rename one")


class Mixing(PromptCurator):
    name = "mixing"
    Params = MixingParams

    def __init__(self, params: MixingParams, ctx) -> None:
        super().__init__(params, ctx)
        total = sum(params.sources.values())
        self.weights = {source_name(s): w / total for s, w in params.sources.items()}
        self.scheduled = {s: 0 for s in self.weights}
        self.finished = {s: 0 for s in self.weights}
        self.reward_sum = {s: 0.0 for s in self.weights}

    def sources(self) -> dict[str, float]:
        return dict(self.params.sources)

    def should_schedule(self, prompt: Prompt, version: int) -> bool:
        s = prompt.source
        if s not in self.weights:
            return False
        return self.scheduled[s] < self.weights[s] * (sum(self.scheduled.values()) + 1)

    def on_scheduled(self, prompt: Prompt, version: int) -> None:
        if prompt.source in self.scheduled:
            self.scheduled[prompt.source] += 1

    def tags(self, prompt: Prompt) -> dict[str, Any]:
        return {"source": prompt.source}

    def update(self, outcome: Outcome) -> None:
        s = outcome.tags.get("source")
        if s in self.finished:
            self.finished[s] += 1
            self.reward_sum[s] += outcome.mean

    def state(self) -> dict[str, Any]:
        return {"scheduled": dict(self.scheduled), "finished": dict(self.finished),
                "reward_sum": dict(self.reward_sum)}

    def load_state(self, state: dict[str, Any]) -> None:
        for key in ("scheduled", "finished", "reward_sum"):
            getattr(self, key).update(state.get(key, {}))

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        total = sum(self.scheduled.values()) or 1
        for s in self.weights:
            out[f"{s}.share"] = self.scheduled[s] / total
            out[f"{s}.scheduled"] = float(self.scheduled[s])
            if self.finished[s]:
                out[f"{s}.reward_mean"] = self.reward_sum[s] / self.finished[s]
        return out
