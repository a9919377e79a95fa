"""The dataflow actor: schedules tasks under the staleness bound and assembles batches.

Owns the job's data schedule, for every policy of it (one lane each):

* **prompts → tasks.** The dataset is published to ``prompts`` once (:mod:`.prompt_source`).
  Task ``i`` may be scheduled only while
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
* **lanes** (:mod:`.lanes`): every policy is a lane with its own ledger, bound, algorithms,
  partial batch and ``batches.<p>`` (a single-policy job is one lane). A task is an episode
  of the workflow (:func:`.tasks.make_task`), admitted only when every lane it trains has
  room, and the tightest lane paces admission; each lane writes its batch when its own is
  full (``barrier: async``), or batch ``k`` of every lane together (``lockstep``).

Nothing lives only in memory: every transaction (tasks + prompt offsets; drops, batch +
trajectory offsets) also writes the :class:`~astraflow.actors.ledger.Ledger`'s compact
state and the algorithms' state to ``dataflow-state.<policy>``, so a restarted actor
reads one record and the committed offsets, never the history (a replay buffer, made of
trained groups, is read back from the last batches).
"""

from __future__ import annotations

import logging
from collections import Counter

from opentelemetry import trace
from opentelemetry.trace import Link

from astraflow.algorithms import Candidate, TrainedGroup
from astraflow.algorithms.pipeline import digest
from astraflow.config import JobConfig
from astraflow.topics import (Batch, Consumer, DeadLetters, Delivery, Producer, Prompt, Task, TopicPartition,
                              TrajectoryGroup, VersionAnnouncement)
from astraflow.topics import tracing as topic_tracing, job_topics
from astraflow.topics.codec import encode
from astraflow.topics.messages import DROP_REASONS
from astraflow.topics.replay import read_topic
from astraflow.workflows.chat import ChatTemplateError

from .common import close_quietly, prompt_renderer
from .group_checks import CONTENT_REASONS, ImpossibleGroup, impossible, limits_for
from .lanes import Lane, episode_room, make_lanes, training_lanes
from .ledger import Ledger, read_state
from .prompt_source import end_offset, publish_prompts
from .signing import GroupGate, VersionGate
from .supervisor import LoopActor
from .tasks import make_task, published
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class DataflowActor(LoopActor):
    """Prompts → tasks under the staleness bound; trajectories → batches (one lane per policy)."""

    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str) -> None:
        super().__init__(supervisor, name)
        self.job, self.bootstrap = cfg, bootstrap
        self.lanes = make_lanes(cfg)
        self.lead = self.lanes[cfg.lead_policy]  #: the lane whose curators schedule the prompts (its ledger: the pass)
        self.lockstep = cfg.barrier == "lockstep"
        self.topics = job_topics(cfg)
        self._clients: list = []

    # -- start-up: rebuild state from the topics ---------------------------------------
    def setup(self) -> None:
        cfg, policy = self.lead.cfg, self.lead.policy  # (the scheduling lane's view: prompts, tasks, sampling)
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
        self.render = prompt_renderer(cfg)  # chat models: each task's prompt as token ids, rendered once
        publish_prompts(cfg, self.bootstrap, self.topics, self.txn, self.dead, self.lead.pipeline.sources())
        self.prompts_end = end_offset(self.bootstrap, self.topics.prompts)
        self.state_records_read = 0
        for lane in self.lanes.values():
            p = lane.policy
            state, read = read_state(self.bootstrap, self.topics.dataflow_state(p), p, dead_letters=self.dead)
            self.state_records_read += read
            if state is None and end_offset(self.bootstrap, self.topics.batches(p)) > 0:
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
        led = self.lead.ledger
        log.info("dataflow: resuming at step %d, %d tasks scheduled, %d dropped, %d open (%d state record(s) read)",
                 led.next_step, led.tasks_scheduled, led.dropped, len(led.open), self.state_records_read)
        self.metrics.emit("dataflow.resumed", led.next_step, step=led.next_step,
                          state_records_read=self.state_records_read,
                          algorithms_digest=digest(self.lead.pipeline.state()))

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
        """How many more tasks (episodes) may be scheduled now: the tightest lane's room."""
        return episode_room(self.lanes.values(), self.lockstep)

    #: polls per step while curators reject prompts (the rest waits for the next step)
    CURATOR_POLLS = 8

    def _schedule(self) -> None:
        room, lead = self.capacity(), self.lead
        if room <= 0:
            # A full window can outlast the consumer's max_poll_interval (a slow trainer step):
            # polling held keeps the prompts consumer in its group instead of being expelled
            # and rejoining each time.
            self.prompts.hold(True)
            self.prompts.poll(0)
            return
        self.prompts.hold(False)
        tasks: list[Task] = []
        for _ in range(self.CURATOR_POLLS if lead.pipeline.curators else 1):
            prompts = self.prompts.poll(100, max_records=room - len(tasks))
            if not prompts and not self.prompts.pending_offsets() and self._prompts_exhausted():
                self._next_prompt_epoch()
                continue
            # Dead-lettered prompts advance the offsets but make no task: they take no slot.
            for d in prompts:
                if not lead.pipeline.decide(d.message, lead.version).schedule:
                    continue
                lanes = training_lanes(self.lanes.values(), self.lockstep)
                if not lanes:  # cannot happen: the poll took at most the tightest lane's room
                    raise RuntimeError("dataflow: a polled prompt found no lane with room")
                try:
                    task = make_task(self.job, d.message, d.offset, prompt_epoch=lead.ledger.prompt_epoch,
                                     version=lead.version, train=[role for lane in lanes for role in lane.roles],
                                     versions={lane.policy: lane.version for lane in self.lanes.values()},
                                     render=self.render)
                except ChatTemplateError as e:  # a prompt the model cannot read: its letter, and no slot taken
                    self.dead.put(d.topic, d.partition, d.offset, None, encode(d.message)[0], d.headers, e)
                    continue
                tasks.append(task)
                for lane in lanes:
                    lane.ledger.scheduled(lane.keys(task.task_id))
                    lane.prompt_bytes.update(dict.fromkeys(lane.keys(task.task_id), len(task.prompt.encode())))
                lead.pipeline.scheduled(task.task_id, d.message, lead.version)
            if not prompts or len(tasks) >= room:
                break
        offsets = self.prompts.pending_offsets()
        if not offsets:
            return
        with self.txn.transaction():
            for task in tasks:
                with tracer.start_as_current_span("dataflow.schedule", attributes={
                        "task.id": task.task_id, "prompt.id": task.prompt_id, "policy.version": lead.version}):
                    self.txn.send(self.topics.tasks(lead.policy), task, key=task.task_id)
            self._send_state()
            self.txn.send_offsets(self.prompts, offsets)
        self.metrics.emit("dataflow.scheduled", lead.ledger.tasks_scheduled, step=lead.version)
        if lead.pipeline.curators:
            self._emit_algorithm_stats(lead, lead.version)

    def _prompts_exhausted(self) -> bool:
        tp = TopicPartition(self.topics.prompts, 0)
        return tp in self.prompts.assignment() and self.prompts.position(tp) >= self.prompts_end

    def _next_prompt_epoch(self) -> None:
        """Every prompt was read: begin the next pass (its own transaction: pass number and offset 0)."""
        tp = TopicPartition(self.topics.prompts, 0)
        self.lead.ledger.prompt_epoch += 1
        with self.txn.transaction():
            self._send_state()
            self.txn.send_offsets(self.prompts, {tp: 0})
        self.prompts.seek(tp, 0)
        epoch = self.lead.ledger.prompt_epoch
        log.info("dataflow: every prompt read; pass %d over %s begins", epoch, self.topics.prompts)
        self.metrics.emit("dataflow.prompt_epoch", epoch, step=self.lead.version)

    def _emit_algorithm_stats(self, lane: Lane, step: int) -> None:
        self.metrics.emit_many({f"dataflow.algorithms.{k}": v for k, v in lane.pipeline.stats().items()},
                               step=step, **lane.labels)

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
            if reason == "duplicate" and not published(d.message.task_id, d.message.prompt_id,
                                                        self.lead.ledger.prompt_epoch, self.prompts_end):
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
        if lane.done():
            return False
        k = lane.ledger.next_step
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
        batch = lane.batch(k, members, plan.replay)
        links = [Link(sc) for sc in (topic_tracing.span_context(d.headers) for d in members) if sc is not None]
        with tracer.start_as_current_span("dataflow.batch", context=members[0].trace_context, links=links,
                                          attributes={"batch.step": k, "batch.groups": len(groups),
                                                      "policy": policy}):
            with self.txn.transaction():
                self.txn.send(self.topics.batches(policy), batch, key=str(k))
                self._send_drops_and_state(offsets)
        pipeline.trained(k, [TrainedGroup(d.message, d.source, k) for d in members])
        self.metrics.emit_many({"dataflow.batch_reward": batch.stats["reward_mean"],
                                "dataflow.batch_staleness_max": batch.stats["staleness_max"],
                                **({"dataflow.team_reward": batch.stats["team_reward"]}
                                   if "team_reward" in batch.stats else {})},
                               step=k, **lane.labels)
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

    def _send_state(self) -> None:
        for lane in self.lanes.values():
            if lane is not self.lead:  # every lane keeps the prompt pass the schedule is on
                lane.ledger.prompt_epoch = self.lead.ledger.prompt_epoch
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

