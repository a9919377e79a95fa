"""A dedicated MirrorMaker 2 process running one :class:`~.mirror_plan.MirrorPlan`.

:class:`MirrorMaker` runs that process (java, the broker's jars, logs in a temp dir):
start, wait until it replicates, stop, SIGKILL for chaos, and lag per partition from the
source offsets MirrorMaker itself committed (:class:`PartitionLag`). What a flow mirrors,
and its ``mm2.properties``, are the plan's (:mod:`.mirror_plan`). This module knows Kafka
and processes; no job config, no weights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

from kafka import TopicPartition

from . import security
from .broker import _die_with_parent, _error_lines, _tail, free_port, stop_process
from .exceptions import BrokerStartError, KafkaRuntimeError
from .mirror_plan import MIRROR_MAIN_CLASS, SOURCE_CONNECTOR, MirrorPlan, internal_topics
from .runtime import java_command

__all__ = ["MirrorMaker", "MirrorStartError", "PartitionLag"]

class MirrorStartError(BrokerStartError):
    """MirrorMaker 2 exited or did not start replicating; the message holds its log's errors."""


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
