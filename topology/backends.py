"""Actuators of the autoscaler: how a RaaS node is started and retired.

One small interface (:class:`Backend`): ``start(node)``, ``retire(node_id)``, and the
pool membership the backend holds (what it was asked to run, so a restarted autoscaler
actor picks up where it was). Retiring always means SIGTERM: the node finishes the
rollout in flight, commits it in its transaction, says ``stopping`` on ``control`` and
closes its consumer, which leaves the group so its partitions move at once. Nothing is
lost even when it is killed instead: uncommitted tasks are redelivered.

* :class:`LocalBackend` (default): node processes on this machine. Requests are queued
  and carried out by :meth:`LocalBackend.tick`, which the runner's loop calls, so that one
  thread owns the process list (:class:`.processes.Proc` objects and their supervision).
* :class:`CommandBackend`: shell command templates for real deployments, e.g. a cluster
  scheduler's CLI or ``ssh HOST systemd-run ...``; the stop command must deliver SIGTERM.
"""

from __future__ import annotations

import logging
import queue
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from astraflow.errors import RetriableError
from .plan import NodePlan
from .processes import Proc

log = logging.getLogger(__name__)

CommandFor = Callable[[NodePlan], list[str]]


class BackendError(RetriableError):
    """A start or stop command failed; the message names the command and its output."""


class Backend:
    """Membership bookkeeping shared by the backends; subclasses act in ``_start``/``_retire``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[str, list[NodePlan]] = {}
        self._next: dict[str, int] = {}

    def members(self, pool: str) -> list[str]:
        with self._lock:
            return [n.node_id for n in self._members.get(pool, [])]

    def next_index(self, pool: str) -> int:
        """Indices are never reused: a node id names one process's life in logs and accounting."""
        with self._lock:
            return self._next.get(pool, 0)

    def start(self, node: NodePlan) -> None:
        self._start(node)
        with self._lock:
            self._members.setdefault(node.pool, []).append(node)
            index = int(node.node_id.rpartition("-")[2])
            self._next[node.pool] = max(self._next.get(node.pool, 0), index + 1)

    def retire(self, node_id: str) -> None:
        with self._lock:
            node = next((n for ns in self._members.values() for n in ns if n.node_id == node_id), None)
        if node is None:
            raise KeyError(f"{node_id} is not a node this backend started")
        self._retire(node)
        with self._lock:
            self._members[node.pool].remove(node)

    def retire_all(self) -> list[str]:
        """Retire every member (the job is over, or its autoscaler stops: none may be orphaned);
        returns the nodes whose retirement failed."""
        failed = []
        with self._lock:
            members = [n.node_id for ns in self._members.values() for n in ns]
        for node_id in members:
            try:
                self.retire(node_id)
            except BackendError as e:
                log.error("%s", e)
                failed.append(node_id)
        return failed

    def tick(self, procs: list[Proc]) -> None:
        """Called by the runner's loop; the local and Slurm backends have work to do there."""

    def accounted_hours(self) -> dict | None:
        """The run's device-hours by the scheduler's own accounting (:class:`~.accounting.DeviceHours`'
        shape), where the backend has one; None: only the heartbeats count."""
        return None

    def _start(self, node: NodePlan) -> None:
        raise NotImplementedError

    def _retire(self, node: NodePlan) -> None:
        raise NotImplementedError


class LocalBackend(Backend):
    """Node processes on this machine, carried out by the runner's loop (:meth:`tick`)."""

    def __init__(self, command_for: CommandFor, log_dir: Path, retire_timeout_s: float = 120.0) -> None:
        super().__init__()
        self.command_for, self.log_dir, self.retire_timeout_s = command_for, Path(log_dir), retire_timeout_s
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._retiring: dict[str, tuple[Proc, float]] = {}
        self.exits: dict[str, int] = {}  #: retired node -> its exit status (0: it left cleanly)

    def _start(self, node: NodePlan) -> None:
        self._requests.put(("start", node))

    def retire_all(self) -> list[str]:
        """Nothing to do: its processes are in the runner's list, stopped with the others."""
        return []

    def _retire(self, node: NodePlan) -> None:
        self._requests.put(("retire", node))

    def tick(self, procs: list[Proc]) -> None:
        while True:
            try:
                op, node = self._requests.get_nowait()
            except queue.Empty:
                break
            if op == "start":
                p = Proc(node.role, node.node_id, self.command_for(node), self.log_dir / f"{node.node_id}.log")
                p.start()
                procs.append(p)
                log.info("started %s (pid %d)", node.node_id, p.popen.pid)
                continue
            p = next((p for p in procs if p.node_id == node.node_id and not p.done), None)
            if p is None:
                log.warning("retire %s: no such running process", node.node_id)
                continue
            self._retiring[node.node_id] = (p, time.monotonic() + self.retire_timeout_s)
            retire_process(p)
        for node_id, (p, deadline) in list(self._retiring.items()):
            code = p.popen.poll()
            if code is not None:
                self.exits[node_id] = code
                del self._retiring[node_id]
                log.info("retired %s: exited with %d", node_id, code)
            elif time.monotonic() > deadline:
                log.warning("retired %s still runs after %.0fs; killing it (its uncommitted tasks are redelivered)",
                            node_id, self.retire_timeout_s)
                p.popen.kill()


def retire_process(p: Proc) -> None:
    """Mark a node process done (so supervision does not restart it) and ask it to stop."""
    p.done = True
    if p.alive():
        p.popen.terminate()


class CommandBackend(Backend):
    """Runs the topology's start/stop command templates (see ``autoscaler.command``)."""

    def __init__(self, start: str, stop: str, command_for: CommandFor, job: str, timeout_s: float = 120.0) -> None:
        super().__init__()
        self.templates = {"start": start, "stop": stop}
        self.command_for, self.job, self.timeout_s = command_for, job, timeout_s

    def _start(self, node: NodePlan) -> None:
        self._run("start", node)

    def _retire(self, node: NodePlan) -> None:
        self._run("stop", node)

    def command(self, which: str, node: NodePlan) -> list[str]:
        """The template split like a shell would, each word filled in (``{cmd}`` stays one word)."""
        values = {"cmd": shlex.join(self.command_for(node)), "node_id": node.node_id, "pool": node.pool,
                  "policy": node.policy or "", "host": node.host, "address": node.address, "region": node.region,
                  "job": self.job}
        return [word.format(**values) for word in shlex.split(self.templates[which])]

    def _run(self, which: str, node: NodePlan) -> None:
        argv = self.command(which, node)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BackendError(f"{which} {node.node_id}: {shlex.join(argv)}: {e}") from e
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BackendError(f"{which} {node.node_id}: {shlex.join(argv)} exited with {out.returncode}: {tail[0]}")
