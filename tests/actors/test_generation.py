"""Role calls across pools over the real broker: requests on ``generate.<p>``, replies on
``replies``; a poll's requests are one engine call; a dead server's request is served by
whoever holds its partition once the group changes (the e2e test SIGKILLs a whole pool)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from astraflow.actors.generation import GenerationClient, GenerationServer, RemoteCallFailed
from astraflow.engines.base import PromptRow, SamplingParams, generated_context
from astraflow.topics import JobTopics, ensure_topics
from tests.waiting import wait_until


@pytest.fixture
def topics(bootstrap):
    t = JobTopics(job=f"gen-{uuid.uuid4().hex[:8]}", policies=("solver", "verifier"), task_partitions=2,
                  trajectory_partitions=2, generation=True)
    ensure_topics(bootstrap, t.specs())
    return t


@pytest.fixture(scope="module")
def tok_engine():
    from transformers import AutoTokenizer

    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.engines.cpu import CpuEngine
    path = ensure_tiny_model()
    engine = CpuEngine(path)
    yield AutoTokenizer.from_pretrained(str(path)), engine
    engine.close()


def _server(bootstrap, topics, tok, engine, node_id, calls, contexts=None):
    def run(prompts, params, seeds):
        calls.append(len(prompts))
        if contexts is not None:  # each row's generated-context count, as the engine is handed it
            contexts.append(sorted(generated_context(p) for p in prompts))
        return engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    def params(sampling):
        return SamplingParams(temperature=float(sampling.get("temperature", 1.0)),
                              max_new_tokens=int(sampling.get("max_new_tokens", 4)),
                              stop_token_ids=(tok.eos_token_id,))
    return GenerationServer(bootstrap, topics, "verifier", node_id, run, params)


def _serve_until(server, stop: threading.Event):
    while not stop.is_set():
        server.serve(50)


def test_concurrent_calls_are_answered_from_one_engine_call(bootstrap, topics, tok_engine):
    tok, engine = tok_engine
    calls: list[int] = []
    contexts: list[list[int]] = []
    server = _server(bootstrap, topics, tok, engine, "raas-verifier-0", calls, contexts)
    client = GenerationClient(bootstrap, topics, "raas-solver-0", timeout_s=120)
    # episode 1's rows carry 2 tokens a model generated (an answer as context): the request says so
    prompts = {i: [PromptRow(tok.encode(f"{i}+1=", add_special_tokens=False), 2 * i)] * 3 for i in range(2)}
    out: dict = {}
    sampling = {"temperature": 1.0, "max_new_tokens": 4}

    def call(i):
        out[i] = client.generate("verifier", "verifier", f"ep{i}", prompts[i], [10 * i + j for j in range(3)],
                                 sampling, tok)
    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both requests are on the topic before the server polls
        stop = threading.Event()
        srv = threading.Thread(target=_serve_until, args=(server, stop))
        srv.start()
        for t in threads:
            t.join(120)
        stop.set()
        srv.join(30)
    finally:
        client.close()
        server.close()
    assert sorted(out) == [0, 1]
    assert calls == [6], "the two requests of one poll must be one engine call"
    assert contexts == [[0, 0, 0, 2, 2, 2]]
    for i in range(2):
        turns = out[i]
        assert [t.prompt_ids for t in turns] == [tuple(p) for p in prompts[i]]
        assert [t.context_generated for t in turns] == [2 * i] * 3
        assert all(t.role == "verifier" and t.policy == "verifier" for t in turns)
        # the reply is the sample the seeds decide: the same rows generated locally agree
        local = engine.generate(prompts[i], SamplingParams(temperature=1.0, max_new_tokens=4,
                                                           stop_token_ids=(tok.eos_token_id,)),
                                seeds=[10 * i + j for j in range(3)])
        assert [t.tokens for t in turns] == [g.tokens for g in local]


def test_a_call_nobody_answers_fails_the_episode_with_its_cause(bootstrap, topics, tok_engine):
    tok, _ = tok_engine
    client = GenerationClient(bootstrap, topics, "raas-solver-0", timeout_s=2)
    try:
        with pytest.raises(RemoteCallFailed, match="no reply from pool 'verifier' within 2s"):
            client.generate("verifier", "verifier", "ep9", [[5, 6]], [1], {}, tok)
    finally:
        client.close()


def test_a_request_is_served_by_whoever_holds_its_partition_after_the_group_changes(bootstrap, topics, tok_engine):
    tok, engine = tok_engine
    client = GenerationClient(bootstrap, topics, "raas-solver-0", timeout_s=120)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(turns=client.generate(
        "verifier", "verifier", "ep5", [tok.encode("2+2=", add_special_tokens=False)], [3],
        {"max_new_tokens": 4}, tok)))
    try:
        t.start()
        time.sleep(1.0)
        # a server that joined the group and leaves it without answering or committing
        dead = _server(bootstrap, topics, tok, engine, "raas-verifier-dead", [])
        dead.consumer.raw.poll(0)  # joined, nothing processed
        calls: list[int] = []
        alive = _server(bootstrap, topics, tok, engine, "raas-verifier-1", calls)
        dead.consumer.close()  # leaves the group: its partitions move to the live member
        stop = threading.Event()
        srv = threading.Thread(target=_serve_until, args=(alive, stop))
        srv.start()
        t.join(120)
        stop.set()
        srv.join(30)
        alive.close()
    finally:
        client.close()
    assert len(result["turns"]) == 1 and calls == [1]


def _joined(server, polls: int = 60) -> None:
    for _ in range(polls):
        server.serve(250)
        meta = server.consumer.group_metadata()
        if meta.generation_id >= 0 and server.consumer.assignment():
            return
    raise AssertionError(f"{server.node_id} never joined its group")


def test_a_commit_refused_by_a_rebalance_is_fenced_and_the_new_owner_answers_once(bootstrap, topics, tok_engine,
                                                                                 expel_silently):
    """The group rebalances while a server answers (here: it stops heartbeating and the broker
    expels it, as it does a member whose session expired): its synchronous commit is refused
    (kafka-python's CommitFailedError). The server must not crash: the request is counted
    fenced, the partition's new owner answers it from the committed offset, and the episode
    keeps one answer (the repeat reply is dropped by request id)."""
    from kafka import KafkaConsumer, TopicPartition

    tok, engine = tok_engine
    group = topics.generation_group("verifier")
    holder: dict = {}

    def expelled_while_generating(prompts, params, seeds):
        expel_silently(holder["a"].consumer, group, timeout_s=40, pause_s=0.5)
        holder["ran"] = True
        return engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    def params(sampling):
        return SamplingParams(temperature=1.0, max_new_tokens=int(sampling.get("max_new_tokens", 4)),
                              stop_token_ids=(tok.eos_token_id,))

    a = holder["a"] = GenerationServer(bootstrap, topics, "verifier", "raas-verifier-a", expelled_while_generating,
                                       params)
    client = GenerationClient(bootstrap, topics, "raas-solver-0", timeout_s=120)
    result: dict = {}
    caller = threading.Thread(target=lambda: result.update(turns=client.generate(
        "verifier", "verifier", "ep-fence", [tok.encode("3+3=", add_special_tokens=False)], [4],
        {"max_new_tokens": 4}, tok)))
    b = None
    try:
        _joined(a)
        caller.start()
        # a.serve: before the fix, CommitFailedError out of here
        wait_until(lambda: "ran" in holder, 60, "server a never got the request", step=lambda: a.serve(500))
        assert (a.fenced, a.served) == (1, 0)
        assert a.consumer.pending_offsets() == {}  # the void offset is not tried again
        caller.join(60)
        assert len(result["turns"]) == 1  # a's reply arrived before its commit was refused

        calls_b: list[int] = []
        b = _server(bootstrap, topics, tok, engine, "raas-verifier-b", calls_b)
        wait_until(lambda: b.served, 60, "the request's new owner never got it", step=lambda: b.serve(250))
        assert calls_b == [1] and b.fenced == 0
        a.serve(100)  # a goes on (rejoining); nothing to answer again: b committed it
        assert a.served + b.served == 1
    finally:
        caller.join(5)
        client.close()
        a.close()
        if b is not None:
            b.close()

    # Conservation on the topics: the request's offset committed once; two replies for it
    # on ``replies`` (at-least-once), of which the episode took one.
    probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topics.generate("verifier"), p) for p in range(topics.task_partitions)]
        assert sum(probe.committed(tp) or 0 for tp in parts) == 1
    finally:
        probe.close()
    assert client.calls == 1


def _end_offsets(bootstrap, topic) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition
    probe = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in probe.partitions_for_topic(topic)]
        return {tp.partition: end for tp, end in probe.end_offsets(parts).items()}
    finally:
        probe.close()


def test_a_node_reads_only_its_reply_partition_and_decodes_only_its_own_replies(bootstrap, topics, tok_engine,
                                                                                  monkeypatch):
    """Before: every node read every partition of ``replies`` and decoded every reply of every
    node (then dropped the others' by request id), a cost that grows with the pool."""
    import collections

    from astraflow.topics import consumer as consumer_mod

    tok, engine = tok_engine
    real_decode = consumer_mod.decode
    decoded: collections.Counter = collections.Counter()

    def counting_decode(value, headers):
        msg = real_decode(value, headers)
        decoded[(threading.current_thread().name, type(msg).__name__)] += 1
        return msg
    monkeypatch.setattr(consumer_mod, "decode", counting_decode)

    # Two requesters that share a reply partition (the header check is what keeps them apart)
    # and one on another partition.
    pick = getattr(topics, "reply_partition", lambda node: 0)
    names = [f"raas-solver-{i}" for i in range(64)]
    quiet = names[0]
    busy = next(n for n in names[1:] if pick(n) == pick(quiet))
    other = next((n for n in names[1:] if pick(n) != pick(quiet)), names[-1])
    ends_before = _end_offsets(bootstrap, topics.replies)
    clients = {n: GenerationClient(bootstrap, topics, n, timeout_s=120) for n in (quiet, busy, other)}
    calls: list[int] = []
    server = _server(bootstrap, topics, tok, engine, "raas-verifier-0", calls)
    stop = threading.Event()
    srv = threading.Thread(target=_serve_until, args=(server, stop))
    out: dict = {}
    prompt = [tok.encode("1+2=", add_special_tokens=False)]

    def call(node, i):
        out[(node, i)] = clients[node].generate("verifier", "verifier", f"ep-{node}-{i}", prompt, [i],
                                                {"max_new_tokens": 2}, tok)
    callers = [threading.Thread(target=call, args=(busy, i)) for i in range(5)]
    callers += [threading.Thread(target=call, args=(other, i)) for i in range(3)]
    callers.append(threading.Thread(target=call, args=(quiet, 0)))
    try:
        srv.start()
        for t in callers:
            t.start()
        for t in callers:
            t.join(120)
        time.sleep(1.0)  # every reply is on the topic and has been read by now
    finally:
        stop.set()
        srv.join(30)
        server.close()
        for c in clients.values():
            c.close()
    assert len(out) == 9 and all(len(turns) == 1 for turns in out.values())
    for node, mine in ((quiet, 1), (busy, 5), (other, 3)):
        assert decoded[(f"{node}-replies", "GenerationReply")] == mine, (node, dict(decoded))
        assert {tp.partition for tp in clients[node].consumer.assignment()} == {pick(node)}
    # the quiet node shares its partition with the busy one: it passed over those undecoded.
    # Replies are at-least-once (a request redone after a rebalance is answered twice, and a
    # second answer is passed over by its own node too), so count what is on each partition.
    on_partition = {p: end - ends_before.get(p, 0) for p, end in _end_offsets(bootstrap, topics.replies).items()}
    assert on_partition[pick(quiet)] >= 6 and on_partition.get(pick(other), 0) >= 3, on_partition
    assert clients[quiet].consumer.skipped == on_partition[pick(quiet)] - 1 >= 5
    assert clients[other].consumer.skipped == on_partition[pick(other)] - 3


def test_a_concurrent_engine_is_handed_the_next_polls_requests_while_a_call_runs(bootstrap, topics, tok_engine):
    """A server on an engine that batches concurrent calls (``concurrent=True``) keeps polling
    while a call runs: the second request is answered while the first call is still in the
    engine, and both are committed once both replies are out."""
    tok, engine = tok_engine
    first_in, release, calls, overlap = threading.Event(), threading.Event(), [], []

    def run(prompts, params, seeds):
        calls.append(len(prompts))
        if len(calls) == 1:
            first_in.set()
            release.wait(60)  # the first call stays in the engine until the second is answered
        else:
            overlap.append(not release.is_set())
        return engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    server = GenerationServer(bootstrap, topics, "verifier", "raas-verifier-c", run,
                              lambda s: SamplingParams(temperature=1.0, max_new_tokens=4,
                                                       stop_token_ids=(tok.eos_token_id,)), concurrent=True)
    client = GenerationClient(bootstrap, topics, "raas-solver-c", timeout_s=120)
    prompt = [tok.encode("3+1=", add_special_tokens=False)]
    out: dict = {}
    stop = threading.Event()
    srv = threading.Thread(target=_serve_until, args=(server, stop))
    try:
        srv.start()
        a = threading.Thread(target=lambda: out.setdefault(0, client.generate("verifier", "verifier", "ep0", prompt,
                                                                               [1], {}, tok)))
        a.start()
        assert first_in.wait(60)
        out[1] = client.generate("verifier", "verifier", "ep1", prompt, [2], {}, tok)  # answered meanwhile
        assert server.served == 0  # nothing committed while a call is in flight
        release.set()
        a.join(60)
        wait_until(lambda: server.served >= 2, 30, "the second poll was never committed", interval_s=0.1)
    finally:
        release.set()
        stop.set()
        srv.join(30)
        client.close()
        server.close()
    assert overlap == [True] and sorted(out) == [0, 1] and server.served == 2 and server.calls == 2


def test_a_server_that_always_has_a_call_in_flight_still_commits_what_it_answered(bootstrap, topics, tok_engine):
    """Before: a concurrent server committed only when no call at all was in flight, so under
    steady load (a new poll's call always starting before the last ended) it committed
    nothing (seen at 32 emulated devices: 625 requests, 512 replies, 0 committed). Now a
    poll is committed once it and every poll before it are answered, while later polls run."""
    from kafka import KafkaConsumer, TopicPartition
    tok, engine = tok_engine
    b_in, release, calls = threading.Event(), threading.Event(), []

    def run(prompts, params, seeds):
        calls.append(len(prompts))
        if len(calls) == 1:
            assert b_in.wait(60)  # the first call ends only once the second is in the engine
        else:
            b_in.set()
            release.wait(60)  # the second stays in the engine until the test has looked
        return engine.generate([list(p) for p in prompts], params, seeds=list(seeds))

    server = GenerationServer(bootstrap, topics, "verifier", "raas-verifier-p", run,
                              lambda s: SamplingParams(temperature=1.0, max_new_tokens=4,
                                                       stop_token_ids=(tok.eos_token_id,)), concurrent=True)
    assert server.max_calls_in_flight == 8
    client = GenerationClient(bootstrap, topics, "raas-solver-p", timeout_s=120)
    prompt = [tok.encode("3+1=", add_special_tokens=False)]
    out: dict = {}
    stop = threading.Event()
    srv = threading.Thread(target=_serve_until, args=(server, stop))
    group = topics.generation_group("verifier")
    parts = [TopicPartition(topics.generate("verifier"), p) for p in range(topics.task_partitions)]

    def committed() -> int:
        probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        try:
            return sum(probe.committed(tp) or 0 for tp in parts)
        finally:
            probe.close()
    try:
        srv.start()
        callers = [threading.Thread(target=lambda i=i: out.setdefault(i, client.generate(
            "verifier", "verifier", f"ep{i}", prompt, [i], {}, tok))) for i in range(2)]
        callers[0].start()
        deadline = time.monotonic() + 60  # for the three waits below together
        wait_until(lambda: calls, deadline - time.monotonic(), "the first request never reached the engine")
        callers[1].start()
        callers[0].join(60)
        assert 0 in out and 1 not in out and not release.is_set()
        # the first poll is committed with the second still in the engine
        wait_until(lambda: server.served >= 1, deadline - time.monotonic(), "the answered poll was never committed")
        assert server.served == 1 and committed() == 1 and 1 not in out
        release.set()
        callers[1].join(60)
        wait_until(lambda: server.served >= 2, deadline - time.monotonic(), "the second poll was never committed")
    finally:
        release.set()
        stop.set()
        srv.join(30)
        client.close()
        server.close()
    assert sorted(out) == [0, 1] and server.served == 2 and committed() == 2 and server.fenced == 0


def test_a_servers_calls_in_flight_grow_with_its_nodes_devices(bootstrap, topics, tok_engine):
    tok, engine = tok_engine
    server = GenerationServer(bootstrap, topics, "verifier", "raas-verifier-d", lambda *a: [], lambda s: None,
                              concurrent=True, devices=4)
    try:
        assert server.max_calls_in_flight == 4 * 8 and server._workers._max_workers == 32
    finally:
        server.close()
