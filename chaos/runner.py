"""``astraflow chaos SCENARIO.yaml``: run a job under a fault schedule, then prove nothing was lost.

The runner owns everything a scenario touches: the Kafka broker(s) (:class:`.faults.ChaosKafka`),
the job's component processes (a :class:`.harness.JobHarness` whose nodes may reach the
broker through a cuttable Toxiproxy path, :class:`.faults.CutLink`), a supervisor that restarts a dead component after
``restart.delay_s`` as a process manager would, and the fault schedule. When the trainer
and the dataflow have finished it lifts every fault, lets the log settle, runs the
conservation audit (:mod:`.invariants`), waits for every node to reach the trainer's final
weights, and writes the report (:mod:`.report`). The run passes, and the command exits 0,
only when the job completed, the audit passed and every holder's weights digest is the
trainer's.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from astraflow.chaos.faults import ChaosKafka, signal_proc, slow_down, stop_for
from astraflow.chaos.harness import JobHarness
from astraflow.chaos.report import (FaultRecord, build_report, conservation_counts, final_digests, format_table,
                                    read_task_partitions, read_uncommitted, recovery, snapshot_assignment,
                                    tasks_redone)
from astraflow.chaos.scenario import (BROKER_KINDS, PROCESS_KINDS, Fault, Scenario, ScenarioError,
                                      check_against_job)
from astraflow.config import JobConfig, load_config
from astraflow.errors import EXIT_FATAL
from astraflow.topology.processes import Proc

#: A tmpfs this large holds a short scenario's broker data; disk_full fills the rest.
DISK_MB = 1024


class _Harness(JobHarness):
    """A JobHarness whose nodes each connect where the runner says (their proxy, when cuttable)."""

    def __init__(self, cfg: JobConfig, bootstrap: str, run_dir: Path, overrides: list[str],
                 bootstrap_for: Callable[[str], str]) -> None:
        super().__init__(cfg, bootstrap, run_dir, overrides)
        self.bootstrap_for = bootstrap_for

    def start(self, role: str, node_id: str, *args: Any, **kw: Any) -> Proc:
        direct, self.bootstrap = self.bootstrap, self.bootstrap_for(node_id)
        try:  # the base class builds the node's command line from self.bootstrap
            return super().start(role, node_id, *args, **kw)
        finally:
            self.bootstrap = direct


class ChaosRun:
    """One scenario, run once. ``run()`` returns the report (also written as JSON)."""

    def __init__(self, sc: Scenario, *, run_dir: str | Path | None = None, bootstrap: str | None = None,
                 progress: bool = True) -> None:
        self.sc, self.external, self.progress = sc, bootstrap, progress
        base = load_config(sc.job_config, sc.overrides)
        self.job = f"{base.job}-chaos-{uuid.uuid4().hex[:6]}"
        self.run_dir = Path(run_dir or Path(base.run_dir) / f"chaos-{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.cfg = load_config(sc.job_config, {**sc.overrides, "job": self.job, "run_dir": str(self.run_dir)})
        self.overrides = sc.set_args() + [f"job={self.job}"]
        check_against_job(sc, self.cfg.rollout.nodes)
        kinds = {f.kind for f in sc.faults} | set(sc.random.kinds if sc.random else ())
        if bootstrap and kinds & (set(BROKER_KINDS) | {"partition"}):
            raise ScenarioError(str(sc.path), "faults", f"{sorted(kinds & (set(BROKER_KINDS) | {'partition'}))} "
                                                        "need the runner's own broker; drop --bootstrap-servers")
        self.raas = [f"raas-{i}" for i in range(self.cfg.rollout.nodes)]
        self.nodes = ["dataflow", "trainer", *self.raas]
        self.rng = random.Random(sc.seed)
        self.kafka: ChaosKafka | None = None
        if not bootstrap:
            self.kafka = ChaosKafka(self.run_dir / "kafka", sc.brokers,
                                    proxied=tuple(self.nodes) if "partition" in kinds else (),
                                    disk_mb=DISK_MB if "disk_full" in kinds else None)
        self.records: list[FaultRecord] = []
        self.skipped: list[str] = []
        self.restarts: dict[str, int] = {}
        self._crashes: dict[str, int] = {}
        self._killed: set[str] = set()  # nodes the runner SIGKILLed: their death is no crash
        self._pending: dict[str, float] = {}  # node -> monotonic time of its restart
        self._done: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._cancel = threading.Event()
        self._broker_busy = threading.Lock()
        self._calls: queue.Queue = queue.Queue()  # work fault threads hand to the main thread
        self._fault_error: str | None = None  # a fault that could not be lifted ends the run
        self.step = -1

    # -- the run ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from astraflow.checks import check_data, check_model
        from astraflow.topics import ensure_topics
        check_model(self.cfg)
        check_data(self.cfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        h: _Harness | None = None
        error, completed = None, False
        try:
            if self.kafka is not None:
                self._say(f"starting {self.sc.brokers} Kafka broker(s) ...")
                self.kafka.start()
            bootstrap = self.external or self.kafka.bootstrap_servers
            ensure_topics(bootstrap, _topics(self.cfg).specs())
            h = _Harness(self.cfg, bootstrap, self.run_dir, self.overrides,
                         self.kafka.bootstrap_for if self.kafka else (lambda _: bootstrap))
            self.h = h
            for node in self.nodes:
                h.start(_role(node), node)
            self._say(f"job {self.job}: {len(self.nodes)} component processes; run dir {self.run_dir}")
            error = self._loop(h)
            completed = error is None
            self._lift_faults()
            report = self._judge(h, bootstrap, started, completed, error)
        finally:
            self._lift_faults()
            if h is not None:
                for p in h.procs.values():
                    if p.popen is not None:
                        signal_proc(p.popen, signal.SIGCONT)
                h.stop_all()
            if self.kafka is not None:
                self.kafka.stop()
        path = self.run_dir / "chaos_report.json"
        path.write_text(json.dumps(report, indent=2))
        self._say(format_table(report))
        self._say(f"report: {path}")
        return report

    def _loop(self, h: _Harness) -> str | None:
        t0, mono0 = time.time(), time.monotonic()
        self.t0 = t0
        pending = list(self.sc.faults)
        rnd = self.sc.random
        next_random = mono0 + rnd.start_s if rnd else None
        while True:
            self._run_calls()
            for m in h.poll_metrics(500):
                if m.name == "trainer.samples":
                    self.step = max(self.step, m.step)
            error = self._fault_error or self._supervise(h)
            if error:
                return error
            if {"trainer", "dataflow"} <= self._done:
                for f in pending:
                    self.skipped.append(f"{f.key} {f.kind} at {f.when} (the job finished first)")
                return None
            elapsed = time.monotonic() - mono0
            if elapsed > self.sc.timeout_s:
                return f"the scenario exceeded its timeout_s ({self.sc.timeout_s:.0f}s)"
            if "trainer" in self._done:
                continue  # the job is finishing (final evaluation): nothing left to break
            for f in [f for f in pending if _due(f, elapsed, self.step)]:
                pending.remove(f)
                self._inject(f, h, f.when)
            window_open = self.sc.duration_s is None or elapsed < self.sc.duration_s
            if rnd and window_open and time.monotonic() >= next_random:
                kind = self.rng.choice(rnd.kinds)
                target = self.rng.choice(rnd.targets) if kind in PROCESS_KINDS else "any"
                self._inject(Fault(kind, at_s=elapsed, target=target, params=rnd.params[kind], key="random"),
                             h, "random")
                next_random += rnd.every_s * (1 + self.rng.uniform(-rnd.jitter, rnd.jitter))

    def _supervise(self, h: _Harness) -> str | None:
        """Restart dead components after the delay; the error that ends the run, if any."""
        now = time.monotonic()
        for node, proc in list(h.procs.items()):
            if node in self._done or node in self._pending or proc.popen.poll() is None:
                continue
            code = proc.popen.returncode
            if code == 0 and proc.role in ("trainer", "dataflow"):
                self._done.add(node)
                continue
            if code == EXIT_FATAL:
                return f"{node} stopped with a fatal error: {proc.last_line()} (log {proc.log_path})"
            if node in self._killed:
                self._killed.discard(node)
            else:
                self._crashes[node] = self._crashes.get(node, 0) + 1
                self._say(f"  {node} exited with {code} (not injected); restarting")
                if self._crashes[node] > self.sc.restart.max:
                    return (f"{node} crashed {self._crashes[node]} times (restart.max {self.sc.restart.max}); "
                            f"last words: {proc.last_line()} (log {proc.log_path})")
            self._pending[node] = now + self.sc.restart.delay_s
        for node, at in list(self._pending.items()):
            if now >= at:
                del self._pending[node]
                self.restarts[node] = self.restarts.get(node, 0) + 1
                h.start(_role(node), node)
        return None

    # -- faults -------------------------------------------------------------------------
    def _inject(self, f: Fault, h: _Harness, planned: str) -> None:
        if f.kind in PROCESS_KINDS:
            node = self._resolve(f.target, h)
            if node is None:
                self.skipped.append(f"{f.key} {f.kind} on {f.target} at {f.when} (no live target)")
                return
            rec = FaultRecord(f.kind, node, planned, time.time(), detail=dict(f.params))
            if node.startswith("raas") and f.kind != "slow_node":
                rec.window = snapshot_assignment(h.bootstrap, h.topics.rollout_group(self.cfg.policy),
                                                 h.topics.tasks(self.cfg.policy), node)
                rec.started = time.time()
            self._process_fault(f, rec, h.procs[node].popen)
        elif f.kind in BROKER_KINDS:
            if not self._broker_busy.acquire(blocking=False):
                self.skipped.append(f"{f.key} {f.kind} at {f.when} (another broker fault is in progress)")
                return
            try:
                node = 1 if f.kind == "disk_full" else self.kafka.pick(
                    f.target, h.topics.batches(self.cfg.policy), self.rng,
                    group=h.topics.rollout_group(self.cfg.policy), transactional_id=h.topics.rollout_transactional_id(self.cfg.policy, "raas-0"))
            except Exception as e:  # noqa: BLE001 - no broker answered: this fault cannot land now
                self._broker_busy.release()
                self.skipped.append(f"{f.key} {f.kind} at {f.when} (no broker to pick: {e})")
                return
            rec = FaultRecord(f.kind, f"broker-{node}", planned, time.time(), detail=dict(f.params))
            self._background(self._broker_fault, f, rec, node, rec=rec)
        else:  # rogue_batch
            rec = FaultRecord(f.kind, "rogue", planned, time.time())
            out = subprocess.run([sys.executable, "-m", "astraflow.chaos.rogue", "--bootstrap-servers", h.bootstrap,
                                  "--topic", h.topics.batches(self.cfg.policy)], capture_output=True, text=True)
            rec.detail = {"exit": out.returncode, "said": (out.stdout + out.stderr).strip()[-300:]}
            rec.ended = time.time()
        self.records.append(rec)
        self._say(f"  fault {len(self.records) - 1}: {rec.kind} {rec.target} ({planned}, trainer step {self.step})")

    def _process_fault(self, f: Fault, rec: FaultRecord, popen: subprocess.Popen) -> None:
        p = f.params
        if f.kind == "sigkill":
            self._killed.add(rec.target)
            signal_proc(popen, signal.SIGKILL)
            rec.ended = rec.started
        elif f.kind == "sigstop":
            self._background(lambda: stop_for(popen, p["resume_after_s"], self._cancel), rec=rec)
        elif f.kind == "slow_node":
            self._background(lambda: slow_down(popen, p["duration_s"], p["period_s"], p["stopped_frac"],
                                               self._cancel), rec=rec)
        elif f.kind == "partition":
            proxy = self.kafka.proxies[rec.target]

            def partition() -> None:
                proxy.cut()
                try:
                    self._cancel.wait(p["duration_s"])
                finally:
                    proxy.restore()
            self._background(partition, rec=rec)

    def _broker_fault(self, f: Fault, rec: FaultRecord, node: int) -> None:
        kafka, p = self.kafka, f.params
        try:
            if f.kind == "disk_full":
                rec.detail["ballast_bytes"] = kafka.fill_disk()
                self._cancel.wait(p["duration_s"])
                self._in_main(kafka.free_disk)
                return
            kafka.kill(node)
            wait = p["down_s"] if f.kind == "broker_restart" else p["restart_after_s"]
            if wait is not None:
                time.sleep(wait)  # not cancellable: a broker the runner took down always comes back
                self._in_main(lambda: kafka.restart(node))
        except Exception as e:  # noqa: BLE001 - the broker stays down: nothing can recover, stop the run
            self._fault_error = f"{f.kind} on {rec.target or 'the broker'} could not be lifted: {e}"
            rec.detail["error"] = str(e)
        finally:
            self._broker_busy.release()

    def _background(self, fn, *args, rec: FaultRecord) -> None:
        def body() -> None:
            try:
                fn(*args)
            finally:
                rec.ended = time.time()
        t = threading.Thread(target=body, name=f"fault-{rec.kind}", daemon=True)
        self._threads.append(t)
        t.start()

    def _lift_faults(self) -> None:
        self._cancel.set()
        deadline = time.monotonic() + 300
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            self._run_calls()
            time.sleep(0.1)
        self._run_calls()

    def _in_main(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the main thread and wait for it. A broker dies with the *thread* that
        started it (``PR_SET_PDEATHSIG``), so brokers restart from the thread that outlives them."""
        done: dict[str, Any] = {}
        event = threading.Event()
        self._calls.put((fn, done, event))
        event.wait()
        if "error" in done:
            raise done["error"]

    def _run_calls(self) -> None:
        while True:
            try:
                fn, done, event = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the fault's thread
                done["error"] = e
            event.set()

    def _resolve(self, target: str, h: _Harness) -> str | None:
        if target == "raas":
            live = [n for n in self.raas if h.procs[n].alive() and n not in self._pending]
            return self.rng.choice(live) if live else None
        if target in self._done or target in self._pending or not h.procs[target].alive():
            return None
        return target

    # -- the verdict ----------------------------------------------------------------------
    def _judge(self, h: _Harness, bootstrap: str, started: float, completed: bool, error: str | None) -> dict:
        from astraflow.actors.signing import with_run_keys
        from astraflow.chaos.invariants import audit, content_limits, group_verifier, read_log
        from astraflow.topics import Heartbeat
        verifier = group_verifier(with_run_keys(self.cfg, self.run_dir))  # the keys the nodes sign with
        from astraflow.topics.replay import read_topic
        policy, topics = self.cfg.policy, h.topics
        self._say("auditing the topics ...")
        report = (h.audit_until_settled(self.sc.settle_s) if completed
                  else audit(bootstrap, topics, policy, self.cfg.effective_staleness,
                             verifier=verifier, limits=content_limits(self.cfg)))
        deadline = time.monotonic() + (self.sc.settle_s if completed else 0)
        while True:  # every live node must reach the trainer's final weights (it applies them between polls)
            h.poll_metrics(200)
            beats = [m for _, _, m in read_topic(bootstrap, topics.control) if isinstance(m, Heartbeat)
                     and m.policy == policy]
            weights = final_digests(h.metrics, beats, self.cfg.trainer.steps)
            if weights["match"] or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        log = read_log(bootstrap, topics, policy, verifier=verifier)
        redone = tasks_redone(log, read_uncommitted(bootstrap, topics.trajectories),
                              read_task_partitions(bootstrap, topics.tasks(policy)), self.records, policy)
        for rec in self.records:
            rec.recovery_s = recovery(rec, h.metrics, beats)
        with open(self.run_dir / "metrics.jsonl", "w") as f:  # what recovery times were read from
            for m in sorted(h.metrics, key=lambda m: m.ts):
                f.write(json.dumps({"ts": m.ts, "component": m.component, "name": m.name, "value": m.value,
                                    "step": m.step, **{f"label.{k}": v for k, v in m.labels.items()}}) + "\n")
        return build_report(scenario=str(self.sc.path), job=self.job, brokers=self.sc.brokers, seed=self.sc.seed,
                            started=started, faults=self.records, skipped=self.skipped, audit=report,
                            counts=conservation_counts(log), redone=redone, weights=weights,
                            restarts=self.restarts, completed=completed, error=error, run_dir=str(self.run_dir))

    def _say(self, text: str) -> None:
        if self.progress:
            print(text, flush=True)


def run_scenario(path: str | Path, *, run_dir: str | Path | None = None, bootstrap: str | None = None,
                 progress: bool = True, report_path: str | Path | None = None) -> dict[str, Any]:
    """Load, run and judge one scenario file; the report (``report["ok"]`` is the verdict)."""
    from astraflow.chaos.scenario import load_scenario
    report = ChaosRun(load_scenario(path), run_dir=run_dir, bootstrap=bootstrap, progress=progress).run()
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report, indent=2))
    return report


def _due(f: Fault, elapsed: float, step: int) -> bool:
    return (f.at_s is not None and elapsed >= f.at_s) or (f.at_step is not None and step >= f.at_step)


def _role(node: str) -> str:
    return "raas" if node.startswith("raas") else node


def _topics(cfg: JobConfig):
    from astraflow.topics import job_topics
    return job_topics(cfg)
