"""The dataflow actor: schedules tasks under the staleness bound and assembles batches.

Owns the job's data schedule for one policy:

* **prompts → tasks.** Task ``i`` may be scheduled only while
  ``scheduled < (version + max_staleness + 1) * B + dropped`` where ``version`` is the
  newest announced policy version, ``B`` the groups per batch and ``dropped`` the tasks
  settled without a batch so far (stale or failed groups). A sample generated at version
  ``v`` therefore lands in a batch trained at version ``<= v + max_staleness``;
  ``max_staleness = 0`` is the synchronous schedule. Scheduling stops at the training
  horizon (``steps * B + dropped``), so no task is left unneeded after the last batch.
* **trajectories → batches.** A group answers an open task or is a duplicate (a group for
  a task never published is ``unknown_task``); its content is checked
  (:mod:`.group_checks`: token ids inside the model's vocabulary, lengths within the task's
  limits, rewards finite and inside the reward's range, the group's size), and a group
  that fails is dead-lettered with the check's name, counted in ``dataflow.groups_rejected``
  and dropped with that reason, which frees its slot for a replacement like a failed
  group's. A group that passes is checked against the bound once more for the batch it
  enters, and written as ``Batch(step=k)``. Every group consumed without a batch gets a :class:`GroupDrop` on
  ``drops.<policy>`` with its reason and coordinates (the conservation audit reads them).
  Offsets are committed only up to the first group still waiting, so a restart re-reads
  exactly the partial batch.
* **data algorithms** (:mod:`astraflow.algorithms`, ``dataflow.algorithms``): curators
  decide which prompts become tasks, filters drop finished groups with a reason, and
  composers order a batch's fresh groups and add replayed ones (marked in the batch).
  Replay slots shrink the fresh groups a batch needs and over-sampling widens the
  schedule; both enter the bound through ``DataPipeline.fresh_until``. Curators learn
  from a group when it is settled (batched or dropped), i.e. in the transaction that
  records the settlement, so a restart re-reading a group never learns from it twice.
  When the prompts run out the next pass over them begins (``prompt_epoch``).

* **several policies** (``policies:`` + ``workflow.roles``): a task is an episode of the
  workflow, scheduled on the lead policy's ``tasks.<lead>``; every policy is a *lane* with
  its own ledger, staleness bound, partial batch and ``batches.<p>``. Every role of an
  episode generates, so an episode is *admitted* only when each lane it trains has room
  under its bound, and it opens one group per role in each of them (``Task.train``): no
  role's generation is rolled out for a lane that cannot take it. The lanes it trains are
  every lane still short of its training horizon; a lane that has scheduled every group
  its steps need sits out (its role still plays), which happens only at the end of a job,
  while another lane replaces groups it dropped. A lane whose trainer lags holds what it
  was given (groups waiting in its partial batch, batches its trainer has not reached),
  and that backlog is bounded by the lane's own staleness bound: nothing is admitted past
  it, since a group there, rolled out on the weights the lane's pool has now, would train
  more than ``max_staleness`` versions later and be dropped as ``stale``. So the tightest
  lane paces admission, and each lane still writes a batch as soon as its own is full
  (``barrier: async``); ``barrier: lockstep`` admits only when every lane (finished ones
  included) has room and writes batch ``k`` of every policy together.

Nothing lives only in memory: every transaction (tasks + prompt offsets; drops, batch +
trajectory offsets) also writes the :class:`~astraflow.actors.ledger.Ledger`'s compact
state and the algorithms' state to ``dataflow-state.<policy>``, so a restarted actor
reads one record and the committed offsets, never the history (a replay buffer, made of
trained groups, is read back from the last batches).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter

from kafka import TopicPartition
from opentelemetry import trace
from opentelemetry.trace import Link

from astraflow.algorithms import Candidate, TrainedGroup, build_pipeline
from astraflow.algorithms.pipeline import context_of, digest, team_free_specs
from astraflow.config import GENERATORS, JobConfig
from astraflow.topics import (Batch, Consumer, DeadLetters, Delivery, Producer, Prompt, Task,
                              TrajectoryGroup, VersionAnnouncement)
from astraflow.topics import tracing as topic_tracing, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.messages import DROP_REASONS
from astraflow.topics.replay import read_topic
from astraflow.topics import security

from .common import close_quietly
from .group_checks import CONTENT_REASONS, GroupLimits, ImpossibleGroup, impossible, limits_for
from .heldout import training_prompts
from .ledger import Ledger, read_state
from .signing import GroupGate, VersionGate
from .supervisor import LoopActor
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class Lane:
    """One policy's share of the dataflow: its bound, ledger, algorithms and partial batch."""

    def __init__(self, cfg: JobConfig, roles: list[str], multi_role: bool, schedules_prompts: bool = True) -> None:
        self.cfg, self.policy = cfg, cfg.policy
        self.roles, self.multi_role = roles, multi_role  #: the workflow roles this policy plays
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


class DataflowActor(LoopActor):
    """Prompts → tasks under the staleness bound; trajectories → batches (one lane per policy)."""

    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str) -> None:
        super().__init__(supervisor, name)
        self.job, self.bootstrap = cfg, bootstrap
        bound = cfg.role_policies
        multi_role = len(bound) > 1
        self.lead = cfg.lead_policy
        self.lanes = {p: Lane(cfg.view(p), [r for r, q in bound.items() if q == p], multi_role,
                              schedules_prompts=p == self.lead)
                      for p in cfg.policy_names}
        self.lockstep = cfg.barrier == "lockstep" and len(self.lanes) > 1
        self.cfg = cfg.view(self.lead)  # the scheduling lane's view: prompts, tasks, sampling
        self.topics = job_topics(cfg)
        self._clients: list = []

    # The lead lane's fields under their single-policy names (tests and tools read them).
    @property
    def main(self) -> Lane:
        return self.lanes[self.lead]

    @property
    def ledger(self) -> Ledger:
        return self.main.ledger

    @property
    def pipeline(self):
        return self.main.pipeline

    @property
    def version(self) -> int:
        return self.main.version

    @property
    def partial(self) -> list[Delivery]:
        return self.main.partial

    @property
    def B(self) -> int:
        return self.main.B

    @property
    def staleness(self) -> int:
        return self.main.staleness

    # -- start-up: rebuild state from the topics ---------------------------------------
    def setup(self) -> None:
        cfg, policy = self.cfg, self.lead
        self.plain = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}"))
        # It writes the batches: its records may be as large as batches.<policy> takes.
        self.txn = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}",
                                       max_request_size=self.topics.max_message_bytes(
                                           *(self.topics.batches(p) for p in self.lanes)),
                                       transactional_id=f"af.{cfg.job}.dataflow.{policy}",
                                       transaction_timeout_ms=cfg.kafka.transaction_timeout_ms))
        self.dead = DeadLetters(self.plain, self.topics.dlq, f"dataflow.{policy}", recall=self.bootstrap)
        self.metrics = MetricsEmitter(self.plain, self.topics.metrics, f"dataflow.{policy}")
        self.versions_gate = VersionGate(self.job, self.dead, self.metrics)  # only signed versions count
        self.groups_gate = GroupGate(self.job, self.dead, self.metrics)  # only the pool's signed groups count
        self.content_rejected: Counter = Counter()  #: signed groups refused by a content check, by reason
        for lane in self.lanes.values():
            lane.limits = limits_for(self.job, lane.policy)
        self._load_prompts()
        self.prompts_end = self._end_offset(self.topics.prompts)
        self.state_records_read = 0
        for lane in self.lanes.values():
            p = lane.policy
            state, read = read_state(self.bootstrap, self.topics.dataflow_state(p), p, dead_letters=self.dead)
            self.state_records_read += read
            if state is None and self._end_offset(self.topics.batches(p)) > 0:
                raise RuntimeError(f"{self.topics.batches(p)} holds batches but "
                                   f"{self.topics.dataflow_state(p)} has no dataflow state: the job was written "
                                   f"by an older astraflow; finish it with that version or start a new job")
            lane.ledger = Ledger(p, state)
            lane.pipeline.load_state(lane.ledger.algorithms)
            self._restore_composers(lane)
            if lane.pipeline.replay_slots(1) and lane.cfg.trainer.engine.loss == "grpo":
                log.warning("dataflow: replay with loss 'grpo' clips most replayed (stale) tokens away; "
                            "decoupled_ppo or m2po correct for the policy lag (trainer.engine.loss)")
        group, client = self.topics.dataflow_group(policy), f"dataflow.{policy}"
        self.prompts = self._keep(Consumer(self.bootstrap, topics=[self.topics.prompts], group_id=group,
                                           dead_letters=self.dead, client_id=client, expect=(Prompt,)))
        # One consumer for both inputs the loop waits on, so a poll returns on whichever comes
        # first: a group finished, or a version announced (which lets more tasks be scheduled,
        # on the path of the batch after next). ``versions`` offsets are never committed: each
        # assignment re-reads the compacted topic from its start, like the plain reader it was.
        self.trajectories = self._keep(Consumer(self.bootstrap, topics=[self.topics.trajectories, self.topics.versions],
                                                group_id=group + ".trajectories", dead_letters=self.dead,
                                                client_id=client, max_poll_records=500,
                                                expect={self.topics.trajectories: (TrajectoryGroup,),
                                                        self.topics.versions: (VersionAnnouncement,)}))
        log.info("dataflow: resuming at step %d, %d tasks scheduled, %d dropped, %d open (%d state record(s) read)",
                 self.ledger.next_step, self.ledger.tasks_scheduled, self.ledger.dropped, len(self.ledger.open),
                 self.state_records_read)
        self.metrics.emit("dataflow.resumed", self.ledger.next_step, step=self.ledger.next_step,
                          state_records_read=self.state_records_read,
                          algorithms_digest=digest(self.pipeline.state()))

    def _restore_composers(self, lane: Lane) -> None:
        """A replay buffer holds trained groups: read them back from the last batches."""
        n = lane.pipeline.history
        if not n or lane.ledger.next_step == 0:
            return
        fresh = [TrainedGroup(g, src, b.step)
                 for _, _, b in read_topic(self.bootstrap, self.topics.batches(lane.policy), tail=n)
                 if isinstance(b, Batch) and b.step < lane.ledger.next_step
                 for i, (g, src) in enumerate(zip(b.groups, b.sources)) if not b.is_replay(i)]
        lane.pipeline.restore(fresh)

    def _keep(self, client):
        self._clients.append(client)
        return client

    def _load_prompts(self) -> None:
        """Publish the dataset to ``prompts`` once (a transaction: all of it or none).

        Several sources (dataset mixing) are interleaved in proportion to their weights. The
        evaluator's held-out rows are never published (:func:`.heldout.training_prompts`).
        """
        from astraflow.workflows.datasets import bad_row_handler
        if self._end_offset(self.topics.prompts) > 0:
            return
        needed = self.cfg.data.num_prompts or 2 * self.cfg.trainer.steps * self.B
        sources = self.pipeline.sources() or {self.cfg.data.source: 1.0}
        loaded = {spec: training_prompts(self.cfg, spec, needed if spec in GENERATORS else self.cfg.data.num_prompts,
                                         bad_row_handler(self.cfg.data.on_bad_row, self.dead))
                  for spec in sources}
        prompts = interleave(loaded, sources)
        with self.txn.transaction():
            for p in prompts:
                self.txn.send(self.topics.prompts, p, key=p.prompt_id, trace=False)
        log.info("dataflow: published %d prompts to %s", len(prompts), self.topics.prompts)

    def _end_offset(self, topic: str) -> int:
        probe = security.consumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed")
        try:
            tp = TopicPartition(topic, 0)
            return probe.end_offsets([tp])[tp]
        finally:
            probe.close()

    # -- the loop ----------------------------------------------------------------------
    def step(self) -> None:
        self._schedule()
        self._collect()

    def _follow(self, msg: VersionAnnouncement) -> None:
        # The newest lineage wins (epoch first): after a trainer resumed behind its announced
        # head, versions restart lower in a new epoch, and the bound must follow them down.
        lane = self.lanes.get(msg.policy)
        if lane is not None and (msg.epoch, msg.version) > (lane.epoch, lane.version):
            lane.epoch, lane.version = msg.epoch, msg.version
            lane.pipeline.on_version(lane.version)

    def capacity(self) -> int:
        """How many more tasks may be scheduled now: the lead lane's room (one policy: its bound)."""
        return self.main.capacity() // len(self.main.keys("t"))

    def _training_lanes(self) -> list[Lane]:
        """The lanes the next episode trains, or none while it may not be admitted.

        Async: every lane still scheduling (:meth:`Lane.schedules`), and only when each of
        them has room under its bound (an episode generates every role, so admitting one a
        lane cannot take would roll out that lane's part for nothing). Lockstep: every
        lane, all or none.
        """
        if self.lockstep:
            ready = [lane for lane in self.lanes.values() if lane.has_room()]
            return ready if len(ready) == len(self.lanes) else []
        training = [lane for lane in self.lanes.values() if lane.schedules()]
        return training if all(lane.has_room() for lane in training) else []

    def _episode_room(self) -> int:
        """How many episodes may be admitted now (several policies): the tightest lane's room."""
        lanes = self.lanes.values() if self.lockstep else [lane for lane in self.lanes.values() if lane.schedules()]
        return min((lane.capacity() // len(lane.keys("t")) for lane in lanes), default=0)

    #: polls per step while curators reject prompts (the rest waits for the next step)
    CURATOR_POLLS = 8

    def _schedule(self) -> None:
        room = self.capacity() if len(self.lanes) == 1 else self._episode_room()
        if room <= 0:
            # A full window can outlast the consumer's max_poll_interval (a slow trainer step):
            # polling held keeps the prompts consumer in its group instead of being expelled
            # and rejoining each time.
            self.prompts.hold(True)
            self.prompts.poll(0)
            return
        self.prompts.hold(False)
        tasks: list[Task] = []
        for _ in range(self.CURATOR_POLLS if self.pipeline.curators else 1):
            prompts = self.prompts.poll(100, max_records=room - len(tasks))
            if not prompts and not self.prompts.pending_offsets() and self._prompts_exhausted():
                self._next_prompt_epoch()
                continue
            # Dead-lettered prompts advance the offsets but make no task: they take no slot.
            for d in prompts:
                if not self.pipeline.decide(d.message, self.version).schedule:
                    continue
                lanes = self._training_lanes() if len(self.lanes) > 1 else [self.main]
                if not lanes:  # cannot happen: the poll took at most the tightest lane's room
                    raise RuntimeError("dataflow: a polled prompt found no lane with room")
                task = self._task(d, lanes)
                tasks.append(task)
                for lane in lanes:
                    lane.ledger.scheduled(lane.keys(task.task_id))
                    lane.prompt_bytes.update(dict.fromkeys(lane.keys(task.task_id), len(task.prompt.encode())))
                self.pipeline.scheduled(task.task_id, d.message, self.version)
            if not prompts or len(tasks) >= room:
                break
        offsets = self.prompts.pending_offsets()
        if not offsets:
            return
        with self.txn.transaction():
            for task in tasks:
                with tracer.start_as_current_span("dataflow.schedule", attributes={
                        "task.id": task.task_id, "prompt.id": task.prompt_id, "policy.version": self.version}):
                    self.txn.send(self.topics.tasks(self.lead), task, key=task.task_id)
            self._send_state()
            self.txn.send_offsets(self.prompts, offsets)
        self.metrics.emit("dataflow.scheduled", self.ledger.tasks_scheduled, step=self.version)
        if self.pipeline.curators:
            self._emit_algorithm_stats(self.main, self.version)

    def _task(self, d: Delivery, lanes: list[Lane]) -> Task:
        r, epoch = self.cfg.rollout, self.ledger.prompt_epoch
        sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                    "max_new_tokens": r.max_new_tokens}
        # A prompt's offset names its task within a pass; later passes add the pass number.
        task_id = f"t{d.offset:07d}-{d.message.prompt_id}" if epoch == 0 else \
            f"t{d.offset:07d}.{epoch}-{d.message.prompt_id}"
        wf = self.job.workflow
        multi = len(self.job.role_policies) > 1
        return Task(task_id=task_id, prompt_id=d.message.prompt_id, policy=self.lead, prompt=d.message.text,
                    answer=d.message.answer, n_samples=r.n_samples, sampling=sampling,
                    scheduled_version=self.version, created_at=time.time(), workflow=wf.name,
                    role=next(iter(self.job.role_policies)),
                    roles=dict(self.job.role_policies) if multi else {},
                    train=sorted(role for lane in lanes for role in lane.roles) if multi else [],
                    params=dict(wf.params), metadata=dict(d.message.metadata),
                    scheduled_versions={lane.policy: lane.version for lane in self.lanes.values()} if multi else {})

    def _prompts_exhausted(self) -> bool:
        tp = TopicPartition(self.topics.prompts, 0)
        return tp in self.prompts.assignment() and self.prompts.raw.position(tp) >= self.prompts_end

    def _next_prompt_epoch(self) -> None:
        """Every prompt was read: begin the next pass (its own transaction: pass number and offset 0)."""
        tp = TopicPartition(self.topics.prompts, 0)
        self.ledger.prompt_epoch += 1
        with self.txn.transaction():
            self._send_state()
            self.txn.send_offsets(self.prompts, {tp: 0})
        self.prompts.raw.seek(tp, 0)
        log.info("dataflow: every prompt read; pass %d over %s begins", self.ledger.prompt_epoch, self.topics.prompts)
        self.metrics.emit("dataflow.prompt_epoch", self.ledger.prompt_epoch, step=self.version)

    def _emit_algorithm_stats(self, lane: Lane, step: int) -> None:
        labels = {"policy": lane.policy} if len(self.lanes) > 1 else {}
        self.metrics.emit_many({f"dataflow.algorithms.{k}": v for k, v in lane.pipeline.stats().items()},
                               step=step, **labels)

    #: How long one step waits for a group or a version when neither has come.
    COLLECT_POLL_MS = 200

    def _collect(self) -> None:
        for d in self.trajectories.poll(self.COLLECT_POLL_MS):
            if d.topic == self.topics.versions:
                if self.versions_gate.admits(d):
                    self._follow(d.message)
                continue
            lane = self.lanes.get(d.message.policy)
            # Another job's dataflow would settle foreign policies; ours has a lane per policy.
            if lane is None or lane.ledger.already_settled(d) or not self.groups_gate.admits(d):
                continue
            reason = lane.ledger.verdict(d)
            detail = f"group {d.message.group_key} is not open" if reason == "duplicate" else d.message.error
            if reason == "duplicate" and not self._published(d.message):
                reason, detail = "unknown_task", f"task {d.message.task_id[:80]!r} was never published"
            if reason != "duplicate":
                prompt_bytes = lane.prompt_bytes.pop(d.message.group_key, None)
                if reason is None and (bad := impossible(d.message, lane.limits, prompt_bytes=prompt_bytes)):
                    reason, detail = bad
                if reason in CONTENT_REASONS:
                    self._refuse(lane, d, reason, detail)
            if reason is None and (verdict := lane.pipeline.verdict(d.message)) is not None:
                reason, detail = verdict[0], f"dropped by {verdict[1]}"
            if reason is None:
                lane.ledger.wait(d)
                lane.partial.append(d)
            else:
                self._drop(lane, d, reason, detail)
        if self.lockstep:
            while all(self._ready(lane) for lane in self.lanes.values()):
                for lane in self.lanes.values():
                    self._fill_batch(lane)
        else:
            for lane in self.lanes.values():
                while self._ready(lane) and self._fill_batch(lane):
                    pass
        if any(lane.ledger.pending_drops for lane in self.lanes.values()):
            with self.txn.transaction():
                self._send_drops_and_state(self._safe_offsets())

    #: what the dataflow names its tasks (:meth:`_task`): prompt offset, pass (from the 2nd), prompt id
    _TASK_ID = re.compile(r"t(\d+)(?:\.(\d+))?-(.*)", re.S)

    def _published(self, g: TrajectoryGroup) -> bool:
        """Whether ``g``'s task may be one this dataflow published: an id it writes, for the
        group's prompt, at an offset of ``prompts`` in a pass begun (the settled tasks are not
        kept; a group for one of them is a ``duplicate``)."""
        m = self._TASK_ID.fullmatch(g.task_id)
        if m is None or m[3] != g.prompt_id:
            return False
        offset, epoch = int(m[1]), int(m[2] or 0)
        if f"{offset:07d}" != m[1] or (m[2] is not None and (epoch == 0 or str(epoch) != m[2])):
            return False
        return epoch <= self.ledger.prompt_epoch and offset < self.prompts_end

    def _refuse(self, lane: Lane, d: Delivery, reason: str, detail: str) -> None:
        """A signed group whose content is impossible: dead-lettered (once: the letters recall
        what was refused before a restart) with the check's name, counted; the caller drops it."""
        g = d.message
        self.content_rejected[reason] += 1
        log.warning("dataflow: refusing the trajectory group at %s[%d]@%d (task %s, from %r): %s: %s", d.topic,
                    d.partition, d.offset, g.task_id[:80], g.node_id[:80], reason, detail)
        try:
            value = encode(g)[0]
        except (TypeError, ValueError):
            value = b""
        self.dead.put(d.topic, d.partition, d.offset, d.key.encode() if d.key is not None else None, value,
                      d.headers, ImpossibleGroup(reason, detail))
        self.metrics.emit("dataflow.groups_rejected", 1, reason=reason, policy=lane.policy)

    def _drop(self, lane: Lane, d: Delivery, reason: str, detail: str = "") -> None:
        lane.ledger.drop(d, reason, lane.ledger.next_step, detail)
        # A duplicate's task was settled, and learnt from, by its first group; an unknown task
        # is none of ours. A group refused for its content settles its task, teaching nothing.
        if DROP_REASONS[reason]:
            lane.pipeline.settled(d.message, learn=reason not in CONTENT_REASONS)
        self.metrics.emit(f"dataflow.dropped.{reason}", 1, step=lane.ledger.next_step, task=d.message.task_id,
                          policy=lane.policy)

    def _oldest_version(self, d: Delivery, default: int) -> int:
        return min((min(s.own_versions(), default=default) for s in d.message.samples), default=default)

    def _ready(self, lane: Lane) -> bool:
        """Drop what went stale for the next batch; True when the lane can fill it."""
        k = lane.ledger.next_step
        if k >= lane.cfg.trainer.steps and len(self.lanes) > 1:
            return False  # this policy is done; its late groups wait (a finished job has none)
        fresh = []
        for d in lane.partial:
            oldest = self._oldest_version(d, k)
            if k - oldest > lane.staleness:
                self._drop(lane, d, "stale", f"a token of version {oldest} cannot train at step {k}")
            else:
                fresh.append(d)
        lane.partial = fresh
        return len(lane.partial) >= lane.B - lane.pipeline.replay_slots(k)

    def _fill_batch(self, lane: Lane) -> bool:
        k = lane.ledger.next_step
        pipeline, policy = lane.pipeline, lane.policy
        plan = pipeline.compose(k, [Candidate(d, d.message, self._oldest_version(d, k) + lane.staleness, i)
                                    for i, d in enumerate(lane.partial)])
        members = [c.item for c in plan.fresh[:plan.fresh_slots]]
        taken = {id(d) for d in members}
        lane.partial = [d for d in lane.partial if id(d) not in taken]
        groups = [d.message for d in members]
        lane.ledger.batched(members)
        for g in groups:
            pipeline.settled(g)
        offsets = self._safe_offsets()
        replayed = [r.group for r in plan.replay]
        rewards = [s.reward for g in groups + replayed for s in g.samples]
        staleness = [k - min(s.own_versions()) for g in groups for s in g.samples if s.own_versions()]
        stats = {"dropped_total": lane.ledger.dropped, "reward_mean": sum(rewards) / len(rewards),
                 "staleness_max": max(staleness, default=0), "staleness_mean": sum(staleness) / max(1, len(staleness)),
                 "created_at": time.time()}
        team = [g.stats["team_reward"] for g in groups if "team_reward" in g.stats]
        if team:
            stats["team_reward"] = sum(team) / len(team)
        if replayed:
            stats["replayed"] = len(replayed)
        batch = Batch(policy, k, groups + replayed, [d.source for d in members] + [r.source for r in plan.replay],
                      stats, [False] * len(groups) + [True] * len(replayed) if replayed else [])
        links = [Link(sc) for sc in (topic_tracing.span_context(d.headers) for d in members) if sc is not None]
        with tracer.start_as_current_span("dataflow.batch", context=members[0].trace_context, links=links,
                                          attributes={"batch.step": k, "batch.groups": len(groups),
                                                      "policy": policy}):
            with self.txn.transaction():
                self.txn.send(self.topics.batches(policy), batch, key=str(k))
                self._send_drops_and_state(offsets)
        pipeline.trained(k, [TrainedGroup(d.message, d.source, k) for d in members])
        labels = {"policy": policy} if len(self.lanes) > 1 else {}
        self.metrics.emit_many({"dataflow.batch_reward": batch.stats["reward_mean"],
                                "dataflow.batch_staleness_max": batch.stats["staleness_max"],
                                **({"dataflow.team_reward": stats["team_reward"]} if team else {})},
                               step=k, **labels)
        if not pipeline.empty:
            self._emit_algorithm_stats(lane, k)
        return True

    def _send_drops_and_state(self, offsets: dict[TopicPartition, int]) -> None:
        """Inside a transaction: the drops so far, the state, and the offsets past what they settle."""
        for lane in self.lanes.values():
            for drop in lane.ledger.take_drops():
                self.txn.send(self.topics.drops(lane.policy), drop, key=drop.task_id)
            lane.ledger.committed(offsets)
        self._send_state()
        self.txn.send_offsets(self.trajectories, offsets)

    def _send_state(self, lanes=None) -> None:
        for lane in lanes or self.lanes.values():
            if lane is not self.main:  # every lane keeps the prompt pass the schedule is on
                lane.ledger.prompt_epoch = self.main.ledger.prompt_epoch
            self.txn.send(self.topics.dataflow_state(lane.policy), lane.ledger.state(lane.pipeline.state()),
                          key=lane.policy)

    def _safe_offsets(self) -> dict[TopicPartition, int]:
        """Commit past everything consumed, except groups still waiting in a partial batch."""
        offsets = {tp: o for tp, o in self.trajectories.pending_offsets().items() if tp.topic != self.topics.versions}
        for lane in self.lanes.values():
            for d in lane.partial:
                tp = TopicPartition(d.topic, d.partition)
                offsets[tp] = min(offsets.get(tp, d.offset), d.offset)
        return offsets

    def teardown(self) -> None:
        close_quietly(*reversed(self._clients))
        self._clients.clear()


def interleave(loaded: dict[str, list[Prompt]], weights: dict[str, float]) -> list[Prompt]:
    """One list of every source's prompts, each source spread in proportion to its weight
    (the source furthest behind its share goes next; exhausted sources drop out)."""
    if len(loaded) == 1:
        return next(iter(loaded.values()))
    queues = {s: list(reversed(p)) for s, p in loaded.items()}
    taken = dict.fromkeys(loaded, 0)
    out: list[Prompt] = []
    while any(queues.values()):
        live = [s for s in queues if queues[s]]
        total = sum(weights[s] for s in live)
        s = max(live, key=lambda s: weights[s] / total * (len(out) + 1) - taken[s])
        out.append(queues[s].pop())
        taken[s] += 1
    return out
