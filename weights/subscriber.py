"""A RaaS node's side of weight transfer: follow announcements, keep the newest verified version.

:class:`WeightSubscriber` owns a background thread that follows the compacted ``versions``
topic and moves the node's copy of the weights (:mod:`.held`) to the newest announced
version, off the rollout path, through the delta or the snapshot path (:mod:`.assembly`,
where every check is described). A failure is reported in :attr:`WeightSubscriber.faults`
with the path that recovered; a version that cannot be reached is retried with backoff, and
the subscriber keeps its last good version until a newer snapshot is announced.

With ``prefetch``, chunks are read while they are written (:mod:`.prefetch`), so a
payload is mostly in memory when its version is announced; what was missed is fetched then.

Lineage epochs: versions are ordered by ``(epoch, version)``. When a trainer resumes
behind the announced head it opens a new epoch with a snapshot (see
:mod:`.publisher`); the subscriber then takes the snapshot path to the new epoch
even when its number is lower than the version it holds, dropping the old epoch's
weights, and from then on ignores announcements of older epochs (a fenced trainer).

Signatures: with a ``verifier`` (:mod:`.signing`) an announcement counts only when the
policy's trainer signed it. Anything else (unsigned, signed by another key, altered) never
becomes the head, whatever epoch it claims: it is counted in
:attr:`WeightSubscriber.rejected`, written to the dead-letter topic with its reason (once
per record and process: the compacted topic is re-read on every reconnect) and handed to
``on_reject``; the node keeps following the real lineage. It is no fault: asking the
trainer for a snapshot would let anyone who can write ``versions`` make it write snapshots.

Bases (:mod:`.adapters`): a node serves either full weights or adapters of one base model
(``base_model``, its digest). An announcement for anything else (an adapter of another
base, an adapter on a full-weights node, full weights on an adapter node) is refused the
same way, with reason ``wrong_base``: counted, dead-lettered once, handed to ``on_reject``,
and the node keeps what it holds.

The rollout side calls :meth:`WeightSubscriber.apply_to` between requests; it copies the
held version into the engine under the held weights' lock, so an engine never sees a
half-applied version. This module does not talk to engines otherwise, does not decode or
verify payloads itself, and knows nothing about rollouts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from astraflow.topics import ChunkReader, DeadLetters, JobTopics, TopicPartition, VersionAnnouncement
from astraflow.topics import tracing
from astraflow.topics import security

from .adapters import WrongBaseError, check_base
from .announcements import announcement_of, newer
from .assembly import PathFailed, PayloadSource, VersionAssembler
from .held import Held, HeldWeights, WeightEngine
from .prefetch import DEFAULT_MAX_BYTES as DEFAULT_PREFETCH_BYTES
from .prefetch import ChunkPrefetcher
from .signing import AnnouncementVerifier, Rejection, SignatureError

__all__ = ["WeightSubscriber"]

log = logging.getLogger(__name__)

_MAX_FAULTS = 1000
_RETRY_S = (1.0, 30.0)  # backoff bounds for retrying a version that could not be reached


def _claimed(n: object) -> int:
    """A number a refused record claims, for metrics: -1 unless it is an int (nothing checked its types)."""
    return n if type(n) is int else -1


class WeightSubscriber:
    """Keeps a verified copy of the newest announced weights of one policy.

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        topics: the job's topics.
        policy: whose weights to follow.
        initial: weights the node starts with (copied); None: the first version comes
            through the snapshot path.
        initial_version: the version of ``initial`` (or of the engine's weights when
            ``initial`` is None); announcements at or below it are not fetched.
        initial_epoch: the lineage epoch of ``initial_version``.
        node_id: names this node in logs, fault reports and spans.
        codec_threads: threads for decoding and applying payloads.
        tracer: OpenTelemetry tracer (default: this module's).
        on_fault: called from the subscriber's thread with ``(report, held_version)`` for
            every unrecovered fault (RaaS nodes ask the trainer for a snapshot with it).
        on_demand: fetch nothing until a version is asked for (:meth:`want`, or
            :meth:`wait_for`), then move straight to the head: a node that needs only some
            versions (the evaluator, every ``eval.every``-th) loads the chain's latest
            snapshot and the few deltas after it instead of applying every delta.
        prefetch: read payload chunks while they are written (:mod:`.prefetch`), so
            a version is assembled from memory once announced instead of fetched after its
            write. Off by default: it pays where the node has its own cores; on one shared
            2-core machine it only moved the read's CPU into the write (docs/weight-transfer.md: the weight path).
        prefetch_bytes: chunk bytes the prefetcher may hold.
        verifier: accept only announcements it passes (:mod:`.signing`); None: every
            announcement counts (tests, benchmarks; components always pass one).
        dead_letters: where refused announcements go, with their reason.
        on_reject: called from the subscriber's thread with each :class:`~.signing.Rejection`
            (a node counts them in its metrics).
        security_setting: the client setting on ``bootstrap_servers`` (a region's own cluster:
            ``rollout.weights_security``); None: the process's.
        base_model: the digest of the base model this node's engine applies adapters to
            (:func:`.adapters.base_digest`); "": it serves full weights. Versions for
            anything else are refused (see the module docstring).
    """

    def __init__(self, bootstrap_servers: str, topics: JobTopics, policy: str, *,
                 initial: Mapping[str, torch.Tensor] | None = None, initial_version: int = -1,
                 initial_epoch: int = 0, node_id: str = "", codec_threads: int = 1,
                 tracer: trace.Tracer | None = None,
                 on_fault: Callable[[str, int], None] | None = None, on_demand: bool = False,
                 prefetch: bool = False, prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
                 verifier: AnnouncementVerifier | None = None, dead_letters: DeadLetters | None = None,
                 on_reject: Callable[[Rejection], None] | None = None,
                 security_setting: security.ClientSecurity | None = None, base_model: str = "") -> None:
        self.bootstrap_servers, self.topics, self.policy = bootstrap_servers, topics, policy
        self.security_setting = security_setting
        self.node_id = node_id or "subscriber"
        self.codec_threads = codec_threads
        self._held = HeldWeights(initial, initial_version, initial_epoch, policy=policy, node_id=self.node_id,
                                 tracer=tracer or trace.get_tracer(__name__))
        self._assembler = VersionAssembler(self._held, node_id=self.node_id, codec_threads=codec_threads)
        self._on_fault = on_fault
        self._lock = threading.Lock()  # guards the fault reports and the rejection counts
        self._faults: list[str] = []
        self._rejected: dict[str, int] = {}  # by reason
        # Only the thread touches these.
        self._head: VersionAnnouncement | None = None
        self._head_context: otel_context.Context | None = None
        self._retry_at = 0.0
        self._backoff = _RETRY_S[0]
        self._unrecovered = False  # a fault was reported and no version was reached since
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_demand = on_demand
        self._prefetch = prefetch
        self._prefetch_bytes = prefetch_bytes
        self._prefetcher: ChunkPrefetcher | None = None  # the thread's, while connected
        self._wanted = -1  # on demand: the lowest version worth fetching; -1: none asked for yet
        self._verifier = verifier if verifier is not None and verifier.checks else None
        self._dead_letters, self._on_reject = dead_letters, on_reject
        self.base_model = base_model
        self._judged: dict[int, int] = {}  # partition -> newest offset whose signature was checked

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "WeightSubscriber":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"weight-subscriber-{self.node_id}",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "WeightSubscriber":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the node reads -----------------------------------------------------------
    @property
    def version(self) -> int:
        """The newest version fully assembled and verified (what the node reports in heartbeats)."""
        return self._held.version

    @property
    def epoch(self) -> int:
        """The lineage epoch of the held version."""
        return self._held.epoch

    def held(self) -> Held | None:
        """Epoch, version and digest of the held weights; None before the first version."""
        return self._held.held()

    def held_by(self, engine: WeightEngine) -> Held | None:
        """What :meth:`apply_to` last loaded into ``engine``; None if it never loaded anything."""
        return self._held.held_by(engine)

    @property
    def faults(self) -> list[str]:
        """Fault reports, oldest first: what failed and which path recovered."""
        with self._lock:
            return list(self._faults)

    @property
    def rejected(self) -> dict[str, int]:
        """Announcements refused, by reason (signatures: ``unsigned``, ``wrong_key``, ...; ``wrong_base``)."""
        with self._lock:
            return dict(self._rejected)

    @property
    def path_counts(self) -> dict[str, int]:
        """Payloads applied, by kind: ``{"delta": n, "snapshot": m}``."""
        return self._held.path_counts

    @property
    def load_waits(self) -> dict[str, float]:
        """Engine loads, and the seconds each loaded version had been held before (summed)."""
        return self._held.load_waits

    @property
    def prefetched_chunks(self) -> int:
        """Chunks offered by the prefetcher (read during their write) for payloads fetched so far."""
        return self._assembler.prefetched

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the held weights (tests, checkpoints)."""
        return self._held.weights()

    def digest(self) -> str | None:
        """``weights_digest`` of the held weights (equal to the trainer's iff bit-identical)."""
        return self._held.digest()

    def want(self, version: int) -> None:
        """On demand: move to the head once it reaches ``version`` (the latest ask counts; no-op
        when following every version)."""
        self._wanted = version

    def wait_for(self, version: int, timeout: float, *, epoch: int | None = None) -> bool:
        """Wait until a version >= ``version`` is held (in ``epoch`` or a newer one, if given); False on timeout."""
        self._wanted = version
        return self._held.wait_for(version, timeout, epoch)

    def apply_to(self, engine: WeightEngine) -> int | None:
        """Load the held version into ``engine`` if it is newer; returns it, else None.

        Call between requests. Runs under the held weights' lock, so the engine gets one
        whole verified version (engines copy the tensors in).
        """
        return self._held.apply_to(engine)

    # -- the background thread ---------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._connect_and_follow()
                return
            except Exception as e:  # noqa: BLE001 - report, back off, reconnect
                self._fault(f"weight subscriber error ({type(e).__name__}: {e}); reconnecting")
                self._stop.wait(self._backoff)
                self._backoff = min(self._backoff * 2, _RETRY_S[1])

    def _connect_and_follow(self) -> None:
        tp = TopicPartition(self.topics.versions, 0)
        with contextlib.ExitStack() as stack:
            consumer = security.consumer(bootstrap_servers=self.bootstrap_servers, group_id=None,
                                         enable_auto_commit=False, client_id=f"astraflow-weights-{self.node_id}",
                                         max_partition_fetch_bytes=8 * 1024 * 1024, security=self.security_setting)
            stack.callback(consumer.close)
            reader = stack.enter_context(ChunkReader(self.bootstrap_servers, security_setting=self.security_setting))
            if self._prefetch:
                self._prefetcher = ChunkPrefetcher(
                    self.bootstrap_servers, self.topics.weights(self.policy), node_id=self.node_id,
                    want_snapshots=lambda: not self._held.holds_weights, max_bytes=self._prefetch_bytes,
                    security_setting=self.security_setting)
                stack.callback(self._drop_prefetcher)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            source = PayloadSource(reader, self._prefetcher)
            while not self._stop.is_set():
                self._follow(consumer, tp, source)

    def _drop_prefetcher(self) -> None:
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()

    def _follow(self, consumer: security.KafkaConsumer, tp: TopicPartition, source: PayloadSource) -> None:
        # Drain what is there, then act on the newest: a late joiner jumps straight to the head.
        timeout_ms = 200
        while True:
            records = consumer.poll(timeout_ms=timeout_ms).get(tp, [])
            if not records:
                break
            for r in records:
                ann = announcement_of(r, self.policy, self._dead_letters)
                if ann is None or not self._admitted(r, ann):
                    continue
                if self._head is None or newer(ann, self._head):
                    self._head, self._head_context = ann, tracing.extract(r.headers)
                    self._retry_at, self._backoff = 0.0, _RETRY_S[0]
                elif ann.epoch < self._head.epoch:
                    log.warning("%s: ignoring version %d of lineage epoch %d: epoch %d superseded it (a trainer "
                                "that resumed elsewhere fenced this one off)", self.node_id, ann.version, ann.epoch,
                                self._head.epoch)
            timeout_ms = 0
        head = self._head
        if (head is None or (head.epoch, head.version) <= (self._held.epoch, self._held.version)
                or time.monotonic() < self._retry_at):
            return
        if self._on_demand and (self._wanted < 0 or head.version < self._wanted):
            return  # not asked for yet: announcements are followed, payloads are not fetched
        if not self._advance(source, head):
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _RETRY_S[1])

    def _admitted(self, record, ann: VersionAnnouncement) -> bool:
        """Whether ``ann`` may count: signed by the policy's trainer (or nothing is checked)
        and for the weights this node serves (its base, or full weights)."""
        # The topic is re-read from its start on every reconnect: a record at or below the
        # newest offset checked before was refused, counted and dead-lettered then.
        seen = record.offset <= self._judged.get(record.partition, -1)
        self._judged[record.partition] = max(record.offset, self._judged.get(record.partition, -1))
        try:
            if self._verifier is not None:
                self._verifier.check(record.topic, record.value, record.headers)
            check_base(ann.base_model, self.base_model)
            return True
        except (SignatureError, WrongBaseError) as e:
            if not seen:
                self._refuse(record, ann, e)
            return False

    def _refuse(self, record, ann: VersionAnnouncement, error: SignatureError | WrongBaseError) -> None:
        with self._lock:
            self._rejected[error.reason] = self._rejected.get(error.reason, 0) + 1
        log.warning("%s: refusing the announcement at %s[%d]@%d (version %s of lineage epoch %s): %s; keeping "
                    "version %d of epoch %d", self.node_id, record.topic, record.partition, record.offset,
                    ann.version, ann.epoch, error, self._held.version, self._held.epoch)
        if self._dead_letters is not None:
            try:
                self._dead_letters.put(record.topic, record.partition, record.offset, record.key, record.value,
                                       record.headers or [], error)
            except Exception as e:  # noqa: BLE001 - refused either way; the log line above keeps the record's place
                log.warning("%s: could not dead-letter the refused announcement: %s", self.node_id, e)
        if self._on_reject is not None:
            try:
                self._on_reject(Rejection(record.topic, record.partition, record.offset, ann.policy,
                                          _claimed(ann.epoch), _claimed(ann.version), error.reason, str(error)))
            except Exception:  # noqa: BLE001 - a failing callback must not stop the subscriber
                log.exception("%s: on_reject callback failed", self.node_id)

    def _advance(self, source: PayloadSource, head: VersionAnnouncement) -> bool:
        """Move to ``head``: delta path if possible, else snapshot path. True when reached."""
        steps = self._assembler.delta_steps(head)
        if steps is not None:
            try:
                self._assembler.apply_deltas(source, steps, head, self._head_context)
                self._report_recovery(head, "delta path")
                return True
            except PathFailed as e:
                self._fault(f"delta path to version {head.version} failed: {e}; trying the snapshot path")
        try:
            self._assembler.load_snapshot(source, head, self._head_context)
        except PathFailed as e:
            self._fault(f"cannot reach version {head.version}: {e}; holding version {self._held.version} "
                        "until a newer snapshot is announced")
            return False
        self._report_recovery(head, f"snapshot path (snapshot {head.snapshot_version})")
        return True

    def _report_recovery(self, head: VersionAnnouncement, path: str) -> None:
        if self._unrecovered:
            self._fault(f"recovered: reached version {head.version} through the {path}", recovered=True)

    def _fault(self, report: str, *, recovered: bool = False) -> None:
        """Record a fault report (or, with ``recovered``, the recovery that follows faults)."""
        report = f"{self.node_id}: {report}"
        log.warning("%s", report)
        with self._lock:
            self._faults.append(report)
            del self._faults[:-_MAX_FAULTS]
        held = self._held.version
        self._unrecovered = not recovered
        if not recovered and self._on_fault is not None:
            try:
                self._on_fault(report, held)
            except Exception:  # noqa: BLE001 - a failing callback must not stop the subscriber
                log.exception("%s: on_fault callback failed", self.node_id)
