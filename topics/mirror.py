"""Apache Kafka's MirrorMaker 2 between a job's home cluster and a remote region's cluster.

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

:class:`MirrorMaker` runs that process (java, the broker's jars, logs in a temp dir):
start, wait until it replicates, stop, SIGKILL for chaos, and lag per partition from the
source offsets MirrorMaker itself committed. This module knows Kafka and topic names; no
job config, no weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from kafka import TopicPartition

from . import security
from .broker import _die_with_parent, _error_lines, _tail, free_port, stop_process
from .exceptions import BrokerStartError, KafkaRuntimeError, TopicsError
from .registry import DAY_MS, JobTopics, TopicSpec, ensure_topics
from .runtime import java_command

__all__ = ["MirrorPlan", "MirrorMaker", "MirrorStartError", "PartitionLag", "connect_group", "internal_topics",
           "mirrored_specs", "weight_topics", "MIRROR_MAIN_CLASS"]

MIRROR_MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"
IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
SOURCE_CONNECTOR = "MirrorSourceConnector"

#: A mirrored weights topic keeps this many snapshots' worth of bytes (per partition) by default.
DEFAULT_KEEP_SNAPSHOTS = 4
DEFAULT_RETENTION_MS = 7 * DAY_MS


class MirrorStartError(BrokerStartError):
    """MirrorMaker 2 exited or did not start replicating; the message holds its log's errors."""


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
        lines = ["# MirrorMaker 2, dedicated mode: generated by astraflow.topics.mirror.MirrorPlan"]
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


class PartitionLag(NamedTuple):
    """One mirrored partition: how far the target is behind the source."""

    source_end: int  #: the source partition's end offset (read_committed: its last stable offset)
    mirrored: int  #: the source offset MirrorMaker will copy next (committed with its writes)
    target_end: int  #: the target partition's end offset (it differs: transaction markers take offsets)

    markers_only: bool = False  #: what lies between ``mirrored`` and ``source_end`` is transaction markers

    @property
    def lag(self) -> int:
        """Source offsets not yet mirrored; 0 when only transaction markers (or aborted records) remain."""
        return 0 if self.markers_only else max(0, self.source_end - self.mirrored)


def _nothing_to_copy(consumer, tp: TopicPartition, start: int, end: int) -> bool:
    """Whether a read_committed read of ``[start, end)`` returns no record (markers, aborted data)."""
    consumer.assign([tp])
    consumer.seek(tp, start)
    deadline = time.monotonic() + 5.0
    while consumer.position(tp) < end and time.monotonic() < deadline:
        if any(r.offset < end for r in consumer.poll(timeout_ms=500, max_records=1).get(tp, [])):
            return False
    return consumer.position(tp) >= end


class MirrorMaker:
    """A dedicated MirrorMaker 2 process running one :class:`MirrorPlan`.

    Args:
        plan: what to mirror.
        work_dir: ``mm2.properties`` and the logs; a temp dir (removed on :meth:`close`) when omitted.
        heap: JVM max heap.
        startup_timeout: seconds until its source task runs.
        wrap: argv -> argv the JVM runs through, e.g. into the region's network namespace
            (:meth:`astraflow.topology.links.RegionLink.wrap`); None: as it is.
        reach: ``(source, target)`` bootstrap servers as *this* process reaches the two clusters,
            where they differ from the plan's (which are MirrorMaker's view, from its region):
            used to create the target's topics and to measure the lag.
    """

    def __init__(self, plan: MirrorPlan, work_dir: str | os.PathLike | None = None, *, heap: str = "384m",
                 startup_timeout: float = 120.0, wrap: Callable[[list[str]], list[str]] | None = None,
                 reach: tuple[str, str] | None = None) -> None:
        self.plan, self.wrap = plan, wrap
        self.source_here, self.target_here = reach or (plan.source_bootstrap, plan.target_bootstrap)
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="astraflow-mm2-"))
        self.heap, self.startup_timeout = heap, startup_timeout
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0
        self.starts = 0  #: how many times the process was started

    @property
    def log_path(self) -> Path:
        return self.work_dir / "mm2.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -------------------------------------------------------------------
    def start(self, wait: bool = True) -> "MirrorMaker":
        """Create the target's mirrored topics, start the JVM, and (``wait``) wait until it replicates."""
        if self.running():
            return self
        self.plan.prepare_target(bootstrap=self.target_here)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        props = self.plan.write(self.work_dir / "mm2.properties", rest_port=self.plan.rest_port or free_port())
        log4j = self._write_log4j()
        jvm = [f"-Dlog4j2.configurationFile={log4j}", "-Djava.awt.headless=true", "-XX:+UseSerialGC"]
        try:
            # --clusters: this process drives only the flows into its own region's cluster.
            cmd = java_command(MIRROR_MAIN_CLASS, [str(props), "--clusters", self.plan.target_alias],
                               heap=self.heap, jvm_opts=jvm)
        except KafkaRuntimeError as e:
            raise MirrorStartError(str(e)) from e
        if self.wrap is not None:
            cmd = self.wrap(cmd)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        out = open(self.work_dir / "stdout.log", "ab")
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      preexec_fn=_die_with_parent)
        out.close()
        self.starts += 1
        if wait:
            self.wait_replicating()
        return self

    def wait_replicating(self) -> None:
        """Wait until the source task of the flow has started (it then copies what is new at home)."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                self._proc = None
                raise MirrorStartError(f"MirrorMaker 2 ({self.plan.flow}) exited with code {code} during start-up; "
                                       f"{self._log_report()}")
            if self._log_says_replicating():
                return
            time.sleep(0.3)
        self.kill()
        raise MirrorStartError(f"MirrorMaker 2 ({self.plan.flow}) did not start replicating within "
                               f"{self.startup_timeout:.0f}s; {self._log_report()}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Connect's clean shutdown: tasks commit), SIGKILL after ``timeout``."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL (chaos): whatever it had not committed is copied again by the next start."""
        if self._proc is not None:
            if self._proc.poll() is None:
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "MirrorMaker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lag -------------------------------------------------------------------------
    def lag(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, PartitionLag]:
        """Per mirrored partition: the source's end offset, the next source offset MirrorMaker
        will copy (from the offsets it commits with its writes, on the target), the target's end."""
        names = list(topics) if topics is not None else self._mirrored_topics()
        src = security.consumer(bootstrap_servers=self.source_here, group_id=None,
                                enable_auto_commit=False, isolation_level="read_committed",
                                client_id="astraflow-mirror-lag", security=self.plan.source_security)
        tgt = security.consumer(bootstrap_servers=self.target_here, group_id=None,
                                enable_auto_commit=False, isolation_level="read_committed",
                                client_id="astraflow-mirror-lag", security=self.plan.target_security)
        try:
            tps = [TopicPartition(t, p) for t in names for p in sorted(src.partitions_for_topic(t) or ())]
            source_end = src.end_offsets(tps) if tps else {}
            target_end = tgt.end_offsets(tps) if tps else {}
            mirrored = self._committed_source_offsets(tgt)
            out = {}
            for tp in tps:
                done = mirrored.get(tp, 0)
                out[tp] = PartitionLag(source_end[tp], done, target_end.get(tp, 0),
                                       0 < source_end[tp] - done <= 64 and _nothing_to_copy(src, tp, done,
                                                                                            source_end[tp]))
        finally:
            src.close()
            tgt.close()
        return out

    def wait_caught_up(self, timeout: float = 60.0, topics: Sequence[str] | None = None) -> dict[TopicPartition, PartitionLag]:
        """Wait until every mirrored partition has lag 0; raises :class:`TimeoutError` with the lags."""
        deadline = time.monotonic() + timeout
        while True:
            lags = self.lag(topics)
            if all(pl.lag == 0 for pl in lags.values()):
                return lags
            if time.monotonic() > deadline:
                behind = {f"{tp.topic}[{tp.partition}]": pl.lag for tp, pl in lags.items() if pl.lag}
                raise TimeoutError(f"MirrorMaker 2 ({self.plan.flow}) still behind after {timeout:.0f}s: {behind}")
            time.sleep(0.5)

    def _mirrored_topics(self) -> list[str]:
        if self.plan.topics:
            return list(self.plan.topics)
        admin = security.admin(bootstrap_servers=self.source_here, client_id="astraflow-mirror-lag",
                               security=self.plan.source_security)
        try:
            return sorted(t for t in admin.list_topics() if self.plan.matches(t))
        finally:
            admin.close()

    def _committed_source_offsets(self, tgt) -> dict[TopicPartition, int]:
        """Connect's offsets topic on the target: the last source offset copied, per partition."""
        topic = internal_topics(self.plan.source_alias)["offsets"]
        parts = tgt.partitions_for_topic(topic)
        if not parts:
            return {}
        tps = [TopicPartition(topic, p) for p in parts]
        tgt.assign(tps)
        tgt.seek_to_beginning(*tps)
        end = tgt.end_offsets(tps)
        out: dict[TopicPartition, int] = {}
        while any(tgt.position(tp) < end[tp] for tp in tps):
            for records in tgt.poll(timeout_ms=500).values():
                for r in records:
                    try:
                        name, where = json.loads(r.key)
                        value = json.loads(r.value) if r.value is not None else None
                    except (TypeError, ValueError):
                        continue
                    if name != SOURCE_CONNECTOR or where.get("cluster") != self.plan.source_alias:
                        continue
                    tp = TopicPartition(where["topic"], int(where["partition"]))
                    if value is None:
                        out.pop(tp, None)
                    else:
                        out[tp] = int(value["offset"]) + 1
        return out

    # -- logs ------------------------------------------------------------------------
    def _write_log4j(self) -> Path:
        path = self.work_dir / "log4j2.properties"
        path.write_text(
            "status = error\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_path}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            # Kafka clients' config dumps are long and say nothing about the flow.
            "logger.cfg.name = org.apache.kafka.common.config.AbstractConfig\nlogger.cfg.level = WARN\n"
        )
        return path

    def _log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_says_replicating(self) -> bool:
        text = self._log_text()
        return f"{SOURCE_CONNECTOR}-0" in text and "finished initialization and start" in text

    def _log_report(self) -> str:
        text = self._log_text()
        stdout = (self.work_dir / "stdout.log")
        extra = stdout.read_text(errors="replace") if stdout.exists() else ""
        errors = _error_lines(text + "\n" + extra)
        return (f"log {self.log_path}:\n" + "\n".join(errors) + ("\n--- last lines ---\n" + _tail(text or extra, 15)))
