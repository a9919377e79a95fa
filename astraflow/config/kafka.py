"""The ``kafka`` section: the cluster a job uses, its topics' partitions, copies and retention.

Owns the keys and what they say together (a replication factor and its in-sync minimum,
retention limits a running job can live with). Authentication is :mod:`.security`'s; what
topics a job has is :mod:`astraflow.topics.registry`'s, which reads these keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from astraflow.topics.bootstrap import parse_bootstrap
from astraflow.typed_config import Bounds
from astraflow.typed_config import setting

from .security import KafkaSecurityConfig


@dataclass(frozen=True)
class RetentionLimit:
    ms: int | None = setting(None, "retention.ms of the family's topics: records older than this are deleted (-1: "
                                   "never; null: the project's default; else at least 60000)",
                 bounds=Bounds(-1, 2**62, why="-1 or at least 60000"))
    bytes: int | None = setting(None, "retention.bytes per partition of the family's topics: the oldest segments go "
                                      "beyond it (-1: unbounded; null: the project's default; else at least 1 MiB)",
                    bounds=Bounds(-1, 2**62, why="-1 or at least 1048576"))  # noqa: A003


#: The smallest limits accepted: below them a running job would lose what it still reads.
_MIN_RETENTION_MS, _MIN_RETENTION_BYTES = 60_000, 1024 * 1024


@dataclass(frozen=True)
class RetentionConfig:
    """Broker-side retention per topic family (docs/run-dir.md). Bounding ``tasks``,
    ``trajectories``, ``batches`` or ``prompts`` below a job's length loses records the
    running job, its audit, ``replay`` and ``export`` still read; ``metrics`` and
    ``control`` are the safe ones to bound. ``weights.<policy>`` is trimmed by its publisher."""

    prompts: RetentionLimit = setting(RetentionLimit(), "the input stream (default: kept forever)")
    tasks: RetentionLimit = setting(RetentionLimit(), "tasks.<policy> (default: kept forever)")
    trajectories: RetentionLimit = setting(RetentionLimit(), "trajectory groups (default: kept forever)")
    batches: RetentionLimit = setting(RetentionLimit(), "batches.<policy>, the record replay retrains from (default: "
                                                        "kept forever)")
    drops: RetentionLimit = setting(RetentionLimit(), "drops.<policy> (default: kept forever)")
    metrics: RetentionLimit = setting(RetentionLimit(), "metric events (default: 7 days)")
    control: RetentionLimit = setting(RetentionLimit(), "heartbeats and control records (default: 1 hour)")
    dlq: RetentionLimit = setting(RetentionLimit(), "the dead-letter topic (default: kept forever)")

    def __post_init__(self) -> None:
        # The bounds admit -1 and any positive limit; the small ones in between are refused here.
        for family in self.limits():
            lim = getattr(self, family)
            if lim.ms is not None and lim.ms != -1 and lim.ms < _MIN_RETENTION_MS:
                raise ValueError(f"kafka.retention.{family}.ms must be -1 (never delete) or >= {_MIN_RETENTION_MS} "
                                 f"(one minute), got {lim.ms}")
            if lim.bytes is not None and lim.bytes != -1 and lim.bytes < _MIN_RETENTION_BYTES:
                raise ValueError(f"kafka.retention.{family}.bytes must be -1 (unbounded) or >= "
                                 f"{_MIN_RETENTION_BYTES} (1 MiB), got {lim.bytes}")

    def limits(self) -> dict[str, tuple[int | None, int | None]]:
        """``{family: (ms, bytes)}`` of the families given a limit (the topics layer's view)."""
        out = {}
        for f in dataclasses.fields(self):
            lim = getattr(self, f.name)
            if lim.ms is not None or lim.bytes is not None:
                out[f.name] = (lim.ms, lim.bytes)
        return out


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str | None = setting(None, "existing cluster; null starts the embedded broker")
    task_partitions: int = setting(8, "partitions of tasks.<policy> (>= most RaaS nodes of a policy)",
                                   bounds=Bounds(1, 10_000))
    trajectory_partitions: int = setting(4, "partitions of the trajectories topic", bounds=Bounds(1, 10_000))
    replication_factor: int | None = setting(None, "copies of each partition of the job's topics; null: min(3, brokers "
                                                   "in the cluster when a topic is created)", bounds=Bounds(1, 100))
    min_insync_replicas: int | None = setting(None, "copies an acks=all write needs; null: replication_factor - 1 "
                                                    "(at least 1), so losing one broker stops nothing",
                                                    bounds=Bounds(1, 100))
    transaction_timeout_ms: int = setting(30_000, "a producer that dies inside a transaction blocks read_committed "
                                                  "readers of its partitions until the broker aborts it after this "
                                                  "long; at most the broker's transaction.max.timeout.ms (900000)",
                                                  bounds=Bounds(1_000, 900_000, why="at most the broker's "
                                                                "transaction.max.timeout.ms, 900000 by default"))
    retention: RetentionConfig = setting(RetentionConfig(), "broker-side retention per topic family (ms / bytes), to "
                                                            "bound a run dir's Kafka log (docs/run-dir.md)")
    security: KafkaSecurityConfig = setting(KafkaSecurityConfig(), "authentication and TLS of every client "
                                                                   "(docs/security.md)")

    def __post_init__(self) -> None:
        if self.bootstrap_servers is not None:
            parse_bootstrap(self.bootstrap_servers, "kafka.bootstrap_servers")
            if self.security.embedded:
                raise ValueError("kafka.security.embedded: secures the broker a run starts itself, but "
                                 "kafka.bootstrap_servers names a cluster; give that cluster's protocol and "
                                 "principals in kafka.security instead")
        rf, isr = self.replication_factor, self.min_insync_replicas
        if rf is not None and isr is not None and isr > rf:  # (each is at least 1: its bounds)
            raise ValueError(f"kafka.min_insync_replicas must be between 1 and kafka.replication_factor "
                             f"({rf}), got {isr}")
