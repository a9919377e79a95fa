"""A single-node Slurm cluster of our own in a directory: munged, slurmctld and slurmd.

What the Slurm backend's tests and benchmarks run against (Debian's ``slurm-wlm`` and
``munge``, which ``make slurm`` installs): every file the daemons read or write is under
the cluster's directory (``slurm.conf``, the munge key, state, spool, pid and log files, the
job completion log) but munged's socket, which has a temporary folder of its own (munged's
rules for a socket's folders), every port is a free one, and the daemons run as this
user's children, in the foreground, without systemd. Nothing under ``/etc``, ``/run`` or
``/var`` is read or written, so it runs beside any other Slurm or munge on the machine.
Clients reach it through the ``SLURM_CONF`` of :attr:`LocalSlurmCluster.env` (its
``slurm.conf`` names its munge socket).

:meth:`LocalSlurmCluster.stop` cancels every job still queued, waits for the queue to drain
(the jobs' processes are children of slurmd's step daemons, not of ours) and stops the
daemons; it is also what leaving the ``with`` block does, failure or not.

It knows nothing about AstraFlow's jobs: :mod:`.slurm` submits them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from astraflow.errors import AstraflowError
from astraflow.topics.broker import free_port, stop_process

from .netns import die_with_parent

__all__ = ["LocalSlurmCluster", "SlurmUnavailable", "missing_slurm"]

DAEMONS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm"}
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


class SlurmUnavailable(AstraflowError):
    """Slurm or munge is not installed, or the cluster did not come up; says what to do."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(Path(d) / name) for d in ("/usr/sbin", "/sbin")
                                       if (Path(d) / name).exists()), None)


def missing_slurm() -> list[str]:
    """The daemons and client commands of a local cluster that are not installed here."""
    return [n for n in (*DAEMONS, *CLIENTS) if _which(n) is None]


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return max(1, kb // 1024 - 512)  # slurmd drains a node that claims more than it has


class LocalSlurmCluster:
    """One node (this machine, at 127.0.0.1) in partition ``debug``; ``cpus`` beyond the
    machine's let jobs share cores (slurmd takes the configured counts). No generic
    resources: a ``--gres=gpu:N`` job is refused here."""

    def __init__(self, directory: str | Path, *, cpus: int | None = None, name: str = "astraflow",
                 startup_timeout_s: float = 60.0) -> None:
        self.dir = Path(directory).resolve()
        self.cpus, self.name = cpus or os.cpu_count() or 1, name
        self.startup_timeout_s = startup_timeout_s
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.jobcomp = self.dir / "jobcomp.txt"
        self.socket: Path | None = None  #: munged's socket, in a short folder of its own (see _start_munge)
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a client command needs in its environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "LocalSlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        missing = missing_slurm()
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)}; run `make slurm` (as root: apt-get install "
                                   "slurm-wlm munge)")
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self._daemon("slurmctld", "-D", "-i", "-f", str(self.conf))
            self._daemon("slurmd", "-D", "-f", str(self.conf))
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        # munged refuses a socket whose every parent folder others cannot traverse (a test's
        # temporary folder often is private), and a socket path is limited to 107 bytes: so the
        # socket gets a short folder of its own under the system's temporary folder, removed by stop.
        self.socket = Path(tempfile.mkdtemp(prefix="af-munge-")) / "socket"
        self.socket.parent.chmod(0o755)
        d = self.dir / "munge"
        d.mkdir(exist_ok=True)
        d.chmod(0o700)
        key = d / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon("munged", "--foreground", f"--socket={self.socket}", f"--key-file={key}",
                     f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                     f"--seed-file={d / 'munged.seed'}")
        self._until(lambda: self.socket.exists(), "munged's socket", d / "munged.log")

    def _write_conf(self) -> None:
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(exist_ok=True)
        d = self.dir
        self.conf.write_text("\n".join([
            f"ClusterName={self.name}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root" if os.getuid() == 0 else f"SlurmUser={os.environ.get('USER', 'root')}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd.log'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",  # the configured CPUs and memory, not the probed ones
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            "KillWait=5",
            "MinJobAge=600",  # finished jobs stay in squeue --states=all this long (their exit codes)
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_memory_mb()} "
            "State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            ""]))

    def _daemon(self, name: str, *args: str) -> None:
        log = self.dir / f"{name}.out"
        with open(log, "ab") as out:
            self.procs[name] = subprocess.Popen([_which(name) or name, *args], stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                                preexec_fn=die_with_parent)

    def _until(self, ready, what: str, log: Path) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0]} exited with {self.procs[dead[0]].returncode}" if dead else "timed out"
                raise SlurmUnavailable(f"local Slurm cluster in {self.dir}: waiting for {what}: {why}; see {log} "
                                       f"and {self.dir}/*.out")
            time.sleep(0.2)

    def command(self, tool: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster."""
        return subprocess.run([_which(tool) or tool, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)

    def _wait_idle(self) -> None:
        def idle() -> bool:
            out = self.command("sinfo", "--noheader", "--format=%T").stdout.split()
            return bool(out) and all(s.rstrip("*") in ("idle", "mixed", "allocated") for s in out)
        self._until(idle, "the node to be idle in sinfo", self.dir / "slurmctld.log")

    def jobs(self) -> list[str]:
        """Ids of the jobs queued or running."""
        out = self.command("squeue", "--noheader", "--format=%i")
        return out.stdout.split() if out.returncode == 0 else []

    def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Cancel every job, wait for them to leave, stop the daemons (slurmd first)."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            jobs = self.jobs()
            if jobs:
                self.command("scancel", *jobs)
                deadline = time.monotonic() + drain_timeout_s
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.3)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is not None:
                stop_process(p, 15)
        if self.socket is not None:
            shutil.rmtree(self.socket.parent, ignore_errors=True)
