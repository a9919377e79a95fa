"""A RaaS node's side of weight transfer: follow announcements, assemble verified versions.

:class:`WeightSubscriber` owns a background thread and its own copy of the weights. The
thread follows the compacted ``versions`` topic and moves its copy to the newest
announced version, off the rollout path:

* **delta path** — when it holds a version on the announced chain, it fetches and
  applies the deltas after it, in order (a follower applies exactly one per version);
* **snapshot path** — when it holds nothing, holds a version off the chain (too old, a
  late joiner), or a delta is missing, corrupt or does not fit its weights, it loads the
  chain's snapshot and the deltas after it into fresh tensors and swaps them in.

With ``prefetch``, chunks are read while they are written (:mod:`.prefetch`), so a
payload is mostly in memory when its version is announced; what was missed is fetched then. Every chunk's BLAKE3 digest, the manifest's, the delta's base
digest, every tensor's result hash and the announced digest of the full weights are
checked before a version counts as held; a failure is reported in :attr:`WeightSubscriber.faults` with the path
that recovered. A payload that failed verification is never fetched again: when it lies
on every path, the subscriber keeps its last good version until a newer snapshot is
announced.

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

The rollout side calls :meth:`WeightSubscriber.apply_to` between requests; it copies the
held version into the engine under the subscriber's lock, so an engine never sees a
half-applied version. This module does not talk to engines otherwise, and knows nothing
about rollouts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from astraflow.topics import (ChunkError, ChunkManifest, ChunkReader, CorruptChunkError, DeadLetters, JobTopics,
                              ReleasableBuffer, TopicPartition, VersionAnnouncement)
from astraflow.topics import tracing
from astraflow.topics import security

from . import codec
from .format import PayloadKind, WeightCodecError, read_table
from .prefetch import DEFAULT_MAX_BYTES as DEFAULT_PREFETCH_BYTES
from .prefetch import ChunkPrefetcher
from .publisher import _announcement, _newer
from .signing import AnnouncementVerifier, Rejection, SignatureError

__all__ = ["WeightSubscriber", "WeightEngine", "Held"]

log = logging.getLogger(__name__)

_MAX_FAULTS = 1000
_RETRY_S = (1.0, 30.0)  # backoff bounds for retrying a version that could not be reached


class WeightEngine(Protocol):
    """What :meth:`WeightSubscriber.apply_to` needs of a rollout engine."""

    @property
    def version(self) -> int: ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None: ...


class Held(NamedTuple):
    """Which weights: lineage epoch, version and ``weights_digest`` (heartbeats report it)."""

    epoch: int
    version: int
    digest: str


def _claimed(n: object) -> int:
    """A number a refused record claims, for metrics: -1 unless it is an int (nothing checked its types)."""
    return n if type(n) is int else -1


class _PathFailed(Exception):
    """One path to a version failed; the message is the fault report."""


class _ReadAborted(Exception):
    """The payload being decoded will not arrive (the fetch failed)."""


class _Arrival:
    """How much of a payload has arrived, for a decoder running alongside the fetch."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._have = 0
        self._aborted = False

    def advance(self, nbytes: int) -> None:
        with self._cond:
            self._have = nbytes
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def ready(self, nbytes: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._have >= nbytes or self._aborted)
            if self._have < nbytes:
                raise _ReadAborted(f"the fetch stopped before byte {nbytes}")


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
    """

    def __init__(self, bootstrap_servers: str, topics: JobTopics, policy: str, *,
                 initial: Mapping[str, torch.Tensor] | None = None, initial_version: int = -1,
                 initial_epoch: int = 0, node_id: str = "", codec_threads: int = 1,
                 tracer: trace.Tracer | None = None,
                 on_fault: Callable[[str, int], None] | None = None, on_demand: bool = False,
                 prefetch: bool = False, prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
                 verifier: AnnouncementVerifier | None = None, dead_letters: DeadLetters | None = None,
                 on_reject: Callable[[Rejection], None] | None = None,
                 security_setting: security.ClientSecurity | None = None) -> None:
        self.bootstrap_servers, self.topics, self.policy = bootstrap_servers, topics, policy
        self.security_setting = security_setting
        self.node_id = node_id or "subscriber"
        self.codec_threads = codec_threads
        self._tracer = tracer or trace.get_tracer(__name__)
        self._on_fault = on_fault
        self._lock = threading.Condition(threading.RLock())
        # Guarded by _lock: the held weights, their tensor hashes, version and trace context.
        self._state: dict[str, torch.Tensor] | None = (
            {k: v.detach().clone() for k, v in initial.items()} if initial is not None else None)
        self._hashes: dict[str, bytes] | None = None
        self._version = initial_version
        self._epoch = self._initial_epoch = initial_epoch
        self._digest: str | None = None  # of the held weights, computed when first asked
        # What each engine was given by apply_to: engines know their version, not its epoch.
        self._engines: weakref.WeakKeyDictionary[object, Held] = weakref.WeakKeyDictionary()
        self._context: otel_context.Context | None = None
        self._faults: list[str] = []
        self._path_counts = {"delta": 0, "snapshot": 0}
        # Only the thread touches these.
        self._head: VersionAnnouncement | None = None
        self._head_context: otel_context.Context | None = None
        self._bad: set[str] = set()  # object ids that failed verification: never fetched again
        self._retry_at = 0.0
        self._backoff = _RETRY_S[0]
        self._unrecovered = False  # a fault was reported and no version was reached since
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_demand = on_demand
        self._prefetch = prefetch
        self._prefetch_bytes = prefetch_bytes
        self._prefetcher: ChunkPrefetcher | None = None  # the thread's, while connected
        self._prefetched = 0
        self._wanted = -1  # on demand: the lowest version worth fetching; -1: none asked for yet
        self._verifier = verifier if verifier is not None and verifier.checks else None
        self._dead_letters, self._on_reject = dead_letters, on_reject
        self._rejected: dict[str, int] = {}  # by reason; guarded by _lock
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
        return self._version

    @property
    def epoch(self) -> int:
        """The lineage epoch of the held version."""
        return self._epoch

    def held(self) -> Held | None:
        """Epoch, version and digest of the held weights; None before the first version."""
        with self._lock:
            digest = self.digest()
            return None if digest is None else Held(self._epoch, self._version, digest)

    def held_by(self, engine: WeightEngine) -> Held | None:
        """What :meth:`apply_to` last loaded into ``engine``; None if it never loaded anything."""
        with self._lock:
            return self._engines.get(engine)

    @property
    def faults(self) -> list[str]:
        """Fault reports, oldest first: what failed and which path recovered."""
        with self._lock:
            return list(self._faults)

    @property
    def rejected(self) -> dict[str, int]:
        """Announcements refused for their signature, by reason (``unsigned``, ``wrong_key``, ...)."""
        with self._lock:
            return dict(self._rejected)

    @property
    def path_counts(self) -> dict[str, int]:
        """Payloads applied, by kind: ``{"delta": n, "snapshot": m}``."""
        with self._lock:
            return dict(self._path_counts)

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the held weights (tests, checkpoints)."""
        with self._lock:
            return {k: v.clone() for k, v in (self._state or {}).items()}

    def digest(self) -> str | None:
        """``weights_digest`` of the held weights (equal to the trainer's iff bit-identical)."""
        with self._lock:
            if self._state is None:
                return None
            if self._digest is None:
                self._digest = codec.weights_digest(self._state, self._hashes)
            return self._digest

    def want(self, version: int) -> None:
        """On demand: move to the head once it reaches ``version`` (the latest ask counts; no-op
        when following every version)."""
        with self._lock:
            self._wanted = version

    def wait_for(self, version: int, timeout: float, *, epoch: int | None = None) -> bool:
        """Wait until a version >= ``version`` is held (in ``epoch`` or a newer one, if given); False on timeout."""
        with self._lock:
            self._wanted = version
            if epoch is None:
                return self._lock.wait_for(lambda: self._version >= version, timeout)
            return self._lock.wait_for(lambda: (self._epoch, self._version) >= (epoch, version), timeout)

    def apply_to(self, engine: WeightEngine) -> int | None:
        """Load the held version into ``engine`` if it is newer; returns it, else None.

        Call between requests. Runs under the subscriber's lock, so the engine gets one
        whole verified version (engines copy the tensors in).
        """
        with self._lock:
            given = self._engines.get(engine)
            engine_epoch = given.epoch if given is not None else self._initial_epoch
            if self._state is None or (self._epoch, self._version) <= (engine_epoch, engine.version):
                return None
            with self._tracer.start_as_current_span(
                    "raas.weights.apply", context=self._context,
                    attributes={"policy": self.policy, "policy.version": self._version, "policy.epoch": self._epoch,
                                "node.id": self.node_id, "engine.version": engine.version}):
                engine.load_weights(self._state, self._version)
            held = self.held()
            assert held is not None
            self._engines[engine] = held
            return self._version

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
                    want_snapshots=lambda: self._state is None, max_bytes=self._prefetch_bytes,
                    security_setting=self.security_setting)
                stack.callback(self._drop_prefetcher)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            while not self._stop.is_set():
                self._follow(consumer, tp, reader)

    def _follow(self, consumer: security.KafkaConsumer, tp: TopicPartition, reader: ChunkReader) -> None:
        # Drain what is there, then act on the newest: a late joiner jumps straight to the head.
        timeout_ms = 200
        while True:
            records = consumer.poll(timeout_ms=timeout_ms).get(tp, [])
            if not records:
                break
            for r in records:
                ann = _announcement(r, self.policy, self._dead_letters)
                if ann is None or not self._signed(r, ann):
                    continue
                if self._head is None or _newer(ann, self._head):
                    self._head, self._head_context = ann, tracing.extract(r.headers)
                    self._retry_at, self._backoff = 0.0, _RETRY_S[0]
                elif ann.epoch < self._head.epoch:
                    log.warning("%s: ignoring version %d of lineage epoch %d: epoch %d superseded it (a trainer "
                                "that resumed elsewhere fenced this one off)", self.node_id, ann.version, ann.epoch,
                                self._head.epoch)
            timeout_ms = 0
        head = self._head
        if (head is None or (head.epoch, head.version) <= (self._epoch, self._version)
                or time.monotonic() < self._retry_at):
            return
        if self._on_demand and (self._wanted < 0 or head.version < self._wanted):
            return  # not asked for yet: announcements are followed, payloads are not fetched
        if not self._advance(reader, head):
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _RETRY_S[1])

    def _signed(self, record, ann: VersionAnnouncement) -> bool:
        """Whether ``ann`` may count: signed by the policy's trainer (or nothing is checked)."""
        if self._verifier is None:
            return True
        # The topic is re-read from its start on every reconnect: a record at or below the
        # newest offset checked before was refused, counted and dead-lettered then.
        seen = record.offset <= self._judged.get(record.partition, -1)
        self._judged[record.partition] = max(record.offset, self._judged.get(record.partition, -1))
        try:
            self._verifier.check(record.topic, record.value, record.headers)
            return True
        except SignatureError as e:
            if not seen:
                self._refuse(record, ann, e)
            return False

    def _refuse(self, record, ann: VersionAnnouncement, error: SignatureError) -> None:
        with self._lock:
            self._rejected[error.reason] = self._rejected.get(error.reason, 0) + 1
        log.warning("%s: refusing the announcement at %s[%d]@%d (version %s of lineage epoch %s): %s; keeping "
                    "version %d of epoch %d", self.node_id, record.topic, record.partition, record.offset,
                    ann.version, ann.epoch, error, self._version, self._epoch)
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

    def _advance(self, reader: ChunkReader, head: VersionAnnouncement) -> bool:
        """Move to ``head``: delta path if possible, else snapshot path. True when reached."""
        steps = self._delta_steps(head)
        if steps is not None:
            try:
                self._apply_deltas(reader, steps, head)
                self._report_recovery(head, "delta path")
                return True
            except _PathFailed as e:
                self._fault(f"delta path to version {head.version} failed: {e}; trying the snapshot path")
        try:
            self._load_snapshot(reader, head)
        except _PathFailed as e:
            self._fault(f"cannot reach version {head.version}: {e}; holding version {self._version} "
                        "until a newer snapshot is announced")
            return False
        self._report_recovery(head, f"snapshot path (snapshot {head.snapshot_version})")
        return True

    def _report_recovery(self, head: VersionAnnouncement, path: str) -> None:
        if self._unrecovered:
            self._fault(f"recovered: reached version {head.version} through the {path}", recovered=True)

    def _delta_steps(self, head: VersionAnnouncement) -> list[tuple[int, ChunkManifest]] | None:
        """The deltas from the held version to ``head``, or None when there is no such path."""
        if self._state is None or head.epoch != self._epoch:
            return None  # another lineage: only its snapshot leads there
        v = self._version
        if head.base_version == v and head.base_version != head.version:
            steps = [(head.version, head.manifest)]  # a follower, one version behind
        else:
            chain = [head.snapshot_version, *head.delta_versions]
            if v not in chain or len(head.delta_versions) != len(head.deltas):
                return None
            steps = list(zip(head.delta_versions, head.deltas))[chain.index(v):]
        return None if any(m.object_id in self._bad for _, m in steps) else steps

    def _apply_deltas(self, reader: ChunkReader, steps: list[tuple[int, ChunkManifest]],
                      head: VersionAnnouncement) -> None:
        for version, manifest in steps:
            payload = self._fetch(reader, manifest, version, PayloadKind.DELTA, self._expect(head, version))
            with self._lock:
                assert self._state is not None
                try:
                    # Verifies the base digest and the data before writing anything.
                    hashes = codec.apply_in_place(payload, self._state, base_hashes=self._hashes,
                                                  threads=self.codec_threads)
                except codec.BaseMismatchError as e:
                    raise _PathFailed(f"delta to version {version} does not fit the held version "
                                      f"{self._version}: {e}") from e
                except WeightCodecError as e:
                    # Checks after writing failed: the held tensors can no longer be trusted.
                    self._state, self._hashes, self._digest = None, None, None
                    self._bad.add(manifest.object_id)
                    raise _PathFailed(f"delta to version {version} failed to apply ({e}); "
                                      "dropped the held weights") from e
                self._hashes, self._version, self._context = hashes, version, self._head_context
                self._digest = None
                self._path_counts["delta"] += 1
                self._lock.notify_all()
        self._check_head(head)

    def _load_snapshot(self, reader: ChunkReader, head: VersionAnnouncement) -> None:
        """Assemble ``head`` in fresh tensors from its snapshot, then swap them in."""
        snap = head.snapshot_manifest
        if snap is None:
            raise _PathFailed(f"announcement of version {head.version} names no snapshot")
        if snap.object_id in self._bad:
            raise _PathFailed(f"snapshot {head.snapshot_version} failed verification before")
        payload, state = self._fetch_and_decode_snapshot(reader, snap, head)
        hashes = {e.name: e.hash for e in read_table(payload)[1]}
        del payload
        version, error, intact = head.snapshot_version, None, True
        for dv, manifest in zip(head.delta_versions, head.deltas):
            try:
                if manifest.object_id in self._bad:
                    raise _PathFailed(f"delta to version {dv} failed verification before")
                payload = self._fetch(reader, manifest, dv, PayloadKind.DELTA, self._expect(head, dv))
                hashes = codec.apply_in_place(payload, state, base_hashes=hashes, threads=self.codec_threads)
            except (_PathFailed, codec.BaseMismatchError) as e:
                error = e  # raised before anything was written: `state` still holds `version`
                break
            except WeightCodecError as e:
                self._bad.add(manifest.object_id)
                error, intact = e, False
                break
            version = dv
        # Even a partial chain is a verified, newer version; a newer epoch replaces any version.
        if intact and (head.epoch, version) > (self._epoch, self._version):
            with self._lock:
                if head.epoch != self._epoch:
                    log.info("%s: moving to lineage epoch %d at version %d (dropping version %d of epoch %d)",
                             self.node_id, head.epoch, version, self._version, self._epoch)
                self._state, self._hashes, self._version = state, hashes, version
                self._epoch, self._digest = head.epoch, None
                self._context = self._head_context
                self._path_counts["snapshot"] += 1
                self._path_counts["delta"] += len([v for v in head.delta_versions if v <= version])
                self._lock.notify_all()
        if error is not None:
            raise _PathFailed(f"snapshot path stopped at version {version}: {error}")
        self._check_head(head)

    def _fetch_and_decode_snapshot(self, reader: ChunkReader, snap: ChunkManifest,
                                   head: VersionAnnouncement) -> tuple[memoryview, dict[str, torch.Tensor]]:
        """Fetch a snapshot and decode it while it arrives: a decoder thread takes each tensor
        as soon as its chunks are verified (the payload's head is fetched first), so decoding
        overlaps the transfer instead of following it, and gives each decoded tensor's bytes
        back to the OS, so the payload is never held whole beside the tensors it becomes."""
        buf = ReleasableBuffer(snap.total_bytes)
        arrival = _Arrival()
        outcome: dict[str, object] = {}

        def decode() -> None:
            try:
                outcome["state"] = codec.decode_streaming(buf.view, arrival.ready, threads=self.codec_threads,
                                                          release=buf.release)
            except BaseException as e:  # noqa: BLE001 - handed to the subscriber's thread below
                outcome["error"] = e

        decoder = threading.Thread(target=decode, name=f"weight-decoder-{self.node_id}", daemon=True)
        decoder.start()
        try:
            payload = self._fetch(reader, snap, head.snapshot_version, PayloadKind.SNAPSHOT,
                                  self._expect(head, head.snapshot_version), into=buf.view,
                                  on_progress=arrival.advance)
        except BaseException:
            arrival.abort()
            raise
        finally:
            decoder.join()
        error = outcome.get("error")
        if isinstance(error, WeightCodecError):
            self._bad.add(snap.object_id)
            raise _PathFailed(f"snapshot {head.snapshot_version} does not decode: {error}") from error
        if error is not None:
            raise error  # type: ignore[misc]
        return payload, outcome["state"]  # type: ignore[return-value]

    @staticmethod
    def _expect(head: VersionAnnouncement, version: int) -> str | None:
        return head.checksum if version == head.version else None

    def _fetch(self, reader: ChunkReader, manifest: ChunkManifest, version: int, kind: PayloadKind,
               digest: str | None = None, **read: object) -> bytearray | memoryview:
        """The verified payload of ``version``; ``digest``: the announced digest it must produce.

        ``read``: passed to :meth:`ChunkReader.read` (a buffer to fill, a progress callback).
        """
        prefetcher = self._prefetcher
        if prefetcher is not None:
            read["cached"] = cached = prefetcher.take(manifest)
            self._prefetched += len(cached)
        try:
            payload = reader.read(manifest, **read)  # type: ignore[arg-type]  # checks the manifest and every chunk's digest
        except ChunkError as e:
            if isinstance(e, CorruptChunkError):
                self._bad.add(manifest.object_id)
            raise _PathFailed(f"{kind.name.lower()} of version {version}: {type(e).__name__}: {e}") from e
        try:
            header = codec.read_header(payload)
        except WeightCodecError as e:
            self._bad.add(manifest.object_id)
            raise _PathFailed(f"{kind.name.lower()} of version {version} is not a weight payload: {e}") from e
        if header.version != version or header.kind != kind:
            self._bad.add(manifest.object_id)
            raise _PathFailed(f"announced {kind.name.lower()} of version {version} holds a "
                              f"{header.kind.name.lower()} of version {header.version}")
        if digest is not None and header.digest != digest:
            self._bad.add(manifest.object_id)
            raise _PathFailed(f"{kind.name.lower()} of version {version} produces weights digest "
                              f"{header.digest[:16]}…, the announcement says {digest[:16]}…")
        return payload

    def _drop_prefetcher(self) -> None:
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.close()

    @property
    def prefetched_chunks(self) -> int:
        """Chunks offered by the prefetcher (read during their write) for payloads fetched so far."""
        return self._prefetched

    def _check_head(self, head: VersionAnnouncement) -> None:
        """Belt and braces: the held weights must have the announced digest.

        Each payload's result digest was compared with the announcement before it was
        applied, and apply_in_place checked every tensor, so this only trips on a bug.
        """
        with self._lock:
            if (self._epoch, self._version) != (head.epoch, head.version) or self._state is None:
                return
            digest = self.digest()
            if digest != head.checksum:
                self._state, self._hashes, self._version, self._digest = None, None, -1, None
                raise _PathFailed(f"version {head.version} assembled with digest {digest[:16]}…, announced "
                                  f"{head.checksum[:16]}…; dropped the held weights")

    def _fault(self, report: str, *, recovered: bool = False) -> None:
        """Record a fault report (or, with ``recovered``, the recovery that follows faults)."""
        report = f"{self.node_id}: {report}"
        log.warning("%s", report)
        with self._lock:
            self._faults.append(report)
            del self._faults[:-_MAX_FAULTS]
            held = self._version
        self._unrecovered = not recovered
        if not recovered and self._on_fault is not None:
            try:
                self._on_fault(report, held)
            except Exception:  # noqa: BLE001 - a failing callback must not stop the subscriber
                log.exception("%s: on_fault callback failed", self.node_id)
