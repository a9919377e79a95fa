"""A dataflow's lanes: one per policy, each with its own bound, ledger, partial batch and batches.

A task is an episode of the job's workflow, scheduled on the lead policy's ``tasks.<lead>``;
every policy is a *lane* with its own ledger, staleness bound, data algorithms, partial
batch and ``batches.<p>``. A single-policy job is one lane; nothing here asks how many
there are.

Every role of an episode generates, so an episode is *admitted* only when each lane it
trains has room under its bound (:func:`training_lanes`), and it opens one group per role
in each of them (``Task.train``): no role's generation is rolled out for a lane that cannot
take it. The lanes it trains are every lane still short of its training horizon; a lane that
has scheduled every group its steps need sits out (its role still plays), which happens
only at the end of a job, while another lane replaces groups it dropped. A lane whose
trainer lags holds what it was given (groups waiting in its partial batch, batches its
trainer has not reached), and that backlog is bounded by the lane's own staleness bound:
nothing is admitted past it, since a group there, rolled out on the weights the lane's pool
has now, would train more than ``max_staleness`` versions later and be dropped as
``stale``. So the tightest lane paces admission (:func:`episode_room`), and each lane
writes a batch as soon as its own is full (``barrier: async``); ``barrier: lockstep``
admits only when every lane (finished ones included) has room and writes batch ``k`` of
every policy together.

It knows nothing about Kafka: the dataflow actor (:mod:`.dataflow`) reads and writes the
records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from astraflow.algorithms import build_pipeline
from astraflow.algorithms.pipeline import context_of, team_free_specs
from astraflow.config import JobConfig
from astraflow.topics import Batch, Delivery

from .group_checks import GroupLimits
from .ledger import Ledger


class Lane:
    """One policy's share of the dataflow: its bound, ledger, algorithms and partial batch."""

    def __init__(self, cfg: JobConfig, roles: list[str], multi_role: bool, schedules_prompts: bool,
                 labels: dict[str, str]) -> None:
        self.cfg, self.policy = cfg, cfg.policy
        self.roles, self.multi_role = roles, multi_role  #: the workflow roles this policy plays
        self.labels = labels  #: what its batch metrics are labelled with (the policy, in a job of several)
        self.B = cfg.dataflow.groups_per_batch
        self.staleness = cfg.effective_staleness
        self.epoch = self.version = 0
        self.partial: list[Delivery] = []
        # The prompt curators choose what the team's episodes run on, once for every policy:
        # they run in the lead lane only (config.py refuses one a non-lead policy adds); every
        # lane runs its own filters and composers on its own groups.
        specs = cfg.dataflow.algorithms if schedules_prompts else team_free_specs(cfg.dataflow.algorithms)
        self.pipeline = build_pipeline(specs, context_of(cfg), cfg.dataflow.force_after_skips)
        self.ledger: Ledger | None = None
        self.limits: GroupLimits | None = None  #: what its groups may hold (set up with the dataflow)
        #: open group key -> UTF-8 bytes of its task's prompt (tasks scheduled by this process)
        self.prompt_bytes: dict[str, int] = {}

    def keys(self, task_id: str) -> list[str]:
        """The group keys an episode opens in this lane (``TrajectoryGroup.group_key``)."""
        return [f"{task_id}/{r}" for r in self.roles] if self.multi_role else [task_id]

    def _limits(self) -> tuple[int, int]:
        """The staleness bound and the training horizon, in groups scheduled.

        Without algorithms ``fresh_until(s)`` is ``s * B``; replay slots lower it (batches
        take fewer fresh groups) and over-sampling raises the bound, not the horizon: the
        last batches fill by replacements, so no task is left unneeded at the end.
        """
        led, fresh_until = self.ledger, self.pipeline.fresh_until
        bound = fresh_until(self.version + self.staleness + 1) + led.dropped
        horizon = fresh_until(self.cfg.trainer.steps, oversampled=False) + led.dropped
        return bound, horizon

    def capacity(self) -> int:
        """How many more groups the staleness bound (and the training horizon) allows now."""
        bound, horizon = self._limits()
        return max(0, min(bound, horizon) - self.ledger.tasks_scheduled)

    def has_room(self) -> bool:
        """Room for the groups of one more episode."""
        return self.capacity() >= len(self.keys("t"))

    def schedules(self) -> bool:
        """True while the training horizon lacks an episode's groups: the lane trains the
        next episode (when its bound has room) rather than sitting it out."""
        return self._limits()[1] - self.ledger.tasks_scheduled >= len(self.keys("t"))

    def batch(self, k: int, members: list[Delivery], replay: list) -> Batch:
        """Batch ``k`` of ``members`` (the fresh groups, in the composer's order) and the
        ``replay`` a composer adds (marked replayed), with the batch's statistics."""
        groups, replayed = [d.message for d in members], [r.group for r in replay]
        rewards = [s.reward for g in groups + replayed for s in g.samples]
        staleness = [k - min(s.own_versions()) for g in groups for s in g.samples if s.own_versions()]
        stats = {"dropped_total": self.ledger.dropped, "reward_mean": sum(rewards) / len(rewards),
                 "staleness_max": max(staleness, default=0), "staleness_mean": sum(staleness) / max(1, len(staleness)),
                 "created_at": time.time()}
        team = [g.stats["team_reward"] for g in groups if "team_reward" in g.stats]
        if team:
            stats["team_reward"] = sum(team) / len(team)
        if replayed:
            stats["replayed"] = len(replayed)
        return Batch(self.policy, k, groups + replayed, [d.source for d in members] + [r.source for r in replay],
                     stats, [False] * len(groups) + [True] * len(replayed) if replayed else [])

    def done(self) -> bool:
        """Every step of its trainer has its batch: its late groups wait (a finished job has none)."""
        return self.ledger.next_step >= self.cfg.trainer.steps


def make_lanes(cfg: JobConfig) -> dict[str, Lane]:
    """One lane per policy of the job; the lead policy's schedules the prompts."""
    bound = cfg.role_policies
    multi_role, several = len(bound) > 1, len(cfg.policy_names) > 1
    return {p: Lane(cfg.view(p), [r for r, q in bound.items() if q == p], multi_role,
                    schedules_prompts=p == cfg.lead_policy, labels={"policy": p} if several else {})
            for p in cfg.policy_names}


def _admitting(lanes: Iterable[Lane], lockstep: bool) -> list[Lane]:
    """The lanes whose bounds admission answers to: every lane in lockstep, else those still scheduling."""
    return list(lanes) if lockstep else [lane for lane in lanes if lane.schedules()]


def training_lanes(lanes: Iterable[Lane], lockstep: bool) -> list[Lane]:
    """The lanes the next episode trains, or none while it may not be admitted: every lane
    still scheduling (every lane, in lockstep), and only when each of them has room under its
    bound (an episode generates every role, so admitting one a lane cannot take would roll out
    that lane's part for nothing)."""
    admitting = _admitting(lanes, lockstep)
    return admitting if all(lane.has_room() for lane in admitting) else []


def episode_room(lanes: Iterable[Lane], lockstep: bool) -> int:
    """How many episodes may be admitted now: the tightest lane's room."""
    return min((lane.capacity() // len(lane.keys("t")) for lane in _admitting(lanes, lockstep)), default=0)
