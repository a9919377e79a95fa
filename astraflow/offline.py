"""Reading a finished run offline: a broker of our own on the run dir's Kafka log.

A run directory that ``astraflow run`` made with the embedded broker holds that broker's
whole log under ``kafka/`` (what ``replay``, ``export`` and ``status`` read: every batch,
weight payload, announcement and metric). :class:`OfflineBroker` starts an embedded broker
on that log, on free ports, with its own configuration and logs in a temporary directory
(the run dir's ``server.properties`` and ``server.log`` stay as the run left them), and
stops it after. Retention and compaction are switched off for its lifetime, so opening
a run dir never deletes a record of it; nothing here writes to the job's topics. It
refuses a log whose broker is still running (Kafka locks it) and names that broker's
address instead.

:func:`offline` is the CLI's plumbing: a command given ``--run-dir RUN`` (or a
``--bootstrap-servers`` that is a run dir's path) runs against such a broker. It knows
nothing about what the commands read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from astraflow.errors import FatalError
from astraflow.topics import KafkaError, security

__all__ = ["OfflineBroker", "OfflineError", "kafka_dir", "offline"]

#: Broker settings while a run dir is open: no record may be deleted by reading it.
READ_ONLY = {
    "log.retention.check.interval.ms": str(2**62),
    "log.cleaner.enable": "false",
    "auto.create.topics.enable": "false",
}


class OfflineError(FatalError):
    """The path is no run dir with a Kafka log, or its broker is still running."""


def kafka_dir(path: str | Path) -> Path | None:
    """The Kafka data dir of a run dir (``RUN/kafka``, or that dir itself); None if it has none."""
    p = Path(path)
    for d in (p / "kafka", p):
        if (d / "meta" / "meta.properties").is_file():
            return d
    return None


def _listener(data: Path) -> str | None:
    """The client address the run's broker listened on (from its ``server.properties``)."""
    try:
        for line in (data / "server.properties").read_text().splitlines():
            if line.startswith("listeners="):
                return next((x.split("://", 1)[1] for x in line.split("=", 1)[1].split(",")
                             if x.startswith("PLAINTEXT://")), None)
    except OSError:
        pass
    return None


def _in_use(data: Path) -> bool:
    """Whether a broker holds the log's lock (Kafka's ``.lock``: a POSIX record lock)."""
    lock = data / "meta" / ".lock"
    if not lock.exists():
        return False
    with open(lock, "rb+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(f, fcntl.LOCK_UN)
    return False


def _wait_for_coordinators(bootstrap: str, timeout_s: float) -> None:
    """Until the group coordinators answer: a broker reopened on a log loads its groups (or,
    where the run used none, creates their internal topic) after it starts listening, and a
    command asking for a group's offsets meanwhile gets CoordinatorNotAvailable."""
    deadline = time.monotonic() + timeout_s
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-offline")
    try:
        pending = [f"astraflow-offline-probe-{i}" for i in range(8)]  # spread over the offsets partitions
        while pending:
            try:
                admin.list_group_offsets(pending[0])
                pending.pop(0)
            except KafkaError as e:
                if time.monotonic() > deadline:
                    raise OfflineError(f"the broker opened on the run's Kafka log answers no group request within "
                                       f"{timeout_s:g} s ({type(e).__name__})") from None
                time.sleep(0.5)
    finally:
        admin.close()


class OfflineBroker:
    """An embedded broker on a run dir's Kafka log, for reading it: ``with OfflineBroker(run) as bootstrap``."""

    def __init__(self, run_dir: str | Path, *, startup_timeout: float = 120.0) -> None:
        data = kafka_dir(run_dir)
        if data is None:
            raise OfflineError(f"{run_dir}: no Kafka log here (no kafka/meta/meta.properties); give the directory "
                               "`astraflow run` printed as 'run dir:' of a run with the embedded broker, or "
                               "--bootstrap-servers of the cluster a run used")
        self.run_dir, self.data = Path(run_dir), data
        self.startup_timeout = startup_timeout
        self._broker = None
        self._conf: Path | None = None

    def __enter__(self) -> str:
        from astraflow.topics import EmbeddedBroker
        from astraflow.topics.broker import BrokerStartError

        if _in_use(self.data):
            at = _listener(self.data)
            raise OfflineError(f"{self.data}: its broker is still running" + (f" at {at}" if at else "")
                               + "; read it there with --bootstrap-servers" + (f" {at}" if at else "")
                               + ", or stop the run first")
        self._conf = Path(tempfile.mkdtemp(prefix="astraflow-offline-"))
        broker = EmbeddedBroker(self.data, conf_dir=self._conf, heap="512m", properties=READ_ONLY,
                                startup_timeout=self.startup_timeout)
        try:
            broker.start()
        except BrokerStartError as e:
            self._cleanup()
            raise OfflineError(f"could not open the Kafka log in {self.data}: {str(e).splitlines()[0]}") from e
        self._broker = broker
        try:
            _wait_for_coordinators(broker.bootstrap_servers, self.startup_timeout)
        except BaseException:
            self.__exit__()
            raise
        return broker.bootstrap_servers

    def __exit__(self, *exc: object) -> None:
        if self._broker is not None:
            self._broker.stop()
            self._broker = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._conf is not None:
            shutil.rmtree(self._conf, ignore_errors=True)
            self._conf = None


@contextlib.contextmanager
def offline(args) -> Iterator[None]:
    """Run a command's ``args`` against its run dir's log when it names one (``run_dir_log``,
    or a ``bootstrap_servers`` that is a directory), else as they are."""
    run = getattr(args, "run_dir_log", None)
    servers = getattr(args, "bootstrap_servers", None)
    if run is None and servers and Path(servers).is_dir():
        run = servers
    if run is None:
        yield
        return
    with OfflineBroker(run) as bootstrap:
        args.bootstrap_servers, args.run_dir_log = bootstrap, str(run)
        yield
