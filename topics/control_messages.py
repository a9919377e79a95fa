"""Typed records of the job's bookkeeping topics: ``versions``, ``control``, ``metrics``, ``dlq``.

A policy version's announcement and the manifests of its chunked weights, components'
heartbeats and snapshot requests, measurements, and dead letters — what the job says about
itself beside the data path (:mod:`.messages`). Shapes and what each field means only;
encoding lives in :mod:`.codec`, the base class and registry in :mod:`.message_base`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .message_base import Message, register, same_length

__all__ = ["ChunkManifest", "ChunkRef", "DeadLetter", "Heartbeat", "Metric", "SnapshotRequest", "VersionAnnouncement"]


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of a chunked binary payload."""

    partition: int
    offset: int
    size: int
    digest: str  #: BLAKE3 (hex) of the chunk's bytes


@dataclass(frozen=True)
class ChunkManifest:
    """Where the chunks of one binary object live and how to verify them."""

    object_id: str
    topic: str
    total_bytes: int
    digest: str  #: ``manifest_digest(chunks)``: BLAKE3 over the chunks' sizes and digests, in order
    chunks: list[ChunkRef]
    #: the chunks' record timestamps (create time, ms), earliest and latest; -1: unknown (written
    #: before schema 4). Offsets hold only on the cluster the chunks were written to, timestamps
    #: also on a mirror (MirrorMaker 2 copies them): a reader there finds the chunks from these.
    first_timestamp_ms: int = -1
    last_timestamp_ms: int = -1


@register
@dataclass(frozen=True)
class VersionAnnouncement(Message):
    """A policy version is durable on ``weights.<policy>``; keyed by policy on compacted ``versions``.

    Compaction keeps only the latest announcement per policy, so each one carries the whole
    chain a late joiner needs: the newest snapshot and every delta after it, in order.
    Versions are ordered by ``(epoch, version)``: a trainer that resumes behind the announced
    head starts a new lineage epoch with a snapshot, and announcements of an older epoch are
    ignored (fenced) by subscribers. Schema 2 added ``delta_versions``; schema 3 ``epoch``;
    schema 4 the manifests' chunk timestamps (a mirror's readers locate chunks by them);
    schema 5 ``base_model``.
    """

    TYPE: ClassVar[str] = "version"
    SCHEMA: ClassVar[int] = 5
    policy: str
    version: int
    kind: str  #: "snapshot" (``version`` has a full snapshot, ``snapshot_manifest``) or "delta"
    base_version: int  #: version ``manifest`` applies to (== version when it is a snapshot)
    snapshot_version: int  #: newest full snapshot at or below ``version``
    manifest: ChunkManifest  #: the payload from ``base_version`` to ``version``: a delta or a snapshot
    checksum: str  #: digest of the full weights at ``version``
    snapshot_manifest: ChunkManifest | None = None  #: where ``snapshot_version`` lives
    deltas: list[ChunkManifest] = field(default_factory=list)  #: deltas after the snapshot, in order
    delta_versions: list[int] = field(default_factory=list)  #: the version each of ``deltas`` produces
    created_at: float = 0.0
    epoch: int = 0  #: lineage epoch; every payload of the chain belongs to it
    #: a LoRA policy's: the digest of the base model its adapter tensors apply to
    #: (``weights.adapters.base_digest``); "" for a policy whose versions are full weights
    base_model: str = ""

    def validate(self) -> None:
        if self.kind not in ("snapshot", "delta"):
            raise ValueError(f"kind is {self.kind[:40]!r}; it is 'snapshot' or 'delta'")
        same_length("delta_versions", self.delta_versions, "deltas", len(self.deltas), may_be_empty=True)


@register
@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness and load of a component, on ``control``. Schema 2 added ``epoch`` and ``weights_digest``,
    schema 3 ``error``. Retired: ``busy_slots`` / ``total_slots`` (never set by any node, never read)."""

    TYPE: ClassVar[str] = "heartbeat"
    SCHEMA: ClassVar[int] = 3
    RETIRED: ClassVar[frozenset[str]] = frozenset({"busy_slots", "total_slots"})
    node_id: str
    role: str  #: "raas", "trainer", "dataflow"
    policy: str
    version: int  #: policy version the node holds
    tokens_per_s: float = 0.0
    ts: float = 0.0
    #: "alive", "stopping" (leaving on request), "starting" (sent for it by its launcher) or "failed"
    #: (stopping on a fatal error, ``error``: a launcher that reads it stops the job)
    status: str = "alive"
    epoch: int = 0  #: lineage epoch of the weights the node holds
    weights_digest: str = ""  #: digest of those weights ("" when unknown)
    error: str = ""  #: with status "failed": the cause, one line


@register
@dataclass(frozen=True)
class SnapshotRequest(Message):
    """A node could not reach the newest version by deltas; asks the trainer for a snapshot (on ``control``)."""

    TYPE: ClassVar[str] = "snapshot-request"
    policy: str
    node_id: str
    have_version: int  #: newest version the node holds
    reason: str  #: the subscriber's fault report
    ts: float = 0.0


@register
@dataclass(frozen=True)
class Metric(Message):
    """One measurement, on ``metrics``."""

    TYPE: ClassVar[str] = "metric"
    component: str
    name: str
    value: float
    step: int = 0
    ts: float = 0.0
    labels: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class DeadLetter(Message):
    """A record that could not be processed, with where it came from and why.

    Schema 2 bounded it: ``value`` holds at most a prefix of the original (64 KiB), and
    ``value_size`` / ``value_sha256`` name the whole, so a letter fits any producer's limit
    whatever the record it tells of (schema 1 letters carry the whole value; -1, "").
    """

    TYPE: ClassVar[str] = "dead-letter"
    SCHEMA: ClassVar[int] = 2
    source_topic: str
    partition: int
    offset: int
    error_type: str
    error: str
    key: str | None  #: base64 of the original key
    value: str  #: base64 of the original value, or of its first 64 KiB (``truncated``)
    headers: dict[str, str | None] = field(default_factory=dict)  #: original headers (bytes as latin-1; null: null)
    consumer: str = ""  #: who gave up on it
    ts: float = 0.0
    value_size: int = -1  #: bytes of the original value (-1: schema 1, ``value`` is all of it)
    value_sha256: str = ""  #: hex SHA-256 of the original value
    truncated: bool = False  #: value, key or headers were cut to their bounds
