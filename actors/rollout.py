"""The RaaS node actor: consume tasks, roll them out, produce trajectory groups.

A member of consumer group ``raas.<policy>`` on ``tasks.<policy>``. One loop: each step
loads newer weights (:mod:`.engine_weights`, the one place they reach the engine: between
engine calls, never during one), serves other pools, commits the polls that finished and
starts the next poll when there is room (:mod:`.polls`: up to ``rollout.polls_in_flight``
roll out at once, each on a thread of its own; 1 is the same pipeline with depth 1). A poll
waits for at least the version its tasks were scheduled at (the sync schedule relies on
this), runs the workflow, and its trajectory groups are written *and* its task offsets
committed in one Kafka transaction, under the group membership the tasks were handed out
in: a node that dies mid-rollout commits nothing, and the group protocol redelivers its
tasks to the others. A node asked to stop finishes and commits its polls in flight first.
Heartbeats go to ``control``.

Episodes that keep failing deterministically (``rollout.max_episode_failures`` in a row,
none succeeding: a workflow or reward that raises on its input) stop the node with a fatal
error before it commits the poll that crossed the bound, so those tasks stay uncommitted;
its last heartbeat (status ``failed``) carries the cause, so a launcher that does not own
the process stops the job too.

A task is an episode of its workflow (:mod:`.episodes`): the one-role ``rlvr`` of a
single-policy job, or a multi-role one whose roles other policies' pools may play. In a
multi-policy job every node also serves its policy's ``generate.<policy>`` requests
(:mod:`.generation`) in every step, while its own episodes roll out too; an
episode is committed with every role's group in the one transaction, or not at all.
"""

from __future__ import annotations

import logging
import os
import time

from opentelemetry import trace

from astraflow.config import JobConfig
from astraflow.engines.base import SamplingParams, prompt_rows
from astraflow.engines.gate import EngineGate
from astraflow.errors import FatalError
from astraflow.topics import (Consumer, DeadLetters, Heartbeat, Producer, SnapshotRequest, StaleMembershipError, Task,
                              TrajectoryGroup, job_topics)
from astraflow.topics.membership import MembershipWatch
from astraflow.weights import WeightSubscriber
from astraflow.workflows.http_pool import server_counts

from . import fault_points
from .common import base_model, close_quietly, configure_sandbox, make_pool_engines, model_path, set_threads
from .engine_weights import EngineWeights
from .episodes import CALL_WAIT_S, EpisodeRunner, EpisodesFailing
from .generation import REPLY_TIMEOUT_S, GenerationClient, GenerationServer
from .polls import Poll, PollsInFlight
from .signing import group_signer_for, verifier_for
from .supervisor import LoopActor
from .telemetry import MetricsEmitter

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

WEIGHT_WAIT_LIMIT_S = 600.0
#: A task consumer that is not a stable member this long makes the node ask the broker
#: whether it is in its group (far above a rebalance here: session timeout 10 s, joins take
#: seconds); so does one that handed out nothing for CONSUMER_IDLE_PROBE_S.
CONSUMER_REJOIN_S = 45.0
CONSUMER_IDLE_PROBE_S = 30.0
TASK_SESSION_TIMEOUT_MS = 10_000
SNAPSHOT_REQUEST_INTERVAL_S = 10.0


class RolloutActor(LoopActor):
    """One RaaS node of a policy."""

    def __init__(self, supervisor, name: str, cfg: JobConfig, bootstrap: str, node_id: str,
                 run_dir: str | None = None) -> None:
        super().__init__(supervisor, name)
        self.cfg, self.bootstrap, self.node_id = cfg, bootstrap, node_id
        self.run_dir = run_dir  #: where devices shared with the policy's trainer are met (device.share)
        self.topics = job_topics(cfg)
        self._last_hb = 0.0
        self._tokens = 0
        self._busy_s = 0.0
        self._serve_busy_s = 0.0  # serving other policies' episodes outside a rollout of its own, not yet reported
        self._fenced = 0  # tasks whose results were dropped because the node lost its group membership
        self._started = time.monotonic()
        self._last_snapshot_request: dict[str, float] = {}  #: policy -> when this node last asked for a snapshot
        self.engine = self.consumer = self.producer = self.plain = self.weights = None
        self.client = self.server = self.runner = self.watch = None
        self._polls: PollsInFlight | None = None  #: the polls rolling out, oldest first
        self.multi = len(cfg.policy_names) > 1

    def setup(self) -> None:
        from transformers import AutoTokenizer  # (with torch: ~2 s that what reads this module's constants skips)

        if not self.cfg.pool_policies(self.cfg.policy):
            raise FatalError(f"policy {self.cfg.policy!r} runs no RaaS node of its own: its rows are served by "
                             f"{self.cfg.pool_of(self.cfg.policy)!r}'s pool (policies.{self.cfg.policy}.rollout.pool)")
        set_threads(self.cfg.rollout.engine.threads)
        configure_sandbox(self.cfg)
        path = model_path(self.cfg)
        #: policy -> engine of every policy whose rows this node serves (a shared pool: several adapters)
        self.engines = make_pool_engines(self.cfg, path, name=self.node_id, run_dir=self.run_dir)
        self.engine = self.engines[self.cfg.policy]
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.engine_lock = EngineGate(self.engine)  # shared by calls when the engine batches them itself
        self.plain = Producer(self.bootstrap, client_id=self.node_id)
        self.metrics = MetricsEmitter(self.plain, self.topics.metrics, self.node_id)
        dead = DeadLetters(self.plain, self.topics.dlq, self.node_id, recall=self.bootstrap)
        # A region with its own cluster: versions and weights come from there (MirrorMaker 2
        # copies them from home once per region); everything else stays on the home cluster.
        self.weights_bootstrap = self.cfg.rollout.weights_bootstrap_servers or self.bootstrap
        self._weights_loaded = -1
        self._weights_loads = 0
        self._env_counts: dict[str, dict[str, int]] = {}  # per environment server, as last reported
        subscriber, *others = [self._subscriber(p, engine, path, dead) for p, engine in self.engines.items()]
        self.weights = EngineWeights(subscriber, self.engine, self.engine_lock, self.node_id,
                                     others=list(zip(others, list(self.engines.values())[1:])))
        if self.cfg.rollout.partial:  # rows in flight go on under each new version (engines/cpu.py)
            self.engine.set_weight_refresh(self.weights.refresh_mid_call, self.cfg.rollout.max_versions_per_trajectory)
        self._partial_rows = 0
        stretch = self._emulation_stretch()
        if self.multi:
            self.client = GenerationClient(self.bootstrap, self.topics, self.node_id, dead_letters=dead,
                                           producer=self.plain, timeout_s=REPLY_TIMEOUT_S * stretch)
            self.server = GenerationServer(self.bootstrap, self.topics, self.cfg.policy, self.node_id,
                                           self._serve_rows, self._sampling_params, dead_letters=dead,
                                           producer=self.plain, concurrent=self.engine_lock.concurrent,
                                           devices=self.cfg.rollout.device.count)
        self.runner = EpisodeRunner(self.cfg.policy, self.node_id, self.engine, self.tokenizer, self.cfg.seed,
                                    engine_lock=self.engine_lock, before_call=self.weights.apply,
                                    client=self.client, batch_invariant=self.cfg.rollout.batch_invariant,
                                    tracer=tracer, sampling_of=self._sampling_of, call_wait_s=CALL_WAIT_S * stretch,
                                    engines=self.engines, max_versions=self.cfg.rollout.max_versions_per_trajectory)
        # The pool's identity on every group it writes: the dataflow counts no other (actors/signing.py).
        self.group_signer = group_signer_for(self.cfg)
        self.producer = Producer(self.bootstrap, client_id=self.node_id,
                                 transactional_id=self.topics.rollout_transactional_id(self.cfg.policy, self.node_id),
                                 transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)
        self.consumer = self._task_consumer()
        self.watch = MembershipWatch(self.bootstrap, self.node_id, unsettled_s=CONSUMER_REJOIN_S,
                                     idle_s=CONSUMER_IDLE_PROBE_S)
        for sub in (subscriber, *others):
            sub.start()
        self._polls = PollsInFlight(self.cfg.rollout.polls_in_flight, self.runner.roll_out, self.node_id)
        self._heartbeat(force=True)

    def _subscriber(self, policy: str, engine, path, dead) -> WeightSubscriber:
        """The subscriber that follows ``policy``'s versions into ``engine`` (its adapter, on a shared pool)."""
        view = self.cfg.view(policy) if self.multi else self.cfg
        return WeightSubscriber(self.weights_bootstrap, self.topics, policy,
                                initial=None, initial_version=engine.version, node_id=self.node_id,
                                on_fault=lambda report, held: self._request_snapshot(report, held, policy),
                                prefetch=self.cfg.rollout.prefetch_weights, verifier=verifier_for(view),
                                dead_letters=dead, security_setting=self._weights_security(),
                                base_model=base_model(view, path),
                                on_reject=lambda r: self.metrics.emit(
                                    "raas.versions_rejected", 1, step=engine.version, reason=r.reason, epoch=r.epoch,
                                    version=r.version, policy=policy))

    def _emulation_stretch(self) -> float:
        """The bounds on waiting for device work (a role call's reply, a call's wait for the
        others) are device seconds; on emulated devices held ``dilation`` wall seconds per
        modelled one they stretch by the job's largest rollout dilation above 1."""
        views = [self.cfg.view(p) for p in self.cfg.policy_names] if self.multi else [self.cfg]
        return max([1.0, *(v.rollout.device.dilation for v in views if v.rollout.device.emulated)])

    def _task_consumer(self) -> Consumer:
        return Consumer(
            self.bootstrap, topics=[self.topics.tasks(self.cfg.policy)], group_id=self.topics.rollout_group(self.cfg.policy),
            client_id=self.node_id, dead_letters=DeadLetters(self.plain, self.topics.dlq, self.node_id,
                                                              recall=self.bootstrap),
            max_poll_records=self.cfg.rollout.tasks_per_call, session_timeout_ms=TASK_SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=TASK_SESSION_TIMEOUT_MS // 5, max_poll_interval_ms=int(WEIGHT_WAIT_LIMIT_S * 1000) + 60_000,
            sticky=True, expect=(Task,), redo_lost=True)

    def _rejoin_if_stuck(self) -> None:
        """Recreate the task consumer when the broker says it is not in its group.

        Seen in CI: a node's task consumer that never joined (the broker had no such group)
        while the node kept polling and the client reported a generation, so the node sat
        idle with tasks waiting. :class:`MembershipWatch` asks the broker when the consumer
        has been unsettled or idle too long. The loop asks only with no poll in flight, so a
        fresh consumer loses nothing: it resumes from the committed offsets, like a
        restarted node.
        """
        consumer = self.watch.renew(self.consumer, self._task_consumer)
        if consumer is not self.consumer:
            self.consumer = consumer
            self.metrics.emit_many({"raas.consumer_rejoins": self.watch.renewals}, step=self.engine.version)

    # -- the loop ----------------------------------------------------------------------
    def step(self) -> None:
        """One turn of the node's loop: load newer weights beside the polls in flight, serve
        other pools, commit the polls that finished (in the order they were polled: a poll's
        offsets only after every earlier poll's), and start a poll when there is room. The
        episodes of each poll run on a thread of their own (the engine batches their calls);
        everything Kafka stays on this thread. ``rollout.polls_in_flight`` is the depth: at 1
        the next poll starts once the last one is committed."""
        if not self._polls:
            self._rejoin_if_stuck()  # nothing in flight: a fresh consumer loses nothing
        self.weights.load_beside()
        answered = self._serve()
        self._commit_finished_polls()
        self._start_held()
        room = self._polls.room()
        # At the limit the task partitions are paused, not left unpolled: the poll keeps the
        # consumer's group membership current (a rebalance it sat out would fence every poll).
        self.consumer.hold(not room)
        # A node that just answered role calls looks for tasks without waiting: more calls are
        # likely queued, and a pool that mostly serves (the verifier's) would idle here each time.
        deliveries = self.consumer.poll(0 if answered or self._polls else 50 if self.multi else 500)
        if deliveries:  # (at the limit only from a partition assigned since the pause: taken all the same)
            if self._polls.held is not None:  # (a partition assigned while a poll waits: it waits with it)
                self._polls.held = [*self._polls.held, *deliveries]
            elif self._polls and max(d.message.scheduled_version for d in deliveries) > self.engine.version:
                self._polls.held = deliveries  # never block on a version while polls are in flight
            else:
                self._start_poll(deliveries)
        elif not self._polls and self.consumer.pending_offsets():  # only dead-lettered records: move past them
            try:
                self.consumer.commit()
            except StaleMembershipError as e:
                # Rebalanced since the poll: the partition's owner is handed those records
                # again and dead-letters them itself; nothing of ours to keep.
                log.warning("%s: %s", self.node_id, e)
        if not room and self.server is None:  # (serving, it waited for role calls above)
            self._polls.wait(0.01)
        self._heartbeat()

    def _serve(self) -> int:
        """Answer other pools' role calls (a multi-policy job); how many were answered."""
        if self.server is None:
            return 0
        before = self.server.busy_s
        answered = self.server.serve(20 if self._polls else 50)
        if not self._polls:  # serving during its own polls is inside their raas.busy_s
            self._serve_busy_s += self.server.busy_s - before
        return answered

    def _start_held(self) -> None:
        """A poll waiting for weights it was scheduled at: those need the polls in flight to be
        committed and trained first, so it starts once they are loaded, or, with nothing in
        flight, waits for them (:meth:`_start_poll`)."""
        held = self._polls.held
        if held is not None and (not self._polls or
                                 self.engine.version >= max(d.message.scheduled_version for d in held)):
            self._polls.held = None
            self._start_poll(held)

    def _start_poll(self, deliveries) -> None:
        self.watch.saw_records()
        tasks: list[Task] = [d.message for d in deliveries]
        offsets = self.consumer.pending_offsets()  # everything handed out so far: committed with this poll
        try:  # the membership these were handed out in: the poll commits under it or not at all
            membership = self.consumer.membership_for(offsets)
        except StaleMembershipError as e:
            log.warning("%s: %s", self.node_id, e)  # handed out across a rebalance: redone from the committed offset
            return
        try:  # (nothing is in flight when this waits: a poll ahead of the engine is held until then)
            self.weights.wait_for(max(t.scheduled_version for t in tasks), WEIGHT_WAIT_LIMIT_S, self._heartbeat)
        except TimeoutError as e:
            self._answer_failed(tasks, str(e), offsets, membership)
            raise
        spans = [tracer.start_span("raas.rollout", context=d.trace_context,
                                   attributes={"task.id": d.message.task_id, "node.id": self.node_id,
                                               "policy.version": self.engine.version})
                 for d in deliveries]
        self._polls.start(tasks, spans, offsets, membership)
        self.metrics.emit_many({"raas.polls_in_flight": len(self._polls)}, step=self.engine.version,
                               node=self.node_id, policy=self.cfg.policy)

    def _commit_finished_polls(self) -> None:
        """Commit the polls that finished, oldest first, each under the membership it was
        handed out in: one handed out before a rebalance is fenced (dropped; redone from the
        committed offset), one handed out after it commits."""
        for poll in self._polls.finished():
            per_task = poll.future.result()  # a rollout that raised fails the step
            self._check_failures()
            try:
                self._commit(per_task, poll)
            except StaleMembershipError as e:
                self._fenced_poll(e, poll)
                continue
            self._report(poll, per_task, self._polls.lap())

    def _finish_polls(self) -> None:
        """Asked to stop: finish and commit the polls in flight (a retired node finishes its
        in-flight tasks before it leaves the group), serving other pools meanwhile."""
        while self._polls:
            if self.server is not None:
                self._serve()
            else:
                self._polls.wait(0.05)
            self._commit_finished_polls()
            self._heartbeat()
        self._heartbeat(force=True)  # the device's totals and no task in flight, before "stopping"

    def _send_group(self, g: TrajectoryGroup) -> None:
        self.producer.send(self.topics.trajectories, g, key=g.task_id,
                           sign=self.group_signer.headers if self.group_signer is not None else None)

    def _commit(self, per_task: list[list[TrajectoryGroup]], poll: Poll) -> None:
        """A poll's groups and its task offsets in one transaction, under the membership its
        tasks were handed out in."""
        with self.producer.transaction():
            for gs, span in zip(per_task, poll.spans):
                with trace.use_span(span):  # the record carries this rollout's trace context
                    for g in gs:
                        self._send_group(g)
            fault_points.reach(fault_points.IN_TRANSACTION, self.node_id)
            self.producer.send_offsets(self.consumer, poll.offsets, membership=poll.membership)

    def _check_failures(self) -> None:
        """Too many deterministic episode failures in a row: say so on ``control``, then stop fatally."""
        try:
            self.runner.failures.check(self.cfg.rollout.max_episode_failures)
        except EpisodesFailing as e:
            try:
                self.plain.send(self.topics.control,
                                Heartbeat(self.node_id, "raas", self.cfg.policy, self.engine.version,
                                          ts=time.time(), status="failed", error=str(e)), key=self.node_id, trace=False)
                self.plain.flush(timeout=10)
            except Exception:  # noqa: BLE001 - the process's exit status says it too
                log.warning("%s: could not report the failure on control", self.node_id, exc_info=True)
            raise

    def _fenced_poll(self, e: Exception, poll: Poll) -> None:
        # Fell out of the group while rolling out (a broker restart, a long pause): the
        # partition's new owner redoes these tasks; ours were aborted with the transaction.
        log.warning("%s: %s", self.node_id, e)
        self._fenced += len(poll.tasks)
        self.metrics.emit_many({"raas.fenced_tasks": self._fenced}, step=self.engine.version,
                               node=self.node_id, policy=self.cfg.policy)
        for span in poll.spans:
            span.set_attribute("raas.fenced", True)
            span.end()

    def _report(self, poll: Poll, per_task, busy: float) -> None:
        groups = [g for gs in per_task for g in gs]
        for span in poll.spans:
            span.end()
        self._busy_s += busy
        n_tokens = sum(len(s.tokens) for g in groups for s in g.samples)
        self._tokens += n_tokens
        # raas.tokens counts a multi-turn trajectory's context too; generated_tokens only what
        # the episode's roles wrote (each token once: in its writer's group, where it is trained)
        values = {"raas.tasks": len(poll.tasks), "raas.tokens": n_tokens, "raas.busy_s": busy,
                  "raas.generated_tokens": sum(s.trained() for g in groups for s in g.samples),
                  "raas.reward": _mean([s.reward for g in groups for s in g.samples])}
        team = [m["team_reward"] for m in poll.metrics if "team_reward" in m]
        if self.multi and team:
            values["raas.team_reward"] = _mean(team)
            for key in sorted({k for m in poll.metrics for k in m} - {"team_reward"}):
                values[f"raas.episode.{key}"] = _mean([m[key] for m in poll.metrics if key in m])
        if self.client is not None and self.client.calls:
            values["raas.remote_wait_s_per_call"] = self.client.wait_s / self.client.calls
        if self.server is not None and self.server.fenced:
            values["raas.gen_fenced_requests"] = self.server.fenced
        self.metrics.emit_many(values, step=self.engine.version, node=self.node_id, policy=self.cfg.policy)
        self._heartbeat()

    def _serve_rows(self, prompts, params, seeds):
        self.weights.load(wait=False)  # new weights only while no call is in flight
        with self.engine_lock.call():
            return self.engine.generate(prompt_rows(prompts), params, seeds=list(seeds))

    def _sampling_params(self, sampling: dict) -> SamplingParams:
        return SamplingParams.from_mapping(sampling, stop_token_ids=(self.tokenizer.eos_token_id,))

    def _sampling_of(self, policy: str, task: Task) -> dict:
        """A role's sampling settings: its own policy's rollout section (the task's for one policy)."""
        if not self.multi or policy == task.policy:
            return task.sampling
        r = self.cfg.view(policy).rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_new_tokens}

    def _answer_failed(self, tasks: list[Task], error: str, offsets: dict, membership) -> None:
        """Commit a failure record for each of ``tasks`` before the node restarts over a version
        that never came: a task scheduled at a version no trainer announces (a forged one)
        is answered once, not waited for again by every restart of every node it reaches.
        The dataflow drops failed groups and schedules replacements for them."""
        try:
            with self.producer.transaction():
                for task in tasks:
                    for g in self.runner.failed_groups(task, error):
                        self._send_group(g)
                self.producer.send_offsets(self.consumer, offsets, membership=membership)
        except Exception:  # noqa: BLE001 - the wait's error is the one to report; the tasks are redelivered
            log.warning("%s: could not answer %d task(s) as failed", self.node_id, len(tasks), exc_info=True)

    def _request_snapshot(self, report: str, held_version: int, policy: str) -> None:
        """Runs on a subscriber's thread: ask ``policy``'s trainer for a snapshot, at most every 10 s."""
        now = time.monotonic()
        if now - self._last_snapshot_request.get(policy, -SNAPSHOT_REQUEST_INTERVAL_S) < SNAPSHOT_REQUEST_INTERVAL_S:
            return
        self._last_snapshot_request[policy] = now
        self.plain.send(self.topics.control, SnapshotRequest(policy, self.node_id, held_version, report,
                                                             time.time()), key=policy, trace=False)

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_hb < self.cfg.rollout.heartbeat_s:
            return
        self._last_hb = now
        elapsed = max(1e-9, now - self._started)
        held = self.weights.held()  # the lineage the engine rolls out with
        self.plain.send(self.topics.control,
                        Heartbeat(self.node_id, "raas", self.cfg.policy, self.engine.version,
                                  tokens_per_s=self._tokens / elapsed, ts=time.time(), epoch=held.epoch if held else 0,
                                  weights_digest=held.digest if held else ""), key=self.node_id, trace=False)
        self.metrics.emit_device(self.engine, step=self.engine.version, node=self.node_id)
        # Beside the device's totals: the episodes of polls rolling out, not committed yet. The
        # device did part of their work, so what prices work per episode counts them (a node that
        # is killed leaves up to ``polls_in_flight`` polls of them uncommitted).
        self.metrics.emit_many({"raas.tasks_in_flight": self._polls.tasks()},
                               step=self.engine.version, node=self.node_id, policy=self.cfg.policy)
        # the task group's generation: how often it rebalanced (each rebalance fences the polls in flight)
        generation = self.consumer.group_metadata().generation_id if self.consumer is not None else -1
        if generation >= 0:
            self.metrics.emit_many({"raas.task_group_generation": generation}, step=self.engine.version,
                                   node=self.node_id, policy=self.cfg.policy)
        self._report_weights_source()
        self._report_env_servers()
        if self._serve_busy_s > 0:  # a pool that serves other policies' episodes is busy too (its autoscaler's demand)
            self.metrics.emit_many({"raas.serve_busy_s": self._serve_busy_s}, step=self.engine.version,
                                   node=self.node_id, policy=self.cfg.policy)
            self._serve_busy_s = 0.0

    def _report_env_servers(self) -> None:
        """``raas.env_requests`` / ``env_retries`` / ``env_failures``: this process's totals per
        environment server (label ``server``, the URL; ``pid``: the summary adds processes up),
        sent when they change."""
        for url, counts in server_counts().items():
            if self._env_counts.get(url) != counts:
                self._env_counts[url] = counts
                self.metrics.emit_many({f"raas.env_{k}": v for k, v in counts.items()}, step=self.engine.version,
                                       node=self.node_id, policy=self.cfg.policy, server=url, pid=os.getpid())

    def _report_weights_source(self) -> None:
        """``raas.weights_loaded``: versions reached so far (snapshots + deltas applied), labelled
        with the cluster they were read from; sent when the count changes (the summary's record
        of where each node's weights came from)."""
        paths = self.weights.subscriber.path_counts
        loaded = paths["snapshot"] + paths["delta"]
        partial = getattr(self.engine, "refreshes", None)
        if partial and partial["rows"] != self._partial_rows:  # rows continued under a newer version
            self._partial_rows = partial["rows"]
            self.metrics.emit_many({"raas.partial_rows": partial["rows"],
                                    "raas.partial_recomputed_tokens": partial["recomputed_tokens"]},
                                   step=self.engine.version, node=self.node_id, policy=self.cfg.policy)
        if loaded != self._weights_loaded:
            self._weights_loaded = loaded
            self.metrics.emit("raas.weights_loaded", loaded, step=self.engine.version, node=self.node_id,
                              bootstrap=self.weights_bootstrap, snapshots=paths["snapshot"], deltas=paths["delta"])
        waits = self.weights.subscriber.load_waits
        if waits["loads"] != self._weights_loads:  # how long the loaded versions waited for the engine, summed
            self._weights_loads = waits["loads"]
            self.metrics.emit_many({"raas.weights_loads": waits["loads"], "raas.weights_wait_s": waits["wait_s"]},
                                   step=self.engine.version, node=self.node_id, policy=self.cfg.policy)

    def _weights_security(self):
        """The client setting of ``rollout.weights_bootstrap_servers`` (None: the process's)."""
        sec = self.cfg.rollout.weights_security
        if sec is None:
            return None
        return sec.client(self.cfg.source, "rollout.weights_security", self.cfg.config_dir)

    def on_stop(self) -> None:
        # Asked to stop (retired, or the job is over): the polls in flight finish and commit,
        # and closing the consumer below leaves the group, so its partitions move at once. The
        # last heartbeat says so; device-hours accounting closes the node's time here.
        try:
            if self._polls and self.consumer is not None:
                try:
                    self._finish_polls()
                except Exception:  # noqa: BLE001 - what was not committed is redone by the group
                    log.warning("%s: could not finish the polls in flight", self.node_id, exc_info=True)
            if self.plain is not None and self.engine is not None:
                if self.weights is not None:
                    self._report_weights_source()
                self.plain.send(self.topics.control,
                                Heartbeat(self.node_id, "raas", self.cfg.policy, self.engine.version,
                                          tokens_per_s=self._tokens / max(1e-9, time.monotonic() - self._started),
                                          ts=time.time(), status="stopping"), key=self.node_id, trace=False)
        finally:
            super().on_stop()

    def teardown(self) -> None:
        if self._polls is not None:
            self._polls.close()
        close_quietly(self.runner, self.server, self.client, self.weights, self.consumer, self.watch,
                      self.producer, self.plain, getattr(self.engine, "host", self.engine))
        self.engine = self.consumer = self.producer = self.plain = self.weights = None
        self.client = self.server = self.runner = self.watch = None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
