"""``astraflow run CONFIG`` and ``astraflow launch TOPOLOGY JOB``: one job from one machine,
each component its own OS process.

:func:`run_job` makes sure the model exists (built before the broker starts, so none sits
unwatched through a long build), starts the embedded broker (unless ``--bootstrap-servers``)
and the job's topics, then starts the dataflow, the trainer and the RaaS node(s)
as ``astraflow node`` processes that talk only through Kafka. It follows the ``metrics``
topic for the progress display (:mod:`astraflow.progress`) and the run's record
(:mod:`astraflow.run_outputs`), restarts a component process that dies unexpectedly (its
work is redelivered by Kafka; :func:`astraflow.topology.processes.supervise`), and when
training and the final evaluation are done stops everything and writes the run directory:
``summary.json``, ``metrics.jsonl``, ``metrics.csv``, ``plot.png``, ``logs/`` and
``traces/`` (and, as the job config's ``tracking`` asks, TensorBoard event files and an
MLflow run: :mod:`astraflow.tracking`). A component that exits with :data:`~astraflow.errors.EXIT_FATAL` (bad data,
bad config, missing model, episodes that keep failing deterministically) is not restarted:
the job stops at once and :class:`~astraflow.topology.processes.RunFailed` carries the
cause, the last line the component wrote; a component elsewhere that says so on ``control``
(a ``failed`` heartbeat) stops it the same way. The embedded broker is watched too: its
death stops the job, the broker log's path in the cause. SIGINT, SIGTERM and SIGHUP stop
everything as Ctrl-C does.

A policy with no signing key configured (and ``trainer.require_signatures``, the default)
gets the run's own Ed25519 pair in ``<run dir>/keys/`` before anything starts; every
component finds it through the run dir (:mod:`astraflow.actors.signing`).

Once the job has finished (and every ``audit.every_versions`` while it runs) the
conservation audit reads its topics (:mod:`astraflow.job_audit`); the verdict is the
summary's ``audit``, and a violation found while it runs stops the job
(:class:`~astraflow.job_audit.AuditFailed`).

:func:`launch` is the same run on a topology's deployment: the plan's processes instead of
the job config's, and the autoscaler beside them
(:class:`~astraflow.topology.launch.TopologyRun`).

It owns the loop and the broker's lifetime; how processes are started and supervised is
:mod:`astraflow.topology.processes`', what is shown, recorded and drawn is the modules
named above.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path

from astraflow.config import JobConfig
from astraflow.job_audit import PeriodicAudit, audit_summary, final_audit
from astraflow.progress import progress_bar, say, update_bar
from astraflow.run_outputs import RunState, record, write_outputs
from astraflow.topology.processes import Proc, RunFailed, node_command, stop_processes, supervise
from astraflow.tracking import open_sinks

#: the launcher's metrics/control feed: a fetch returns once this many bytes are there, or after the wait
FEED_FETCH_MIN_BYTES = 64 * 1024
FEED_FETCH_MAX_WAIT_MS = 250


def run_job(cfg: JobConfig, *, bootstrap: str | None = None, overrides: list[str] | None = None,
            run_dir: str | Path | None = None, progress: bool = True, max_restarts: int = 3,
            timeout_s: float | None = None, extension=None, dashboard: int | None = None) -> dict:
    """Run the job to completion; returns the summary (also written to the run directory).

    ``extension`` (``astraflow launch``'s :class:`~astraflow.topology.launch.TopologyRun`)
    replaces the job config's processes with its own (``processes``), runs beside them
    (``running``, a context entered once they have started), is ticked by this loop (``tick``:
    the one thread that owns the process list) and adds to the summary (``summary``). With the
    embedded broker, its ``broker_setup(broker)`` context is entered before the broker starts
    (it may add ``server.properties`` to ``broker.extra``, e.g. the listeners of emulated WAN
    links) and exited after the broker stops. ``dashboard``: serve the job's live dashboard on
    that port (0: a free one) while it runs; None: none."""
    from astraflow.actors.common import model_path
    from astraflow.topics import (Consumer, DeadLetters, EmbeddedBroker, Heartbeat, Metric, SnapshotRequest,
                                  TopicPartition, ensure_topics, job_topics)

    from astraflow.config import ConfigError, KafkaSecurityConfig, install_security
    secured = cfg.kafka.security.embedded
    if secured and (bootstrap is not None or extension is not None):
        raise ConfigError(cfg.source, "kafka.security.embedded", "secures the broker `astraflow run` starts itself; "
                          + ("with --bootstrap-servers give that cluster's protocol and principals in kafka.security"
                             if bootstrap is not None else "`astraflow launch` runs its broker plaintext (not yet "
                             "secured); use `astraflow broker start --secure` and --bootstrap-servers"))
    if bootstrap is None and not secured and cfg.kafka.security != KafkaSecurityConfig():
        raise ConfigError(cfg.source, "kafka.security", "a secured job runs on an existing cluster: set "
                                                        "kafka.bootstrap_servers (or --bootstrap-servers); for a "
                                                        "secured embedded broker set only kafka.security.embedded: "
                                                        "true")
    install_security(cfg, "admin")  # the launcher's own clients: topics, metrics, control
    overrides = list(overrides or [])
    run_dir = Path(run_dir or Path(cfg.run_dir) / f"{cfg.job}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    state = RunState(lead=cfg.lead_policy)
    started = time.time()
    from astraflow.checks import check_data, check_model
    # Bad data or a missing model fail here in seconds, before any process starts; the
    # components still stop fatally on their own (`astraflow node` runs without us too).
    for policy in cfg.policy_names:
        check_model(cfg.view(policy))
    check_data(cfg)
    keyed = _run_keys(cfg, run_dir, progress)  # what the audit checks signed groups with
    # The model first (a missing tiny model is built once, minutes on a small machine): no broker
    # sits idle meanwhile, and none can die unwatched before the job has started.
    from astraflow.models.target import model_warning
    warm_starts: dict[str, str] = {}  # policy -> the warning of a warm start that missed its target
    for policy in cfg.policy_names:
        path = model_path(cfg.view(policy))
        say(progress, f"model: {path}" if len(cfg.policy_names) == 1 else f"model of {policy}: {path}")
        if warning := model_warning(path):  # said even with --quiet: RL starts weaker than its recipe meant
            warm_starts[policy] = warning
            print(warning if len(cfg.policy_names) == 1 else f"{warning} (model of {policy})", file=sys.stderr,
                  flush=True)
    with contextlib.ExitStack() as stack:
        broker = None
        if bootstrap is None:
            say(progress, f"starting the embedded Kafka broker{' (secured)' if secured else ''} ...")
            run = None
            if secured:
                from astraflow.secured_run import SecuredRun
                run = SecuredRun.create(cfg, run_dir)
            broker = EmbeddedBroker(run_dir / "kafka", secure=run.setup if run else None,
                                    startup_timeout=180 if run else 90)
            if extension is not None:
                stack.enter_context(extension.broker_setup(broker))
            broker = stack.enter_context(_broker(broker))
            bootstrap = broker.bootstrap_servers
            # what `astraflow status --bootstrap-servers` and other Kafka clients reach it at
            say(progress, f"kafka: {bootstrap} (embedded; its log: {broker.log_path})")
            if run is not None:  # users and ACLs as the super user; from then on the launcher is `admin`
                from astraflow.topics import security
                security.install(run.setup.client_security())
                with _broker_watched(broker):
                    n = run.grant(bootstrap, cfg)
                cfg, keyed = run.job_config(cfg), run.job_config(keyed)
                overrides += run.overrides()
                install_security(cfg, "admin")
                say(progress, f"kafka: SASL_SSL ({run.setup.describe()['sasl_mechanism']}), {n} ACLs for "
                              f"{len(run.users)} principals; their password files in {run.setup.dir}")
        topics = job_topics(cfg)
        with _broker_watched(broker):
            ensure_topics(bootstrap, topics.specs())
            dead = DeadLetters.own(bootstrap, topics.dlq, "launcher")
            stack.callback(dead.close)
            # `metrics` from the start (the run's record); `control` from now on: a component
            # that stops on a fatal error says so there (status "failed"), wherever it runs
            feed = stack.enter_context(Consumer(
                bootstrap, partitions=[TopicPartition(topics.metrics, 0), TopicPartition(topics.control, 0)],
                client_id="launcher", dead_letters=dead,
                expect={topics.metrics: (Metric,), topics.control: (Heartbeat, SnapshotRequest)},
                # the components emit metrics all through a step: without these the broker answers
                # every few of them with a fetch of its own (~17 a second); a run's progress and a
                # component's failure may come a quarter of a second later instead
                fetch_min_bytes=FEED_FETCH_MIN_BYTES, fetch_max_wait_ms=FEED_FETCH_MAX_WAIT_MS))
            feed.seek_to_beginning(TopicPartition(topics.metrics, 0))
            feed.seek_to_end(TopicPartition(topics.control, 0))
        if dashboard is not None:
            from astraflow.dashboard import Dashboard, alive_window, plan_regions
            plan = getattr(extension, "plan", None)  # `astraflow launch`: nodes grouped by their pools' regions
            dash = stack.enter_context(Dashboard(bootstrap, cfg.job, port=dashboard, policies=tuple(cfg.policy_names),
                                                 alive_s=alive_window(cfg.rollout.heartbeat_s),
                                                 regions=plan_regions(plan) if plan is not None else None))
            print(f"dashboard: {dash.url}", flush=True)  # (also under --quiet: it is what the flag asked for)
        tracked = stack.enter_context(open_sinks(cfg.tracking, run_dir, cfg.job))  # TensorBoard / MLflow, if asked
        for line in tracked.where():
            say(progress, line)
        if extension is not None:
            procs = extension.processes(bootstrap, run_dir)
        else:
            procs = default_processes(cfg, run_dir)
        for p in procs:
            p.cmd = p.cmd or node_command(p.role, cfg.view(p.policy) if p.policy else cfg, bootstrap, run_dir,
                                          p.node_id, overrides)
            p.start()
        stack.callback(stop_processes, procs)
        if extension is not None:
            stack.enter_context(extension.running(bootstrap, run_dir, procs))
        bar = progress_bar(cfg, progress)
        stop = {"now": False}
        # Ctrl-C, the SIGTERM systemd, CI runners and `kill` send, and the SIGHUP of a closed
        # terminal: each stops every component (the exit stack below) instead of leaving them
        # re-parented to PID 1.
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # under nohup: a closed terminal is meant to leave the run going
            previous = signal.signal(sig, lambda *_: stop.update(now=True))
            stack.callback(signal.signal, sig, previous)
        say(progress, f"run dir: {run_dir}  (logs in {run_dir / 'logs'})")
        interrupted, error = False, None
        auditor = PeriodicAudit(bootstrap, keyed)
        while True:
            failed = None
            for d in feed.poll(500):
                record(state, d.message)
                tracked.write(d.message)
                failed = failed or _failure_reported(d.message, procs)
            update_bar(bar, state, started)
            error = broker_failure(broker) or failed \
                or (extension.tick(procs) if extension is not None else None) or supervise(procs, max_restarts,
                                                                                            progress) \
                or auditor.tick(state.trained)
            finished = all(p.done for p in procs if p.role in ("trainer", "dataflow"))
            if finished or error:
                break
            if stop["now"]:
                interrupted = True
                break
            if timeout_s and time.time() - started > timeout_s:
                error = RunFailed(f"run exceeded its {timeout_s:.0f}s timeout")
                break
        # what the components wrote last (a fetch waits up to FEED_FETCH_MAX_WAIT_MS for bytes):
        # read until a poll comes back empty, for at most a few seconds (RaaS nodes still running write on)
        drain_until = time.monotonic() + 3.0
        while True:
            batch = feed.poll(2 * FEED_FETCH_MAX_WAIT_MS)
            for d in batch:
                record(state, d.message)
                tracked.write(d.message)
            if not batch or time.monotonic() > drain_until:
                break
        if bar is not None:
            update_bar(bar, state, started)
            bar.close()
        if not (interrupted or error):
            error = auditor.finish()  # the running job's audit in flight: a violation it found fails the run
        verdict = None
        error = error or (broker_failure(broker) if not interrupted else None)
        if not (interrupted or error):  # finished: the broker is still up, the trainer and dataflow are done
            say(progress, "auditing the job's topics (conservation) ...")
            verdict = final_audit(bootstrap, keyed, state.trained)
        audit = audit_summary(verdict, auditor.verdicts,
                              None if verdict else "interrupted" if interrupted else "the job did not finish")
    summary = write_outputs(run_dir, cfg, state, started, procs, interrupted, str(error) if error else None,
                            {"audit": audit, "warm_start_warnings": warm_starts,
                             **(extension.summary() if extension is not None else {})})
    if error:
        raise error
    return summary


def _run_keys(cfg: JobConfig, run_dir: Path, progress: bool) -> JobConfig:
    """Make the run's signing keys before any process starts (each finds them by the run dir);
    returns ``cfg`` with them."""
    from astraflow.actors.signing import run_key_paths, with_run_keys
    from astraflow.weights.signing import key_id, load_public_key
    keyed = with_run_keys(cfg, run_dir)
    for policy in cfg.policy_names:
        private, public = run_key_paths(run_dir, policy)
        if keyed.view(policy).trainer.verify_key == str(public.resolve()):
            say(progress, f"signing key of {policy}: {private} (key {key_id(load_public_key(public))}, generated "
                          "for this run: trainer.signing_key)")
    return keyed


def default_processes(cfg: JobConfig, run_dir: Path) -> list[Proc]:
    """One dataflow; per policy a trainer and ``rollout.nodes`` RaaS nodes (one policy: the
    names ``trainer``, ``raas-<i>``; several: ``trainer-<p>``, ``raas-<p>-<i>``), no nodes for a
    policy whose rows another policy's pool serves (``rollout.pool``) and no trainer for one
    another policy's trainer process trains (``trainer.process``)."""
    procs = [Proc("dataflow", "dataflow", [], run_dir / "logs" / "dataflow.log")]
    multi = len(cfg.policy_names) > 1
    for policy in cfg.policy_names:
        view, tag = cfg.view(policy), f"-{policy}" if multi else ""
        if cfg.trainer_policies(policy):
            procs.append(Proc("trainer", f"trainer{tag}", [], run_dir / "logs" / f"trainer{tag}.log",
                              policy=policy if multi else ""))
        procs += [Proc("raas", f"raas{tag}-{i}", [], run_dir / "logs" / f"raas{tag}-{i}.log", policy=policy if multi else "")
                  for i in range(view.rollout.nodes if cfg.pool_policies(policy) else 0)]
    return procs


#: The signals that stop a run (and its components) as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def broker_failure(broker) -> RunFailed | None:
    """The embedded broker's death as the cause that stops the run (its log's path last); None
    while it runs, or when the job uses a cluster of its own (``broker`` None)."""
    code = broker.exit_code() if broker is not None else None
    if code is None:
        return None
    return RunFailed(f"the embedded Kafka broker (pid {broker.pid}) exited with code {code}; its log: "
                     f"{broker.log_path}", node_id="kafka", log_path=broker.log_path)


@contextlib.contextmanager
def _broker_watched(broker):
    """Kafka client calls the embedded broker's death would fail (or hang on for a minute) raise
    that death instead: checked first, and again when a call fails."""
    failure = broker_failure(broker)
    if failure is not None:
        raise failure
    try:
        yield
    except Exception:
        if broker is not None:
            deadline = time.monotonic() + 5  # a client can notice a dying broker before its process is gone
            while broker.exit_code() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        failure = broker_failure(broker)
        if failure is not None:
            raise failure from None
        raise


def _failure_reported(message, procs: list[Proc]) -> RunFailed | None:
    """A component's ``failed`` heartbeat on ``control``: the fatal error it stops on."""
    from astraflow.topics import Heartbeat
    if not (isinstance(message, Heartbeat) and message.status == "failed"):
        return None
    log_path = next((p.log_path for p in procs if p.node_id == message.node_id), None)
    return RunFailed(message.error or "stopped on a fatal error (see its log)", node_id=message.node_id,
                     log_path=log_path, retriable=False)


@contextlib.contextmanager
def _broker(broker):
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def launch(topology: str | Path, cfg: JobConfig, *, overrides: list[str] | None = None,
           run_dir: str | Path | None = None, bootstrap: str | None = None, progress: bool = True,
           timeout_s: float | None = None, dashboard: int | None = None, backend: str = "local") -> dict:
    """``astraflow launch``: run the job ``cfg`` (loaded with ``overrides``, which its nodes get
    too) on the deployment ``topology`` describes, every node a process of this machine
    (``backend`` ``slurm``: a Slurm job, :mod:`astraflow.topology.slurm`); ``dashboard`` as
    :func:`run_job`'s (with the nodes grouped by region)."""
    from astraflow.topology.launch import TopologyRun, load_plan
    from astraflow.topology.plan import check_launchable, format_plan, without_emulation
    overrides = list(overrides or [])
    plan = load_plan(topology, cfg)
    check_launchable(plan)
    cluster = plan.home
    bootstrap = bootstrap or cfg.kafka.bootstrap_servers or (None if cluster.embedded else cluster.name)
    if bootstrap is not None:
        without_emulation(plan, bootstrap)
    if progress:
        print(format_plan(plan), flush=True)
    return run_job(cfg, bootstrap=bootstrap, overrides=overrides, run_dir=run_dir, progress=progress,
                   timeout_s=timeout_s, extension=TopologyRun(plan, cfg, overrides, backend), dashboard=dashboard)
