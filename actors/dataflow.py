"""The dataflow actor: schedules tasks under the staleness bound and assembles batches.

Owns the job's data schedule for one policy:

* **prompts → tasks.** Task ``i`` may be scheduled only while
  ``scheduled < (version + max_staleness + 1) * B + dropped`` where ``version`` is the
  newest announced policy version, ``B`` the groups per batch and ``dropped`` the tasks
  settled without a batch so far (stale or failed groups). A sample generated at version
  ``v`` therefore lands in a batch trained at version ``<= v + max_staleness``;
  ``max_staleness = 0`` is the synchronous schedule. Scheduling stops at the training
  horizon (``steps * B + dropped``), so no task is left unneeded after the last batch.
* **trajectories → batches.** A group answers an open task or is a duplicate; it is
  checked against the bound once more for the batch it enters, and written as
  ``Batch(step=k)``. Every group consumed without a batch gets a :class:`GroupDrop` on
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

Nothing lives only in memory: every transaction (tasks + prompt offsets; drops, batch +
trajectory offsets) also writes the :class:`~astraflow.actors.ledger.Ledger`'s compact
state and the algorithms' state to ``dataflow-state.<policy>``, so a restarted actor
reads one record and the committed offsets, never the history (a replay buffer, made of
trained groups, is read back from the last batches).
"""

from __future__ import annotations

import logging
import time

from kafka import TopicPartition
from opentelemetry import trace
from opentelemetry.trace import Link

from astraflow.algorithms import Candidate, TrainedGroup, build_pipeline
from astraflow.algorithms.pipeline import context_of, digest
from astraflow.config import JobConfig
from astraflow.topics import (Batch, Consumer, DeadLetters, Delivery, Producer, Prompt, Task,
                              TrajectoryGroup, VersionAnnouncement)
from astraflow.topics import tracing as topic_tracing
from astraflow.topics.replay import read_topic

from .common import close_quietly, job_topics
from .ledger import Ledger, read_state
from .supervisor import LoopActor
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class DataflowActor(LoopActor):
    """Prompts → tasks under the staleness bound; trajectories → batches."""

    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str) -> None:
        super().__init__(supervisor, name)
        self.cfg, self.bootstrap = cfg, bootstrap
        self.topics = job_topics(cfg)
        self.B = cfg.dataflow.groups_per_batch
        self.staleness = cfg.effective_staleness
        self.epoch = self.version = 0
        self.partial: list[Delivery] = []
        self._clients: list = []
        self.pipeline = build_pipeline(cfg.dataflow.algorithms, context_of(cfg), cfg.dataflow.force_after_skips)

    # -- start-up: rebuild state from the topics ---------------------------------------
    def setup(self) -> None:
        cfg, policy = self.cfg, self.cfg.policy
        self.plain = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}"))
        self.txn = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}",
                                       transactional_id=f"af.{cfg.job}.dataflow.{policy}",
                                       transaction_timeout_ms=cfg.kafka.transaction_timeout_ms))
        self.dead = DeadLetters(self.plain, self.topics.dlq, f"dataflow.{policy}")
        self.metrics = MetricsEmitter(self.plain, self.topics.metrics, f"dataflow.{policy}")
        self._load_prompts()
        self.prompts_end = self._end_offset(self.topics.prompts)
        state, self.state_records_read = read_state(self.bootstrap, self.topics.dataflow_state(policy), policy)
        if state is None and self._end_offset(self.topics.batches(policy)) > 0:
            raise RuntimeError(f"{self.topics.batches(policy)} holds batches but "
                               f"{self.topics.dataflow_state(policy)} has no dataflow state: the job was written "
                               f"by an older astraflow; finish it with that version or start a new job")
        self.ledger = Ledger(policy, state)
        self.pipeline.load_state(self.ledger.algorithms)
        self._restore_composers()
        if self.pipeline.replay_slots(1) and cfg.trainer.engine.loss == "grpo":
            log.warning("dataflow: replay with loss 'grpo' clips most replayed (stale) tokens away; "
                        "decoupled_ppo or m2po correct for the policy lag (trainer.engine.loss)")
        group = f"dataflow.{policy}"
        self.prompts = self._keep(Consumer(self.bootstrap, topics=[self.topics.prompts], group_id=group,
                                           dead_letters=self.dead, client_id=group, expect=(Prompt,)))
        self.trajectories = self._keep(Consumer(self.bootstrap, topics=[self.topics.trajectories],
                                                group_id=group + ".trajectories", dead_letters=self.dead,
                                                client_id=group, max_poll_records=500,
                                                expect=(TrajectoryGroup,)))
        self.versions = self._keep(Consumer(self.bootstrap, partitions=[TopicPartition(self.topics.versions, 0)],
                                            dead_letters=self.dead, client_id=group))
        log.info("dataflow: resuming at step %d, %d tasks scheduled, %d dropped, %d open (%d state record(s) read)",
                 self.ledger.next_step, self.ledger.tasks_scheduled, self.ledger.dropped, len(self.ledger.open),
                 self.state_records_read)
        self.metrics.emit("dataflow.resumed", self.ledger.next_step, step=self.ledger.next_step,
                          state_records_read=self.state_records_read,
                          algorithms_digest=digest(self.pipeline.state()))

    def _restore_composers(self) -> None:
        """A replay buffer holds trained groups: read them back from the last batches."""
        n = self.pipeline.history
        if not n or self.ledger.next_step == 0:
            return
        fresh = [TrainedGroup(g, src, b.step)
                 for _, _, b in read_topic(self.bootstrap, self.topics.batches(self.cfg.policy), tail=n)
                 if isinstance(b, Batch) and b.step < self.ledger.next_step
                 for i, (g, src) in enumerate(zip(b.groups, b.sources)) if not b.is_replay(i)]
        self.pipeline.restore(fresh)

    def _keep(self, client):
        self._clients.append(client)
        return client

    def _load_prompts(self) -> None:
        """Publish the dataset to ``prompts`` once (a transaction: all of it or none).

        Several sources (dataset mixing) are interleaved in proportion to their weights.
        """
        from astraflow.workflows.datasets import bad_row_handler, load_prompts
        if self._end_offset(self.topics.prompts) > 0:
            return
        needed = self.cfg.data.num_prompts or 2 * self.cfg.trainer.steps * self.B
        sources = self.pipeline.sources() or {self.cfg.data.source: 1.0}
        loaded = {spec: load_prompts(spec, needed if spec == "arithmetic" else self.cfg.data.num_prompts,
                                     seed=self.cfg.data.seed, max_digits=self.cfg.data.max_digits,
                                     ops=self.cfg.data.ops, base_dir=self._config_dir(),
                                     on_bad_row=bad_row_handler(self.cfg.data.on_bad_row, self.dead))
                  for spec in sources}
        prompts = interleave(loaded, sources)
        with self.txn.transaction():
            for p in prompts:
                self.txn.send(self.topics.prompts, p, key=p.prompt_id, trace=False)
        log.info("dataflow: published %d prompts to %s", len(prompts), self.topics.prompts)

    def _config_dir(self) -> str:
        from pathlib import Path
        return str(Path(self.cfg.source).parent) if self.cfg.source != "<dict>" else "."

    def _end_offset(self, topic: str) -> int:
        from kafka import KafkaConsumer
        probe = KafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed")
        try:
            tp = TopicPartition(topic, 0)
            return probe.end_offsets([tp])[tp]
        finally:
            probe.close()

    # -- the loop ----------------------------------------------------------------------
    def step(self) -> None:
        self._follow_versions()
        self._schedule()
        self._collect()

    def _follow_versions(self) -> None:
        # The newest lineage wins (epoch first): after a trainer resumed behind its announced
        # head, versions restart lower in a new epoch, and the bound must follow them down.
        for d in self.versions.poll(0 if self.version else 100):
            msg = d.message
            if isinstance(msg, VersionAnnouncement) and msg.policy == self.cfg.policy:
                if (msg.epoch, msg.version) > (self.epoch, self.version):
                    self.epoch, self.version = msg.epoch, msg.version
                    self.pipeline.on_version(self.version)

    def capacity(self) -> int:
        """How many more tasks the staleness bound (and the training horizon) allows now.

        Without algorithms ``fresh_until(s)`` is ``s * B``; replay slots lower it (batches
        take fewer fresh groups) and over-sampling raises the bound, not the horizon: the
        last batches fill by replacements, so no task is left unneeded at the end.
        """
        led, fresh_until = self.ledger, self.pipeline.fresh_until
        bound = fresh_until(self.version + self.staleness + 1) + led.dropped
        horizon = fresh_until(self.cfg.trainer.steps, oversampled=False) + led.dropped
        return max(0, min(bound, horizon) - led.tasks_scheduled)

    #: polls per step while curators reject prompts (the rest waits for the next step)
    CURATOR_POLLS = 8

    def _schedule(self) -> None:
        room = self.capacity()
        if room <= 0:
            return
        tasks: list[Task] = []
        for _ in range(self.CURATOR_POLLS if self.pipeline.curators else 1):
            prompts = self.prompts.poll(100, max_records=room - len(tasks))
            if not prompts and not self.prompts.pending_offsets() and self._prompts_exhausted():
                self._next_prompt_epoch()
                continue
            # Dead-lettered prompts advance the offsets but make no task: they take no slot.
            for d in prompts:
                if self.pipeline.decide(d.message, self.version).schedule:
                    tasks.append(self._task(d))
                    self.pipeline.scheduled(tasks[-1].task_id, d.message, self.version)
            if not prompts or len(tasks) >= room:
                break
        offsets = self.prompts.pending_offsets()
        if not offsets:
            return
        self.ledger.scheduled(t.task_id for t in tasks)
        with self.txn.transaction():
            for task in tasks:
                with tracer.start_as_current_span("dataflow.schedule", attributes={
                        "task.id": task.task_id, "prompt.id": task.prompt_id, "policy.version": self.version}):
                    self.txn.send(self.topics.tasks(self.cfg.policy), task, key=task.task_id)
            self._send_state()
            self.txn.send_offsets(self.prompts, offsets)
        self.metrics.emit("dataflow.scheduled", self.ledger.tasks_scheduled, step=self.version)
        if self.pipeline.curators:
            self._emit_algorithm_stats(self.version)

    def _task(self, d: Delivery) -> Task:
        r, epoch = self.cfg.rollout, self.ledger.prompt_epoch
        sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                    "max_new_tokens": r.max_new_tokens}
        # A prompt's offset names its task within a pass; later passes add the pass number.
        task_id = f"t{d.offset:07d}-{d.message.prompt_id}" if epoch == 0 else \
            f"t{d.offset:07d}.{epoch}-{d.message.prompt_id}"
        return Task(task_id=task_id, prompt_id=d.message.prompt_id, policy=self.cfg.policy, prompt=d.message.text,
                    answer=d.message.answer, n_samples=r.n_samples, sampling=sampling,
                    scheduled_version=self.version, created_at=time.time())

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

    def _emit_algorithm_stats(self, step: int) -> None:
        self.metrics.emit_many({f"dataflow.algorithms.{k}": v for k, v in self.pipeline.stats().items()}, step=step)

    def _collect(self) -> None:
        for d in self.trajectories.poll(200):
            # Another policy's dataflow settles its groups; the shared topic carries both.
            if d.message.policy != self.cfg.policy or self.ledger.already_settled(d):
                continue
            reason = self.ledger.verdict(d)
            detail = f"task {d.message.task_id} is not open" if reason == "duplicate" else d.message.error
            if reason is None and (verdict := self.pipeline.verdict(d.message)) is not None:
                reason, detail = verdict[0], f"dropped by {verdict[1]}"
            if reason is None:
                self.ledger.wait(d)
                self.partial.append(d)
            else:
                self._drop(d, reason, detail)
        while self._fill_batch():
            pass
        if self.ledger.pending_drops:
            with self.txn.transaction():
                self._send_drops_and_state(self._safe_offsets())

    def _drop(self, d: Delivery, reason: str, detail: str = "") -> None:
        self.ledger.drop(d, reason, self.ledger.next_step, detail)
        if reason != "duplicate":  # a duplicate's task was settled, and learnt from, by its first group
            self.pipeline.settled(d.message)
        self.metrics.emit(f"dataflow.dropped.{reason}", 1, step=self.ledger.next_step, task=d.message.task_id)

    def _oldest_version(self, d: Delivery, default: int) -> int:
        return min(min(s.versions, default=default) for s in d.message.samples)

    def _fill_batch(self) -> bool:
        k = self.ledger.next_step
        fresh = []
        for d in self.partial:
            oldest = self._oldest_version(d, k)
            if k - oldest > self.staleness:
                self._drop(d, "stale", f"a token of version {oldest} cannot train at step {k}")
            else:
                fresh.append(d)
        self.partial = fresh
        if len(self.partial) < self.B - self.pipeline.replay_slots(k):
            return False
        plan = self.pipeline.compose(k, [Candidate(d, d.message, self._oldest_version(d, k) + self.staleness, i)
                                         for i, d in enumerate(self.partial)])
        members = [c.item for c in plan.fresh[:plan.fresh_slots]]
        taken = {id(d) for d in members}
        self.partial = [d for d in self.partial if id(d) not in taken]
        groups = [d.message for d in members]
        self.ledger.batched(members)
        for g in groups:
            self.pipeline.settled(g)
        offsets = self._safe_offsets()
        replayed = [r.group for r in plan.replay]
        rewards = [s.reward for g in groups + replayed for s in g.samples]
        staleness = [k - min(s.versions) for g in groups for s in g.samples if s.versions]
        stats = {"dropped_total": self.ledger.dropped, "reward_mean": sum(rewards) / len(rewards),
                 "staleness_max": max(staleness, default=0), "staleness_mean": sum(staleness) / max(1, len(staleness)),
                 "created_at": time.time()}
        if replayed:
            stats["replayed"] = len(replayed)
        batch = Batch(self.cfg.policy, k, groups + replayed, [d.source for d in members] + [r.source for r in plan.replay],
                      stats, [False] * len(groups) + [True] * len(replayed) if replayed else [])
        links = [Link(sc) for sc in (topic_tracing.span_context(d.headers) for d in members) if sc is not None]
        with tracer.start_as_current_span("dataflow.batch", context=members[0].trace_context, links=links,
                                          attributes={"batch.step": k, "batch.groups": len(groups)}):
            with self.txn.transaction():
                self.txn.send(self.topics.batches(self.cfg.policy), batch, key=str(k))
                self._send_drops_and_state(offsets)
        self.pipeline.trained(k, [TrainedGroup(d.message, d.source, k) for d in members])
        self.metrics.emit_many({"dataflow.batch_reward": batch.stats["reward_mean"],
                                "dataflow.batch_staleness_max": batch.stats["staleness_max"]}, step=k)
        if not self.pipeline.empty:
            self._emit_algorithm_stats(k)
        return True

    def _send_drops_and_state(self, offsets: dict[TopicPartition, int]) -> None:
        """Inside a transaction: the drops so far, the state, and the offsets past what they settle."""
        for drop in self.ledger.take_drops():
            self.txn.send(self.topics.drops(self.cfg.policy), drop, key=drop.task_id)
        self.ledger.committed(offsets)
        self._send_state()
        self.txn.send_offsets(self.trajectories, offsets)

    def _send_state(self) -> None:
        self.txn.send(self.topics.dataflow_state(self.cfg.policy), self.ledger.state(self.pipeline.state()),
                      key=self.cfg.policy)

    def _safe_offsets(self) -> dict[TopicPartition, int]:
        """Commit past everything consumed, except groups still waiting in the partial batch."""
        offsets = self.trajectories.pending_offsets()
        for d in self.partial:
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
