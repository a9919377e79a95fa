"""Role calls across pools: a role of one policy's episode served by another policy's pool.

The request path is Kafka, like everything else between components:

* the episode's runner (a RaaS node of the lead policy) sends a
  :class:`~astraflow.topics.GenerationRequest` to ``generate.<policy>``, keyed by episode,
  and waits for the :class:`~astraflow.topics.GenerationReply` with its ``request_id`` on
  ``replies`` (:class:`GenerationClient`; one background thread reads the node's own
  partition of ``replies``, ``JobTopics.reply_partition(node id)``, from where it stood
  when the node started). The request names that partition and the server answers there,
  with the request id in the record's ``af-request`` header: a node fetches only its
  partition and decodes only the replies it waits for (another node's that shares the
  partition, or a repeated answer, is passed over undecoded), so what a node reads does
  not grow with the number of nodes;
* every RaaS node of ``policy`` is a member of consumer group ``gen.<policy>`` and serves
  requests between its own work (:class:`GenerationServer`); it commits a request's offset
  after sending the reply. A commit the group refuses because it rebalanced meanwhile
  (``CommitFailedError``: the member was kicked out or its session expired) is the task
  path's fencing: the server counts those requests ``fenced``, not served, and goes on;
  their new owner answers them again.

Delivery is at-least-once and that is enough: a server that dies before committing leaves
the request to the next member, a repeated reply is the same sample (the request carries
the seeds) and the client keeps the first. The exactly-once unit stays the episode: its
runner writes every role's groups in one transaction with the task offset, or nothing.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from astraflow.engines.base import Generation, PromptRow, SamplingParams, generated_context
from astraflow.topics import (Consumer, DeadLetters, GenerationReply, GenerationRequest, JobTopics, Producer,
                              StaleMembershipError, TopicPartition)
from astraflow.topics.codec import header
from astraflow.topics.membership import MembershipWatch
from astraflow.workflows.api import Turn

from .common import close_quietly

log = logging.getLogger(__name__)

#: header of a reply record: the ``request_id`` it answers (read before the value is decoded)
H_REQUEST = "af-request"

#: how long an episode waits for another pool's answer before the episode fails (a failed
#: episode is recorded, dropped with its reason, and its slot is scheduled again)
REPLY_TIMEOUT_S = 300.0

#: engine calls a server keeps in flight at once, per device of its node, on an engine that
#: batches concurrent calls (each a poll's requests of one sampling setting); it stops polling
#: while that many run. Per device: a fixed cap let a 4-device verifier node take no more
#: requests at once than a 1-device one, and at 32 emulated devices the solver's calls waited
#: past their reply timeout behind it.
MAX_CALLS_IN_FLIGHT = 8


class RemoteCallFailed(RuntimeError):
    pass


class GenerationClient:
    """Sends role calls to other pools and hands each reply to the thread waiting for it."""

    def __init__(self, bootstrap: str, topics: JobTopics, node_id: str, dead_letters: DeadLetters | None = None,
                 timeout_s: float = REPLY_TIMEOUT_S, producer: Producer | None = None) -> None:
        self.topics, self.node_id, self.timeout_s = topics, node_id, timeout_s
        # the node's own (non-transactional) producer when given: fewer clients, fewer I/O threads
        self._own_producer = producer is None
        self.producer = producer or Producer(bootstrap, client_id=f"{node_id}.gen-client")
        self.partition = topics.reply_partition(node_id)
        parts = [TopicPartition(topics.replies, self.partition)]
        self._waiting: dict[str, tuple[threading.Event, list]] = {}
        self.consumer = Consumer(bootstrap, partitions=parts, client_id=f"{node_id}.gen-client",
                                 dead_letters=dead_letters, expect=(GenerationReply,), accept=self._awaited)
        self.consumer.seek_to_end(*parts)  # resolved now: replies to this node's requests come after
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._nonce = f"{node_id}.{os.getpid()}.{int(time.time() * 1000) % 10**9}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"{node_id}-replies", daemon=True)
        self._thread.start()
        self.calls = 0
        self.wait_s = 0.0

    def _awaited(self, key: bytes | None, headers: list[tuple[str, bytes]]) -> bool:
        """Decode a reply only if a call of this node waits for it (by its ``af-request``
        header; a reply without one, from an older server, is decoded to find out)."""
        request_id = header(headers, H_REQUEST)
        if request_id is None:
            return True
        with self._lock:
            return request_id.decode("utf-8", "replace") in self._waiting

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                deliveries = self.consumer.poll(200)
            except Exception:  # noqa: BLE001 - a closed client on the way out
                if self._stop.is_set():
                    return
                log.warning("reading %s failed; retrying", self.topics.replies, exc_info=True)
                time.sleep(0.5)
                continue
            for d in deliveries:
                reply = d.message
                with self._lock:
                    slot = self._waiting.pop(reply.request_id, None)
                if slot is not None:  # else: a duplicate, or the answer to a request of another node
                    slot[1].append(reply)
                    slot[0].set()

    def generate(self, role: str, policy: str, episode_id: str, prompts: Sequence[Sequence[int]],
                 seeds: Sequence[int], sampling: dict, tokenizer) -> list[Turn]:
        request_id = f"{self._nonce}.{next(self._ids)}"
        event, box = threading.Event(), []
        with self._lock:
            self._waiting[request_id] = (event, box)
        generated = [generated_context(p) for p in prompts]
        req = GenerationRequest(request_id, episode_id, policy, role, [list(p) for p in prompts], list(seeds),
                                dict(sampling), ts=time.time(), reply_partition=self.partition,
                                context_generated=generated if any(generated) else [])
        t0 = time.monotonic()
        self.producer.send(self.topics.generate(policy), req, key=episode_id)
        self.producer.flush()
        if not event.wait(self.timeout_s):
            with self._lock:
                self._waiting.pop(request_id, None)
            raise RemoteCallFailed(f"role {role!r}: no reply from pool {policy!r} within {self.timeout_s:.0f}s "
                                   f"(request {request_id})")
        self.calls += 1
        self.wait_s += time.monotonic() - t0
        reply: GenerationReply = box[0]
        if reply.error:
            raise RemoteCallFailed(f"role {role!r}: pool {policy!r} node {reply.node_id} failed: {reply.error}")
        per_token = reply.token_versions or [[]] * len(reply.tokens)
        return [Turn(tuple(p), tuple(t), tuple(lp), v, fr, tokenizer.decode(list(t), skip_special_tokens=True),
                     role, policy, tuple(tv), g)
                for p, t, lp, v, fr, tv, g in zip(prompts, reply.tokens, reply.logprobs, reply.versions,
                                                 reply.finish_reasons, per_token, generated)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        close_quietly(self.consumer, self.producer if self._own_producer else None)


class GenerationServer:
    """Serves ``generate.<policy>`` with this node's engine (consumer group ``gen.<policy>``).

    Versions: a request names no version (``min_version`` was retired: written, never
    enforced). The server answers with the weights its node holds when it serves the
    request (``run`` takes the newest the subscriber has, between engine calls) and every
    reply row carries the version that generated it, which the episode keeps per token
    (``Turn.version``); the serving policy's dataflow bounds the staleness of those tokens
    like any other, and a lockstep job's barrier is the dataflow's, not the server's.
    """

    def __init__(self, bootstrap: str, topics: JobTopics, policy: str, node_id: str,
                 run: Callable[[Sequence[Sequence[int]], SamplingParams, Sequence[int]], list[Generation]],
                 params: Callable[[dict], SamplingParams], dead_letters: DeadLetters | None = None,
                 producer: Producer | None = None, concurrent: bool = False, devices: int = 1) -> None:
        self.topics, self.policy, self.node_id, self.run, self.params = topics, policy, node_id, run, params
        self._own_producer = producer is None
        self.producer = producer or Producer(bootstrap, client_id=f"{node_id}.gen-server")
        self._new_consumer = lambda: Consumer(
            bootstrap, topics=[topics.generate(policy)], group_id=topics.generation_group(policy),
            client_id=f"{node_id}.gen-server", dead_letters=dead_letters, max_poll_records=8,
            session_timeout_ms=10_000, heartbeat_interval_ms=2_000,
            sticky=True, expect=(GenerationRequest,), redo_lost=True)
        self.consumer = self._new_consumer()
        # The consumer wedge of the task consumer (actors/rollout.py) can hit this one too;
        # nothing is in flight between serve() calls, so a replacement loses nothing.
        self.watch = MembershipWatch(bootstrap, f"{node_id}.gen-server")  # .renewals: consumers replaced
        self.served = 0  #: requests answered and committed
        self.rows = 0
        self.fenced = 0  #: requests answered but not committed: the group rebalanced (redone by their new owner)
        self.calls = 0  #: engine calls made for the requests served
        #: an engine that batches concurrent calls itself is handed each poll's call at once, on
        #: a thread of its own, while the next poll goes on; a poll's offsets are committed once
        #: its replies and those of every poll before it are sent (at-least-once, as before), so
        #: a server that always has calls in flight still commits what it has answered
        self.concurrent = concurrent
        self.max_calls_in_flight = MAX_CALLS_IN_FLIGHT * max(1, int(devices))
        self._workers = ThreadPoolExecutor(self.max_calls_in_flight, thread_name_prefix=f"{node_id}-serve") \
            if concurrent else None
        self._in_flight: list[Future] = []
        #: per poll whose offsets are not committed yet, in order: its calls and its deliveries
        self._polls: list[tuple[list[Future], list]] = []
        self._count = threading.Lock()
        self._answering, self._busy_from = 0, 0.0  #: calls being answered now, since when
        #: seconds spent answering (engine calls and replies, while any is under way; their commit), not
        #: polling an empty topic:
        #: the pool's work for other policies' episodes, which its autoscaler counts as demand
        self.busy_s = 0.0

    def serve(self, timeout_ms: int = 50) -> int:
        """Answer what is waiting (at most one poll); returns the requests answered (committed).
        The requests of a poll that share sampling settings are answered by one engine call,
        as a node batches its own episodes' calls; a concurrent engine's calls run on while
        this returns."""
        for f in [f for f in self._in_flight if f.done()]:
            f.result()  # a reply that could not be sent fails the step, as it does when served inline
        self._in_flight = [f for f in self._in_flight if not f.done()]
        if not self._in_flight and not self._polls:  # nothing of the consumer's is pending
            self.consumer = self.watch.renew(self.consumer, self._new_consumer)
        # At the limit (calls held back while a weight load waits, or a long call) the request
        # partitions are paused, not left unpolled: the poll keeps this member's group membership
        # current, so a rebalance never waits on it.
        self.consumer.hold(len(self._in_flight) >= self.max_calls_in_flight)
        deliveries = self.consumer.poll(timeout_ms)
        if deliveries:
            self.watch.saw_records()
        by_sampling: dict[str, list[GenerationRequest]] = {}
        for d in deliveries:
            by_sampling.setdefault(repr(sorted(d.message.sampling.items())), []).append(d.message)
        calls: list[Future] = []
        for reqs in by_sampling.values():
            if self._workers is not None:
                calls.append(self._workers.submit(self._answer, reqs))
            else:
                self._answer(reqs)
        self._in_flight.extend(calls)
        if deliveries:
            self._polls.append((calls, deliveries))
        if self._in_flight:
            return self._commit_answered_prefix()
        deliveries = [d for _, polled in self._polls for d in polled]
        self._polls = []
        return self._commit(deliveries, None)

    def _commit_answered_prefix(self) -> int:
        """With calls still in flight: commit the polls answered so far whose every earlier
        poll is answered too (offsets are positions: a later poll's answer cannot be committed
        past an earlier poll still in the engine)."""
        done: list = []
        while self._polls and all(f.done() for f in self._polls[0][0]):
            for f in self._polls[0][0]:
                f.result()  # a reply that could not be sent fails the step, as it does when served inline
            done.extend(self._polls.pop(0)[1])
        if not done:
            return 0
        offsets: dict[TopicPartition, int] = {}
        for d in done:
            tp = TopicPartition(d.topic, d.partition)
            offsets[tp] = max(offsets.get(tp, 0), d.offset + 1)
        return self._commit(done, offsets)

    def _commit(self, deliveries: list, offsets: dict[TopicPartition, int] | None) -> int:
        """Commit ``offsets`` (None: everything handed out) once the replies are flushed;
        returns the requests served, 0 when the group rebalanced first (they are fenced)."""
        t0 = time.monotonic()
        if deliveries or self.consumer.pending_offsets():
            self.producer.flush()
            try:
                # a prefix, too, only under the membership its records were handed out in
                self.consumer.commit(offsets, check_membership=True)
            except StaleMembershipError as e:
                # The group rebalanced while these were answered (this member was kicked out,
                # its session expired): their partitions' owner is handed them again from the
                # committed offset and answers them too. Our replies are out already and the
                # episode keeps the first per request_id, so the repeat is dropped there; here
                # they count as fenced, not served. The next poll rejoins.
                log.warning("%s: %s", self.node_id, e)
                self.fenced += len(deliveries)
                self.busy_s += time.monotonic() - t0
                return 0
        self.busy_s += time.monotonic() - t0 if deliveries else 0.0
        self.served += len(deliveries)
        self.rows += sum(len(d.message.prompts) for d in deliveries)
        return len(deliveries)

    def _answer(self, reqs: list[GenerationRequest]) -> None:
        """One engine call for requests sharing sampling settings, a reply for each (an error
        reply when the call fails: the episodes fail with the cause, the node goes on). The time
        while at least one call is being answered counts as :attr:`busy_s`."""
        with self._count:
            if not self._answering:
                self._busy_from = time.monotonic()
            self._answering += 1
        try:
            self._answer_now(reqs)
        finally:
            with self._count:
                self._answering -= 1
                if not self._answering:
                    self.busy_s += time.monotonic() - self._busy_from

    def _answer_now(self, reqs: list[GenerationRequest]) -> None:
        rows = [PromptRow(p, g) for r in reqs
                for p, g in zip(r.prompts, r.context_generated or [0] * len(r.prompts))]
        seeds = [s for r in reqs for s in r.seeds]
        try:
            gens = self.run(rows, self.params(reqs[0].sampling), seeds)
            error = ""
        except Exception as e:  # noqa: BLE001
            log.warning("%s: generation for %d request(s) failed", self.node_id, len(reqs), exc_info=True)
            gens, error = [], f"{type(e).__name__}: {e}"
        i = 0
        for req in reqs:
            mine = gens[i:i + len(req.prompts)]
            i += len(req.prompts)
            reply = GenerationReply(req.request_id, req.episode_id, self.node_id,
                                    [list(g.tokens) for g in mine], [list(g.logprobs) for g in mine],
                                    [g.version for g in mine], [g.finish_reason for g in mine], error=error,
                                    ts=time.time(),
                                    token_versions=[list(g.token_versions) for g in mine]
                                    if any(g.token_versions for g in mine) else [])
            self.producer.send(self.topics.replies, reply, key=req.episode_id,
                               partition=req.reply_partition if req.reply_partition >= 0 else None,
                               headers=[(H_REQUEST, req.request_id.encode())])
        if self.concurrent:  # answered off the node's thread: on the way now, not at the next commit
            self.producer.flush()
        with self._count:
            self.calls += 1

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=True, cancel_futures=False)
        close_quietly(self.consumer, self.watch, self.producer if self._own_producer else None)
