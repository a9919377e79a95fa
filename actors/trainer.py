"""The trainer actor: one optimizer step per batch, weights published off the critical path.

Reads ``batches.<policy>`` (one partition: the ordered record of training) by offset —
not by consumer-group commits — because the offset it resumes from is part of its
checkpoint: ``DeepSpeed state + the next batch offset + the lineage of (step, offset)``
are saved together, every ``checkpoint_every`` steps, as one step-tagged directory that
an atomic pointer publishes (:mod:`astraflow.engines.checkpoints`: a kill during a save
leaves the previous checkpoint in force). A restarted trainer loads the checkpoint the
pointer names and seeks to the stored offset, so every batch contributes to the weights
exactly once and none is skipped. After each step the weights (a CPU copy) go to the
:class:`~astraflow.weights.WeightPublisher`, whose thread encodes, writes and
announces them while the next step runs. A trainer that resumed behind the announced
head announces its weights as a new lineage epoch (see the publisher), so every node
drops the versions the crashed trainer announced after its checkpoint.

No record makes it crash. Every record it reads is checked before it is used (the codec
checks types and the schema's bounds; :func:`refusal` what only the trainer knows: the
batch is its policy's, its step is the next one, every token id is inside the model's
vocabulary, enough samples for its minibatches) and a refused one is dead-lettered, once, and passed over: a repeated or
forged earlier step is never trained again, a gap waits for the step that is missing.
What the trainer reads on ``control`` gets the same treatment.

A trainer of N ranks (``trainer.ranks``; torch's launcher starts one process per rank, see
:mod:`astraflow.trainer_group`) runs this actor in every rank. Every rank reads the same
batch record by the same offset (each has its own consumer, no group) and trains its
shard of it; checkpoints are saved by all ranks together (each writes its DeepSpeed
shards, rank 0 publishes the checkpoint). Rank 0 alone publishes weights, heartbeats,
answers snapshot requests and reports the step's metrics; under ZeRO-3 every rank joins
the parameter gather that the publish needs. A failure in any rank ends its process, and
the launcher takes the group down and restarts it from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import NamedTuple

from opentelemetry import trace

from astraflow.config import JobConfig
from astraflow.engines.checkpoints import CheckpointStore
from astraflow.engines.hf_export import HFExports
from astraflow.topics import (Batch, Consumer, DeadLetters, Delivery, Heartbeat, Producer, SnapshotRequest,
                              TopicPartition, job_topics)

from .common import (base_model, close_quietly, lower_priority, make_train_engine, model_path, niceness, set_threads,
                     to_train_batch)
from .signing import trainer_keys
from .supervisor import LoopActor
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


class TrainerActor(LoopActor):
    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str, run_dir: str) -> None:
        super().__init__(supervisor, name)
        self.cfg, self.bootstrap, self.run_dir = cfg, bootstrap, run_dir
        self.topics = job_topics(cfg)
        self.ckpt_dir = Path(run_dir) / "checkpoints" / cfg.policy
        self.exports = HFExports(Path(run_dir) / "hf" / cfg.policy)
        self.checkpoints = CheckpointStore(self.ckpt_dir, keep=cfg.trainer.keep_checkpoints)
        self.engine = self.consumer = self.control = self.producer = self.publisher = None
        self._wait_s = 0.0
        self._last_hb = 0.0

    def setup(self) -> None:
        from astraflow.weights import WeightPublisher

        began = time.time()
        marks = {"setup": time.monotonic()}
        set_threads(self.cfg.trainer.engine.threads)
        marks["torch_import"] = time.monotonic()
        self.engine = make_train_engine(self.cfg, model_path(self.cfg), run_dir=self.run_dir)
        marks["engine"] = time.monotonic()
        self.rank, self.world = getattr(self.engine, "rank", 0), getattr(self.engine, "world", 1)
        self.leader = self.rank == 0
        state: dict = {}
        ckpt = self.checkpoints.latest()
        if ckpt is not None:
            state = dict(self.engine.load_checkpoint(ckpt.path))
            log.info("trainer: resumed at step %d from %s", self.engine.step, ckpt.path)
        marks["checkpoint_load"] = time.monotonic()
        self.offset = int(state.get("batches_offset", 0))
        self.lineage: list[list[int]] = [list(x) for x in state.get("lineage", [])]
        client = f"trainer.{self.cfg.policy}" + (f".rank{self.rank}" if self.rank else "")
        self.producer = Producer(self.bootstrap, client_id=client)
        self.metrics = MetricsEmitter(self.producer, self.topics.metrics, f"trainer.{self.cfg.policy}")
        tp = TopicPartition(self.topics.batches(self.cfg.policy), 0)
        self.limits = model_limits(model_path(self.cfg))
        # One record per poll: each is judged against the step the batches before it left.
        self.dead = DeadLetters(self.producer, self.topics.dlq, client, recall=self.bootstrap)
        self.consumer = Consumer(self.bootstrap, partitions=[tp], client_id=client, dead_letters=self.dead,
                                 max_poll_records=1, expect=(Batch,), validate=self._check_batch)
        self.consumer.seek(tp, self.offset)
        if not self.leader:
            self._weights()  # rank 0's publisher resumes from the gathered weights: join the gather
            lower_priority(self.cfg.trainer.cpu_nice)
            self.metrics.emit("trainer.rank_ready", self.rank, step=self.engine.step, rank=self.rank,
                              pid=os.getpid(), world_size=self.world, nice=niceness())
            return
        # Snapshot requests from nodes that cannot reach the newest version by deltas.
        self.control = Consumer(self.bootstrap, partitions=[TopicPartition(self.topics.control, 0)],
                                client_id=f"trainer.{self.cfg.policy}", dead_letters=self.dead,
                                expect=(Heartbeat, SnapshotRequest))
        self.control.seek_to_beginning()
        self._snapshot_next = False
        self._catch_up_control()
        marks["clients"] = time.monotonic()
        # Signed announcements (actors/signing.py): readers refuse any other, whatever epoch it claims.
        signer, verifier = trainer_keys(self.cfg)
        self.publisher = WeightPublisher(self.bootstrap, self.topics, self.cfg.policy,
                                         snapshot_every=self.cfg.trainer.snapshot_every,
                                         write_deltas=self.cfg.trainer.weight_transport == "delta",
                                         producer_id=f"trainer.{self.cfg.policy}", signer=signer, verifier=verifier,
                                         base_model=base_model(self.cfg, model_path(self.cfg)))
        head = self.publisher.last_announced
        epoch = self.publisher.resume(self._weights(), self.engine.step)
        marks["publisher"] = time.monotonic()
        self.metrics.emit("trainer.resumed_step", self.engine.step, step=self.engine.step, epoch=epoch,
                          announced_head=-1 if head is None else head)
        self._report_startup(began, marks)
        # Steady state only: at full priority the start-up (DeepSpeed, the first weights) is not
        # starved by the evaluator's first evaluation and the rollout nodes' start. The
        # publisher's threads keep theirs: the next batch's rollout waits for what they send.
        kept = self.publisher.thread_ids()
        lower_priority(self.cfg.trainer.cpu_nice, keep=kept)
        self.metrics.emit("trainer.rank_ready", self.rank, step=self.engine.step, rank=self.rank, pid=os.getpid(),
                          world_size=self.world, nice=niceness(),
                          publisher_nice=max((niceness(t) for t in kept), default=niceness()), publisher_threads=len(kept))

    def step(self) -> None:
        if self.engine.step >= self.cfg.trainer.steps:
            weights = self._weights()  # every rank: a collective under ZeRO-3
            if self.leader:
                self._export(weights, final=True)
                self.publisher.flush(timeout=300)
                self._report_published()
                from astraflow.weights.codec import weights_digest
                self.metrics.emit("trainer.done", self.engine.step, step=self.engine.step,
                                  epoch=self.publisher.epoch, weights_digest=weights_digest(weights))
                self._heartbeat(force=True)
            self.producer.flush()
            self.finished = True
            return
        if self.leader:
            self._check_snapshot_requests()
        t0 = time.monotonic()
        deliveries = self.consumer.poll(500)
        self._wait_s += time.monotonic() - t0
        if not deliveries:
            self._heartbeat()
            return
        d = deliveries[0]
        batch = d.message
        with tracer.start_as_current_span("trainer.step", context=d.trace_context,
                                          attributes={"trainer.step": batch.step, "batch.offset": d.offset}):
            t_train = time.monotonic()
            out = self.engine.train_step(to_train_batch(batch))
            train_s = time.monotonic() - t_train
            self.offset = d.offset + 1
            self.lineage.append([batch.step, d.offset])
            # Publish first: the rollout path waits for these weights, and the publisher's thread
            # encodes them while this one checkpoints. A crash in between leaves the announced
            # head past the checkpoint, which resume() handles (a new lineage epoch) as it does
            # for the versions between checkpoints.
            weights = self._weights()
            if self.leader:
                # The moment the rollout path's wait for this version starts (its metric ts): before
                # the publish call, which runs behind a niced trainer's back and may announce the
                # version before a later emit (the critical path measures the publish stage from it).
                self.metrics.emit("trainer.handed_off", 1.0, step=self.engine.step)
                self.publisher.publish(weights, self.engine.step, snapshot=self._snapshot_next)
                self._snapshot_next = False
            if self.engine.step % self.cfg.trainer.checkpoint_every == 0 or self.engine.step >= self.cfg.trainer.steps:
                self._checkpoint()
            every = self.cfg.trainer.export_every
            if self.leader and every and self.engine.step % every == 0 and self.engine.step < self.cfg.trainer.steps:
                self._export(weights)  # (the last version is exported once the run ends)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        if not self.leader:
            self.metrics.emit("trainer.peak_rss_mb", rss_mb, step=self.engine.step, rank=self.rank)
            return
        self._report_published()
        versions = [v for g in batch.groups for s in g.samples for v in s.own_versions()]
        self.metrics.emit_many({
            **{f"trainer.{k}": float(v) for k, v in out.items() if isinstance(v, (int, float))},
            "trainer.train_s": train_s, "trainer.wait_s": self._wait_s,
            "trainer.reward": float(batch.stats.get("reward_mean", 0.0)),
            "trainer.staleness_max": float(batch.step - min(versions)) if versions else 0.0,
            # every trained token's lag behind this step, averaged: what partial rollouts shorten
            # (their rows' later tokens come from newer versions; staleness_max keeps the oldest)
            "trainer.token_lag_mean": float(batch.step - sum(versions) / len(versions)) if versions else 0.0,
            "trainer.samples": float(sum(len(g.samples) for g in batch.groups)),
            "trainer.batch_offset": float(d.offset),
            "trainer.peak_rss_mb": rss_mb,
        }, step=self.engine.step)
        self.metrics.emit_device(self.engine, step=self.engine.step)
        self._wait_s = 0.0
        self._heartbeat()

    def _report_startup(self, began: float, marks: dict[str, float]) -> None:
        """Where this process's start-up went, as ``trainer.start.<phase>_s`` (seconds): the
        interpreter and imports before setup (``python``, from the process's start), torch's
        import, the engine's own parts (``engine_<part>``: DeepSpeed's and transformers'
        imports, the process group, the model load, ``deepspeed.initialize``; ``engine_other``
        the rest), the checkpoint load, the Kafka clients (with the ``control`` catch-up) and the
        weight publisher (the announced head, ``resume``). Benchmarks read it
        (``benchmarks/trainer_loss.py``)."""
        from .telemetry import process_started_at
        names = list(marks)
        phases = {f"{b}_s": marks[b] - marks[a] for a, b in zip(names, names[1:])}
        engine = phases.pop("engine_s")
        parts = {f"engine_{k}_s": float(v) for k, v in (getattr(self.engine, "init_s", None) or {}).items()}
        phases.update(parts, engine_other_s=max(0.0, engine - sum(parts.values())))
        started = process_started_at()
        if started is not None:
            phases["python_s"] = max(0.0, began - started)
        phases["total_s"] = marks[names[-1]] - marks["setup"] + phases.get("python_s", 0.0)
        self.metrics.emit_many({f"trainer.start.{k}": v for k, v in phases.items()}, step=self.engine.step)

    def _check_batch(self, d: Delivery) -> None:
        """The consumer's check of each batch as it is handed out (a refusal dead-letters it)."""
        reason = refusal(d.message, self.cfg.policy, self.engine.step, self.limits,
                         max(1, self.cfg.trainer.engine.minibatches))
        if reason:
            self.metrics.emit("trainer.batches_refused", 1, step=self.engine.step, offset=d.offset)
            raise ValueError(f"batch at {d.topic}@{d.offset} refused: {reason}")

    def _catch_up_control(self, limit_s: float = 10.0) -> None:
        """Read the requests already on ``control`` before training, so none waits a step."""
        tp = TopicPartition(self.topics.control, 0)
        end = self.control.end_offsets([tp])[tp]
        deadline = time.monotonic() + limit_s
        while self.control.position(tp) < end and time.monotonic() < deadline:
            self._check_snapshot_requests(timeout_ms=200)

    def _check_snapshot_requests(self, timeout_ms: int = 0) -> None:
        """A request from a node behind the trainer makes the next published version a snapshot too."""
        for d in self.control.poll(timeout_ms):
            m = d.message
            if isinstance(m, SnapshotRequest) and m.policy == self.cfg.policy and m.have_version < self.engine.step + 1:
                if not self._snapshot_next:
                    log.warning("trainer: %s asked for a snapshot (holds v%d): %s", m.node_id, m.have_version,
                                m.reason)
                self._snapshot_next = True
                self.metrics.emit("trainer.snapshot_requests", 1, step=self.engine.step, node=m.node_id)

    def _weights(self) -> dict:
        """The trainer's weights as rollout engines will hold them (``trainer.publish_dtype``);
        ``{}`` on ranks other than 0. Every rank calls it at the same points: under ZeRO-3
        it is a collective gather of the partitioned parameters."""
        import torch
        dtype = getattr(torch, self.cfg.trainer.publish_dtype)
        named = self.engine.named_weights(rank0_only=True) if self.world > 1 else self.engine.named_weights()
        return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in named.items()}

    def _export(self, weights: dict, final: bool = False) -> None:
        """The weights as published (``publish_dtype``) as an HF directory of this version
        (rank 0; ``weights`` were gathered by every rank); ``final`` points ``final`` at it."""
        t0 = time.monotonic()
        version = self.engine.step
        path = self.exports.path(version)
        if not (final and path.is_dir()):  # (a resumed finished run exported it already)
            path = self.engine.export_hf(path, weights)
        if final:
            self.exports.mark_final(version)
        log.info("trainer: exported v%d as a Hugging Face model: %s", version, path)
        self.metrics.emit("trainer.hf_export_s", time.monotonic() - t0, step=version, path=str(path), final=final)

    def _report_published(self) -> None:
        """Metrics for payloads the publisher finished since the last call (it runs behind us).

        The trainer is the only reader of ``publisher.published``; deque pops are thread-safe."""
        while self.publisher.published:
            p = self.publisher.published.popleft()
            self.metrics.emit_many({f"weights.{p.kind}_bytes": p.payload_bytes,
                                    f"weights.{p.kind}_changed_frac": p.stats.changed_fraction,
                                    f"weights.{p.kind}_encode_s": p.encode_s,
                                    f"weights.{p.kind}_write_s": p.write_s}, step=p.version)

    def _checkpoint(self) -> None:
        state = {"step": self.engine.step, "batches_offset": self.offset, "lineage": self.lineage,
                 "world_size": self.world}
        self.checkpoints.save(self.engine.step, lambda d: self.engine.save_checkpoint(d, state), state,
                              leader=self.leader, barrier=getattr(self.engine, "barrier", None))
        if not self.leader:
            return
        # A readable copy for operators and audits; the checkpoint's own state is authoritative.
        tmp = self.ckpt_dir / "progress.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.ckpt_dir / "progress.json")

    def _heartbeat(self, force: bool = False) -> None:
        if not self.leader:
            return
        now = time.monotonic()
        if not force and now - self._last_hb < self.cfg.rollout.heartbeat_s:
            return
        self._last_hb = now
        self.producer.send(self.topics.control, Heartbeat(f"trainer.{self.cfg.policy}", "trainer", self.cfg.policy,
                                                          self.engine.step, ts=time.time(), epoch=self.publisher.epoch),
                           key=f"trainer.{self.cfg.policy}", trace=False)

    def teardown(self) -> None:
        # The publisher first: close() publishes what is queued before the clients go away.
        close_quietly(self.publisher, self.consumer, self.control, self.producer, self.engine)
        self.engine = self.consumer = self.control = self.producer = self.publisher = None



class ModelLimits(NamedTuple):
    """What a batch must fit of the model it trains (from the model's ``config.json``)."""

    vocab: int  #: token ids are in ``[0, vocab)``


def model_limits(path: Path) -> ModelLimits:
    """The :class:`ModelLimits` of the HF model at ``path``."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or vocab <= 0:
        raise ValueError(f"{path}/config.json names no vocab_size; the trainer cannot bound token ids")
    return ModelLimits(vocab)


def refusal(batch: Batch, policy: str, step: int, limits: ModelLimits, min_samples: int = 1) -> str:
    """Why a trainer of ``policy`` at ``step`` (the next step it trains) of a model with
    ``limits``, which needs ``min_samples`` samples per batch (its minibatches), must not
    train ``batch``; "" when it may.

    A step below ``step`` is one already trained (a repeat, or a forgery of an old one); one
    above it is a gap (the missing batch comes first, or the job's batches disagree with
    the checkpoint). A token id outside ``[0, vocab)`` would index past the embedding.
    """
    if batch.policy != policy:
        return f"it is policy {batch.policy[:60]!r}'s, this trainer trains {policy!r}"
    if batch.step < step:
        return f"step {batch.step} was trained already (this trainer is at step {step})"
    if batch.step > step:
        return f"step {batch.step} leaves a gap: this trainer trains step {step} next"
    trainable = 0
    for g in batch.groups:
        for s in g.samples:
            context = s.prompt_ids or g.prompt_ids
            if not s.tokens:
                continue
            if not context:
                return f"task {g.task_id[:60]!r}: a sample has no context (no prompt_ids of its own or its group's)"
            for name, ids in (("tokens", s.tokens), ("prompt_ids", context)):
                if not 0 <= min(ids) <= max(ids) < limits.vocab:
                    return (f"task {g.task_id[:60]!r}: {name} holds ids {min(ids)}..{max(ids)}, outside the "
                            f"model's vocabulary of {limits.vocab}")
            trainable += bool(s.trained())
    if trainable < min_samples:
        return f"it has {trainable} sample(s) to train, the trainer needs at least {min_samples} (its minibatches)"
    return ""
