"""Run a poll's episodes on a RaaS node: one thread per episode, engine calls coalesced.

A workflow is plain Python that blocks in ``roles[name].generate``; the node runs the
episodes of one poll on threads of their own and a :class:`CallBatcher` turns their
concurrent calls on this node's engine into batched engine calls: it waits until every
episode still running is either waiting on the engine or on another pool (over Kafka,
:mod:`.generation`), then makes one engine call per sampling setting with the waiting
rows in episode order. For the one-role ``rlvr`` workflow this is exactly one call with
every sample of the poll, as a single-policy node has always made; ``batch_invariant``
gives every call an engine call of its own. An episode's own calls are sequential (a
concurrent second one raises :class:`~astraflow.workflows.api.ConcurrentGenerateError`),
and a call waits at most :data:`CALL_WAIT_S` for the others (:class:`EngineWaitTimeout`
fails that episode alone).

:meth:`EpisodeRunner.roll_out` is a poll's tasks in and, per task, one trajectory group
per role the task trains (``Task.train``) out; a workflow that raises yields a ``failed``
group for each, so every policy's dataflow settles what it opened. An episode that fails
*deterministically* (:func:`deterministic`: the workflow or its reward raising on its input)
counts toward the runner's :class:`FailureStreak`, which any success resets; the rollout
actor stops the job when it gets too long (``rollout.max_episode_failures``) instead of
failing the same way forever. It needs an engine and
a tokenizer, not Kafka (only the multi-policy remote roles go through a
:class:`~astraflow.actors.generation.GenerationClient` it is handed), so it is the one
episode code path of the RaaS node and of the in-process baseline
(``benchmarks/inprocess_loop.py``). Nothing is written here: the rollout actor sends every
group of the poll and commits the task offsets in one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from opentelemetry import trace

from astraflow.engines.base import Generation, SamplingParams, generated_context, prompt_rows
from astraflow.errors import AstraflowError, FatalError, one_line
from astraflow.engines.gate import EngineGate
from astraflow.topics import Sample, Task, TrajectoryGroup
from astraflow.workflows.api import (ConcurrentGenerateError, Episode, EngineRole, EpisodeResult, Trajectory,
                                    call_sampling, get_workflow, run_episode)

from .version_span import check_version_span

log = logging.getLogger(__name__)


#: how long a ``generate`` call waits for the batched engine call it joins (the time every
#: other running episode of the poll may spend outside ``generate``; the engine call itself
#: runs under the batcher's lock and is not counted)
CALL_WAIT_S = 600.0


class EngineWaitTimeout(TimeoutError):
    """A ``generate`` call waited longer than the batcher's bound for its engine call."""


#: What user code raises on an input it cannot handle: the same task fails the same way on
#: any node and any retry. Everything else (timeouts and OS errors, Kafka's and torch's
#: ``RuntimeError``\ s, a retriable error of ours) depends on the world and is not counted.
DETERMINISTIC = (ValueError, TypeError, LookupError, AttributeError, NameError, ArithmeticError, AssertionError,
                 NotImplementedError, ImportError, FatalError)


def deterministic(error: BaseException) -> bool:
    """Whether an episode's error would recur on the same input (see :data:`DETERMINISTIC`)."""
    if isinstance(error, AstraflowError):
        return not error.retriable
    return isinstance(error, DETERMINISTIC) and not isinstance(error, OSError)


class EpisodesFailing(FatalError):
    """Episodes kept failing deterministically, with no success between them: stop the job."""


class FailureStreak:
    """Deterministic episode failures in a row on this node, with the last one's cause.

    A success resets it; a transient failure (:func:`deterministic` is false) neither counts
    nor resets. Fed by :meth:`EpisodeRunner.roll_out` once per task, from any poll's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.last: str = ""  #: ``task <id> of workflow <name>: <Type>: <message>``

    def observe(self, task: Task, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.count, self.last = 0, ""
            elif deterministic(error):
                self.count += 1
                self.last = f"task {task.task_id} of workflow {task.workflow!r}: {type(error).__name__}: " \
                            f"{one_line(error)}"

    def check(self, limit: int) -> None:
        """Raise :class:`EpisodesFailing` once ``limit`` (> 0) failures are in a row."""
        if limit > 0 and self.count >= limit:
            raise EpisodesFailing(f"{self.count} episodes in a row failed with a deterministic error and none "
                                  f"succeeded (rollout.max_episode_failures: {limit}), so the job stops; the "
                                  f"tasks stay uncommitted. Last: {self.last}")


class CallBatcher:
    """Coalesces the engine calls of concurrently running episodes (see the module docstring).

    ``engines`` is this node's engine, or a mapping policy -> engine when one process holds
    every policy (the sequential baseline) or a shared pool holds several policies' adapters;
    calls name their policy then, and the rows of adapters of one host engine
    (:class:`~astraflow.engines.base.AdapterEngine`) go into one call of it, each naming its adapter. Each running
    episode is counted with :meth:`enter` (or ``episodes=`` up front) and uncounted with
    :meth:`leave` when it finishes or while it waits on another pool (:meth:`away`).
    """

    def __init__(self, engines, lock: threading.Lock | EngineGate | None = None, before_call=None,
                 batch_invariant: bool = False, episodes: int = 0, timeout_s: float | None = None) -> None:
        self.engines = engines if isinstance(engines, dict) else {None: engines}
        self.timeout_s = CALL_WAIT_S if timeout_s is None else timeout_s
        self.engine_lock = lock or threading.Lock()
        #: the engine batches concurrent calls itself (``EngineGate.concurrent``): a call is
        #: made as soon as every running episode waits on the engine, counting the ones whose
        #: call is in flight, and it runs outside the batcher's lock, so episodes that come back
        #: from another pool one by one join the engine's batch instead of waiting for a turn
        self.concurrent = isinstance(lock, EngineGate) and lock.concurrent
        self.before_call, self.batch_invariant = before_call, batch_invariant
        self._cv = threading.Condition()
        self._stats = threading.Lock()
        self._pending: dict[int, tuple] = {}
        self._running = episodes  #: episodes neither finished nor waiting on another pool
        self._in_flight = 0  #: running episodes whose call is in an engine call now (concurrent)
        self.calls = dict.fromkeys(self.engines, 0)  #: engine calls made, per policy
        self.rows = 0  #: rows of those calls
        self.engine_s = dict.fromkeys(self.engines, 0.0)  #: seconds inside each engine

    @property
    def engine(self):
        return self.engines[None] if None in self.engines else next(iter(self.engines.values()))

    def enter(self) -> None:
        with self._cv:
            self._running += 1

    def leave(self) -> None:
        with self._cv:
            self._running -= 1
            batch = self._flush_if_all_waiting()
        if batch:  # the leaving episode goes on (to another pool, or out): the call gets a thread of its own
            threading.Thread(target=self._call_outside, args=(batch,), name="batcher-call", daemon=True).start()

    def away(self):
        """Context: the episode waits on another pool, not on this engine."""
        batcher = self

        class _Away:
            def __enter__(self):
                batcher.leave()

            def __exit__(self, *exc):
                batcher.enter()
        return _Away()

    def generate(self, index: int, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int], policy: str | None = None) -> list[Generation]:
        slot: dict = {}
        with self._cv:
            if index in self._pending:
                raise ConcurrentGenerateError(
                    f"episode {index} of this poll called the engine while its previous call is still waiting; an "
                    f"episode's generate calls must be sequential")
            self._pending[index] = (policy, prompt_rows(prompts), params, list(seeds), slot)
            batch = self._flush_if_all_waiting()
        if batch:
            self._call_outside(batch)
        with self._cv:
            deadline = time.monotonic() + self.timeout_s
            while "out" not in slot and "error" not in slot:
                left = deadline - time.monotonic()
                if left <= 0 and index in self._pending:  # (a call in flight is the engine's time: not counted)
                    del self._pending[index]
                    raise EngineWaitTimeout(
                        f"episode {index} of this poll: its generate call (policy {policy or 'of this node'}, "
                        f"{len(prompts)} row(s)) waited {self.timeout_s:.0f}s for the batched engine call, which is "
                        f"made once every running episode waits on an engine or another pool; "
                        f"{self._running - len(self._pending) - self._in_flight - 1} of the {self._running} running "
                        f"episode(s) never called generate nor finished (a workflow stuck outside generate?)")
                self._cv.wait(max(left, 0.05))
        if "error" in slot:
            raise slot["error"]
        return slot["out"]

    def _flush_if_all_waiting(self) -> list | None:
        """Under ``_cv``: once every running episode waits, take the waiting calls. A plain
        engine is called here, under the lock; a concurrent one's batch is returned, for the
        caller to make outside it (:meth:`_call_outside`)."""
        if not self._pending or len(self._pending) + self._in_flight < self._running:
            return None
        pending, self._pending = sorted(self._pending.items()), {}
        if not self.concurrent:
            with self.engine_lock:
                if self.before_call is not None:
                    self.before_call()
                self._call(pending)
            self._cv.notify_all()
            return None
        self._in_flight += len(pending)
        return pending

    def _call_outside(self, pending: list) -> None:
        try:
            with self.engine_lock.try_exclusive() as alone:
                if alone and self.before_call is not None:  # new weights only while no call is in flight
                    self.before_call()
            with self.engine_lock.call():
                self._call(pending)
        finally:
            with self._cv:
                self._in_flight -= len(pending)
                batch = self._flush_if_all_waiting()
                self._cv.notify_all()
            if batch:
                self._call_outside(batch)

    def _call(self, pending: list) -> None:
        """One engine call per engine and sampling setting, rows in episode order; fills the
        slots. Adapters of one host engine (a shared pool's policies) share its calls: each
        row names its adapter."""
        groups: dict = {}
        for item in pending:
            policy, _, params, _, _ = item[1]
            host = getattr(self.engines[policy if policy in self.engines else None], "host", None)
            engine = ("host", id(host)) if host is not None else policy
            groups.setdefault(item[0] if self.batch_invariant else (engine, params), []).append(item)
        for group in groups.values():
            policy, _, params, _, _ = group[0][1]
            key = policy if policy in self.engines else None
            rows = [p for _, (_, prompts, _, _, _) in group for p in prompts]
            seeds = [s for _, (_, _, _, ss, _) in group for s in ss]
            t0 = time.perf_counter()
            try:
                gens = self._generate(group, rows, params, seeds)
            except Exception as e:  # noqa: BLE001 - every episode in the call fails with it
                for _, (*_, slot) in group:
                    slot["error"] = e
                continue
            finally:
                with self._stats:
                    self.engine_s[key] += time.perf_counter() - t0
            with self._stats:
                self.calls[key] += 1
                self.rows += len(rows)
            i = 0
            for _, (_, prompts, _, _, slot) in group:
                slot["out"] = gens[i:i + len(prompts)]
                i += len(prompts)

    def _generate(self, group: list, rows: list, params: SamplingParams, seeds: list) -> list[Generation]:
        engines = [self.engines[policy if policy in self.engines else None] for _, (policy, *_) in group]
        host = getattr(engines[0], "host", None)
        if host is None:
            return engines[0].generate(rows, params, seeds=seeds)
        names = [e.name for e, (_, (_, prompts, *_)) in zip(engines, group) for _ in prompts]
        return host.generate(rows, params, seeds=seeds, adapters=names)


class _BatchedRole(EngineRole):
    """A role on this node's engine, through the batcher."""

    def __init__(self, name, policy, batcher: CallBatcher, index: int, tokenizer, sampling, tracer, ctx) -> None:
        super().__init__(name, policy, batcher.engine, tokenizer, sampling)
        self.batcher, self.index, self.tracer, self.ctx = batcher, index, tracer, ctx

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None, stop=None):
        with self.tracer.start_as_current_span("raas.generate", context=self.ctx,
                                               attributes={"role": self.name, "policy": self.policy,
                                                           "task.samples": len(prompts)}):
            gens = self.batcher.generate(self.index, prompts, self.params(max_new_tokens, temperature, stop), seeds,
                                         policy=self.policy)
        return [self.turn(g, generated_context(p)) for g, p in zip(gens, prompts)]


class _RemoteRole:
    """A role played by another policy's pool (over Kafka)."""

    def __init__(self, name, policy, client, batcher: CallBatcher, episode_id: str, tokenizer, sampling, tracer,
                 ctx) -> None:
        self.name, self.policy, self.client, self.batcher = name, policy, client, batcher
        self.episode_id, self.tokenizer, self.sampling, self.tracer, self.ctx = \
            episode_id, tokenizer, dict(sampling), tracer, ctx

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None, stop=None):
        sampling = call_sampling(self.name, self.policy, self.sampling, max_new_tokens=max_new_tokens,
                                 temperature=temperature, stop=stop)
        with self.tracer.start_as_current_span("raas.generate", context=self.ctx,
                                               attributes={"role": self.name, "policy": self.policy,
                                                           "remote": True, "task.samples": len(prompts)}):
            with self.batcher.away():
                return self.client.generate(self.name, self.policy, self.episode_id, prompts, seeds, sampling,
                                            self.tokenizer)


class EpisodeRunner:
    """Runs tasks (episodes) of any registered workflow on this node; see the module docstring."""

    def __init__(self, policy: str, node_id: str, engine, tokenizer, job_seed: int, *, engine_lock: threading.Lock,
                 before_call=None, client=None, batch_invariant: bool = False, tracer=None,
                 sampling_of=None, step_out: bool = True, call_wait_s: float | None = None,
                 engines: dict | None = None, max_versions: int = 0) -> None:
        self.policy, self.node_id, self.engine, self.tokenizer = policy, node_id, engine, tokenizer
        #: ``rollout.max_versions_per_trajectory`` (0: no bound): an episode with a trajectory whose
        #: trained tokens span more versions fails (its task is scheduled again)
        self.max_versions = max_versions
        #: the policies whose roles this node plays on its own engine(s): its policy, and on a
        #: shared pool the policies whose adapters its engine holds (``engines``: policy -> engine)
        self.engines = dict(engines) if engines else {policy: engine}
        self.call_wait_s = call_wait_s  #: a call's bound on waiting for the others (None: CALL_WAIT_S)
        #: an episode's tool and environment time out of the engine's batch (``ep.off_engine``);
        #: False keeps it in (every other episode's call then waits for it): the baseline of
        #: ``benchmarks/multi_turn.py``, not a setting a job has
        self.step_out = step_out
        self.engine_calls = self.engine_rows = 0  #: engine calls made (and their rows), over every poll
        self.job_seed, self.client, self.engine_lock = job_seed, client, engine_lock
        self.before_call, self.batch_invariant = before_call, batch_invariant
        self.tracer = tracer or trace.get_tracer(__name__)
        self.sampling_of = sampling_of or (lambda policy, task: task.sampling)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._reserved = 0  #: episodes running or about to, over every poll in flight
        self.failures = FailureStreak()

    def roll_out(self, tasks: Sequence[Task], spans: Sequence | None = None,
                 metrics_out: list | None = None) -> list[list[TrajectoryGroup]]:
        """A poll's tasks in, per task its groups (one per trained role) out: what a RaaS
        node writes for a poll, and what the in-process baseline trains on. The job seed
        and the task id alone decide each sample's seed. An episode that breaks yields
        failed groups of its own; when a batched engine call breaks every episode in it,
        they are retried one by one, so one bad task cannot fail its neighbours. Several
        polls may be rolled out at once from different threads (a node with
        ``polls_in_flight`` above 1); ``metrics_out`` receives this poll's episode metrics."""
        spans = list(spans or [None] * len(tasks))
        per_task, metrics, errors = self._run(tasks, spans)
        broken = [i for i, gs in enumerate(per_task) if gs and all(g.status == "failed" for g in gs)]
        if len(tasks) > 1 and len(broken) == len(tasks):
            log.warning("%s: every episode of the poll failed (%s); retrying them one by one", self.node_id,
                        per_task[0][0].error)
            per_task, metrics, errors = [], [], []
            for t, s in zip(tasks, spans):
                gs, ms, es = self._run([t], [s])
                per_task += gs
                metrics += ms
                errors += es
        for task, gs, error in zip(tasks, per_task, errors):
            if error is None and gs and all(g.status == "failed" for g in gs):  # (it returned no trajectory)
                error = ValueError(gs[0].error)
            self.failures.observe(task, error)
        if metrics_out is not None:
            metrics_out.extend(metrics)
        return per_task

    def run(self, tasks: Sequence[Task], spans: Sequence | None = None) -> list[list[TrajectoryGroup]]:
        """Per task, its groups."""
        return self._run(tasks, list(spans or [None] * len(tasks)))[0]

    def _run(self, tasks: Sequence[Task], spans: list):
        """Per task its groups, its episode metrics and the error its episode raised (or None)."""
        batcher = CallBatcher(self.engines, self.engine_lock, self.before_call, self.batch_invariant,
                              timeout_s=self.call_wait_s)
        for _ in tasks:
            batcher.enter()
        futures = self._submit(tasks, spans, batcher)
        try:
            wait(futures)
            results = [f.result() for f in futures]
        finally:
            with self._pool_lock:
                self._reserved -= len(tasks)
                self.engine_calls += sum(batcher.calls.values())
                self.engine_rows += batcher.rows
        return [r[0] for r in results], [r[1] for r in results], [r[2] for r in results]

    def _submit(self, tasks: Sequence[Task], spans: list, batcher: CallBatcher) -> list:
        """One thread per episode, on a pool large enough for every poll in flight (an outgrown
        pool is retired, its episodes finishing on it); reserved and submitted under one lock,
        so another poll cannot retire the pool in between."""
        with self._pool_lock:
            self._reserved += len(tasks)
            if self._pool is None or self._pool._max_workers < self._reserved:  # noqa: SLF001
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=max(1, self._reserved),
                                                thread_name_prefix=f"{self.node_id}-ep")
            return [self._pool.submit(self._one, i, t, s, batcher) for i, (t, s) in enumerate(zip(tasks, spans))]

    def _one(self, index: int, task: Task, span, batcher: CallBatcher):
        started = time.time()
        ctx = trace.set_span_in_context(span) if span is not None else None
        roles_of = task.roles or {task.role: task.policy}
        train = task.train or list(roles_of)
        try:
            spec = get_workflow(task.workflow)
            roles = {}
            for name, policy in roles_of.items():
                sampling = self.sampling_of(policy, task)
                if policy in self.engines:
                    roles[name] = _BatchedRole(name, policy, batcher, index, self.tokenizer, sampling, self.tracer, ctx)
                elif self.client is None:
                    raise RuntimeError(f"role {name!r} of policy {policy!r} needs another pool, but this job has "
                                       f"no generation topics (one policy)")
                else:
                    roles[name] = _RemoteRole(name, policy, self.client, batcher, task.task_id, self.tokenizer,
                                              sampling, self.tracer, ctx)
            params = {**task.params, "_job_seed": self.job_seed}
            ep = Episode(task.task_id, task.prompt, task.answer, task.n_samples, roles, self.tokenizer, params,
                         task.metadata, off_engine=batcher.away if self.step_out else contextlib.nullcontext,
                         attempt=f"{self.node_id}/{uuid.uuid4().hex[:12]}", prompt_ids=tuple(task.prompt_ids))
            with self.tracer.start_as_current_span("raas.workflow", context=ctx,
                                                   attributes={"workflow": task.workflow, "task.id": task.task_id}):
                result = run_episode(spec, ep, self.job_seed)
            if self.max_versions:
                check_version_span(result, train, self.max_versions)
        except Exception as e:  # noqa: BLE001 - an explicit failure record per role, never a lost task
            if span is not None:
                span.record_exception(e)
            log.warning("%s: episode %s failed: %s", self.node_id, task.task_id, e)
            return [self._failed(task, role, roles_of, f"{type(e).__name__}: {e}") for role in train], {}, e
        finally:
            batcher.leave()
        prompt_ids = list(task.prompt_ids) or list(self.tokenizer.encode(task.prompt, add_special_tokens=False))
        groups = [self.group(task, role, roles_of, prompt_ids, result, started) for role in train]
        return groups, dict(result.metrics, **({"team_reward": result.team_reward}
                                                if result.team_reward is not None else {})), None

    def failed_groups(self, task: Task, error: str) -> list[TrajectoryGroup]:
        """The failure records of a task not rolled out (one per role it trains), with ``error``."""
        roles_of = task.roles or {task.role: task.policy}
        return [self._failed(task, role, roles_of, error) for role in task.train or list(roles_of)]

    def _failed(self, task: Task, role: str, roles_of: dict, error: str) -> TrajectoryGroup:
        return TrajectoryGroup(task.task_id, task.prompt_id, roles_of[role], self.node_id, [], [],
                               task.scheduled_versions.get(roles_of[role], task.scheduled_version),
                               status="failed", error=error, role=role if task.roles else "",
                               role_policies=dict(task.roles))

    def group(self, task: Task, role: str, roles_of: dict, prompt_ids: list[int], result: EpisodeResult,
              started: float) -> TrajectoryGroup:
        """The trajectory group of ``role`` in a finished episode (what the node writes)."""
        trajs: list[Trajectory] = result.trajectories.get(role, [])
        writers = sorted({w for t in trajs for w in t.token_roles} | {role})
        index = {w: i for i, w in enumerate(writers)}
        samples = []
        for t in trajs:
            own_only = all(t.loss_mask) and all(w == role for w in t.token_roles)
            samples.append(Sample(list(t.tokens), list(t.logprobs), list(t.versions), float(t.reward),
                                  t.finish_reason, t.text,
                                  prompt_ids=[] if list(t.prompt_ids) == prompt_ids else list(t.prompt_ids),
                                  loss_mask=[] if own_only else list(t.loss_mask),
                                  token_roles=[] if own_only else [index[w] for w in t.token_roles],
                                  info=dict(t.info), context_generated=t.context_generated))
        rewards = [s.reward for s in samples]
        stats = {"n": len(samples), "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                 "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0}
        if result.team_reward is not None:
            stats["team_reward"] = float(result.team_reward)
        stats.update({f"episode.{k}": float(v) for k, v in result.metrics.items()})
        policy = roles_of[role]
        if not samples:
            return TrajectoryGroup(task.task_id, task.prompt_id, policy, self.node_id, prompt_ids, [],
                                   task.scheduled_versions.get(policy, task.scheduled_version), started, time.time(),
                                   status="failed", error=f"workflow {task.workflow!r} returned no trajectory for "
                                                          f"role {role!r}",
                                   role=role if task.roles else "", role_policies=dict(task.roles))
        return TrajectoryGroup(task.task_id, task.prompt_id, policy, self.node_id, prompt_ids, samples,
                               task.scheduled_versions.get(policy, task.scheduled_version), started, time.time(),
                               role=role if task.roles else "",
                               roles=writers if task.roles or len(writers) > 1 else [],
                               role_policies=dict(task.roles), stats=stats if task.roles else {})

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["CALL_WAIT_S", "CallBatcher", "EngineWaitTimeout", "EpisodeRunner", "EpisodesFailing", "FailureStreak",
           "deterministic"]
