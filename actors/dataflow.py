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

Nothing lives only in memory: every transaction (tasks + prompt offsets; drops, batch +
trajectory offsets) also writes the :class:`~astraflow.actors.ledger.Ledger`'s compact
state to ``dataflow-state.<policy>``, so a restarted actor reads one record and the
committed offsets, never the history.
"""

from __future__ import annotations

import logging
import time

from kafka import TopicPartition
from opentelemetry import trace
from opentelemetry.trace import Link

from astraflow.config import JobConfig
from astraflow.topics import (Batch, Consumer, DeadLetters, Delivery, Producer, Prompt, Task,
                              TrajectoryGroup, VersionAnnouncement)
from astraflow.topics import tracing as topic_tracing

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
        state, self.state_records_read = read_state(self.bootstrap, self.topics.dataflow_state(policy), policy)
        if state is None and self._end_offset(self.topics.batches(policy)) > 0:
            raise RuntimeError(f"{self.topics.batches(policy)} holds batches but "
                               f"{self.topics.dataflow_state(policy)} has no dataflow state: the job was written "
                               f"by an older astraflow; finish it with that version or start a new job")
        self.ledger = Ledger(policy, state)
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
                          state_records_read=self.state_records_read)

    def _keep(self, client):
        self._clients.append(client)
        return client

    def _load_prompts(self) -> None:
        """Publish the dataset to ``prompts`` once (a transaction: all of it or none)."""
        from astraflow.workflows.datasets import bad_row_handler, load_prompts
        if self._end_offset(self.topics.prompts) > 0:
            return
        needed = self.cfg.data.num_prompts or 2 * self.cfg.trainer.steps * self.B
        prompts = load_prompts(self.cfg.data.source, needed, seed=self.cfg.data.seed,
                               max_digits=self.cfg.data.max_digits, ops=self.cfg.data.ops,
                               base_dir=self._config_dir(),
                               on_bad_row=bad_row_handler(self.cfg.data.on_bad_row, self.dead))
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

    def capacity(self) -> int:
        """How many more tasks the staleness bound (and the training horizon) allows now."""
        led = self.ledger
        bound = (self.version + self.staleness + 1) * self.B + led.dropped
        horizon = self.cfg.trainer.steps * self.B + led.dropped
        return max(0, min(bound, horizon) - led.tasks_scheduled)

    def _schedule(self) -> None:
        room = self.capacity()
        if room <= 0:
            return
        prompts = self.prompts.poll(100, max_records=room)
        offsets = self.prompts.pending_offsets()
        if not offsets:
            return
        r = self.cfg.rollout
        sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                    "max_new_tokens": r.max_new_tokens}
        # Dead-lettered prompts advance the offsets but make no task: they take no slot.
        tasks = [Task(task_id=f"t{d.offset:07d}-{d.message.prompt_id}", prompt_id=d.message.prompt_id,
                      policy=self.cfg.policy, prompt=d.message.text, answer=d.message.answer,
                      n_samples=r.n_samples, sampling=sampling, scheduled_version=self.version,
                      created_at=time.time()) for d in prompts]
        self.ledger.scheduled(t.task_id for t in tasks)
        with self.txn.transaction():
            for task in tasks:
                with tracer.start_as_current_span("dataflow.schedule", attributes={
                        "task.id": task.task_id, "prompt.id": task.prompt_id, "policy.version": self.version}):
                    self.txn.send(self.topics.tasks(self.cfg.policy), task, key=task.task_id)
            self._send_state()
            self.txn.send_offsets(self.prompts, offsets)
        self.metrics.emit("dataflow.scheduled", self.ledger.tasks_scheduled, step=self.version)

    def _collect(self) -> None:
        for d in self.trajectories.poll(200):
            # Another policy's dataflow settles its groups; the shared topic carries both.
            if d.message.policy != self.cfg.policy or self.ledger.already_settled(d):
                continue
            reason = self.ledger.verdict(d)
            if reason is None:
                self.ledger.wait(d)
                self.partial.append(d)
            else:
                self._drop(d, reason, f"task {d.message.task_id} is not open" if reason == "duplicate"
                           else d.message.error)
        while self._fill_batch():
            pass
        if self.ledger.pending_drops:
            with self.txn.transaction():
                self._send_drops_and_state(self._safe_offsets())

    def _drop(self, d: Delivery, reason: str, detail: str = "") -> None:
        self.ledger.drop(d, reason, self.ledger.next_step, detail)
        self.metrics.emit(f"dataflow.dropped.{reason}", 1, step=self.ledger.next_step, task=d.message.task_id)

    def _fill_batch(self) -> bool:
        k = self.ledger.next_step
        fresh = []
        for d in self.partial:
            oldest = min(min(s.versions, default=k) for s in d.message.samples)
            if k - oldest > self.staleness:
                self._drop(d, "stale", f"a token of version {oldest} cannot train at step {k}")
            else:
                fresh.append(d)
        self.partial = fresh
        if len(self.partial) < self.B:
            return False
        members, self.partial = self.partial[:self.B], self.partial[self.B:]
        groups = [d.message for d in members]
        self.ledger.batched(members)
        offsets = self._safe_offsets()
        rewards = [s.reward for g in groups for s in g.samples]
        staleness = [k - min(s.versions) for g in groups for s in g.samples if s.versions]
        batch = Batch(self.cfg.policy, k, groups, [d.source for d in members],
                      {"dropped_total": self.ledger.dropped, "reward_mean": sum(rewards) / len(rewards),
                       "staleness_max": max(staleness, default=0), "staleness_mean": sum(staleness) / max(1, len(staleness)),
                       "created_at": time.time()})
        links = [Link(sc) for sc in (topic_tracing.span_context(d.headers) for d in members) if sc is not None]
        with tracer.start_as_current_span("dataflow.batch", context=members[0].trace_context, links=links,
                                          attributes={"batch.step": k, "batch.groups": len(groups)}):
            with self.txn.transaction():
                self.txn.send(self.topics.batches(self.cfg.policy), batch, key=str(k))
                self._send_drops_and_state(offsets)
        self.metrics.emit_many({"dataflow.batch_reward": batch.stats["reward_mean"],
                                "dataflow.batch_staleness_max": batch.stats["staleness_max"]}, step=k)
        return True

    def _send_drops_and_state(self, offsets: dict[TopicPartition, int]) -> None:
        """Inside a transaction: the drops so far, the state, and the offsets past what they settle."""
        for drop in self.ledger.take_drops():
            self.txn.send(self.topics.drops(self.cfg.policy), drop, key=drop.task_id)
        self.ledger.committed(offsets)
        self._send_state()
        self.txn.send_offsets(self.trajectories, offsets)

    def _send_state(self) -> None:
        self.txn.send(self.topics.dataflow_state(self.cfg.policy), self.ledger.state(), key=self.cfg.policy)

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
