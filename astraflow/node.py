"""One component process: ``astraflow node --role dataflow|raas|trainer``.

Sets the process's thread budget, installs tracing (and a test's fault points, when its
environment asks for them: :mod:`astraflow.chaos.hooks`), and runs the role's actors under a
supervisor until they finish, the process is asked to stop (SIGTERM, SIGHUP, Ctrl-C; or its
launcher died: :func:`~astraflow.topology.processes.watch_launcher`, started by the CLI), or the
supervisor gives up on an actor — then it exits non-zero with the reason as its last
stderr line: 1 after retriable failures used up the restarts (a fresh process may fare
better), :data:`~astraflow.errors.EXIT_FATAL` after a fatal one (bad data, bad config,
missing model: do not restart). Components reach each other only through Kafka, so the
same command runs on any host. A trainer started as one rank of a larger world (by its
host's group agent, :mod:`astraflow.trainer_group`) is ``<node id>.rank<R>`` and never
restarts an actor in-process: its failure ends the process, and with it the group.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from astraflow.config import JobConfig
from astraflow.errors import EXIT_FATAL
from astraflow.trainer_group import die_unless_stopped, rank_in_group, rank_node_id, start_rank

ROLES = ("dataflow", "raas", "trainer")
log = logging.getLogger("astraflow.node")


def child_specs(role: str, cfg: JobConfig, bootstrap: str, run_dir: str, node_id: str):
    from astraflow.actors.supervisor import ChildSpec

    if role == "dataflow":
        from astraflow.actors.dataflow import DataflowActor
        from astraflow.actors.evaluator import EvaluatorActor
        return [ChildSpec("dataflow", lambda sup, name: DataflowActor.start(sup, name, cfg, bootstrap),
                          required=False),
                ChildSpec("evaluator", lambda sup, name: EvaluatorActor.start(sup, name, cfg.view(cfg.lead_policy),
                                                                              bootstrap),
                          required=True)]
    if role == "raas":
        from astraflow.actors.rollout import RolloutActor
        return [ChildSpec(node_id, lambda sup, name: RolloutActor.start(sup, name, cfg, bootstrap, node_id, run_dir),
                          required=False)]
    if role == "trainer":
        from astraflow.actors.trainer import TrainerActor
        # the policies this process trains (trainer.process: LoRA adapters of one base, whose
        # engines share the base's tensors in this process), each an actor of its own
        policies = cfg.trainer_policies(cfg.policy) or (cfg.policy,)
        return [ChildSpec("trainer" if p == cfg.policy else f"trainer.{p}",
                          lambda sup, name, view=cfg.view(p): TrainerActor.start(sup, name, view, bootstrap, run_dir))
                for p in policies]
    raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")


def threads_for(role: str, cfg: JobConfig) -> int:
    return {"raas": cfg.rollout.engine.threads, "trainer": cfg.trainer.engine.threads, "dataflow": cfg.eval.threads}[role]


def run_node(role: str, cfg: JobConfig, bootstrap: str, run_dir: str, node_id: str | None = None) -> int:
    from astraflow.checks import check_model
    from astraflow.config import install_security
    kafka_security = install_security(cfg, role)  # every Kafka client here logs in as the role's principal
    check_model(cfg)  # every role loads the model; a bad path is fatal, not worth restarts
    node_id = node_id or f"{role}-{os.getpid()}"
    rank = rank_in_group() if role == "trainer" else None
    if rank is not None:
        node_id = rank_node_id(node_id, rank)
        start_rank(node_id, rank)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    from astraflow.actors.signing import with_run_keys
    cfg = with_run_keys(cfg, run_dir)  # no key configured: the run's own pair, shared through its run dir
    logging.basicConfig(level=os.environ.get("ASTRAFLOW_LOG", "INFO"),
                        format=f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s")
    for noisy in ("urllib3", "deepspeed", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # kafka-python warns about slow selector tasks on a busy 2-core box; errors still show.
    logging.getLogger("kafka").setLevel(os.environ.get("ASTRAFLOW_KAFKA_LOG", "ERROR"))
    log.info("kafka clients: %s", kafka_security.describe())  # which principal (never a password)
    # Group membership changes are rare and what a stuck consumer is diagnosed from.
    logging.getLogger("kafka.coordinator").setLevel(os.environ.get("ASTRAFLOW_KAFKA_LOG", "INFO"))
    n = threads_for(role, cfg)
    if n > 0:
        # Before anything imports torch here: OpenMP sizes its pool from it. torch itself is
        # imported, and its thread count set, by the actor that computes (`set_threads` in its
        # setup), on that actor's thread and so at that thread's niceness (the evaluator's).
        os.environ["OMP_NUM_THREADS"] = str(n)

    from astraflow.actors.supervisor import Outcome, run_supervised
    from astraflow.actors.telemetry import setup_tracing
    from astraflow.chaos.hooks import install_from_env
    for point in install_from_env():  # a test's fault at a named moment (nothing in a production run)
        log.warning("test fault installed at %s", point)
    provider = setup_tracing(node_id, run_dir, cfg.tracing.otlp_endpoint, cfg.tracing.otlp_protocol)
    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("received signal %d, stopping", signum)
        stop.set()
        if rank is not None:
            die_unless_stopped(signum)

    # `kill -USR1 <pid>` writes every thread's stack to the node's log (stderr): what a stalled
    # node is blocked in, without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # (SIGHUP: its terminal closed)
        if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:  # (nohup: keep going)
            signal.signal(sig, on_signal)
    outcome = Outcome()
    # A rank cannot re-enter its process group: a failed actor ends the process, and the
    # group's agent stops the other ranks so the group restarts as one.
    restarts = {"max_restarts": 0} if rank is not None else {}
    try:
        fatal = run_supervised(child_specs(role, cfg, bootstrap, run_dir, node_id), stop, outcome, **restarts)
    finally:
        provider.shutdown()
    if fatal:
        logging.disable(logging.CRITICAL)  # nothing may print after the cause: launchers read the last line
        print(f"astraflow node {node_id}: {'error' if outcome.retriable else 'fatal'}: {fatal}",
              file=sys.stderr, flush=True)
        return 1 if outcome.retriable else EXIT_FATAL
    return 0
