"""The dataflow actor: schedules tasks under the staleness bound and assembles batches.

Owns the job's data schedule for one policy:

* **prompts → tasks.** Task ``i`` may be scheduled only while
  ``scheduled < (version + max_staleness + 1) * B + dropped`` where ``version`` is the
  newest announced policy version, ``B`` the groups per batch and ``dropped`` the groups
  discarded so far (stale or failed). A sample generated at version ``v`` therefore lands
  in a batch trained at version ``<= v + max_staleness``; ``max_staleness = 0`` is the
  synchronous schedule. Tasks and the prompt offsets they consumed are written in one
  transaction, so the number scheduled *is* the committed prompt offset.
* **trajectories → batches.** Groups are deduplicated by task id, checked against the
  bound once more for the batch they enter (a violating group is dropped and counted),
  and written as ``Batch(step=k)`` together with the trajectory offsets in one
  transaction. Offsets are committed only up to the first group still waiting, so a
  restart re-reads exactly the partial batch.

Nothing lives only in memory: a restarted actor rebuilds ``next step``, ``dropped`` and
the batched task ids from the ``batches`` topic and its committed offsets.
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
from astraflow.topics.replay import read_topic

from .common import close_quietly, job_topics
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
        self.version = 0
        self.partial: list[Delivery] = []
        self._clients: list = []

    # -- start-up: rebuild state from the topics ---------------------------------------
    def setup(self) -> None:
        cfg, policy = self.cfg, self.cfg.policy
        self.plain = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}"))
        self.txn = self._keep(Producer(self.bootstrap, client_id=f"dataflow.{policy}",
                                       transactional_id=f"af.{cfg.job}.dataflow.{policy}"))
        self.dead = DeadLetters(self.plain, self.topics.dlq, f"dataflow.{policy}")
        self.metrics = MetricsEmitter(self.plain, self.topics.metrics, f"dataflow.{policy}")
        self._load_prompts()
        self.next_step, self.dropped, self.batched = self._read_batches()
        group = f"dataflow.{policy}"
        self.prompts = self._keep(Consumer(self.bootstrap, topics=[self.topics.prompts], group_id=group,
                                           dead_letters=self.dead, client_id=group, expect=(Prompt,)))
        self.trajectories = self._keep(Consumer(self.bootstrap, topics=[self.topics.trajectories],
                                                group_id=group + ".trajectories", dead_letters=self.dead,
                                                client_id=group, max_poll_records=500,
                                                expect=(TrajectoryGroup,)))
        self.versions = self._keep(Consumer(self.bootstrap, partitions=[TopicPartition(self.topics.versions, 0)],
                                            dead_letters=self.dead, client_id=group))
        committed = self.prompts.raw.committed(TopicPartition(self.topics.prompts, 0))
        self.scheduled = committed or 0
        log.info("dataflow: resuming at step %d, %d tasks scheduled, %d dropped", self.next_step,
                 self.scheduled, self.dropped)

    def _keep(self, client):
        self._clients.append(client)
        return client

    def _load_prompts(self) -> None:
        """Publish the dataset to ``prompts`` once (a transaction: all of it or none)."""
        from kafka import KafkaConsumer

        from astraflow.workflows.datasets import bad_row_handler, load_prompts
        probe = KafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed")
        tp = TopicPartition(self.topics.prompts, 0)
        end = probe.end_offsets([tp])[tp]
        probe.close()
        if end > 0:
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

    def _read_batches(self) -> tuple[int, int, set[str]]:
        """Next step, dropped count and batched task ids, from the committed batches."""
        next_step, dropped, batched = 0, 0, set()
        for _, _, b in read_topic(self.bootstrap, self.topics.batches(self.cfg.policy)):
            if isinstance(b, Batch):
                next_step = b.step + 1
                dropped = int(b.stats.get("dropped_total", 0))
                batched.update(g.task_id for g in b.groups)
        return next_step, dropped, batched

    # -- the loop ----------------------------------------------------------------------
    def step(self) -> None:
        self._follow_versions()
        self._schedule()
        self._collect()

    def _follow_versions(self) -> None:
        for d in self.versions.poll(0 if self.version else 100):
            msg = d.message
            if isinstance(msg, VersionAnnouncement) and msg.policy == self.cfg.policy:
                self.version = max(self.version, msg.version)

    def capacity(self) -> int:
        """How many more tasks the staleness bound (and the training horizon) allows now."""
        bound = (self.version + self.staleness + 1) * self.B + self.dropped
        horizon = self.cfg.trainer.steps * self.B + self.dropped
        return max(0, min(bound, horizon) - self.scheduled)

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
        with self.txn.transaction():
            for d in prompts:
                p: Prompt = d.message
                task = Task(task_id=f"t{d.offset:07d}-{p.prompt_id}", prompt_id=p.prompt_id, policy=self.cfg.policy,
                            prompt=p.text, answer=p.answer, n_samples=r.n_samples, sampling=sampling,
                            scheduled_version=self.version, created_at=time.time())
                with tracer.start_as_current_span("dataflow.schedule", attributes={
                        "task.id": task.task_id, "prompt.id": p.prompt_id, "policy.version": self.version}):
                    self.txn.send(self.topics.tasks(self.cfg.policy), task, key=task.task_id)
            self.txn.send_offsets(self.prompts, offsets)
        position = offsets[TopicPartition(self.topics.prompts, 0)]
        # Offsets that yielded no task (dead-lettered records) free their slot again.
        self.dropped += (position - self.scheduled) - len(prompts)
        self.scheduled = position
        self.metrics.emit("dataflow.scheduled", self.scheduled, step=self.version)

    def _collect(self) -> None:
        for d in self.trajectories.poll(200):
            g: TrajectoryGroup = d.message
            if g.task_id in self.batched or any(p.message.task_id == g.task_id for p in self.partial):
                self.metrics.emit("dataflow.duplicates", 1, step=self.next_step)
                continue
            if g.status != "ok" or not g.samples:
                self.dropped += 1
                self.metrics.emit("dataflow.failed_groups", 1, step=self.next_step, task=g.task_id)
                continue
            self.partial.append(d)
        while self._fill_batch():
            pass

    def _fill_batch(self) -> bool:
        k = self.next_step
        fresh = []
        for d in self.partial:
            if k - min(min(s.versions, default=k) for s in d.message.samples) > self.staleness:
                self.dropped += 1
                self.metrics.emit("dataflow.stale_dropped", 1, step=k, task=d.message.task_id)
            else:
                fresh.append(d)
        self.partial = fresh
        if len(self.partial) < self.B:
            return False
        members, self.partial = self.partial[:self.B], self.partial[self.B:]
        groups = [d.message for d in members]
        offsets = self._safe_offsets()
        rewards = [s.reward for g in groups for s in g.samples]
        staleness = [k - min(s.versions) for g in groups for s in g.samples if s.versions]
        batch = Batch(self.cfg.policy, k, groups, [d.source for d in members],
                      {"dropped_total": self.dropped, "reward_mean": sum(rewards) / len(rewards),
                       "staleness_max": max(staleness, default=0), "staleness_mean": sum(staleness) / max(1, len(staleness)),
                       "created_at": time.time()})
        links = [Link(sc) for sc in (topic_tracing.span_context(d.headers) for d in members) if sc is not None]
        with tracer.start_as_current_span("dataflow.batch", context=members[0].trace_context, links=links,
                                          attributes={"batch.step": k, "batch.groups": len(groups)}):
            with self.txn.transaction():
                self.txn.send(self.topics.batches(self.cfg.policy), batch, key=str(k))
                self.txn.send_offsets(self.trajectories, offsets)
        self.batched.update(g.task_id for g in groups)
        self.next_step += 1
        self.metrics.emit_many({"dataflow.batch_reward": batch.stats["reward_mean"],
                                "dataflow.batch_staleness_max": batch.stats["staleness_max"]}, step=k)
        return True

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
