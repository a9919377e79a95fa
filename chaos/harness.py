"""Start, kill and restart a job's component processes by hand (chaos tests).

The same ``astraflow node`` processes ``astraflow run`` starts
(:mod:`astraflow.topology.processes`), without the automatic restarts of its
:func:`~astraflow.topology.processes.supervise`, so a test decides what dies and when,
then watches the ``metrics`` topic for progress.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

from astraflow.config import JobConfig
from astraflow.topics import Consumer, DeadLetters, Metric, TopicPartition
from astraflow.topology.processes import Proc, node_command, stop_processes


class JobHarness:
    def __init__(self, cfg: JobConfig, bootstrap: str, run_dir: str | Path, overrides: list[str] | None = None):
        self.cfg, self.bootstrap, self.run_dir = cfg, bootstrap, Path(run_dir)
        self.overrides = list(overrides or [])
        self.procs: dict[str, Proc] = {}
        from astraflow.topics import job_topics
        self.topics = job_topics(cfg)
        self.metrics: list[Metric] = []
        self._consumer: Consumer | None = None

    def start(self, role: str, node_id: str, policy: str | None = None) -> Proc:
        """Start a component; ``policy`` names the policy a trainer / RaaS node of a
        multi-policy job serves."""
        cfg = self.cfg.view(policy) if policy else self.cfg
        proc = Proc(role, node_id, node_command(role, cfg, self.bootstrap, self.run_dir, node_id, self.overrides),
                    self.run_dir / "logs" / f"{node_id}.log", policy=policy or "")
        proc.start()
        self.procs[node_id] = proc
        return proc

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[node_id]
        os.kill(proc.popen.pid, sig)
        proc.popen.wait()

    def poll_metrics(self, timeout_ms: int = 500) -> list[Metric]:
        if self._consumer is None:
            self._dead = DeadLetters.own(self.bootstrap, self.topics.dlq, "harness")
            self._consumer = Consumer(self.bootstrap, partitions=[TopicPartition(self.topics.metrics, 0)],
                                      client_id="harness", dead_letters=self._dead, expect=(Metric,))
            self._consumer.seek_to_beginning()
        new = [d.message for d in self._consumer.poll(timeout_ms) if isinstance(d.message, Metric)]
        self.metrics += new
        return new

    def wait_for(self, predicate: Callable[[Metric], bool], timeout: float, what: str = "") -> Metric:
        """The first metric (seen so far or arriving) that satisfies ``predicate``."""
        for m in self.metrics:
            if predicate(m):
                return m
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.poll_metrics():
                if predicate(m):
                    return m
            for p in self.procs.values():
                if p.popen.poll() not in (None, 0, -9):
                    raise RuntimeError(f"{p.node_id} exited with {p.popen.returncode}; see {p.log_path}")
        raise TimeoutError(f"no metric {what} within {timeout:.0f}s; logs in {self.run_dir / 'logs'}")

    def audit_until_settled(self, timeout: float = 180.0, interval: float = 3.0):
        """Audit the topics until the conservation law holds or ``timeout`` passes; the last
        report either way (surviving nodes may still be answering redelivered tasks)."""
        from astraflow.actors.signing import with_run_keys
        from astraflow.chaos.invariants import audit, audit_job, content_limits, group_verifier
        keyed = with_run_keys(self.cfg, self.run_dir)  # the keys the nodes sign with (their run dir's)
        deadline = time.monotonic() + timeout
        while True:
            if len(self.cfg.policy_names) > 1:
                reports = audit_job(self.bootstrap, keyed)
                if all(r.ok for r in reports.values()) or time.monotonic() > deadline:
                    return reports
            else:
                report = audit(self.bootstrap, self.topics, self.cfg.policy, self.cfg.effective_staleness,
                               verifier=group_verifier(keyed), limits=content_limits(keyed))
                if report.ok or time.monotonic() > deadline:
                    return report
            time.sleep(interval)

    def wait_exit(self, node_id: str, timeout: float) -> int:
        return self.procs[node_id].popen.wait(timeout)

    def stop_all(self, timeout: float = 30.0) -> None:
        stop_processes(list(self.procs.values()), timeout)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
            self._dead.close()
