"""The trainer as a group of ranks: one host's group agent, and what a rank needs to know.

``astraflow node --role trainer`` whose world (``trainer.ranks`` per host x ``--nnodes``)
is larger than one, and which is not itself a rank, is its host's *group agent*: it starts
the host's ranks with torch's own launcher (``elastic_launch``: static rendezvous at
``--master-addr:--master-port``, where host 0's agent keeps the store; no restarts), tees
every rank's output into its own with a ``[rank<R>]:`` prefix, and waits. Each rank is the
same ``astraflow node`` command; torch's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*``
tell it its place, and its node id is ``<agent node id>.rank<R>``.

The group lives and dies as one, because a process group cannot be re-entered: a rank
that fails ends its process (no in-process actor restart), the agent stops the other
ranks and exits non-zero, and whoever launched the agent restarts the whole group, which
resumes from the last checkpoint. A rank that fails *fatally* (bad config, bad model)
makes the agent exit :data:`~astraflow.errors.EXIT_FATAL` with that rank's cause as its
own last line, so the launcher stops the job instead of restarting it. A rank whose agent
dies (SIGKILL) kills itself: an orphaned rank would go on training beside the next group.

This module knows nothing about training or Kafka.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from astraflow.errors import EXIT_FATAL, FatalError, last_words_cause

log = logging.getLogger("astraflow.trainer_group")

#: Test-only hook: ``"<rank>:<cause>"`` makes that global rank fail fatally with ``cause``
#: as it starts, as a rank that rejects its config would (no real input fails in a rank
#: only: the agent checks the model and the config first).
TEST_RANK_FATAL_ENV = "ASTRAFLOW_TEST_RANK_FATAL"
#: How long host 0's agent waits for the other hosts' agents (static rendezvous).
RENDEZVOUS_TIMEOUT_S = 900
#: How long the ranks have to stop on SIGTERM before the agent kills them: below the
#: launcher's own 30 s grace, so the agent is never killed with its ranks still alive.
SHUTDOWN_TIMEOUT_S = 15
#: How long a rank asked to stop may take before it dies of the signal: one blocked in a
#: collective or in the rendezvous with a dead peer would hold its agent for torch's 30 s,
#: and a group that is going down has nothing left to finish (checkpoints are atomic).
RANK_STOP_GRACE_S = 5.0
#: How often a rank checks that its agent is still its parent.
AGENT_WATCH_S = 0.5
#: The agent's pid, set in the ranks' environment: a rank whose agent died before the rank
#: began watching (it is already reparented) must not take its new parent for the agent.
AGENT_PID_ENV = "ASTRAFLOW_AGENT_PID"


class FlagError(FatalError, ValueError):
    """A bad ``astraflow node`` flag; the message names the flag."""


@dataclass(frozen=True)
class Topology:
    """Where this host's trainer ranks sit in the world (``astraflow node`` flags)."""

    ranks: int  #: ranks on this host (``trainer.ranks``)
    nnodes: int = 1  #: hosts in the group, each with its own agent
    node_rank: int = 0  #: this host's index; its ranks are node_rank*ranks .. +ranks-1
    master_addr: str = "127.0.0.1"  #: host 0's address, reachable from every host
    master_port: int = 0  #: host 0's rendezvous port; 0 picks a free one (one host only)

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise FlagError(f"trainer.ranks must be >= 1, got {self.ranks}")
        if self.nnodes < 1:
            raise FlagError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise FlagError(f"--node-rank must be between 0 and --nnodes - 1 ({self.nnodes - 1}), "
                            f"got {self.node_rank}")
        if not self.master_addr.strip():
            raise FlagError("--master-addr is empty; give host 0's address")
        if not 0 <= self.master_port <= 65535:
            raise FlagError(f"--master-port must be a TCP port (1-65535, or 0 for a free one "
                            f"with --nnodes 1), got {self.master_port}")
        if self.nnodes > 1 and self.master_port == 0:
            raise FlagError(f"--master-port is required with --nnodes {self.nnodes}: every host's "
                            f"agent meets host 0's at --master-addr:--master-port, so all must name the same port")

    @property
    def world_size(self) -> int:
        return self.ranks * self.nnodes

    @property
    def global_ranks(self) -> range:
        return range(self.node_rank * self.ranks, (self.node_rank + 1) * self.ranks)

    def flags(self) -> list[str]:
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--master-addr", self.master_addr, "--master-port", str(self.master_port)]


def is_rank_process() -> bool:
    """Started as a rank by torch's launcher (ours, ``torchrun`` or DeepSpeed's)."""
    return "LOCAL_RANK" in os.environ


def rank_in_group() -> int | None:
    """This process's global rank when it is one of a world larger than one; else None."""
    if not is_rank_process():
        return None
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ["RANK"]) if world > 1 else None
    except (KeyError, ValueError) as e:
        raise FlagError(f"a trainer rank needs integer RANK and WORLD_SIZE in its environment (LOCAL_RANK is "
                        f"{os.environ['LOCAL_RANK']!r}): {type(e).__name__}: {e}") from None
    return rank


def rank_node_id(node_id: str, rank: int) -> str:
    return f"{node_id}.rank{rank}"


def start_rank(node_id: str, rank: int) -> None:
    """What a rank does before its actors start: die with its agent, and the test hook."""
    agent_pid = int(os.environ.get(AGENT_PID_ENV) or os.getppid())
    threading.Thread(target=_watch_agent, args=(node_id, agent_pid), name="agent-watch", daemon=True).start()
    hook = os.environ.get(TEST_RANK_FATAL_ENV, "")
    target, _, cause = hook.partition(":")
    if hook and target.strip() == str(rank):
        raise FatalError(cause or f"{TEST_RANK_FATAL_ENV} failed rank {rank}")


def _watch_agent(node_id: str, agent_pid: int) -> None:
    while os.getppid() == agent_pid:
        time.sleep(AGENT_WATCH_S)
    print(f"astraflow node {node_id}: error: its group agent (pid {agent_pid}) is gone; the rank stops with it",
          file=sys.stderr, flush=True)
    os._exit(1)


def die_unless_stopped(signum: int) -> None:
    """From a rank's handler of ``signum`` (main thread): that signal's default action after
    :data:`RANK_STOP_GRACE_S`, so the agent sees the rank it stopped die of its signal."""
    signal.signal(signum, signal.SIG_DFL)
    timer = threading.Timer(RANK_STOP_GRACE_S, os.kill, args=(os.getpid(), signum))
    timer.daemon = True
    timer.start()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_agent(topo: Topology, rank_cmd: list[str], *, node_id: str, log_dir: str | Path, run_id: str) -> int:
    """Start this host's ranks (``rank_cmd``, an argv) and wait for the group; the exit status.

    Each rank's stdout and stderr are also kept whole under
    ``log_dir/<time>-<agent pid>/<run_id>_*/attempt_0/<local rank>/``.

    0 when every rank finished (or the agent was asked to stop), 1 when a rank failed or the
    rendezvous did, :data:`EXIT_FATAL` when a rank failed fatally. On failure the cause is
    the last line on stderr, ``astraflow node <node_id>: error|fatal: <cause>``.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if topo.master_port == 0:  # one host: nobody else needs to know the port
        topo = Topology(topo.ranks, topo.nnodes, topo.node_rank, topo.master_addr, free_port(topo.master_addr))
    log_dir = Path(log_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"  # this group's, not a restart's
    # The ranks' output reaches our own through files tailed line by line: keep both live.
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ[AGENT_PID_ENV] = str(os.getpid())  # the ranks inherit it (see start_rank)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    config = LaunchConfig(
        min_nodes=topo.nnodes, max_nodes=topo.nnodes, nproc_per_node=topo.ranks, run_id=run_id, role="trainer",
        rdzv_backend="static", rdzv_endpoint=f"{topo.master_addr}:{topo.master_port}",
        rdzv_configs={"rank": topo.node_rank, "timeout": RENDEZVOUS_TIMEOUT_S},
        # No restarts here: the launcher restarts the group (on every host), from the checkpoint.
        max_restarts=0, monitor_interval=0.2, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template="[rank${rank}]: ")
    log.info("starting ranks %s of a world of %d (rendezvous %s:%d, host %d of %d); rank logs under %s",
             list(topo.global_ranks), topo.world_size, topo.master_addr, topo.master_port, topo.node_rank,
             topo.nnodes, log_dir)
    try:
        elastic_launch(config, rank_cmd[0])(*rank_cmd[1:])
    except ChildFailedError as e:
        fatal, cause = group_failure(e.failures, log_dir)
        return _last_words(node_id, cause, fatal)
    except SignalException as e:
        log.info("received signal %s; the ranks were stopped", e.sigval)
        return 0
    except Exception as e:  # noqa: BLE001 - a failed rendezvous is worth a fresh try, and says why
        return _last_words(node_id, f"the group at {topo.master_addr}:{topo.master_port} did not start: "
                                    f"{type(e).__name__}: {e}", fatal=False)
    log.info("every rank finished")
    return 0


def group_failure(failures: dict, log_dir: Path) -> tuple[bool, str]:
    """(fatal?, cause) of a failed group from torch's ``{global rank: ProcessFailure}`` and
    the ranks' stderr files under ``log_dir`` (see :func:`run_agent`).

    A rank that exited :data:`EXIT_FATAL` decides, even when a peer's failure was seen
    first (its peers fail in their next collective once it is gone). Otherwise the likely
    first failure: torch lists the ranks it stopped itself (SIGTERM) as failures too, and a
    rank's death by a signal (SIGKILL, SIGSEGV) fails its peers' collectives, not the
    other way round.
    """
    ranks = sorted(failures)
    for r in ranks:
        f = failures[r]
        if f.exitcode == EXIT_FATAL:
            return True, last_words_cause(_last_line(log_dir, f.local_rank)) or f"trainer rank {r} failed fatally (see its log)"
    # Peers of a fatal rank may have failed before it exited: its log still says so.
    for stderr in sorted(Path(log_dir).glob("*/attempt_*/*/stderr.log")):
        line = _tail(stderr)
        if line.startswith("astraflow node ") and ": fatal: " in line:
            return True, last_words_cause(line)

    def first(r: int) -> tuple:
        code = failures[r].exitcode
        return (0 if code < 0 and code != -signal.SIGTERM else 1 if code > 0 else 2, failures[r].timestamp, r)

    r = min(ranks, key=first)
    f = failures[r]
    if f.exitcode < 0:
        how = f"was killed by {f.signal_name()}"
    else:
        line = _last_line(log_dir, f.local_rank)
        how = f"exited with code {f.exitcode}" + (f": {last_words_cause(line)}" if line else "")
    return False, f"trainer rank {r} (pid {f.pid}) {how}; the group's other ranks were stopped"


def _last_words(node_id: str, cause: str, fatal: bool) -> int:
    logging.disable(logging.CRITICAL)  # nothing may print after the cause: launchers read the last line
    sys.stdout.flush()
    print(f"astraflow node {node_id}: {'fatal' if fatal else 'error'}: {cause}", file=sys.stderr, flush=True)
    return EXIT_FATAL if fatal else 1


def _last_line(log_dir: Path, local_rank: int) -> str:
    return next((_tail(p) for p in Path(log_dir).glob(f"*/attempt_*/{local_rank}/stderr.log")), "")


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 8192))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def run_trainer_group(cfg, topo: Topology, *, bootstrap: str, run_dir: str, node_id: str,
                      overrides: list[str]) -> int:
    """``astraflow node --role trainer`` as its host's group agent (see the module docstring)."""
    from astraflow.checks import check_model
    from astraflow.topology.processes import node_command

    check_model(cfg)  # a bad path fails here once, not in every rank after the rendezvous
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=os.environ.get("ASTRAFLOW_LOG", "INFO"),
                        format=f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s")
    cmd = node_command("trainer", cfg, bootstrap, Path(run_dir), node_id, overrides) + topo.flags()
    return run_agent(topo, cmd, node_id=node_id, log_dir=Path(run_dir) / "logs" / f"{node_id}.ranks",
                     run_id=cfg.job)
