"""The RaaS node actor: consume tasks, roll them out, produce trajectory groups.

A member of consumer group ``raas.<policy>`` on ``tasks.<policy>``. For each poll it
refreshes weights through the subscriber (between requests, never during one), waits
for at least the version a task was scheduled at (the sync schedule relies on this),
runs the workflow, and writes the trajectory groups *and* commits the task offsets in
one Kafka transaction: a node that dies mid-rollout commits nothing, and the group
protocol redelivers its tasks to the others. Heartbeats go to ``control``.

Episodes that keep failing deterministically (``rollout.max_episode_failures`` in a row,
none succeeding: a workflow or reward that raises on its input) stop the node with a fatal
error before it commits the poll that crossed the bound, so those tasks stay uncommitted;
its last heartbeat (status ``failed``) carries the cause, so a launcher that does not own
the process stops the job too.

A task is an episode of its workflow (:mod:`.episodes`): the one-role ``rlvr`` of a
single-policy job, or a multi-role one whose roles other policies' pools may play. In a
multi-policy job every node also serves its policy's ``generate.<policy>`` requests
(:mod:`.generation`) between its own work and while its episodes wait on other pools; an
episode is committed with every role's group in the one transaction, or not at all.
"""

from __future__ import annotations

import logging
import time

from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from opentelemetry import trace

from astraflow.config import JobConfig
from astraflow.topics import (Consumer, DeadLetters, Heartbeat, Producer, SnapshotRequest, StaleMembershipError, Task,
                              TrajectoryGroup, job_topics)
from astraflow.topics.membership import MembershipWatch

from . import fault_points
from .common import close_quietly, configure_sandbox, make_rollout_engine, model_path, set_threads
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
        self._last_snapshot_request = -SNAPSHOT_REQUEST_INTERVAL_S
        self.engine = self.consumer = self.producer = self.plain = self.subscriber = None
        self.client = self.server = self.runner = self.watch = None
        self.multi = len(cfg.policy_names) > 1

    def setup(self) -> None:
        from transformers import AutoTokenizer

        from astraflow.engines.gate import EngineGate
        from astraflow.weights import WeightSubscriber

        from .episodes import CALL_WAIT_S, EpisodeRunner
        from .generation import REPLY_TIMEOUT_S, GenerationClient, GenerationServer

        set_threads(self.cfg.rollout.engine.threads)
        configure_sandbox(self.cfg)
        path = model_path(self.cfg)
        self.engine = make_rollout_engine(self.cfg, path, name=self.node_id, run_dir=self.run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.engine_lock = EngineGate(self.engine)  # shared by calls when the engine batches them itself
        self.plain = Producer(self.bootstrap, client_id=self.node_id)
        dead = DeadLetters(self.plain, self.topics.dlq, self.node_id, recall=self.bootstrap)
        stretch = self._emulation_stretch()
        if self.multi:
            self.client = GenerationClient(self.bootstrap, self.topics, self.node_id, dead_letters=dead,
                                           producer=self.plain, timeout_s=REPLY_TIMEOUT_S * stretch)
            self.server = GenerationServer(self.bootstrap, self.topics, self.cfg.policy, self.node_id,
                                           self._serve_rows, self._sampling_params, dead_letters=dead,
                                           producer=self.plain, concurrent=self.engine_lock.concurrent,
                                           devices=self.cfg.rollout.device.count)
        self.runner = EpisodeRunner(self.cfg.policy, self.node_id, self.engine, self.tokenizer, self.cfg.seed,
                                    engine_lock=self.engine_lock, before_call=self._refresh_weights,
                                    client=self.client, batch_invariant=self.cfg.rollout.batch_invariant,
                                    tracer=tracer, sampling_of=self._sampling_of, call_wait_s=CALL_WAIT_S * stretch)
        # The pool's identity on every group it writes: the dataflow counts no other (actors/signing.py).
        self.group_signer = group_signer_for(self.cfg)
        self.producer = Producer(self.bootstrap, client_id=self.node_id,
                                 transactional_id=self.topics.rollout_transactional_id(self.cfg.policy, self.node_id),
                                 transaction_timeout_ms=self.cfg.kafka.transaction_timeout_ms)
        self.metrics = MetricsEmitter(self.plain, self.topics.metrics, self.node_id)
        self.consumer = self._task_consumer()
        self.watch = MembershipWatch(self.bootstrap, self.node_id, unsettled_s=CONSUMER_REJOIN_S,
                                     idle_s=CONSUMER_IDLE_PROBE_S)
        # A region with its own cluster: versions and weights come from there (MirrorMaker 2
        # copies them from home once per region); everything else stays on the home cluster.
        self.weights_bootstrap = self.cfg.rollout.weights_bootstrap_servers or self.bootstrap
        self._weights_loaded = -1
        self.subscriber = WeightSubscriber(self.weights_bootstrap, self.topics, self.cfg.policy,
                                           initial=None, initial_version=self.engine.version, node_id=self.node_id,
                                           on_fault=self._request_snapshot, prefetch=self.cfg.rollout.prefetch_weights,
                                           verifier=verifier_for(self.cfg), dead_letters=dead,
                                           security_setting=self._weights_security(),
                                           on_reject=lambda r: self.metrics.emit(
                                               "raas.versions_rejected", 1, step=self.engine.version,
                                               reason=r.reason, epoch=r.epoch, version=r.version))
        self.subscriber.start()
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor
        #: (tasks, spans, offsets, membership, future, metrics) of the polls in flight, oldest first
        self._polls: deque = deque()
        self._held = None  #: a poll's deliveries waiting for the weights they were scheduled at
        self._busy_from = 0.0
        self._poll_threads = ThreadPoolExecutor(self.cfg.rollout.polls_in_flight, thread_name_prefix=f"{self.node_id}-poll")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix=f"{self.node_id}-load")
        self._loading = None  #: a weight load waiting for the engine's calls in flight (polls in flight only)
        self._heartbeat(force=True)

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
            partition_assignment_strategy=[StickyPartitionAssignor], expect=(Task,), redo_lost=True)

    def _rejoin_if_stuck(self) -> None:
        """Recreate the task consumer when the broker says it is not in its group.

        Seen in CI: a node's task consumer that never joined (the broker had no such group)
        while the node kept polling and the client reported a generation, so the node sat
        idle with tasks waiting. :class:`MembershipWatch` asks the broker when the consumer
        has been unsettled or idle too long. Between steps nothing is in flight (tasks are
        rolled out and committed within a step), so a fresh consumer loses nothing: it
        resumes from the committed offsets, like a restarted node.
        """
        consumer = self.watch.renew(self.consumer, self._task_consumer)
        if consumer is not self.consumer:
            self.consumer = consumer
            self.metrics.emit_many({"raas.consumer_rejoins": self.watch.renewals}, step=self.engine.version)

    def step(self) -> None:
        if self.cfg.rollout.polls_in_flight > 1:
            return self._pipelined_step()
        self._rejoin_if_stuck()
        if self._newer_weights():  # (waits for the calls in flight: a load needs the engine idle)
            self._load_weights()
        if self.server is not None:
            before = self.server.busy_s
            answered = self.server.serve(50)
            # Inside a rollout of its own (``_while_waiting``) serving is already part of raas.busy_s.
            self._serve_busy_s += self.server.busy_s - before
        else:
            answered = 0
        # A node that just answered role calls looks for tasks without waiting: more calls are
        # likely queued, and a pool that mostly serves (the verifier's) would idle here each time.
        deliveries = self.consumer.poll(0 if answered else 50 if self.multi else 500)
        if not deliveries:
            if self.consumer.pending_offsets():  # only dead-lettered records: move past them
                try:
                    self.consumer.commit()
                except StaleMembershipError as e:
                    # Rebalanced since the poll: the partition's owner is handed those records
                    # again and dead-letters them itself; nothing of ours to keep.
                    log.warning("%s: %s", self.node_id, e)
            self._heartbeat()
            return
        self.watch.saw_records()
        tasks: list[Task] = [d.message for d in deliveries]
        try:
            self._wait_for_version(max(t.scheduled_version for t in tasks))
        except TimeoutError as e:
            self._answer_failed(tasks, str(e))
            raise
        t0 = time.monotonic()
        spans = [tracer.start_span("raas.rollout", context=d.trace_context,
                                   attributes={"task.id": d.message.task_id, "node.id": self.node_id,
                                               "policy.version": self.engine.version})
                 for d in deliveries]
        per_task = self._roll_out(tasks, spans)
        self._check_failures()
        try:
            self._commit(per_task, spans)
        except StaleMembershipError as e:
            self._fenced_poll(e, tasks, spans)
            return
        self._report(tasks, per_task, spans, time.monotonic() - t0, self.runner.last_metrics)

    def _send_group(self, g: TrajectoryGroup) -> None:
        self.producer.send(self.topics.trajectories, g, key=g.task_id,
                           sign=self.group_signer.headers if self.group_signer is not None else None)

    def _commit(self, per_task: list[list[TrajectoryGroup]], spans, offsets=None, membership=None) -> None:
        """A poll's groups and its task offsets in one transaction (``offsets``, ``membership``: a
        snapshot of the consumer's pending offsets and its group membership taken at that poll,
        when later polls are in flight)."""
        with self.producer.transaction():
            for gs, span in zip(per_task, spans):
                with trace.use_span(span):  # the record carries this rollout's trace context
                    for g in gs:
                        self._send_group(g)
            fault_points.reach(fault_points.IN_TRANSACTION, self.node_id)
            self.producer.send_offsets(self.consumer, offsets, membership=membership)

    def _check_failures(self) -> None:
        """Too many deterministic episode failures in a row: say so on ``control``, then stop fatally."""
        from .episodes import EpisodesFailing
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

    def _fenced_poll(self, e: Exception, tasks: list[Task], spans) -> None:
        # Fell out of the group while rolling out (a broker restart, a long pause): the
        # partition's new owner redoes these tasks; ours were aborted with the transaction.
        log.warning("%s: %s", self.node_id, e)
        self._fenced += len(tasks)
        self.metrics.emit_many({"raas.fenced_tasks": self._fenced}, step=self.engine.version,
                               node=self.node_id, policy=self.cfg.policy)
        for span in spans:
            span.set_attribute("raas.fenced", True)
            span.end()

    def _report(self, tasks: list[Task], per_task, spans, busy: float, episode_metrics: list[dict]) -> None:
        groups = [g for gs in per_task for g in gs]
        for span in spans:
            span.end()
        self._busy_s += busy
        n_tokens = sum(len(s.tokens) for g in groups for s in g.samples)
        self._tokens += n_tokens
        # raas.tokens counts a multi-turn trajectory's context too; generated_tokens only what
        # the episode's roles wrote (each token once: in its writer's group, where it is trained)
        values = {"raas.tasks": len(tasks), "raas.tokens": n_tokens, "raas.busy_s": busy,
                  "raas.generated_tokens": sum(s.trained() for g in groups for s in g.samples),
                  "raas.reward": _mean([s.reward for g in groups for s in g.samples])}
        team = [m["team_reward"] for m in episode_metrics if "team_reward" in m]
        if self.multi and team:
            values["raas.team_reward"] = _mean(team)
            for key in sorted({k for m in episode_metrics for k in m} - {"team_reward"}):
                values[f"raas.episode.{key}"] = _mean([m[key] for m in episode_metrics if key in m])
        if self.client is not None and self.client.calls:
            values["raas.remote_wait_s_per_call"] = self.client.wait_s / self.client.calls
        if self.server is not None and self.server.fenced:
            values["raas.gen_fenced_requests"] = self.server.fenced
        self.metrics.emit_many(values, step=self.engine.version, node=self.node_id, policy=self.cfg.policy)
        self._heartbeat()

    # -- several polls in flight (rollout.polls_in_flight > 1) ---------------------------
    def _pipelined_step(self) -> None:
        """One turn of a node with several polls in flight: load new weights, serve other
        pools, commit the polls that finished (in the order they were polled: a poll's
        offsets are committed only after every earlier poll's), and start a poll when there
        is room. The episodes of each poll run on a thread of their own (the engine batches
        their calls); everything Kafka stays on this thread."""
        limit = self.cfg.rollout.polls_in_flight
        if not self._polls:
            self._rejoin_if_stuck()  # nothing in flight: a fresh consumer loses nothing
        self._load_beside_polls()
        answered = 0
        if self.server is not None:
            before = self.server.busy_s
            answered = self.server.serve(20 if self._polls else 50)
            if not self._polls:  # serving during its own polls is inside their raas.busy_s
                self._serve_busy_s += self.server.busy_s - before
        self._commit_finished_polls()
        if self._held is not None:
            # A poll waiting for weights it was scheduled at: those need the polls in flight to be
            # committed and trained first, so it starts once they are loaded, or, with nothing
            # in flight, waits for them as a single poll does.
            held, self._held = self._held, None
            if not self._polls or self.engine.version >= max(d.message.scheduled_version for d in held):
                self._start_poll(held)
            else:
                self._held = held
        room = len(self._polls) < limit and self._held is None
        # At the limit the task partitions are paused, not left unpolled: the poll keeps the
        # consumer's group membership current (a rebalance it sat out would fence every poll).
        self.consumer.hold(not room)
        deliveries = self.consumer.poll(0 if answered or self._polls else 50 if self.multi else 500)
        if deliveries:  # (at the limit only from a partition assigned since the pause: taken all the same)
            if self._held is not None:  # (a partition assigned while a poll waits: it waits with it)
                self._held = [*self._held, *deliveries]
            elif self._polls and max(d.message.scheduled_version for d in deliveries) > self.engine.version:
                self._held = deliveries  # never block on a version while polls are in flight
            else:
                self._start_poll(deliveries)
        elif not self._polls and self.consumer.pending_offsets():  # only dead-lettered records
            try:
                self.consumer.commit()
            except StaleMembershipError as e:
                log.warning("%s: %s", self.node_id, e)
        if not room and self.server is None:
            time.sleep(0.01)
        self._heartbeat()

    def _load_beside_polls(self) -> None:
        """Load newer weights on a thread of their own. A load needs the engine idle, so it waits
        for the calls in flight (the gate holds new ones back meanwhile), which on an emulated or
        GPU engine can take a long call's time; this thread meanwhile goes on polling, so the
        node never holds up its group's rebalances (a join waits for every member's poll, and
        each rebalance fences the polls in flight of every node)."""
        if self._loading is not None:
            if not self._loading.done():
                return
            loading, self._loading = self._loading, None
            loading.result()  # a load that raised fails the step, as it does inline
        if self._newer_weights():
            self._loading = self._loader.submit(self._load_weights)

    def _load_weights(self) -> None:
        """Apply the newest weights the subscriber holds, with the engine alone (waits for the
        calls in flight)."""
        with self.engine_lock:
            self.subscriber.apply_to(self.engine)

    def _start_poll(self, deliveries) -> None:
        self.watch.saw_records()
        tasks: list[Task] = [d.message for d in deliveries]
        offsets = self.consumer.pending_offsets()  # everything handed out so far: committed with this poll
        try:  # the membership these were handed out in: the poll commits under it or not at all
            membership = self.consumer.membership_for(offsets)
        except StaleMembershipError as e:
            log.warning("%s: %s", self.node_id, e)  # handed out across a rebalance: redone from the committed offset
            return
        self._wait_for_version(max(t.scheduled_version for t in tasks))
        spans = [tracer.start_span("raas.rollout", context=d.trace_context,
                                   attributes={"task.id": d.message.task_id, "node.id": self.node_id,
                                               "policy.version": self.engine.version})
                 for d in deliveries]
        if not self._polls:
            self._busy_from = time.monotonic()
        metrics: list[dict] = []
        future = self._poll_threads.submit(self.runner.roll_out, tasks, spans, None, metrics)
        self._polls.append((tasks, spans, offsets, membership, future, metrics))
        self.metrics.emit_many({"raas.polls_in_flight": len(self._polls)}, step=self.engine.version,
                               node=self.node_id, policy=self.cfg.policy)

    def _commit_finished_polls(self) -> None:
        """Commit the polls that finished, oldest first (a later one waits for every earlier one);
        each under the membership it was handed out in: one handed out before a rebalance is
        fenced (dropped; redone from the committed offset), one handed out after it commits."""
        while self._polls and self._polls[0][4].done():
            tasks, spans, offsets, membership, future, metrics = self._polls.popleft()
            per_task = future.result()  # a rollout that raised fails the step, as it does inline
            self._check_failures()
            try:
                self._commit(per_task, spans, offsets, membership)
            except StaleMembershipError as e:
                self._fenced_poll(e, tasks, spans)
                continue
            now = time.monotonic()  # the time at least one poll was in flight, once
            busy, self._busy_from = now - self._busy_from, now
            self._report(tasks, per_task, spans, busy, metrics)

    def _roll_out(self, tasks: list[Task], spans) -> list[list[TrajectoryGroup]]:
        """Per task, its groups (one per trained role): :meth:`EpisodeRunner.roll_out
        <astraflow.actors.episodes.EpisodeRunner.roll_out>`, serving other pools and
        heartbeating while the episodes run."""
        return self.runner.roll_out(tasks, spans, on_wait=self._while_waiting)

    # -- serving other pools -----------------------------------------------------------
    def _while_waiting(self) -> None:
        if self.server is not None:
            self.server.serve(20)
        else:
            time.sleep(0.005)
        self._heartbeat()

    def _newer_weights(self) -> bool:
        """The subscriber holds a version the engine has not loaded (asked without the engine:
        a step takes the engine alone only to load, never while served calls run for nothing)."""
        held = self.subscriber.held_by(self.engine)
        if held is None:
            return self.subscriber.version > self.engine.version
        return (self.subscriber.epoch, self.subscriber.version) > (held.epoch, held.version)

    def _refresh_weights(self) -> None:
        """Between engine calls (under the engine lock): take the newest weights."""
        self.subscriber.apply_to(self.engine)

    def _serve_rows(self, prompts, params, seeds):
        with self.engine_lock.try_exclusive() as alone:
            if alone:  # new weights only while no call is in flight
                self.subscriber.apply_to(self.engine)
        with self.engine_lock.call():
            return self.engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    def _sampling_params(self, sampling: dict):
        from astraflow.engines.base import SamplingParams
        return SamplingParams.from_mapping(sampling, stop_token_ids=(self.tokenizer.eos_token_id,))

    def _sampling_of(self, policy: str, task: Task) -> dict:
        """A role's sampling settings: its own policy's rollout section (the task's for one policy)."""
        if not self.multi or policy == task.policy:
            return task.sampling
        r = self.cfg.view(policy).rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_new_tokens}

    def _wait_for_version(self, version: int) -> None:
        deadline = time.monotonic() + WEIGHT_WAIT_LIMIT_S
        while self.engine.version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.node_id}: weights version {version} did not arrive within "
                                   f"{WEIGHT_WAIT_LIMIT_S:.0f}s (have {self.engine.version})")
            self.subscriber.wait_for(version, timeout=1.0)
            self._load_weights()
            self._heartbeat()

    def _answer_failed(self, tasks: list[Task], error: str) -> None:
        """Commit a failure record for each of ``tasks`` before the node restarts over a version
        that never came: a task scheduled at a version no trainer announces (a forged one)
        is answered once, not waited for again by every restart of every node it reaches.
        The dataflow drops failed groups and schedules replacements for them."""
        try:
            with self.producer.transaction():
                for task in tasks:
                    for g in self.runner.failed_groups(task, error):
                        self._send_group(g)
                self.producer.send_offsets(self.consumer)
        except Exception:  # noqa: BLE001 - the wait's error is the one to report; the tasks are redelivered
            log.warning("%s: could not answer %d task(s) as failed", self.node_id, len(tasks), exc_info=True)

    def _request_snapshot(self, report: str, held_version: int) -> None:
        """Runs on the subscriber's thread: ask the trainer for a snapshot, at most every 10 s."""
        now = time.monotonic()
        if now - self._last_snapshot_request < SNAPSHOT_REQUEST_INTERVAL_S:
            return
        self._last_snapshot_request = now
        self.plain.send(self.topics.control, SnapshotRequest(self.cfg.policy, self.node_id, held_version, report,
                                                             time.time()), key=self.cfg.policy, trace=False)

    def _heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_hb < self.cfg.rollout.heartbeat_s:
            return
        self._last_hb = now
        elapsed = max(1e-9, now - self._started)
        held = self.subscriber.held_by(self.engine)  # the lineage the engine rolls out with
        self.plain.send(self.topics.control,
                        Heartbeat(self.node_id, "raas", self.cfg.policy, self.engine.version,
                                  tokens_per_s=self._tokens / elapsed, ts=time.time(), epoch=held.epoch if held else 0,
                                  weights_digest=held.digest if held else ""), key=self.node_id, trace=False)
        self.metrics.emit_device(self.engine, step=self.engine.version, node=self.node_id)
        # Beside the device's totals: the episodes of polls rolling out, not committed yet. The
        # device did part of their work, so what prices work per episode counts them (a job that
        # stops leaves up to ``polls_in_flight`` polls of them uncommitted).
        self.metrics.emit_many({"raas.tasks_in_flight": sum(len(p[0]) for p in self._polls)},
                               step=self.engine.version, node=self.node_id, policy=self.cfg.policy)
        # the task group's generation: how often it rebalanced (each rebalance fences the polls in flight)
        generation = self.consumer.group_metadata().generation_id if self.consumer is not None else -1
        if generation >= 0:
            self.metrics.emit_many({"raas.task_group_generation": generation}, step=self.engine.version,
                                   node=self.node_id, policy=self.cfg.policy)
        self._report_weights_source()
        if self._serve_busy_s > 0:  # a pool that serves other policies' episodes is busy too (its autoscaler's demand)
            self.metrics.emit_many({"raas.serve_busy_s": self._serve_busy_s}, step=self.engine.version,
                                   node=self.node_id, policy=self.cfg.policy)
            self._serve_busy_s = 0.0

    def _report_weights_source(self) -> None:
        """``raas.weights_loaded``: versions reached so far (snapshots + deltas applied), labelled
        with the cluster they were read from; sent when the count changes (the summary's record
        of where each node's weights came from)."""
        paths = self.subscriber.path_counts
        loaded = paths["snapshot"] + paths["delta"]
        if loaded != self._weights_loaded:
            self._weights_loaded = loaded
            self.metrics.emit("raas.weights_loaded", loaded, step=self.engine.version, node=self.node_id,
                              bootstrap=self.weights_bootstrap, snapshots=paths["snapshot"], deltas=paths["delta"])

    def _weights_security(self):
        """The client setting of ``rollout.weights_bootstrap_servers`` (None: the process's)."""
        sec = self.cfg.rollout.weights_security
        if sec is None:
            return None
        return sec.client(self.cfg.source, "rollout.weights_security", self.cfg.config_dir)

    def on_stop(self) -> None:
        # Asked to stop (retired, or the job is over): the step in flight has committed, and
        # closing the consumer below leaves the group, so its partitions move at once. The
        # last heartbeat says so; device-hours accounting closes the node's time here.
        try:
            if self.plain is not None and self.engine is not None:
                if self.subscriber is not None:
                    self._report_weights_source()
                self.plain.send(self.topics.control,
                                Heartbeat(self.node_id, "raas", self.cfg.policy, self.engine.version,
                                          tokens_per_s=self._tokens / max(1e-9, time.monotonic() - self._started),
                                          ts=time.time(), status="stopping"), key=self.node_id, trace=False)
        finally:
            super().on_stop()

    def teardown(self) -> None:
        for pool in (getattr(self, "_poll_threads", None), getattr(self, "_loader", None)):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        close_quietly(self.runner, self.server, self.client, self.subscriber, self.consumer, self.watch,
                      self.producer, self.plain, self.engine)
        self.engine = self.consumer = self.producer = self.plain = self.subscriber = None
        self.client = self.server = self.runner = self.watch = None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
