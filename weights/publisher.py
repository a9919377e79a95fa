"""The trainer's side of weight transfer: encode, chunk, make durable, announce, trim.

:class:`WeightPublisher` owns one background thread and a bounded queue. The trainer
hands over the weights of a version (CPU copies it no longer touches) and goes on
training; the thread encodes a sparse delta against the previously published version,
writes it to ``weights.<policy>`` as <= 1 MiB chunks (each with its BLAKE3 digest), waits until
every chunk is acknowledged (``acks=all``), and only then announces the version on the
compacted ``versions`` topic. Every ``snapshot_every`` versions, and on demand, it also
writes a full snapshot of the same version. That version is announced twice: first as
a delta, so nodes that follow every version never download a snapshot and see no extra
latency, then, once the snapshot is durable, as the new chain head for late joiners.

An announcement carries the whole chain a node needs to reach it (compaction keeps
only the latest per policy): the newest snapshot and every delta after it, with each
payload's chunk offsets and checksums, plus the digest of the full weights.

Retention rule (the weights topic is never trimmed by time or size):
    ``weights.<policy>`` has ``retention.ms=-1`` and ``retention.bytes=-1``. After
    announcing snapshot S_n, the publisher calls ``delete_records`` up to the first
    chunk of the previous snapshot S_{n-1}. So the log always holds the newest announced
    snapshot, its predecessor, and every delta after the predecessor. A node that is
    reading the previous chain when S_n lands is not cut off, and a late joiner always
    finds the snapshot the latest announcement points to. Broker time or size limits
    cannot promise this: the trainer may pause (waiting for batches, restarting) for
    longer than any ``retention.ms``; and since a dense delta can be as large as a
    snapshot, the only safe ``retention.bytes`` is 2 * (K + 1) snapshots (K =
    ``snapshot_every``), mostly wasted disk when deltas are sparse.
    The log holds at most two snapshots and two intervals of deltas, plus the rest of
    one segment (``segment.bytes`` is 64 MiB: Kafka frees disk a segment at a time).

Lineage epochs (fenced like Kafka producer epochs): versions are ordered by
``(epoch, version)``. On start the publisher reads the latest announcement of its policy;
the trainer then calls :meth:`WeightPublisher.resume` with the weights it holds. Only a
trainer that provably holds the announced head (same version, same weights digest)
continues that epoch, with a delta. Any other restart, above all one from a checkpoint
*behind* the head (the announced versions after it came from a history this trainer
discarded; on GPU retraining is not bit-exact), opens epoch + 1 with a snapshot of the
version it holds, and versions go on from there, re-publishing the numbers the old epoch
used. Subscribers move to the newest epoch and ignore announcements of older ones, so a
zombie trainer of the old epoch is fenced off. So each epoch is one contiguous history that
starts with a snapshot. Trajectories carry their behaviour log-probs, so samples generated
by old-epoch weights stay correct to train on: the loss weighs them by their own
behaviour policy, and the dataflow's staleness bound (by version number) still applies.

Signatures (:mod:`.signing`): an epoch is a fence only if no one else can raise it. With a
``signer`` every announcement carries the trainer's Ed25519 signature over its exact bytes
(and so over every manifest in it); readers with the policy's public key refuse anything
else. The head a publisher resumes from is read through the same check.

A LoRA policy's versions are its adapter's tensors (the trainer hands over only those);
every announcement then names the base they apply to (``base_model``, :mod:`.adapters`),
and nothing else changes: deltas, snapshots, signatures and epochs are the same.

The bytes of a payload come from :mod:`.codec`; this module owns the transport (chunks,
acknowledgements, announcements, trimming, epochs). It knows no job config and nothing
about training: the trainer actor that hosts it hands over CPU copies of its weights.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from astraflow.topics import (ChunkManifest, ChunkWriter, JobTopics, Producer, TopicPartition,
                              VersionAnnouncement)
from astraflow.topics.chunking import DEFAULT_CHUNK_SIZE
from astraflow.topics import security

from . import codec
from .announcements import read_latest_announcement
from .signing import AnnouncementSigner, AnnouncementVerifier

__all__ = ["WeightPublisher", "WeightPublishError", "PublishedVersion"]

log = logging.getLogger(__name__)

SNAPSHOT, DELTA = "snapshot", "delta"


class WeightPublishError(RuntimeError):
    """A version could not be published; raised on the trainer's next ``publish``/``flush``.

    Nothing of that version was announced, so subscribers never see it. The publisher keeps
    running: the next version is a delta against the last *announced* version.
    """

    def __init__(self, version: int, cause: BaseException) -> None:
        self.version = version
        super().__init__(f"weight version {version} was not published: {type(cause).__name__}: {cause}; "
                         "check the broker, then publish a newer version (or a snapshot)")


@dataclass(frozen=True)
class PublishedVersion:
    """What one payload cost: for metrics and the transfer benchmark."""

    version: int
    kind: str  #: "snapshot" or "delta"
    payload_bytes: int
    chunks: int
    stats: codec.DeltaStats
    encode_s: float  #: encoding, with the chunks of the frames ready so far sent meanwhile (streamed)
    write_s: float  #: after encoding: the last chunks sent and every chunk acknowledged


@dataclass(frozen=True)
class _Job:
    named: Mapping[str, torch.Tensor]
    version: int
    epoch: int
    snapshot: bool
    trace_context: otel_context.Context | None


_STOP = object()


class WeightPublisher:
    """Publishes versions of one policy's weights; see the module docstring.

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        topics: the job's topics (``weights.<policy>`` and ``versions`` must exist).
        policy: the policy whose weights this publisher owns.
        snapshot_every: also write a full snapshot when ``version % snapshot_every == 0``.
        queue_size: versions handed over but not yet published; ``publish`` blocks beyond it.
        producer_id: ``client_id`` of the producer (the ``af-producer`` header).
        tracer: OpenTelemetry tracer (default: this module's).
        write_deltas: False publishes every version as a full snapshot ("full" transport).
        codec_threads: threads the codec may use (it runs off the trainer's critical path).
        trim: delete records before the previous snapshot (the retention rule above).
        chunk_size: bytes per chunk record (default fits a stock 1 MiB record limit).
        signer: signs every announcement (:mod:`.signing`); None: announcements go out
            unsigned, and readers that require signatures refuse them.
        verifier: checks the announced head read at start (the one :meth:`resume` continues
            or fences); None: any head counts.
        base_model: for a LoRA policy, the digest of the base its adapter tensors apply to
            (:func:`.adapters.base_digest`), named in every announcement; "": full weights.
    """

    def __init__(self, bootstrap_servers: str, topics: JobTopics, policy: str, *, snapshot_every: int = 10,
                 queue_size: int = 2, producer_id: str = "publisher", tracer: trace.Tracer | None = None,
                 write_deltas: bool = True, codec_threads: int = 1, trim: bool = True,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, signer: AnnouncementSigner | None = None,
                 verifier: AnnouncementVerifier | None = None, base_model: str = "") -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.bootstrap_servers, self.topics, self.policy = bootstrap_servers, topics, policy
        self.snapshot_every, self.write_deltas = snapshot_every, write_deltas
        self.codec_threads, self.trim, self.chunk_size = codec_threads, trim, chunk_size
        self._tracer = tracer or trace.get_tracer(__name__)
        self._weights_topic = topics.weights(policy)
        self._signer = signer
        self.base_model = base_model
        self._head = read_latest_announcement(bootstrap_servers, topics.versions, policy, verifier=verifier)
        # Digests of versions announced before this process started, for the restart check.
        self._announced: dict[int, str] = {self._head.version: self._head.checksum} if self._head else {}
        self._epoch = self._head.epoch if self._head is not None else 0
        if self._head is not None:
            log.info("%s: announced head is version %d of epoch %d (snapshot %d)", policy,
                     self._head.version, self._head.epoch, self._head.snapshot_version)
        # The last announced version's weights and tensor hashes: the next delta's base.
        self._base: Mapping[str, torch.Tensor] | None = None
        self._base_hashes: Mapping[str, bytes] | None = None
        self._producer = Producer(bootstrap_servers, client_id=producer_id, compression_type=None)
        self._admin: security.KafkaAdminClient | None = None
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._cond = threading.Condition()
        self._pending = 0
        self._error: WeightPublishError | None = None
        self._closed = False
        self.published: deque[PublishedVersion] = deque(maxlen=64)  #: the most recent payloads
        self._thread = threading.Thread(target=self._run, name=f"weight-publisher-{policy}", daemon=True)
        self._thread.start()

    # -- the trainer's side ------------------------------------------------------------
    @property
    def last_announced(self) -> int | None:
        """The newest version announced (by this process or, before a restart, its predecessor)."""
        head = self._head
        return head.version if head is not None else None

    @property
    def epoch(self) -> int:
        """The lineage epoch of the versions this publisher announces."""
        return self._epoch

    def resume(self, named: Mapping[str, torch.Tensor], version: int) -> int:
        """Start the chain from the weights a (re)started trainer holds at ``version``; returns the epoch.

        Call once, before the first :meth:`publish`. When ``named`` is exactly the announced
        head (same version and digest), the epoch continues and the next version is a delta
        against it. Otherwise ``version`` is published as a snapshot: in epoch 0 when nothing
        was announced yet, else in the head's epoch + 1 (see the module docstring).
        """
        if self._pending or self.published:
            raise RuntimeError(f"weight publisher of {self.policy!r}: resume() must come before the first publish()")
        head = self._head
        if head is None:
            self.publish(named, version, snapshot=True)
            return self._epoch
        hashes = codec.tensor_hashes(named, threads=self.codec_threads)
        if version == head.version and codec.weights_digest(named, hashes) == head.checksum:
            log.info("%s: resuming at the announced head (version %d of epoch %d, same weights)", self.policy,
                     version, head.epoch)
            self._base, self._base_hashes = named, hashes
            return self._epoch
        self._epoch = head.epoch + 1
        why = ("behind the announced head" if version < head.version else
               "with other weights than the announced head" if version == head.version else
               "ahead of the announced head (its last versions were never announced)")
        log.warning("%s: the trainer resumed at version %d %s (version %d of epoch %d): starting lineage epoch %d "
                    "with a snapshot of version %d; nodes drop the weights of epoch %d", self.policy, version, why,
                    head.version, head.epoch, self._epoch, version, head.epoch)
        self.publish(named, version, snapshot=True)
        return self._epoch

    def publish(self, named: Mapping[str, torch.Tensor], version: int,
                trace_context: otel_context.Context | None = None, *, snapshot: bool = False) -> None:
        """Hand over ``named`` as ``version``; blocks only while the queue is full.

        ``named`` must not be modified afterwards (the trainer's ``named_weights()`` returns
        fresh CPU copies): it is encoded later and kept as the next delta's base.
        ``snapshot=True`` also writes a full snapshot of this version. The
        ``weights.publish`` span's parent is ``trace_context``, else the caller's current
        context (the trainer's step span), captured here because the work runs on another
        thread. Raises the :class:`WeightPublishError` of an earlier version that failed; this
        version is then not enqueued.
        """
        self._raise_error()
        if self._closed:
            raise RuntimeError(f"weight publisher of {self.policy!r} is closed")
        with self._cond:
            self._pending += 1
        ctx = trace_context if trace_context is not None else otel_context.get_current()
        self._queue.put(_Job(named, version, self._epoch, snapshot, ctx))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every handed-over version is announced (or failed, which is raised)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending == 0, timeout):
                raise TimeoutError(f"{self._pending} weight version(s) of {self.policy!r} still unpublished "
                                   f"after {timeout}s; is the broker slow or down?")
        self._raise_error()

    def thread_ids(self) -> list[int]:
        """The OS threads that carry a version to the broker: the publisher's own (its codec
        threads are started from it) and its producer's I/O thread. The rollout path waits on
        them, so a trainer that lowers its priority leaves these alone."""
        ids = [self._thread.native_id, self._producer.network_thread_id]
        return [i for i in ids if i is not None]

    def close(self, timeout: float | None = 120.0) -> None:
        """Publish what is queued, stop the thread, close the clients; raises a pending error."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            drained = self._cond.wait_for(lambda: self._pending == 0, timeout)
        if not drained:
            log.warning("%s: closing with %d weight version(s) unpublished", self.policy, self._pending)
        try:
            self._queue.put(_STOP, timeout=1.0 if drained else 0.0)
        except queue.Full:
            pass  # the thread is stuck on the broker; it is a daemon and dies with the process
        self._thread.join(timeout if drained else 1.0)
        self._producer.close(timeout=10)
        if self._admin is not None:
            self._admin.close()
        self._raise_error()

    def _raise_error(self) -> None:
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    # -- the background thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            assert isinstance(job, _Job)
            try:
                self._publish(job)
            except Exception as e:  # noqa: BLE001 - surfaced on the trainer's next call
                log.exception("%s: publishing version %d failed", self.policy, job.version)
                with self._cond:
                    if self._error is None:  # the first failure explains the rest
                        self._error = WeightPublishError(job.version, e)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _publish(self, job: _Job) -> None:
        head = self._head
        same_epoch = head is not None and head.epoch == job.epoch
        if same_epoch and job.version <= head.version:
            self._skip_announced(job)
            return
        v = job.version
        with self._tracer.start_as_current_span(
                "weights.publish", context=job.trace_context,
                attributes={"policy": self.policy, "policy.version": v, "policy.epoch": job.epoch}) as span:
            delta_ann: VersionAnnouncement | None = None
            if self._base is not None and same_epoch and self.write_deltas:
                # Deltas go out first, even at snapshot versions: followers stay on deltas.
                manifest, hashes, digest = self._write(job, DELTA, head.version)
                head = delta_ann = self._announce(VersionAnnouncement(
                    self.policy, v, DELTA, head.version, head.snapshot_version, manifest, digest,
                    head.snapshot_manifest, [*head.deltas, manifest], [*head.delta_versions, v],
                    created_at=time.time(), epoch=job.epoch, base_model=self.base_model))
                # The announced version is the next base, even if its snapshot fails below.
                self._base, self._base_hashes = job.named, hashes
                span.set_attribute("weights.delta_bytes", manifest.total_bytes)
            if delta_ann is None or job.snapshot or v % self.snapshot_every == 0:
                previous_snapshot = head.snapshot_manifest if head is not None else None
                manifest, hashes, digest = self._write(job, SNAPSHOT, -1)
                # `manifest` stays the delta that leads here, so a follower one version
                # behind can still take it from this (compacted-to) announcement.
                self._announce(VersionAnnouncement(
                    self.policy, v, SNAPSHOT, delta_ann.base_version if delta_ann else v, v,
                    delta_ann.manifest if delta_ann else manifest, digest, manifest, [], [],
                    created_at=time.time(), epoch=job.epoch, base_model=self.base_model))
                self._base, self._base_hashes = job.named, hashes
                span.set_attribute("weights.snapshot_bytes", manifest.total_bytes)
                if self.trim and previous_snapshot is not None:
                    self._trim_before(previous_snapshot)

    def _write(self, job: _Job, kind: str, base_version: int) -> tuple[ChunkManifest, Mapping[str, bytes], str]:
        """Encode and write one payload; returns its manifest, tensor hashes and weights digest.

        Streamed: each tensor's frame is chunked and sent as soon as it is encoded (the
        codec threads encode the next tensors meanwhile), and the header with the tensor
        table, known only at the end, is sent last but listed first in the manifest.
        """
        t0 = time.perf_counter()
        base = self._base if kind == DELTA else None
        writer = ChunkWriter(
            self._producer, self._weights_topic, key=str(job.version), head_last=True,
            object_id=f"{self.policy}-v{job.version}-{kind}-{uuid.uuid4().hex[:8]}", chunk_size=self.chunk_size,
            headers=[("af-version", str(job.version).encode()), ("af-kind", kind.encode())])
        sv = codec.stream_version(job.named, job.version, writer.write, base=base, base_version=base_version,
                                  base_hashes=self._base_hashes if base is not None else None,
                                  threads=self.codec_threads)
        t1 = time.perf_counter()
        manifest = writer.close(head=sv.head)
        self.published.append(PublishedVersion(job.version, kind, sv.header.nbytes, len(manifest.chunks), sv.stats,
                                               t1 - t0, time.perf_counter() - t1))
        return manifest, sv.tensor_hashes, sv.header.digest

    def _announce(self, ann: VersionAnnouncement) -> VersionAnnouncement:
        # Inside the weights.publish span: send() puts its context in the traceparent header.
        # The signature covers the bytes send() writes.
        self._producer.send_sync(self.topics.versions, ann, key=self.policy,
                                 sign=self._signer.headers if self._signer is not None else None)
        self._head = ann
        log.debug("%s: announced version %d (%s, %d bytes)", self.policy, ann.version, ann.kind,
                  ann.manifest.total_bytes)
        return ann

    def _skip_announced(self, job: _Job) -> None:
        known = self._announced.get(job.version)
        digest = codec.weights_digest(job.named)
        if known is not None and known != digest:
            log.warning("%s: version %d was already announced with weights digest %s… but the trainer now "
                        "holds %s… for it; keeping the announced weights (a restarted trainer must call "
                        "resume() first, which starts a new lineage epoch)", self.policy, job.version, known[:16],
                        digest[:16])
        else:
            log.info("%s: version %d already announced (newest is %d); not announcing it again",
                     self.policy, job.version, self.last_announced)

    def _trim_before(self, previous_snapshot: ChunkManifest) -> None:
        """The retention rule: nothing before the previous snapshot's first chunk is needed."""
        first = min(c.offset for c in previous_snapshot.chunks)
        tp = TopicPartition(previous_snapshot.topic, previous_snapshot.chunks[0].partition)
        try:
            if self._admin is None:
                self._admin = security.admin(bootstrap_servers=self.bootstrap_servers,
                                             client_id=f"astraflow-weights-trim-{self.policy}")
            self._admin.delete_records({tp: first})
        except Exception as e:  # noqa: BLE001 - a failed trim costs disk, never correctness
            log.warning("%s: could not trim %s before offset %d (%s: %s); the topic keeps growing "
                        "until the next snapshot trims it", self.policy, tp.topic, first, type(e).__name__, e)

