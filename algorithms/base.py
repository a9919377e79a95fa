"""The three hook points of data algorithms, as one small interface each.

* :class:`PromptCurator` — **before rollout**: may a prompt be scheduled now? Learns from
  finished groups (:class:`Outcome`) and from new policy versions.
* :class:`GroupFilter` — **after rollout**: keep a finished group, or drop it with a reason
  (the dataflow records the drop durably; the conservation audit counts it).
* :class:`BatchComposer` — **at batch time**: the order fresh groups enter a batch and
  which already-trained groups are replayed in it.

Implementations hold plain Python state that they export with ``state()`` and take back
with ``load_state()``; the dataflow writes that state in the same transaction as the
offsets it covers, so a restart never depends on memory. Randomness comes from
:func:`uniform`, a hash of its arguments, so a decision is a function of the state and
the input alone. This module knows nothing about Kafka or the dataflow actor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from astraflow.topics.messages import Prompt, SourceOffset, TrajectoryGroup
from astraflow.typed_config import Bounds


@dataclass(frozen=True)
class Context:
    """What every algorithm may know about the job it runs in."""

    seed: int = 0  #: the job seed (the root of every random decision)
    groups_per_batch: int = 8  #: B
    n_samples: int = 8  #: samples per group
    max_staleness: int = 1


@dataclass(frozen=True)
class Outcome:
    """A finished group, as curators learn from it."""

    prompt_id: str
    rewards: tuple[float, ...]
    scheduled_version: int = 0
    tags: dict[str, Any] = field(default_factory=dict)  #: what curators tagged the prompt with when scheduled

    @property
    def zero_variance(self) -> bool:
        """All samples got the same reward: the group carries no GRPO advantage."""
        return len(set(self.rewards)) <= 1

    @property
    def mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def solved(self) -> float:
        """Share of samples with a positive reward."""
        return sum(1 for r in self.rewards if r > 0) / len(self.rewards) if self.rewards else 0.0


def param(default: Any, help: str, bounds: Bounds | None = None) -> Any:  # noqa: A002 - the config reference's word
    """A config key of an algorithm's ``Params``: its default, the help ``config keys`` shows
    and, for a number, the :class:`~astraflow.typed_config.Bounds` it is loaded within."""
    meta = {"help": help, **({"bounds": bounds} if bounds else {})}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def uniform(*parts: Any) -> float:
    """A number in [0, 1) that depends only on ``parts`` (a reproducible coin)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Algorithm:
    """What every data algorithm has: a registry name, a parameter class, a context."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = type(None)  #: a frozen dataclass of its config keys (``metadata={"help": ...}``)

    def __init__(self, params: Any, ctx: Context) -> None:
        self.params, self.ctx = params, ctx

    def state(self) -> dict[str, Any]:
        """JSON-able state a restart needs (empty: none)."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state` exported."""

    def stats(self) -> dict[str, float]:
        """Gauges for the ``metrics`` topic (``dataflow.<name>.<key>``)."""
        return {}


class PromptCurator(Algorithm):
    """Before rollout: decides whether a prompt is scheduled now."""

    def should_schedule(self, prompt: Prompt, version: int) -> bool:
        raise NotImplementedError

    def on_scheduled(self, prompt: Prompt, version: int) -> None:
        """The prompt became a task (every curator agreed, or the anti-stall rule forced it)."""

    def tags(self, prompt: Prompt) -> dict[str, Any]:
        """What :meth:`update` will need to know about the prompt (kept with the open task)."""
        return {}

    def update(self, outcome: Outcome) -> None:
        """Learn from a finished group of a prompt this job scheduled."""

    def on_version(self, version: int) -> None:
        """A newer policy version was announced."""

    def sources(self) -> dict[str, float]:
        """Prompt sources this curator needs published (``data.source`` specs -> weight); empty: ``data.source``."""
        return {}


class GroupFilter(Algorithm):
    """After rollout: keep a finished group, or drop it with :attr:`reason`."""

    #: the drop reason recorded on ``drops.<policy>``; one of ``DROP_REASONS`` (the audit knows it)
    reason: ClassVar[str] = "filtered"

    #: scheduling headroom: how many groups to roll out per group a batch needs (>= 1)
    @property
    def oversample(self) -> float:
        return 1.0

    def keep(self, group: TrajectoryGroup) -> bool:
        raise NotImplementedError


@dataclass
class Candidate:
    """A fresh group waiting for a batch."""

    item: Any  #: what the dataflow tracks it by (a consumer delivery)
    group: TrajectoryGroup
    deadline: int  #: the last batch step it may enter (oldest token version + max_staleness)
    arrival: int  #: read order


@dataclass(frozen=True)
class TrainedGroup:
    """A group a batch trained fresh: what a replay buffer holds and a batch may take again."""

    group: TrajectoryGroup
    source: SourceOffset  #: its ``trajectories`` record (the audit checks it was trained before)
    step: int  #: the batch that trained it fresh


@dataclass
class BatchPlan:
    """One batch being composed: composers reorder ``fresh`` and fill ``replay``."""

    step: int
    fresh: list[Candidate]  #: waiting groups; the first ``fresh_slots`` enter the batch
    fresh_slots: int
    replay_slots: int
    replay: list[TrainedGroup] = field(default_factory=list)


class BatchComposer(Algorithm):
    """At batch time: the order of fresh groups and the replayed ones."""

    #: trained batches :meth:`restore` needs to read back after a restart
    history: int = 0

    def replay_slots(self, step: int) -> int:
        """Groups batch ``step`` takes from replay: a pure function of the config, so the
        dataflow can size its schedule (fresh groups per batch) ahead of time."""
        return 0

    def compose(self, plan: BatchPlan) -> None:
        """Reorder ``plan.fresh`` and/or fill ``plan.replay``."""

    def trained(self, step: int, fresh: list[TrainedGroup]) -> None:
        """The fresh groups batch ``step`` trained (for a replay buffer)."""

    def restore(self, fresh: list[TrainedGroup]) -> None:
        """After a restart: the fresh groups of the last ``history`` batches, oldest first."""
