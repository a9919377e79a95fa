"""What one MirrorMaker 2 flow mirrors, and the ``mm2.properties`` that says so.

The flow is one way (docs/cross_region_mirror.md): only a job's weight topics,
``weights.<policy>`` and ``versions``, are mirrored, from the home cluster to each remote
region's cluster; everything else stays home and remote nodes reach it over the link.
:class:`MirrorPlan` says what one such flow mirrors and writes the ``mm2.properties`` of a
**dedicated** MirrorMaker 2 (``org.apache.kafka.connect.mirror.MirrorMaker``) that runs in
the remote region (consume remote, produce local: Kafka's recommended placement):

* exactly-once source support (KIP-618) on the target, and ``read_committed`` on the
  source consumer, so a transaction aborted at home never crosses;
* ``IdentityReplicationPolicy``: mirrored topics keep their names, so a manifest's topic is
  found as it is in the region. Identity naming cannot tell a topic's origin, so it loops
  when a topic is mirrored both ways; nothing is mirrored back here, so nothing loops;
* no checkpoints, heartbeats, offset syncs, group or ACL sync: consumer groups never span
  clusters in this flow, and nothing reads them;
* ``sync.topic.configs.enabled=false``: the home weights topic's ``retention.ms=-1`` (its
  publisher trims it with ``delete_records``, which is not mirrored) must not be copied.
  The mirrored topics are created on the target before MirrorMaker starts, with their own
  bound (:func:`mirrored_specs`).

It also names what a flow uses on the target (its Connect group, its internal topics), for
the ACLs that allow it (:mod:`.acls`). It knows Kafka's settings and topic names; it runs
nothing (:mod:`.mirror` runs the process), and knows no job config and no weights.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from . import security
from .exceptions import TopicsError
from .registry import DAY_MS, JobTopics, TopicSpec, ensure_topics

__all__ = ["MIRROR_MAIN_CLASS", "MirrorPlan", "connect_group", "internal_topics", "mirrored_specs", "weight_topics"]

MIRROR_MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"
IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
SOURCE_CONNECTOR = "MirrorSourceConnector"

#: A mirrored weights topic keeps this many snapshots' worth of bytes (per partition) by default.
DEFAULT_KEEP_SNAPSHOTS = 4
DEFAULT_RETENTION_MS = 7 * DAY_MS


def weight_topics(topics: JobTopics) -> list[str]:
    """The topics this flow mirrors: ``versions`` and every policy's ``weights.<policy>``."""
    return [topics.versions, *(topics.weights(p) for p in topics.policies)]


def connect_group(source_alias: str) -> str:
    """The group of the Connect workers of a dedicated MirrorMaker 2 flow from ``source_alias``
    (MirrorMaker's default ``<source>-mm2``; it also prefixes the flow's transactional ids)."""
    return f"{source_alias}-mm2"


def internal_topics(source_alias: str) -> dict[str, str]:
    """Kind (``configs``, ``offsets``, ``status``) -> the name of that Connect internal topic of
    a flow from ``source_alias`` on the target cluster (MirrorMaker's defaults)."""
    return {kind: f"mm2-{kind}.{source_alias}.internal" for kind in ("configs", "offsets", "status")}


def mirrored_specs(topics: JobTopics, *, snapshot_bytes: int, keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS,
                   retention_ms: int = DEFAULT_RETENTION_MS) -> list[TopicSpec]:
    """The specs of the mirrored weight topics on a region's cluster, with their own bound.

    At home ``weights.<policy>`` keeps ``retention.ms=-1`` and its publisher trims it; the
    trim is not mirrored, so the mirror bounds itself: ``retention.bytes`` of
    ``keep_snapshots`` × ``snapshot_bytes`` (the publisher's full-snapshot payload size;
    Kafka deletes whole segments, the newest never, so a 64 MiB segment may stay beyond
    it) and ``retention.ms``. A size bound deletes only when new data arrives, so a paused
    trainer never loses its region's newest snapshot to it; ``retention_ms`` frees the disk
    of an abandoned job. ``versions`` stays compacted (one record per policy).
    """
    if snapshot_bytes < 1:
        raise ValueError(f"snapshot_bytes must be >= 1 (the size of one full weight snapshot), got {snapshot_bytes}")
    if keep_snapshots < 2:
        raise ValueError(f"keep_snapshots must be >= 2 (the chain's snapshot and the next one), got {keep_snapshots}")
    if retention_ms < 1:
        raise ValueError(f"retention_ms must be >= 1 ms (a mirrored weights topic needs its own bound), "
                         f"got {retention_ms}")
    by_name = {s.name: s for s in topics.specs()}
    # Readers find mirrored chunks by the timestamps MirrorMaker copies: never LogAppendTime.
    create_time = {"message.timestamp.type": "CreateTime"}
    versions = by_name[topics.versions]
    specs = [replace(versions, extra={**versions.extra, **create_time})]
    for p in topics.policies:
        weights = by_name[topics.weights(p)]
        specs.append(replace(weights, retention_ms=retention_ms, retention_bytes=keep_snapshots * snapshot_bytes,
                             extra={**weights.extra, **create_time}))
    return specs


def _java_regex(names: Sequence[str]) -> str:
    return "|".join(re.escape(n).replace("\\-", "-") for n in names)


def _prop_escape(value: str) -> str:
    """A value as java.util.Properties reads it back: backslashes doubled."""
    return value.replace("\\", "\\\\")


#: Beside ``mm2.properties``: the SASL logins it reads through Kafka's FileConfigProvider (mode 0600).
SECRETS_FILE = "mm2-secrets.properties"
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _jaas(sec: security.ClientSecurity) -> str:
    """The login; a password read from an environment variable stays there: the value names
    it (``${env:VAR}``, Kafka's EnvVarConfigProvider) and MirrorMaker, a child process that
    inherits the environment, reads it itself."""
    password = f'"${{env:{sec.password_env}}}"' if sec.password_env else json.dumps(sec.password)
    return f"{_LOGIN_MODULES[sec.mechanism or '']} required username={json.dumps(sec.username)} password={password};"


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (created 0600, never readable by others in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


@dataclass(frozen=True)
class MirrorPlan:
    """One one-way MirrorMaker 2 flow: which topics cross from ``source`` to ``target``.

    Args:
        source_alias / source_bootstrap: the home cluster (where the topics are written).
        target_alias / target_bootstrap: the region's cluster (where MirrorMaker runs).
        topics: topic names to mirror; or ``topics_regex``, a Java regex of names.
        target_specs: topics to create on the target before mirroring, each with its own
            bound (:func:`mirrored_specs`); a mirrored topic missing here is created by
            MirrorMaker with the broker's defaults.
        replication_factor: of MirrorMaker's internal topics on the target (and of topics
            it creates).
        refresh_topics_s: how often MirrorMaker looks for new topics/partitions at home.
        tasks: MirrorSourceConnector tasks (partitions are spread over them).
        max_record_bytes: the largest record that may cross (producer request and fetch sizes).
        rest_port: the internal REST port exactly-once support needs (KIP-710); 0: a free one.
        rebalance_timeout_ms: the workers' group rebalance timeout: a worker restarted after a
            SIGKILL joins as a new member and the group waits this long for the dead one
            (Connect's default is 60 s; the flow's one task stops and commits well within it).
        source_security / target_security: how MirrorMaker's clients (and this process's, for
            the topics and the lag) authenticate to each cluster; None: the process's setting
            (:func:`~.security.current`). The config itself holds no password: a login whose
            password was read from an environment variable names that variable
            (``${env:VAR}``, Kafka's ``EnvVarConfigProvider``; MirrorMaker inherits it), any
            other SASL login's JAAS entry goes to a 0600 file beside ``mm2.properties``
            (:data:`SECRETS_FILE`), read through Kafka's ``FileConfigProvider``.
        extra: more ``mm2.properties`` entries (they win).
    """

    source_alias: str
    source_bootstrap: str
    target_alias: str
    target_bootstrap: str
    topics: tuple[str, ...] = ()
    topics_regex: str | None = None
    target_specs: tuple[TopicSpec, ...] = ()
    replication_factor: int = 1
    refresh_topics_s: int = 5
    tasks: int = 1
    max_record_bytes: int = 16 * 1024 * 1024
    rest_port: int = 0
    rebalance_timeout_ms: int = 15_000
    source_security: security.ClientSecurity | None = None
    target_security: security.ClientSecurity | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        alias = re.compile(r"[A-Za-z0-9_]+")
        for key in ("source_alias", "target_alias"):
            value = getattr(self, key)
            if not alias.fullmatch(value):
                raise ValueError(f"MirrorPlan.{key} is {value!r}; a cluster alias is letters, digits and '_'")
        if self.source_alias == self.target_alias:
            raise ValueError(f"MirrorPlan: source_alias and target_alias are both {self.source_alias!r}")
        if bool(self.topics) == bool(self.topics_regex):
            raise ValueError("MirrorPlan: give exactly one of topics (names) or topics_regex")
        if self.topics_regex:
            try:
                re.compile(self.topics_regex)
            except re.error as e:
                raise ValueError(f"MirrorPlan.topics_regex {self.topics_regex!r} is not a regex: {e}") from None
        for s in self.target_specs:
            if s.cleanup_policy == "delete" and s.retention_ms == -1 and s.retention_bytes == -1:
                raise ValueError(f"MirrorPlan.target_specs: mirrored topic {s.name} has retention.ms=-1 and "
                                 "retention.bytes=-1; a mirror is not trimmed by the publisher, give it a bound "
                                 "(mirrored_specs)")
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "target_specs", tuple(self.target_specs))

    @classmethod
    def for_job(cls, topics: JobTopics, *, source: tuple[str, str], target: tuple[str, str], snapshot_bytes: int,
                keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS, retention_ms: int = DEFAULT_RETENTION_MS,
                **kwargs) -> "MirrorPlan":
        """The plan mirroring ``topics``' weight topics from ``source`` to ``target`` ((alias, bootstrap) each)."""
        return cls(source[0], source[1], target[0], target[1], topics=tuple(weight_topics(topics)),
                   target_specs=tuple(mirrored_specs(topics, snapshot_bytes=snapshot_bytes,
                                                     keep_snapshots=keep_snapshots, retention_ms=retention_ms)),
                   **kwargs)

    @property
    def flow(self) -> str:
        return f"{self.source_alias}->{self.target_alias}"

    def matches(self, topic: str) -> bool:
        return topic in self.topics if self.topics else re.fullmatch(self.topics_regex or "", topic) is not None

    def securities(self) -> dict[str, security.ClientSecurity]:
        """Cluster alias -> the client setting MirrorMaker uses there."""
        return {self.source_alias: self.source_security or security.current(),
                self.target_alias: self.target_security or security.current()}

    def secrets(self) -> dict[str, str]:
        """The entries of :data:`SECRETS_FILE`: the ``sasl.jaas.config`` of each SASL cluster
        whose password came from a file (one from an environment variable is not written)."""
        return {f"{alias}.sasl.jaas.config": _jaas(sec) for alias, sec in self.securities().items()
                if sec.mechanism and not sec.password_env}

    def _security_properties(self, work_dir: Path) -> dict[str, str]:
        out: dict[str, str] = {}
        secrets = work_dir / SECRETS_FILE
        for alias, sec in self.securities().items():
            if sec.protocol == "PLAINTEXT":
                continue
            out[f"{alias}.security.protocol"] = sec.protocol
            if sec.mechanism:
                out[f"{alias}.sasl.mechanism"] = sec.mechanism
                if sec.password_env:
                    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", sec.password_env):
                        raise ValueError(f"MirrorPlan: {sec.source}: password_env {sec.password_env!r} is not an "
                                         f"environment variable name a config provider reference can hold")
                    out[f"{alias}.sasl.jaas.config"] = _jaas(sec)
                else:
                    if ":" in str(secrets) or "}" in str(secrets):
                        raise ValueError(f"MirrorPlan: the work dir {work_dir} holds ':' or '}}', which a config "
                                         f"provider reference cannot name; choose another --run-dir")
                    out[f"{alias}.sasl.jaas.config"] = f"${{file:{secrets}:{alias}.sasl.jaas.config}}"
            if sec.tls:
                if sec.ca_file:
                    out[f"{alias}.ssl.truststore.type"] = "PEM"
                    out[f"{alias}.ssl.truststore.location"] = str(Path(sec.ca_file).resolve())
                if not sec.check_hostname:
                    out[f"{alias}.ssl.endpoint.identification.algorithm"] = ""
                if sec.cert_file:  # mutual TLS: key and chain in one PEM keystore (written by write())
                    out[f"{alias}.ssl.keystore.type"] = "PEM"
                    out[f"{alias}.ssl.keystore.location"] = str(work_dir / f"{alias}.client.pem")
        providers = {}
        if self.secrets():
            providers["file"] = "org.apache.kafka.common.config.provider.FileConfigProvider"
        if any(sec.mechanism and sec.password_env for sec in self.securities().values()):
            providers["env"] = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
        if providers:
            out["config.providers"] = ", ".join(providers)
            out.update({f"config.providers.{name}.class": cls for name, cls in providers.items()})
        return out

    def properties(self, rest_port: int | None = None, work_dir: str | os.PathLike = ".") -> dict[str, str]:
        """The ``mm2.properties`` entries (unescaped values), in the order they are written;
        ``work_dir``: where :meth:`write` puts them (and the secrets they refer to)."""
        src, tgt, flow = self.source_alias, self.target_alias, self.flow
        rf = str(self.replication_factor)
        big = str(self.max_record_bytes)
        props = {
            "clusters": f"{src}, {tgt}",
            f"{src}.bootstrap.servers": self.source_bootstrap,
            f"{tgt}.bootstrap.servers": self.target_bootstrap,
            **self._security_properties(Path(work_dir).resolve()),
            # One way only: nothing is mirrored back, so identity naming cannot loop.
            f"{flow}.enabled": "true",
            f"{tgt}->{src}.enabled": "false",
            f"{flow}.topics": self.topics_regex or _java_regex(self.topics),
            "replication.policy.class": IDENTITY_POLICY,
            # Exactly-once source (KIP-618) writes into the target; it needs the workers'
            # internal REST server (KIP-710) even for one node.
            # (The source connector asks for it; it supports it exactly when its consumer reads
            # read_committed. Not "required": that would also apply to the heartbeat and
            # checkpoint connectors, which do not implement the check.)
            f"{tgt}.exactly.once.source.support": "enabled",
            "dedicated.mode.enable.internal.rest": "true",
            "listeners": f"http://127.0.0.1:{rest_port if rest_port is not None else self.rest_port}",
            # Aborted transactions at home never cross.
            f"{src}.consumer.isolation.level": "read_committed",
            f"{src}.consumer.max.partition.fetch.bytes": big,
            f"{src}.consumer.fetch.max.bytes": big,
            f"{tgt}.producer.max.request.size": big,
            f"{tgt}.producer.compression.type": "none",  # weight chunks are zstd already
            # What this flow does not use: groups never span clusters here.
            "emit.checkpoints.enabled": "false",
            "emit.heartbeats.enabled": "false",
            "emit.offset-syncs.enabled": "false",
            "sync.group.offsets.enabled": "false",
            "refresh.groups.enabled": "false",
            "sync.topic.acls.enabled": "false",
            # The home weights topic's retention.ms=-1 must not be copied (target_specs bound it).
            "sync.topic.configs.enabled": "false",
            "refresh.topics.interval.seconds": str(self.refresh_topics_s),
            "tasks.max": str(self.tasks),
            # A worker restarted after a SIGKILL joins with a new member id: without this its
            # own task, "lost" with the old member, waits up to 5 min to be reassigned.
            f"{tgt}.scheduled.rebalance.max.delay.ms": "0",
            f"{tgt}.rebalance.timeout.ms": str(self.rebalance_timeout_ms),
            "plugin.discovery": "service_load",
            f"{tgt}.plugin.discovery": "service_load",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "replication.factor": rf,
            "offset.storage.replication.factor": rf,
            "config.storage.replication.factor": rf,
            "status.storage.replication.factor": rf,
        }
        props.update(self.extra)
        return props

    def write(self, path: str | os.PathLike, rest_port: int | None = None) -> Path:
        """Write ``mm2.properties`` at ``path``, and beside it, readable by its owner only, the
        SASL logins (:data:`SECRETS_FILE`) and each mutual-TLS client's key + certificate."""
        path = Path(path)
        secrets = self.secrets()
        if secrets:
            _write_private(path.parent / SECRETS_FILE, "".join(f"{k} = {_prop_escape(v)}\n" for k, v in secrets.items()))
        for alias, sec in self.securities().items():
            if sec.tls and sec.cert_file:
                _write_private(path.parent / f"{alias}.client.pem",
                               Path(sec.key_file).read_text() + "\n" + Path(sec.cert_file).read_text())
        lines = ["# MirrorMaker 2, dedicated mode: generated by astraflow.topics.mirror_plan.MirrorPlan"]
        lines += [f"{k} = {_prop_escape(v)}" for k, v in self.properties(rest_port, path.parent).items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def prepare_target(self, timeout: float = 30.0, bootstrap: str | None = None) -> list[str]:
        """Create the mirrored topics on the target with their own bound (verifying existing ones);
        ``bootstrap``: where this process reaches the target (default: ``target_bootstrap``)."""
        if not self.target_specs:
            return []
        stray = [s.name for s in self.target_specs if not self.matches(s.name)]
        if stray:
            raise TopicsError(f"MirrorPlan.target_specs name topics the flow does not mirror: {stray}")
        return ensure_topics(bootstrap or self.target_bootstrap, self.target_specs, timeout,
                             security_setting=self.target_security)
