"""The embedded Apache Kafka broker: one KRaft node (broker + controller) on loopback.

The broker is a real ``kafka.Kafka`` JVM started from the jars that :mod:`.runtime`
provides, with a data dir per run, free ports, a readiness wait and a clean stop.
Alone it is its own controller quorum (``--standalone``); :mod:`.cluster` starts several
as one cluster with a static quorum of all of them.
A broker started in the foreground of a Python process dies with it (``PR_SET_PDEATHSIG``),
so an aborted test run leaves no orphan JVM; ``astraflow broker start`` detaches instead
and records its pid in a state file for ``stop``/``status``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .exceptions import BrokerStartError, KafkaRuntimeError
from .runtime import cache_root, java_command

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .secured import SecureSetup

_PR_SET_PDEATHSIG = 1

#: Broker settings every embedded broker gets. Single node: every internal topic has
#: replication factor 1, or transactions and consumer groups fail (:mod:`.cluster`
#: overrides them for several nodes).
BASE_PROPERTIES: dict[str, str] = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    # Payloads are chunked to <= 1 MiB, but records carry headers and batches overhead.
    "message.max.bytes": str(4 * 1024 * 1024),
    "replica.fetch.max.bytes": str(4 * 1024 * 1024),
    "log.retention.check.interval.ms": "30000",
    # A producer that dies inside a transaction blocks read_committed readers of its
    # partitions until the coordinator aborts it: at transaction.timeout.ms, but only when
    # this sweep runs (10 s by default), so sweep often enough that the timeout is the bound.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}


#: The broker JVM's collector. G1 sizes its regions from the heap — 1 MiB for the heaps used
#: here — and allocates any object of half a region or more as *humongous*: straight into the
#: old generation, each one a reason to start a concurrent marking cycle. Every weight chunk
#: (1 MiB) and every produce request carrying one was such an object: in the demo job G1's
#: concurrent and parallel GC threads took ~0.1 CPU s per trained step (0.16–0.20 for the
#: broker in all, 0.06–0.09 with these regions). 16 MiB regions keep records up to
#: ``message.max.bytes`` (4 MiB) well below the humongous threshold (8 MiB).
GC_OPTIONS = ("-XX:+UseG1GC", "-XX:G1HeapRegionSize=16m")

#: The broker JVM's just-in-time compilers: C1 only. An embedded broker lives as long as one
#: run (the demo, a test, a benchmark); with tiered compilation C2 recompiled the broker's hot
#: paths for minutes of a demo run (JFR forty seconds in: half of the broker's 0.45 cores), on
#: the two cores the job's own processes need. C1's code is done within seconds and a little
#: slower at the broker's light load: ``benchmarks/broker_jit.py`` measures both (the broker's
#: CPU per trained step lower in every pair; the run's s/step unchanged within the box's noise).
JIT_OPTIONS = ("-XX:TieredStopAtLevel=1",)

#: Further options for an embedded broker's JVM, after the ones above (a later ``-XX`` flag
#: wins: ``-XX:TieredStopAtLevel=4`` brings C2 back, as ``benchmarks/broker_jit.py`` does).
JVM_OPTS_ENV = "ASTRAFLOW_BROKER_JVM_OPTS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process of ours (a clean shutdown), SIGKILL it after ``timeout``; wait for its exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class BrokerInfo:
    """What a running broker is: enough to reach it and to stop it."""

    pid: int
    port: int
    controller_port: int
    data_dir: str
    log_path: str

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


class EmbeddedBroker:
    """A single-node Kafka 4.x broker in KRaft combined mode.

    Args:
        data_dir: where logs and metadata live; a fresh temp dir when omitted.
        port: client port; a free one when 0.
        controller_port: KRaft controller port; a free one when 0.
        heap: JVM max heap.
        startup_timeout: seconds to wait for the broker to answer.
        detach: run in its own session and outlive this process (the CLI's ``start``).
        properties: extra ``server.properties`` entries.
        node_id: KRaft node id (distinct per node of a cluster).
        voters: static controller quorum ``id@host:port,...`` of a cluster; None: this node
            alone is the quorum.
        cluster_id: the cluster id to format storage with (shared by a cluster's nodes).
        conf_dir: where ``server.properties``, the log4j settings and the broker's own logs
            go (default: ``data_dir``); another directory leaves a data dir's files as they
            were but for its Kafka log (an offline reader of a run dir, :mod:`astraflow.offline`).
        secure: a :class:`~.secured.SecureSetup`: SASL_SSL (SCRAM-SHA-512) for clients, mutual
            TLS for the controller, ACLs enforced (a cluster's nodes share one); None: plaintext.
        wrap: argv -> argv the JVMs (storage format, broker) run through, e.g. into a network
            namespace (a region's own cluster, :mod:`astraflow.topology.links`); None: as they are.
        probe: whether the client port answers, for :meth:`wait_ready` (default: this
            process's loopback at ``port``; a wrapped broker listens where that cannot see).
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, *, port: int = 0,
                 controller_port: int = 0, heap: str = "1g", startup_timeout: float = 90.0,
                 detach: bool = False, properties: dict[str, str] | None = None, node_id: int = 1,
                 voters: str | None = None, cluster_id: str | None = None,
                 conf_dir: str | os.PathLike | None = None, secure: "SecureSetup | None" = None,
                 wrap: Callable[[list[str]], list[str]] | None = None,
                 probe: Callable[[], bool] | None = None) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="astraflow-kafka-"))
        self.conf_dir = Path(conf_dir) if conf_dir is not None else self.data_dir
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        #: the ports this broker chose itself (0 given): a start that loses one of them to another
        #: process between the choice and the JVM's bind chooses again (:meth:`start`)
        self._chosen = {"port"} if not port else set()
        if not controller_port:
            self._chosen.add("controller_port")
        self._formatted_now = False  #: this start formatted the data dir (no node ran on it yet)
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.detach = detach
        self.extra = dict(properties or {})
        self.node_id, self.voters, self.cluster_id = node_id, voters, cluster_id
        self.secure = secure
        #: a secured broker's mutual-TLS client listener (a client certificate of its CA required)
        self.mtls_port = free_port() if secure is not None else None
        self.wrap, self.probe = wrap, probe
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0

    # -- lifecycle -------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def mtls_bootstrap_servers(self) -> str | None:
        """A secured broker's mutual-TLS listener (clients log in by certificate); None otherwise."""
        return f"127.0.0.1:{self.mtls_port}" if self.mtls_port else None

    @property
    def log_path(self) -> Path:
        return self.conf_dir / "server.log"

    @property
    def gc_log_path(self) -> Path:
        """The JVM's garbage-collection log (start-up settings, one line per pause)."""
        return self.conf_dir / "gc.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def exit_code(self) -> int | None:
        """The broker process's exit status once it has exited (died); None while it runs or
        when it was never started or was stopped here."""
        return self._proc.poll() if self._proc is not None else None

    def info(self) -> BrokerInfo:
        assert self._proc is not None, "broker not started"
        return BrokerInfo(self._proc.pid, self.port, self.controller_port, str(self.data_dir),
                          str(self.log_path))

    #: starts of a lone node whose self-chosen port was taken before its JVM bound it
    PORT_RETRIES = 3

    def start(self) -> "EmbeddedBroker":
        for attempt in range(self.PORT_RETRIES + 1):
            self.launch()
            try:
                self.wait_ready()
                return self
            except BrokerStartError as e:
                lost = self._lost_port()
                if lost is None or attempt == self.PORT_RETRIES:
                    raise
                # A free port is free when chosen, not when the JVM binds it: another process
                # (a parallel test's broker, a client's ephemeral port) took it meanwhile.
                log.warning("Kafka broker: port %d was taken before it bound it (%s); choosing another",
                            getattr(self, lost), str(e).splitlines()[0])
                setattr(self, lost, free_port())
        raise AssertionError("unreachable")

    def _lost_port(self) -> str | None:
        """Which self-chosen port (``port`` or ``controller_port``) the failed start could not
        bind, when choosing again can fix it (the controller's only on a dir this start
        formatted: the voter set it wrote names the port, so the dir is formatted again); else None."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return None
        for name in ("port", "controller_port"):
            if name in self._chosen and f"bind to 127.0.0.1:{getattr(self, name)}: Address already in use" in text:
                if name == "controller_port":
                    if not self._formatted_now:
                        return None
                    shutil.rmtree(self.data_dir / "meta", ignore_errors=True)
                return name
        return None

    def launch(self) -> None:
        """Start the JVM without waiting for it: a cluster's nodes only become ready together."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        log4j = self._write_log4j()
        jvm = [f"-Dlog4j2.configurationFile={log4j}", f"-Dkafka.logs.dir={self.conf_dir}",
               "-Xms256m", *GC_OPTIONS, *JIT_OPTIONS, "-Djava.awt.headless=true",
               *shlex.split(os.environ.get(JVM_OPTS_ENV, ""))]
        try:
            if not (self.data_dir / "meta" / "meta.properties").exists():
                self._format(props, jvm)
                self._formatted_now = True
            gc_log = f"-Xlog:gc,gc+init:file={self.gc_log_path}:uptime,level,tags:filecount=2,filesize=10m"
            cmd = java_command("kafka.Kafka", [str(props)], heap=self.heap, jvm_opts=[*jvm, gc_log])
            if self.wrap is not None:
                cmd = self.wrap(cmd)
        except KafkaRuntimeError as e:
            raise BrokerStartError(str(e)) from e
        out = open(self.conf_dir / "stdout.log", "ab")
        kwargs: dict = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
        if self.detach:
            kwargs["start_new_session"] = True
        else:
            kwargs["preexec_fn"] = _die_with_parent
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._proc = subprocess.Popen(cmd, **kwargs)
        out.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker: SIGTERM (Kafka's controlled shutdown), SIGKILL after ``timeout``."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout)
        self._proc = None

    def terminate(self) -> None:
        """SIGTERM without waiting (a cluster stops all its nodes at once)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def kill(self) -> None:
        """SIGKILL the broker (chaos tests)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self, timeout: float = 30.0) -> None:
        """Stop the broker and delete its data dir when this object made it (a temp dir).

        A data dir the caller named is kept: it is their log to restart or replay from. A
        detached broker (the CLI's ``start``) outlives us, so its dir is never ours to delete.
        """
        self.stop(timeout)
        if self._own_dir and not self.detach:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------
    def _write_config(self) -> Path:
        props = dict(BASE_PROPERTIES)
        props.update({
            "node.id": str(self.node_id),
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.data_dir / "meta"),
        })
        if self.secure is not None:
            props.update(self.secure.broker_properties(self.port, self.controller_port, self.mtls_port))
        if self.voters:
            props["controller.quorum.voters"] = self.voters
        else:
            props["controller.quorum.bootstrap.servers"] = f"127.0.0.1:{self.controller_port}"
        props.update(self.extra)
        path = self.conf_dir / "server.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a secured one holds a password
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _write_log4j(self) -> Path:
        path = self.conf_dir / "log4j2.properties"
        path.write_text(
            "status = error\n"
            "appender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_path}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            # The controller and log cleaner are chatty at INFO; keep the log readable.
            "logger.ctl.name = org.apache.kafka.controller\nlogger.ctl.level = WARN\n"
            "logger.raft.name = org.apache.kafka.raft\nlogger.raft.level = WARN\n"
        )
        return path

    def _format(self, props: Path, jvm: list[str]) -> None:
        # A static quorum is named in server.properties; only a lone node formats itself as one.
        args = ["format", "-t", self.cluster_id or kafka_cluster_id(), "-c", str(props)]
        if not self.voters:
            args.append("--standalone")
        if self.secure is not None:
            args += self.secure.format_args()
        cmd = java_command("kafka.tools.StorageTool", args, heap="256m", jvm_opts=jvm)
        if self.wrap is not None:
            cmd = self.wrap(cmd)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BrokerStartError(
                f"formatting KRaft storage in {self.data_dir} failed (exit {proc.returncode}):\n"
                + _tail(proc.stdout + proc.stderr)
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        assert self._proc is not None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise BrokerStartError(
                    f"Kafka broker exited with code {code} during start-up "
                    f"(port {self.port}, controller port {self.controller_port}, data dir {self.data_dir}); "
                    f"last lines of its log:\n{self._log_tail()}"
                )
            if (self.probe() if self.probe is not None else _port_open(self.port)) and self._log_says_started():
                return
            time.sleep(0.2)
        self.kill()
        raise BrokerStartError(
            f"Kafka broker did not become ready within {self.startup_timeout:.0f}s on port {self.port}; "
            f"last lines of its log:\n{self._log_tail()}"
        )

    def _log_says_started(self) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return b"Kafka Server started" in f.read()
        except FileNotFoundError:
            return False

    def _log_tail(self, n: int = 15) -> str:
        """The log's error lines (what went wrong) and its last lines (where it stopped)."""
        parts = []
        for name in ("server.log", "stdout.log"):
            p = self.conf_dir / name
            if not p.exists():
                continue
            with open(p, "rb") as f:
                f.seek(self._log_offset if name == "server.log" else 0)
                text = f.read().decode(errors="replace")
            errors = _error_lines(text)
            if errors:
                parts.append(f"--- errors in {p} ---\n" + "\n".join(errors))
            if text.strip():
                parts.append(f"--- last lines of {p} ---\n" + _tail(text, n))
        return "\n".join(parts) or "(no log written)"


def _error_lines(text: str, limit: int = 8) -> list[str]:
    seen: list[str] = []
    for line in text.splitlines():
        if (" ERROR " in line or " FATAL " in line or line.startswith("Caused by:")) and line not in seen:
            seen.append(line)
    return seen[:limit]


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def kafka_cluster_id() -> str:
    # Kafka cluster ids are 16 random bytes in URL-safe base64 without padding; like Kafka's
    # own Uuid, never one starting with "-", which the storage tool would read as an option.
    import base64
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


# -- the CLI's detached broker ----------------------------------------------------------

def state_file() -> Path:
    return cache_root() / "broker" / "state.json"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True
