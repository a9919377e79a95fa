"""Nodes as Slurm batch jobs: submitted with ``sbatch``, watched with ``squeue``, retired with ``scancel``.

:class:`Slurm` is one cluster's client commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``
from the topology's ``slurm.bin_dir``, ``$ASTRAFLOW_SLURM_BIN`` or PATH; ``SLURM_CONF`` from
``slurm.conf`` or the environment), with one cached ``squeue`` snapshot of every job's
state, refreshed at most every ``slurm.poll_s``. :class:`SlurmJob` is one submitted job
behind the small part of :class:`subprocess.Popen` that :mod:`.processes` uses (``poll``,
``returncode``, ``terminate``, ``kill``, ``wait``), so :class:`SlurmProc` — a
:class:`~.processes.Proc` whose :meth:`~SlurmProc.start` is ``sbatch`` — is supervised,
restarted (resubmitted) and stopped by the same code as a local process. A node's job is
``sbatch --parsable --job-name=<job>.<node_id> --output=<run_dir>/logs/<node_id>.log
--wrap 'exec <command>'``: the batch step *is* the node process, so Slurm's signals reach it
and its exit code is the job's. Stopping one is ``scancel --signal=TERM --full`` (the node
finishes its transaction and leaves its consumer group), then ``scancel`` if it is still
there after its grace period; a job still pending is cancelled at once.

:class:`SlurmBackend` is the autoscaler's actuator on Slurm (:mod:`.backends`): ``start`` submits
the node's job at once (a refusal is the autoscaler's :class:`~.backends.BackendError`) and
hands its :class:`SlurmProc` to the runner's loop (``tick``), which supervises it like the local
backend's processes; ``retire`` is the TERM-then-cancel above, carried out by ``tick`` in the
runner's thread, which owns the process list (it may be resubmitting that very node); its
``accounted_hours`` are the run's device-hours as Slurm accounts them (:class:`SlurmHours`:
:mod:`.slurm_accounting` over the job completion log, and squeue for the jobs still running),
which the autoscaler reports beside the heartbeats' count.

:func:`sbatch_resources` turns a pool's ``slurm`` keys into sbatch flags,
:func:`check_slurm_launchable` names what ``launch --backend slurm`` cannot run yet and
:func:`slurm_summary` is what ``summary.json`` says under ``slurm``. It knows nothing about
Kafka: callers give it each node's argv.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .backends import Backend, BackendError, CommandFor, retire_process
from .plan import NodePlan, Plan, PoolPlan
from .processes import LAUNCHER_PID_ENV, Proc, component_env
from .schema import SlurmSpec, TopologyError
from .slurm_accounting import JobcompTail, read_jobcomp, slurm_device_hours

log = logging.getLogger(__name__)

__all__ = ["BIN_ENV", "Slurm", "SlurmBackend", "SlurmError", "SlurmHours", "SlurmJob", "SlurmProc",
           "check_slurm_launchable", "sbatch_resources", "slurm_proc", "slurm_summary"]

BIN_ENV = "ASTRAFLOW_SLURM_BIN"
#: A job in one of these states still holds its resources (its process may be running).
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                         "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"})


#: How long squeue may fail before a job is taken as lost (the supervisor then resubmits it,
#: and a cluster still unreachable fails that sbatch: the run stops naming it).
LOST_AFTER_S = 120.0


class SlurmError(BackendError):
    """A Slurm command failed; the message names the command and its last line of output."""


class Slurm:
    """One cluster's client commands, and the state of its jobs as ``squeue`` last said."""

    def __init__(self, spec: SlurmSpec = SlurmSpec(), timeout_s: float = 60.0) -> None:
        self.spec, self.timeout_s = spec, timeout_s
        self.bin_dir = spec.bin_dir or os.environ.get(BIN_ENV)
        self._lock = threading.Lock()
        self._states: dict[str, tuple[str, int]] = {}
        self._states_at = 0.0  #: monotonic time the snapshot was asked for

    def env(self) -> dict[str, str]:
        """This process's environment for the commands (and, through sbatch, its jobs)."""
        env = dict(os.environ)
        if self.spec.conf:
            env["SLURM_CONF"] = self.spec.conf
        return env

    def tool(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    def run(self, name: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
        argv = [self.tool(name), *args]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                 stdin=subprocess.DEVNULL, env=env or self.env())
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{shlex.join(argv)}: {e}") from e
        if check and out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SlurmError(f"{shlex.join(argv)} exited with {out.returncode}: {tail[0]}")
        return out

    def submit(self, name: str, argv: list[str], log_path: Path, flags: list[str]) -> "SlurmJob":
        """``sbatch`` one job whose batch step execs ``argv``; its output appended to ``log_path``."""
        log_path = Path(log_path).resolve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # A launcher inside an allocation (salloc, a batch script) must not hand its own job's
        # SLURM_* settings to sbatch, which would take them for the new job's.
        env = {k: v for k, v in component_env().items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        env.pop(LAUNCHER_PID_ENV, None)  # its parent is slurmstepd, wherever it runs: nothing to watch
        if self.spec.conf:
            env["SLURM_CONF"] = self.spec.conf
        out = self.run("sbatch", "--parsable", f"--job-name={name}", f"--output={log_path}", "--open-mode=append",
                       f"--chdir={os.getcwd()}", *flags, f"--wrap=exec {shlex.join(argv)}", env=env)
        job_id = out.stdout.strip().split(";")[0]  # (<id>;<cluster> on a federation)
        if not job_id.isdigit():
            raise SlurmError(f"sbatch for {name}: no job id in its output {out.stdout.strip()!r}")
        return SlurmJob(self, job_id, time.monotonic())

    def states(self, newer_than: float = 0.0) -> dict[str, tuple[str, int]]:
        """Job id -> (state, raw wait status) of every job squeue knows, finished ones included
        (for the cluster's ``MinJobAge``); asked again when the snapshot is older than
        ``poll_s`` or than ``newer_than`` (a monotonic time: a job submitted since)."""
        with self._lock:
            now = time.monotonic()
            if now - self._states_at < self.spec.poll_s and self._states_at > newer_than:
                return self._states
            out = self.run("squeue", "--noheader", "--me", "--states=all", "--Format=JobID:|,State:|,exit_code:|")
            states = {}
            for line in out.stdout.splitlines():
                parts = [p.strip() for p in line.split("|")]
                if len(parts) >= 3 and parts[0]:
                    states[parts[0]] = (parts[1], int(parts[2]) if parts[2].lstrip("-").isdigit() else 0)
            self._states, self._states_at = states, now
            return states

    def signal(self, job_id: str, sig: str = "TERM") -> None:
        """Deliver ``sig`` to a running job's every process (its batch step too); cancel it if it
        is still pending (nothing to signal, and signalling a pending job fails)."""
        self._scancel(job_id, "--state=PENDING")
        self._scancel(job_id, f"--signal={sig}", "--full", "--state=RUNNING")

    def cancel(self, job_id: str) -> None:
        self._scancel(job_id)

    def _scancel(self, job_id: str, *flags: str) -> None:
        """``scancel``; its failure is an error only while the job is still there (a job that
        ended meanwhile is an "invalid job id" or "already completing" to it)."""
        out = self.run("scancel", *flags, job_id, check=False)
        self._states_at = 0.0
        if out.returncode != 0:
            try:
                state = self.states().get(job_id, ("GONE", 0))[0]
            except SlurmError:
                state = "UNKNOWN"
            if state.split()[0] in LIVE_STATES - {"COMPLETING"} or state == "UNKNOWN":
                tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
                raise SlurmError(f"scancel {' '.join(flags)} {job_id} exited with {out.returncode} while the job is "
                                 f"{state}: {tail[0]}")

    def running(self) -> list[dict[str, str]]:
        """This user's running jobs as job completion records that end now (``squeue``'s start time)."""
        out = self.run("squeue", "--noheader", "--me", "--states=RUNNING", "--Format=JobID:|,Name:|,StartTime:|,NumCPUs:|")
        now = datetime.now().isoformat(timespec="seconds")
        records = []
        for line in out.stdout.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 4 and parts[0]:
                records.append({"JobId": parts[0], "Name": parts[1], "JobState": "RUNNING", "StartTime": parts[2],
                                "EndTime": now, "ProcCnt": parts[3]})
        return records

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as key -> value."""
        out = self.run("scontrol", "show", "config")
        pairs = (line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        return {k.strip(): v.strip() for k, v in pairs}

    def jobcomp_path(self) -> Path | None:
        """The job completion log (``JobCompLoc``) when it is a text file (``jobcomp/filetxt``)."""
        c = self.config()
        return Path(c["JobCompLoc"]) if c.get("JobCompType") == "jobcomp/filetxt" and c.get("JobCompLoc") else None


def exit_code(state: str, status: int) -> int:
    """A finished job's ``Popen``-style return code: the exit status, or minus the signal that
    ended it; a job that ended otherwise than by its own exit (cancelled before it ran, its node
    failed, its time limit) never reads as a clean 0."""
    code = -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
    if code == 0 and state not in ("COMPLETED",):
        return -15 if state in ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE") else -1
    return code


class SlurmJob:
    """One batch job, as much of a :class:`subprocess.Popen` as :mod:`.processes` uses."""

    def __init__(self, slurm: Slurm, job_id: str, submitted: float) -> None:
        self.slurm, self.job_id, self.submitted = slurm, job_id, submitted
        self.pid = int(job_id)  #: (what log lines print as the process id)
        self.returncode: int | None = None
        self.state = "PENDING"
        self.unreachable_since: float | None = None  #: monotonic time squeue started failing

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            found = self.slurm.states(newer_than=self.submitted).get(self.job_id)
        except SlurmError as e:  # a busy or restarting controller: the job is as it was, for a while
            self.unreachable_since = self.unreachable_since or time.monotonic()
            if time.monotonic() - self.unreachable_since < LOST_AFTER_S:
                log.warning("slurm job %s: %s", self.job_id, e)
                return None
            log.error("slurm job %s: squeue has failed for %.0fs; taking the job as lost: %s", self.job_id,
                      LOST_AFTER_S, e)
            found = None
        self.unreachable_since = None
        if found is None:  # purged already (MinJobAge) or the controller lost it: it is not running
            log.warning("slurm job %s is not known to squeue any more; taking it as failed", self.job_id)
            self.state, self.returncode = "UNKNOWN", -1
        elif found[0].split()[0] not in LIVE_STATES:
            self.state, self.returncode = found[0], exit_code(found[0], found[1])
        else:
            self.state = found[0]
        return self.returncode

    def terminate(self) -> None:
        self.slurm.signal(self.job_id, "TERM")

    def kill(self) -> None:
        self.slurm.cancel(self.job_id)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"slurm job {self.job_id}", timeout)
            time.sleep(min(self.slurm.spec.poll_s, 1.0))
        return self.returncode


@dataclass
class SlurmProc(Proc):
    """A :class:`~.processes.Proc` run as a Slurm job: :meth:`start` submits (again, on a restart)."""

    slurm: Slurm | None = None
    job_name: str = ""
    flags: list[str] = field(default_factory=list)  #: its resources as sbatch flags
    job_ids: list[str] = field(default_factory=list)  #: every job it was, the first submission's first

    def start(self) -> None:
        self.popen = self.slurm.submit(self.job_name, self.cmd, self.log_path, self.flags)
        self.job_ids.append(self.popen.job_id)
        log.info("%s: slurm job %s", self.node_id, self.popen.job_id)


def sbatch_resources(pool: PoolPlan, spec: SlurmSpec) -> list[str]:
    """The sbatch flags of one node of ``pool``: CPUs, GPUs as gres, memory, partition, time limit."""
    r = pool.slurm
    flags = [f"--cpus-per-task={r.cpus or pool.threads or 1}"]
    gpus = r.gpus if r.gpus is not None else (
        pool.devices_per_node if pool.device_kind != "cpu" and not pool.device.emulated else 0)
    if gpus:
        flags.append(f"--gres=gpu:{gpus}")
    if r.mem:
        flags.append(f"--mem={r.mem}")
    partition, limit = r.partition or spec.partition, r.time_limit or spec.time_limit
    if partition:
        flags.append(f"--partition={partition}")
    if limit:
        flags.append(f"--time={limit}")
    return flags + list(r.extra)


def check_slurm_launchable(plan: Plan) -> None:
    """What ``launch --backend slurm`` cannot run yet, as a :class:`TopologyError` naming the key."""
    if plan.emulated_links():
        raise TopologyError(plan.source, "emulate_links", "emulated links run a region's nodes in network "
                                                          "namespaces of this machine, which Slurm jobs are not: "
                                                          "set emulate_links: false")
    for p in plan.pools.values():
        if p.component == "trainer" and len(p.hosts) > 1:
            raise TopologyError(plan.source, f"regions.{p.region}.pools.{p.name}.hosts", (
                "a trainer on several hosts needs its rank group's rendezvous on the host Slurm gives rank 0, "
                "which the Slurm backend does not place yet: give it one host (its ranks: trainer.ranks)"))


def slurm_proc(slurm: Slurm, node: NodePlan, pool: PoolPlan, cmd: list[str], log_dir: Path, job: str) -> SlurmProc:
    """The :class:`SlurmProc` of one planned node (not yet submitted)."""
    return SlurmProc(node.role, node.node_id, cmd, Path(log_dir) / f"{node.node_id}.log", slurm=slurm,
                     job_name=f"{job}.{node.node_id}", flags=sbatch_resources(pool, slurm.spec))


class SlurmHours:
    """A run's device-hours as Slurm accounts them, live: its finished jobs from the job
    completion log (read as it grows), its running ones from squeue's start times. None where
    the cluster keeps no such log as text (``JobCompType`` other than ``jobcomp/filetxt``)."""

    def __init__(self, slurm: Slurm, pools: dict[str, PoolPlan], job: str) -> None:
        self.slurm, self.pools, self.job = slurm, pools, job
        self.tail: JobcompTail | None = None
        self.finished: dict[str, dict[str, str]] = {}  #: job id -> its completion record

    def totals(self) -> dict | None:
        if self.tail is None:
            path = self.slurm.jobcomp_path()
            if path is None:
                return None
            self.tail = JobcompTail(path)
        prefix = f"{self.job}."
        self.finished.update((r.get("JobId", ""), r) for r in self.tail.read() if r.get("Name", "").startswith(prefix))
        running = [r for r in self.slurm.running() if r["JobId"] not in self.finished]
        return slurm_device_hours([*self.finished.values(), *running], self.pools, self.job)


def slurm_summary(slurm: Slurm, plan: Plan, job: str, procs) -> dict:
    """What ``summary.json`` says under ``slurm`` once every job has ended: each node's job ids
    and the device-hours from Slurm's job completion log (None, with the reason, without one)."""
    out: dict = {"conf": slurm.spec.conf, "jobs": {p.node_id: list(p.job_ids) for p in procs
                                                   if isinstance(p, SlurmProc)}, "jobcomp": None, "device_hours": None}
    try:
        path = slurm.jobcomp_path()
    except SlurmError as e:
        out["device_hours_unavailable"] = str(e)
        return out
    if path is None:
        out["device_hours_unavailable"] = "the cluster's JobCompType is not jobcomp/filetxt"
        return out
    out["jobcomp"] = str(path)
    out["device_hours"] = slurm_device_hours(read_jobcomp(path), plan.pools, job)
    return out


class SlurmBackend(Backend):
    """The autoscaler's nodes as Slurm jobs; the runner's loop supervises them once handed over (:meth:`tick`)."""

    def __init__(self, slurm: Slurm, command_for: CommandFor, log_dir: Path, job: str, pools: dict[str, PoolPlan],
                 retire_timeout_s: float = 120.0) -> None:
        super().__init__()
        self.slurm, self.command_for, self.log_dir, self.job = slurm, command_for, Path(log_dir), job
        self.pools, self.retire_timeout_s = pools, retire_timeout_s
        self._new: list[SlurmProc] = []  #: submitted, not yet in the runner's list
        self._procs: dict[str, SlurmProc] = {}
        self._asked: list[str] = []  #: retirements asked for, not yet carried out (by tick)
        self._retiring: dict[str, tuple[SlurmProc, float]] = {}  #: (only tick's thread touches it)
        self.exits: dict[str, int] = {}  #: retired node -> its exit status (0: it left cleanly)
        self.hours = SlurmHours(slurm, pools, job)

    def accounted_hours(self) -> dict | None:
        """The whole run's device-hours by Slurm's accounting (its every job, not only these)."""
        try:
            return self.hours.totals()
        except SlurmError as e:
            log.warning("device-hours from slurm: %s", e)
            return None

    def _start(self, node: NodePlan) -> None:
        p = slurm_proc(self.slurm, node, self.pools[node.pool], self.command_for(node), self.log_dir, self.job)
        p.start()
        with self._lock:
            self._new.append(p)
            self._procs[node.node_id] = p

    def _retire(self, node: NodePlan) -> None:
        if node.node_id not in self._procs:
            raise BackendError(f"retire {node.node_id}: no slurm job of this backend")
        with self._lock:  # carried out by tick: the runner's thread owns the procs (it may be resubmitting one)
            self._asked.append(node.node_id)

    def jobs(self) -> dict[str, list[str]]:
        """Node -> the ids of every Slurm job it was (a resubmission adds one)."""
        return {n: list(p.job_ids) for n, p in self._procs.items()}

    def tick(self, procs: list[Proc]) -> None:
        with self._lock:
            new, self._new = self._new, []
            asked, self._asked = self._asked, []
        procs.extend(new)
        for node_id in asked:
            p = self._procs[node_id]
            self._retiring[node_id] = (p, time.monotonic() + self.retire_timeout_s)
            log.info("retiring %s: scancel --signal=TERM slurm job %s", node_id, p.popen.job_id)
            try:
                retire_process(p)  # done (no resubmission), then scancel --signal=TERM --full
            except SlurmError as e:  # its grace period still ends in scancel
                log.error("retire %s: %s", node_id, e)
        for node_id, (p, deadline) in list(self._retiring.items()):
            code = p.popen.poll()
            if code is not None:
                self.exits[node_id] = code
                del self._retiring[node_id]
                log.info("retired %s: slurm job %s ended %s, exit %d", node_id, p.popen.job_id, p.popen.state, code)
            elif time.monotonic() > deadline:
                log.warning("retired %s still runs after %.0fs; scancel %s (its uncommitted tasks are redelivered)",
                            node_id, self.retire_timeout_s, p.popen.job_id)
                self._retiring[node_id] = (p, float("inf"))
                try:
                    p.popen.kill()
                except SlurmError as e:
                    log.error("retire %s: %s", node_id, e)

    def retire_all(self) -> list[str]:
        """Its nodes are the runner's to stop with the others; here only those it has not taken yet."""
        with self._lock:
            new, self._new = self._new, []
        for p in new:
            p.done = True
            p.popen.kill()
        return []
