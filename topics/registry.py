"""The topics of a job: names, partitions and configs, and their idempotent creation.

All names share the prefix ``af.<job>.``. ``versions`` is compacted (latest announcement
per policy); ``weights.<policy>`` is sized by the weight-retention rule of the publisher.
:func:`ensure_topics` creates what is missing and verifies what exists, failing with
:class:`~.exceptions.TopicConfigMismatch` rather than running on a topic that would
silently break a guarantee (too few partitions, compaction off, ...).

Replication is part of that guarantee: a topic's replication factor and
``min.insync.replicas`` are given, or chosen when it is created from the brokers the
cluster has then (:func:`~.cluster.replication_for`: min(3, brokers) copies, one of which
may be missing). Producers write with ``acks=all``, so an acknowledged record is on at
least ``min.insync.replicas`` brokers.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Protocol, Sequence

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import TopicAlreadyExistsError

from . import security
from .cluster import replication_for
from .exceptions import TopicConfigMismatch, TopicsError

MiB = 1024 * 1024
#: The largest record a topic takes (its ``max.message.bytes``) and so the largest record a
#: producer writing to it may send (its ``max_request_size``): one number for both sides, so
#: whatever a topic holds a consumer of it can also have dead-lettered (a letter is bounded:
#: ``dead_letters.DEAD_LETTER_VALUE_BYTES``) and no producer accepts a record its topic refuses.
RECORD_MAX_BYTES = 4 * MiB
#: ``batches.<policy>``'s: one record is a whole training batch.
BATCH_RECORD_MAX_BYTES = 16 * MiB
HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
WEIGHTS_SEGMENT_BYTES = 64 * MiB


@dataclass(frozen=True)
class TopicSpec:
    """One topic and the settings the job depends on."""

    name: str
    partitions: int = 1
    cleanup_policy: str = "delete"  #: "delete" or "compact"
    retention_ms: int = 7 * DAY_MS  #: -1: keep forever
    retention_bytes: int = -1  #: per partition; -1: unbounded
    max_message_bytes: int = RECORD_MAX_BYTES  #: and the ``max_request_size`` of its producers
    extra: dict[str, str] = field(default_factory=dict)
    replication: int | None = None  #: copies of each partition; None: chosen from the cluster at creation
    min_insync_replicas: int | None = None  #: None: replication - 1 (at least 1) at creation

    def __post_init__(self) -> None:
        if self.replication is not None and self.replication < 1:
            raise ValueError(f"topic {self.name}: replication must be >= 1, got {self.replication}")
        if self.min_insync_replicas is not None and not (
                1 <= self.min_insync_replicas <= (self.replication or self.min_insync_replicas)):
            raise ValueError(f"topic {self.name}: min_insync_replicas must be between 1 and the replication "
                             f"factor ({self.replication}), got {self.min_insync_replicas}")

    def configs(self) -> dict[str, str]:
        cfg = {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "max.message.bytes": str(self.max_message_bytes),
        }
        if self.min_insync_replicas is not None:
            cfg["min.insync.replicas"] = str(self.min_insync_replicas)
        cfg.update(self.extra)
        return cfg

    def for_cluster(self, brokers: int) -> "TopicSpec":
        """This spec with replication settled for a cluster of ``brokers`` (what creation uses)."""
        factor = self.replication or replication_for(brokers)[0]
        if factor > brokers:
            raise TopicsError(f"topic {self.name} needs replication factor {factor} but the cluster has "
                              f"{brokers} live broker(s); lower kafka.replication_factor or start more brokers")
        min_isr = self.min_insync_replicas or max(1, factor - 1)
        if min_isr > factor:
            raise TopicsError(f"topic {self.name}: min.insync.replicas {min_isr} exceeds its replication factor "
                              f"{factor}; no write could ever be acknowledged (lower kafka.min_insync_replicas)")
        return replace(self, replication=factor, min_insync_replicas=min_isr)


#: Topic families whose broker-side retention a job may bound (``kafka.retention``): the
#: weights are trimmed by their publisher, the compacted topics keep their latest records.
RETENTION_FAMILIES = ("prompts", "tasks", "trajectories", "batches", "drops", "metrics", "control", "dlq")


class KafkaSettings(Protocol):
    """The part of a job's ``kafka`` config section its topics are made from (and, when it has
    one, ``retention``: ``limits()`` -> ``{family: (retention.ms or None, retention.bytes or None)}``)."""

    task_partitions: int
    trajectory_partitions: int
    replication_factor: int | None
    min_insync_replicas: int | None


class JobSettings(Protocol):
    """What :func:`job_topics` reads of a job config (``astraflow.config.JobConfig``): the
    topics layer knows the shape, not the config module."""

    job: str
    policy_names: Sequence[str]
    kafka: KafkaSettings


def job_topics(cfg: JobSettings) -> "JobTopics":
    """The topics of the job ``cfg`` describes (every one of its policies; the remote-role
    topics when it has several)."""
    return JobTopics(job=cfg.job, policies=tuple(cfg.policy_names), task_partitions=cfg.kafka.task_partitions,
                     trajectory_partitions=cfg.kafka.trajectory_partitions, weights_retention_ms=-1,
                     replication_factor=cfg.kafka.replication_factor,
                     min_insync_replicas=cfg.kafka.min_insync_replicas,
                     generation=len(cfg.policy_names) > 1,
                     retention=tuple((f, ms, nbytes) for f, (ms, nbytes) in sorted(
                         (getattr(cfg.kafka, "retention", None) and cfg.kafka.retention.limits() or {}).items())))


@dataclass(frozen=True)
class JobTopics:
    """Topic names and specs of one job.

    Args:
        job: job name; topics are ``af.<job>.<kind>``.
        policies: policy names (each gets tasks/batches/weights topics).
        task_partitions: partitions of ``tasks.<policy>`` (>= the most RaaS nodes of a policy).
        trajectory_partitions: partitions of ``trajectories``.
        weights_retention_ms / weights_retention_bytes: broker-side retention of
            ``weights.<policy>``. Keep both at -1 (the default): the weight publisher trims
            the topic itself so the newest announced snapshot is never deleted (see
            ``astraflow.weights.publisher``). Time or size limits can delete the
            snapshot a late-joining node needs while the trainer is paused.
        replication_factor / min_insync_replicas: of every topic; None: chosen from the
            cluster when a topic is created (see :meth:`TopicSpec.for_cluster`).
    """

    job: str
    policies: tuple[str, ...] = ("policy",)
    task_partitions: int = 8
    trajectory_partitions: int = 4
    weights_retention_ms: int = -1
    weights_retention_bytes: int = -1
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    generation: bool = False  #: multi-policy jobs: ``generate.<policy>`` and ``replies`` (remote role calls)
    #: ``(family, retention.ms or None, retention.bytes or None)`` overriding the defaults of
    #: :data:`RETENTION_FAMILIES` (None: the default stays)
    retention: tuple[tuple[str, int | None, int | None], ...] = ()

    def _retained(self, spec: TopicSpec) -> TopicSpec:
        """``spec`` with its family's ``kafka.retention`` limits, if any."""
        family = spec.name[len(self.prefix):].split(".", 1)[0]
        for name, ms, nbytes in self.retention:
            if name == family:
                return replace(spec, retention_ms=spec.retention_ms if ms is None else ms,
                               retention_bytes=spec.retention_bytes if nbytes is None else nbytes)
        return spec

    @property
    def prefix(self) -> str:
        return f"af.{self.job}."

    @property
    def prompts(self) -> str:
        return self.prefix + "prompts"

    @property
    def trajectories(self) -> str:
        return self.prefix + "trajectories"

    @property
    def versions(self) -> str:
        return self.prefix + "versions"

    @property
    def control(self) -> str:
        return self.prefix + "control"

    @property
    def metrics(self) -> str:
        return self.prefix + "metrics"

    @property
    def dlq(self) -> str:
        return self.prefix + "dlq"

    def tasks(self, policy: str) -> str:
        return f"{self.prefix}tasks.{policy}"

    def batches(self, policy: str) -> str:
        return f"{self.prefix}batches.{policy}"

    def weights(self, policy: str) -> str:
        return f"{self.prefix}weights.{policy}"

    def rollout_group(self, policy: str) -> str:
        """Consumer group of ``policy``'s RaaS nodes on its tasks topic.

        Job-scoped like the topics: jobs that share a cluster never share a group, so one
        job's nodes joining or leaving never rebalances another job's.
        """
        return f"{self.prefix}raas.{policy}"

    def rollout_transactional_id(self, policy: str, node_id: str) -> str:
        """The transactional id of ``policy``'s RaaS node ``node_id``: under the policy, so an
        ACL can let ``policy``'s principal use only its own pool's ids (:mod:`.acls`)."""
        return f"{self.prefix}raas.{policy}.{node_id}"

    def dataflow_group(self, policy: str) -> str:
        """Consumer group of ``policy``'s dataflow lane on ``prompts`` (``+ ".trajectories"`` on
        ``trajectories``); its transactions commit the lane's offsets under it."""
        return f"{self.prefix}dataflow.{policy}"

    def generation_group(self, policy: str) -> str:
        """Consumer group of the nodes serving ``policy``'s role calls from other policies' episodes."""
        return f"{self.prefix}gen.{policy}"

    def drops(self, policy: str) -> str:
        """Drop records: one per trajectory group the dataflow consumed without batching it."""
        return f"{self.prefix}drops.{policy}"

    def dataflow_state(self, policy: str) -> str:
        """The dataflow's restart state (compacted: the newest record is all a restart reads)."""
        return f"{self.prefix}dataflow-state.{policy}"

    def generate(self, policy: str) -> str:
        """Generation requests a role of another policy's episode sends to this policy's pool."""
        return f"{self.prefix}generate.{policy}"

    @property
    def replies(self) -> str:
        """Answers to generation requests, keyed by episode, each in the partition its
        requester reads (:meth:`reply_partition`)."""
        return self.prefix + "replies"

    def reply_partition(self, requester: str) -> int:
        """The one partition of ``replies`` node ``requester`` reads its answers from: a stable
        hash of its id over the topic's partitions (``trajectory_partitions``)."""
        digest = hashlib.blake2b(requester.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.trajectory_partitions

    def max_message_bytes(self, *topics: str) -> int:
        """The largest record any of ``topics`` takes: the ``max_request_size`` of a producer
        that writes to them (a name this job does not have is refused)."""
        limits = {s.name: s.max_message_bytes for s in self.specs()}
        unknown = [t for t in topics if t not in limits]
        if unknown:
            raise TopicsError(f"{unknown} are not topics of job {self.job}")
        return max((limits[t] for t in topics), default=RECORD_MAX_BYTES)

    def specs(self) -> list[TopicSpec]:
        specs = [
            TopicSpec(self.prompts, partitions=1, retention_ms=-1),
            TopicSpec(self.trajectories, partitions=self.trajectory_partitions, retention_ms=-1),
            TopicSpec(self.versions, partitions=1, cleanup_policy="compact", retention_ms=-1,
                      extra={"min.compaction.lag.ms": "0", "segment.ms": str(HOUR_MS)}),
            TopicSpec(self.control, partitions=1, retention_ms=HOUR_MS),
            TopicSpec(self.metrics, partitions=1, retention_ms=7 * DAY_MS),
            TopicSpec(self.dlq, partitions=1, retention_ms=-1),
        ]
        if self.generation:
            # Requests and replies are worth nothing once their episode is over: short retention.
            specs.append(TopicSpec(self.replies, partitions=self.trajectory_partitions, retention_ms=HOUR_MS))
            specs += [TopicSpec(self.generate(p), partitions=self.task_partitions, retention_ms=HOUR_MS)
                      for p in self.policies]
        for p in self.policies:
            specs += [
                TopicSpec(self.tasks(p), partitions=self.task_partitions, retention_ms=-1),
                # One partition: the ordered, replayable record of training.
                TopicSpec(self.batches(p), partitions=1, retention_ms=-1,
                          max_message_bytes=BATCH_RECORD_MAX_BYTES),
                # Small segments so the publisher's delete_records trims free disk soon.
                TopicSpec(self.weights(p), partitions=1, retention_ms=self.weights_retention_ms,
                          retention_bytes=self.weights_retention_bytes,
                          extra={"segment.bytes": str(WEIGHTS_SEGMENT_BYTES)}),
                TopicSpec(self.drops(p), partitions=1, retention_ms=-1),
                TopicSpec(self.dataflow_state(p), partitions=1, cleanup_policy="compact", retention_ms=-1,
                          extra={"min.compaction.lag.ms": "0", "segment.ms": str(HOUR_MS)}),
            ]
        specs = [self._retained(s) for s in specs]
        return [replace(s, replication=self.replication_factor, min_insync_replicas=self.min_insync_replicas)
                for s in specs]


def ensure_topics(bootstrap_servers: str, specs: Iterable[TopicSpec], timeout: float = 30.0, *,
                  security_setting: "security.ClientSecurity | None" = None) -> list[str]:
    """Create missing topics and verify existing ones; returns the names created
    (``security_setting``: the client setting on that cluster, default the process's).

    A missing topic's unset replication is settled from the brokers live now; an existing
    topic is held to the replication its spec states, if it states one.
    """
    specs = list(specs)
    admin = security.admin(bootstrap_servers=bootstrap_servers, client_id="astraflow-admin",
                           security=security_setting)
    try:
        existing = set(admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        created: list[str] = []
        if missing:
            brokers = live_brokers(admin)
            for s in (m.for_cluster(brokers) for m in missing):
                try:
                    admin.create_topics([NewTopic(s.name, s.partitions, s.replication, topic_configs=s.configs())])
                    created.append(s.name)
                except TopicAlreadyExistsError:
                    pass  # another component created it first; verified below
            _wait_for_metadata(admin, [s.name for s in missing], timeout)
        verify_topics(admin, [s for s in specs if s.name not in created])
        return created
    finally:
        admin.close()


def verify_topics(admin: KafkaAdminClient, specs: list[TopicSpec]) -> None:
    """Raise :class:`TopicConfigMismatch` when an existing topic differs from its spec."""
    if not specs:
        return
    described = {t["name"]: t for t in admin.describe_topics([s.name for s in specs])}
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, s.name) for s in specs])
    topic_cfgs = configs.get("topic", {}) if isinstance(configs, dict) else {}
    for s in specs:
        t = described.get(s.name)
        if t is None or t.get("error_code"):
            raise TopicsError(f"topic {s.name!r} could not be described: {t}")
        n = len(t["partitions"])
        if n != s.partitions:
            raise TopicConfigMismatch(s.name, "partitions", s.partitions, n)
        factor = min(len(p["replica_nodes"]) for p in t["partitions"])
        if s.replication is not None and factor != s.replication:
            raise TopicConfigMismatch(s.name, "replication factor", s.replication, factor)
        actual = topic_cfgs.get(s.name, {})
        for key, want in s.configs().items():
            have = actual.get(key, {}).get("value")
            if have is not None and str(have) != want:
                raise TopicConfigMismatch(s.name, key, want, have)


def live_brokers(admin: KafkaAdminClient) -> int:
    """Brokers registered and not fenced (a killed broker stays registered, fenced)."""
    return sum(1 for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced"))


def _wait_for_metadata(admin: KafkaAdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = admin.describe_topics(names)
        if all(not t.get("error_code") and t["partitions"] and
               all(p["leader_id"] >= 0 for p in t["partitions"]) for t in described):
            return
        time.sleep(0.1)
    raise TopicsError(f"topics {names} were created but have no leader after {timeout}s")
