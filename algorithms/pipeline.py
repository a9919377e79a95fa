"""One policy's data algorithms, composed: what the dataflow actor calls at each hook.

:class:`DataPipeline` holds the configured curators, filters and composers in config
order and adds what belongs to their composition rather than to any one of them:

* **anti-stall**: after ``force_after_skips`` consecutive rejections the next prompt a
  curator rejects is scheduled anyway (counted as ``forced``), so a curator that rejects
  everything slows a job down but never stalls it;
* **tags of open tasks**: what curators need to know about a prompt when its group comes
  back (its source, its difficulty) is kept per open task until the group is settled;
* **fresh groups per batch**: batch ``k`` takes ``B - replay_slots(k)`` fresh groups, and
  the filters' over-sampling scales how many the schedule may have in flight
  (:meth:`fresh_until`), though never past what the last batch needs;
* **state**: one JSON-able dict (curator states, skip counters, tags) that the dataflow
  writes with every transaction, next to the offsets it covers.

With no algorithms configured it is the identity: every prompt scheduled, every group
kept, FIFO batches of ``B`` fresh groups, and an empty state. It knows nothing about Kafka.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from astraflow.topics.messages import Prompt, TrajectoryGroup

from .base import BatchComposer, BatchPlan, Candidate, Context, GroupFilter, Outcome, PromptCurator, TrainedGroup
from .registry import algorithm_class


class PipelineError(ValueError):
    """A ``dataflow.algorithms`` entry cannot run in this job; ``key`` names it (``algorithms[2]``)."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


class Decision(NamedTuple):
    """Whether a prompt is scheduled now."""

    schedule: bool
    by: str | None = None  #: the curator that rejected it
    forced: bool = False  #: scheduled by the anti-stall rule against a curator's wish


@dataclass
class DataPipeline:
    curators: list[PromptCurator]
    filters: list[GroupFilter]
    composers: list[BatchComposer]
    ctx: Context
    force_after_skips: int = 64

    def __post_init__(self) -> None:
        self.consecutive_skips = 0
        self.skipped: dict[str, int] = {}  #: rejections by curator
        self.forced = 0
        self.considered = 0
        self.inflight: dict[str, dict[str, Any]] = {}  #: open task id -> curator tags
        self.oversample = max([f.oversample for f in self.filters], default=1.0)

    @property
    def algorithms(self) -> list:
        return [*self.curators, *self.filters, *self.composers]

    @property
    def empty(self) -> bool:
        return not self.algorithms

    # -- before rollout ------------------------------------------------------------------
    def decide(self, prompt: Prompt, version: int) -> Decision:
        if not self.curators:
            return Decision(True)
        self.considered += 1
        for c in self.curators:
            if not c.should_schedule(prompt, version):
                if self.consecutive_skips >= self.force_after_skips:
                    self.consecutive_skips = 0
                    self.forced += 1
                    return Decision(True, by=c.name, forced=True)
                self.consecutive_skips += 1
                self.skipped[c.name] = self.skipped.get(c.name, 0) + 1
                return Decision(False, by=c.name)
        self.consecutive_skips = 0
        return Decision(True)

    def sources(self) -> dict[str, float]:
        """The prompt sources to publish with their weights (empty: ``data.source`` alone)."""
        out: dict[str, float] = {}
        for c in self.curators:
            out.update(c.sources())
        return out

    def scheduled(self, task_id: str, prompt: Prompt, version: int) -> None:
        tags: dict[str, Any] = {}
        for c in self.curators:
            c.on_scheduled(prompt, version)
            tags.update(c.tags(prompt))
        if tags:
            self.inflight[task_id] = tags

    def on_version(self, version: int) -> None:
        for c in self.curators:
            c.on_version(version)

    # -- after rollout -------------------------------------------------------------------
    def verdict(self, group: TrajectoryGroup) -> tuple[str, str] | None:
        """``(drop reason, filter name)`` when a filter drops the group, else None."""
        for f in self.filters:
            if not f.keep(group):
                return f.reason, f.name
        return None

    def settled(self, group: TrajectoryGroup, learn: bool = True) -> None:
        """The group of an open task was batched or dropped: curators learn from it (once);
        ``learn=False`` settles the task without learning (a group whose content was refused)."""
        tags = self.inflight.pop(group.task_id, {})
        if not learn or group.status != "ok" or not group.samples or not self.curators:
            return
        outcome = Outcome(group.prompt_id, tuple(s.reward for s in group.samples), group.scheduled_version, tags)
        for c in self.curators:
            c.update(outcome)

    # -- at batch time -------------------------------------------------------------------
    def replay_slots(self, step: int) -> int:
        return sum(c.replay_slots(step) for c in self.composers)

    def fresh_until(self, steps: int, oversampled: bool = True) -> int:
        """Tasks the schedule may have written for batches ``0 .. steps-1`` (before drops);
        ``oversampled=False`` gives the fresh groups those batches take."""
        B = self.ctx.groups_per_batch
        fresh = steps * B - sum(self.replay_slots(k) for k in range(steps)) if self.composers else steps * B
        return fresh if self.oversample == 1.0 or not oversampled else math.ceil(fresh * self.oversample)

    def compose(self, step: int, fresh: list[Candidate]) -> BatchPlan:
        replay = self.replay_slots(step)
        plan = BatchPlan(step, list(fresh), self.ctx.groups_per_batch - replay, replay)
        for c in self.composers:
            c.compose(plan)
        return plan

    def trained(self, step: int, fresh: list[TrainedGroup]) -> None:
        for c in self.composers:
            c.trained(step, fresh)

    @property
    def history(self) -> int:
        """Trained batches the composers need read back after a restart."""
        return max([c.history for c in self.composers], default=0)

    def restore(self, fresh: list[TrainedGroup]) -> None:
        for c in self.composers:
            c.restore(fresh)

    # -- state ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        if self.empty:
            return {}
        return {"consecutive_skips": self.consecutive_skips, "skipped": dict(self.skipped), "forced": self.forced,
                "considered": self.considered, "inflight": dict(self.inflight),
                "algorithms": {a.name: s for a in self.algorithms if (s := a.state())}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.skipped = {k: int(v) for k, v in state.get("skipped", {}).items()}
        self.forced = int(state.get("forced", 0))
        self.considered = int(state.get("considered", 0))
        self.inflight = {k: dict(v) for k, v in state.get("inflight", {}).items()}
        saved = state.get("algorithms", {})
        for a in self.algorithms:
            if a.name in saved:
                a.load_state(saved[a.name])

    def stats(self) -> dict[str, float]:
        out = {f"{a.name}.{k}": v for a in self.algorithms for k, v in a.stats().items()}
        if self.curators:
            out.update({f"skipped.{k}": float(v) for k, v in self.skipped.items()})
            out["forced"] = float(self.forced)
        return out


def build_pipeline(specs, ctx: Context, force_after_skips: int = 64) -> DataPipeline:
    """The pipeline of ``dataflow.algorithms`` (entries in config order within each hook).

    Raises :class:`PipelineError` naming ``algorithms[i]`` when an entry cannot run in this
    job (e.g. replay slots that round to nothing), or when entries conflict.
    """
    curators, filters, composers, seen = [], [], [], {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise PipelineError(f"algorithms[{i}]", f"{spec.name} is already configured as algorithms[{seen[spec.name]}]")
        seen[spec.name] = i
        try:
            algo = algorithm_class(spec.name)(spec.params, ctx)
        except ValueError as e:
            raise PipelineError(f"algorithms[{i}]", str(e)) from None
        {PromptCurator: curators, GroupFilter: filters, BatchComposer: composers}[
            next(b for b in (PromptCurator, GroupFilter, BatchComposer) if isinstance(algo, b))].append(algo)
    if "edf" in seen and "fifo" in seen:
        raise PipelineError(f"algorithms[{max(seen['edf'], seen['fifo'])}]",
                            "edf and fifo are two orders of the same batches; keep one")
    if force_after_skips < 1:
        raise PipelineError("force_after_skips", f"must be >= 1, got {force_after_skips}")
    return DataPipeline(curators, filters, composers, ctx, force_after_skips)


def is_curator(spec) -> bool:
    """Whether a ``dataflow.algorithms`` entry is a prompt curator (it decides what is scheduled)."""
    return issubclass(algorithm_class(spec.name), PromptCurator)


def team_free_specs(specs) -> tuple:
    """``specs`` without the prompt curators: what a lane that does not schedule prompts runs
    (a multi-policy job schedules each prompt once for the team, in the lead policy's lane)."""
    return tuple(s for s in specs if not is_curator(s))


def context_of(cfg) -> Context:
    """The :class:`Context` of a :class:`~astraflow.config.JobConfig`."""
    return context_for(cfg.seed, cfg.dataflow, cfg.rollout, cfg.effective_staleness)


def context_for(seed: int, dataflow, rollout, max_staleness: int) -> Context:
    """The :class:`Context` of a job's (or one policy's) ``dataflow`` and ``rollout`` sections:
    what the config's own checks build before any view of it exists."""
    return Context(seed=seed, groups_per_batch=dataflow.groups_per_batch, n_samples=rollout.n_samples,
                   max_staleness=max_staleness)


def digest(state: dict[str, Any]) -> str:
    """A short fingerprint of an exported state (to compare a restored state with the one written)."""
    return hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
