"""A node's components as OS processes: start, supervise, stop.

:class:`Proc` is one ``astraflow node`` process (its command, log file, restarts);
:func:`node_command` is that command for a role of a job; :func:`supervise` restarts a
component that died unexpectedly (its work is redelivered by Kafka) and turns a fatal
exit (:data:`~astraflow.errors.EXIT_FATAL`: bad data, bad config, missing model) or too
many restarts into :class:`RunFailed`, whose cause is the last line the component wrote;
:func:`stop_processes` takes them all down; a component whose launcher died stops on its own
(:func:`watch_launcher`). ``astraflow run``
(:func:`astraflow.launcher.run_job`), ``astraflow launch``, ``astraflow node --topology``
(:func:`.launch.run_host`), the autoscaler's local backend, the chaos harness and the
trainer group agent all start their processes with these.

It knows nothing of the broker, the topics, the progress display or the run directory's
outputs: callers own the loop that calls :func:`supervise`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from astraflow.errors import EXIT_FATAL, AstraflowError, last_words_cause

if TYPE_CHECKING:
    from astraflow.config import JobConfig


class RunFailed(AstraflowError):
    """A job stopped before finishing; the message is the cause, as one line."""

    def __init__(self, cause: str, *, node_id: str | None = None, log_path: Path | None = None,
                 retriable: bool = True) -> None:
        self.cause, self.node_id, self.log_path, self.retriable = cause, node_id, log_path, retriable
        super().__init__(f"{node_id}: {cause}" if node_id else cause)


@dataclass
class Proc:
    role: str
    node_id: str
    cmd: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None
    restarts: int = 0
    done: bool = False
    policy: str = ""  #: the policy a trainer / RaaS node serves ("" for the dataflow and one-policy jobs)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=component_env())
        log.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def last_line(self) -> str:
        """The last line the process wrote: ``astraflow node`` ends with its cause of exit there."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 8192))
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""


#: torch.distributed's placement variables. A process that trained in-process (a test, a
#: benchmark) holds its own; a component inheriting them would take itself for a rank of
#: that world (a trainer group agent would not start its ranks, a trainer would reuse a
#: bound port). Components are placed only by their own group agent.
_TORCH_PLACEMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


#: Set by :meth:`Proc.start` to the starting process's pid: an ``astraflow node`` that finds
#: itself re-parented away from it (its launcher died, SIGKILL or a crash) stops on its own
#: (:func:`watch_launcher`) instead of working on for a job nobody runs.
LAUNCHER_PID_ENV = "ASTRAFLOW_LAUNCHER_PID"


def component_env() -> dict[str, str]:
    """This process's environment without torch's placement variables (see above), naming
    this process as the component's launcher (:data:`LAUNCHER_PID_ENV`)."""
    env = {k: v for k, v in os.environ.items() if k not in _TORCH_PLACEMENT and not k.startswith("TORCHELASTIC_")}
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


#: How long an orphaned component has, after it stops itself as on SIGTERM, before it exits
#: regardless (its broker may be gone with its launcher, and a client's close would wait on it).
ORPHAN_GRACE_S = 8.0
ORPHAN_WATCH_S = 0.5


def watch_launcher(name: str, grace_s: float = ORPHAN_GRACE_S) -> bool:
    """In a component started by :meth:`Proc.start`: once its launcher is no longer its parent
    (the launcher died and the process was re-parented), stop as on SIGTERM, and exit after
    ``grace_s`` if that has not ended the process (a trainer group's agent turns the SIGTERM
    into stopping its ranks). Started by hand (no :data:`LAUNCHER_PID_ENV`) nothing is
    watched. Returns whether a watch started."""
    import signal
    import threading
    try:
        launcher = int(os.environ.get(LAUNCHER_PID_ENV, ""))
    except ValueError:
        return False
    if os.getppid() != launcher:
        try:
            os.kill(launcher, 0)
        except ProcessLookupError:
            pass  # gone already, before this process got here: orphaned
        except OSError:
            return False
        else:
            return False  # started by something else that inherited the variable (a backend's command)

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(ORPHAN_WATCH_S)
        print(f"astraflow node {name}: error: its launcher (pid {launcher}) is gone; stopping", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
    return True


def node_command(role: str, cfg: JobConfig, bootstrap: str, run_dir: Path, node_id: str,
                 overrides: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "astraflow", "node", "--role", role, "--config", cfg.source,
           "--bootstrap-servers", bootstrap, "--run-dir", str(run_dir), "--node-id", node_id]
    if len(cfg.policy_names) > 1 and role != "dataflow":
        cmd += ["--policy", cfg.policy]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def supervise(procs: list[Proc], max_restarts: int, progress: bool) -> RunFailed | None:
    """Restart crashed components; the failure that ends the run, if any. ``progress``: say
    what happens (a fatal stop, a restart) on stdout."""
    for p in procs:
        if p.done or p.alive():
            continue
        code = p.popen.returncode
        if code == 0 and p.role in ("trainer", "dataflow"):
            p.done = True
            continue
        if code == EXIT_FATAL:
            _say(progress, f"{p.node_id} stopped with a fatal error; stopping the job")
            return RunFailed(last_words_cause(p.last_line()) or "no output (see its log)", node_id=p.node_id,
                             log_path=p.log_path, retriable=False)
        if p.restarts >= max_restarts:
            return RunFailed(f"exited with code {code} {p.restarts + 1} times; last words: {p.last_line()}",
                             node_id=p.node_id, log_path=p.log_path)
        p.restarts += 1
        _say(progress, f"{p.node_id} exited with code {code}; restarting ({p.restarts}/{max_restarts})")
        p.start()
    return None


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, flush=True)


def stop_processes(procs: list[Proc], timeout: float = 30.0) -> None:
    """SIGTERM every running component, wait up to ``timeout`` for all, SIGKILL what is left.

    A process already asked to stop (``done`` and still alive: a node the autoscaler retired,
    finishing its in-flight tasks) is waited for, not signalled again: a second SIGTERM that
    lands while its interpreter shuts down, after Python has put the default handler back,
    kills it (exit -15) instead of letting it leave cleanly."""
    for p in procs:
        if p.alive() and not p.done:
            p.popen.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        if p.popen is None:
            continue
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()
