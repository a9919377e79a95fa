from kafka import TopicPartition

from astraflow.topics import Prompt, TrajectoryGroup

from .samples import GROUP


def _drain(consumer, want: int | None = None, polls: int = 6):
    got = []
    for _ in range(polls):
        got.extend(consumer.poll(1500))
        if want is not None and len(got) >= want:
            break
    return got


def _abort_one(p, topic: str, msg) -> None:
    """Write ``msg`` in a transaction that fails after the record reached the broker."""
    try:
        with p.transaction():
            p.send(topic, msg)
            p.flush()
            raise RuntimeError("fail mid-transaction")
    except RuntimeError:
        pass


def test_aborted_records_invisible_to_read_committed(job_topics, make_producer, make_consumer):
    p = make_producer(client_id="tx", transactional_id=f"{job_topics.job}-tx")
    topic = job_topics.prompts
    with p.transaction():
        p.send(topic, Prompt("kept-1", "a", "1"))
    _abort_one(p, topic, Prompt("aborted", "b", "2"))
    with p.transaction():
        p.send(topic, Prompt("kept-2", "c", "3"))

    committed = make_consumer(topics=[topic], group_id="rc")
    ids = [d.message.prompt_id for d in _drain(committed, 2)]
    assert ids == ["kept-1", "kept-2"]

    uncommitted = make_consumer(topics=[topic], group_id="ru", isolation_level="read_uncommitted")
    ids = [d.message.prompt_id for d in _drain(uncommitted, 3)]
    assert ids == ["kept-1", "aborted", "kept-2"]


def test_consume_transform_produce_commits_offsets_atomically(job_topics, make_producer, make_consumer):
    src, dst = job_topics.tasks("policy"), job_topics.trajectories
    feeder = make_producer()
    for i in range(4):
        feeder.send(src, Prompt(f"p{i}", "x", "y"), partition=0)
    feeder.flush()

    group = "ctp"
    consumer = make_consumer(topics=[src], group_id=group)
    p = make_producer(transactional_id=f"{job_topics.job}-ctp")
    first = _drain(consumer, 4)
    assert len(first) == 4
    # aborted: output invisible and offsets not committed
    try:
        with p.transaction():
            p.send(dst, GROUP)
            p.send_offsets(consumer)
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    tp = TopicPartition(src, 0)
    assert consumer.committed(tp) in (None, -1)
    # committed: output visible and offsets committed together
    with p.transaction():
        p.send(dst, GROUP)
        p.send_offsets(consumer, {tp: 4})
    assert consumer.committed(tp) == 4
    out = make_consumer(topics=[dst], group_id="ctp-out")
    got = _drain(out, 1, polls=3)
    assert [type(d.message) for d in got] == [TrajectoryGroup]


def _describe_transaction(bootstrap, transactional_id):
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_transactions([transactional_id])[transactional_id]
    finally:
        admin.close()


def test_transaction_timeout_defaults_to_30s_and_is_configurable(bootstrap, job_topics, make_producer):
    # What the broker holds is what bounds a dead producer's open transaction.
    default = make_producer(client_id="tx", transactional_id=f"{job_topics.job}-default")
    short = make_producer(client_id="tx", transactional_id=f"{job_topics.job}-short", transaction_timeout_ms=5_000)
    for p in (default, short):
        with p.transaction():
            p.send(job_topics.prompts, Prompt("p", "a", "1"))
    assert _describe_transaction(bootstrap, f"{job_topics.job}-default").transaction_timeout_ms == 30_000
    assert _describe_transaction(bootstrap, f"{job_topics.job}-short").transaction_timeout_ms == 5_000


def test_timeout_above_the_broker_maximum_is_a_clear_error(job_topics, make_producer):
    import pytest

    from astraflow.topics import ProduceError
    with pytest.raises(ProduceError, match="transaction.max.timeout.ms.*kafka.transaction_timeout_ms"):
        make_producer(client_id="tx", transactional_id=f"{job_topics.job}-long", transaction_timeout_ms=1_000_000)


def test_close_with_unsent_records_stops_the_producer_instead_of_raising(bootstrap, job_topics):
    """kafka-python's close(timeout=0) raises from its flush while records are unsent, and then
    never stops its sender thread; the wrapper (which closes a stuck transactional producer
    this way) must stop it and fail those records."""
    from astraflow.topics import Producer

    p = Producer(bootstrap, client_id="closer", transactional_id=f"{job_topics.job}-closer", linger_ms=60_000)
    p._kp.begin_transaction()
    future = p.send(job_topics.prompts, Prompt("p-unsent", "x", "1"), key="p-unsent")
    p.close(timeout=0)
    p._kp._sender.join(10)
    assert not p._kp._sender.is_alive()
    assert future.is_done and not future.succeeded()


def test_the_last_records_of_a_transactional_topic_skip_its_markers(bootstrap, job_topics, make_producer):
    """Each transaction leaves a commit (or abort) marker at an offset of its own, so the topic's
    last offset is never a record: ``read_topic(tail=n)`` still returns its last n records (the
    chaos runner's rogue writer and the dataflow's replay buffer read batches this way)."""
    from astraflow.topics.replay import read_topic
    p = make_producer(client_id="tx", transactional_id=f"{job_topics.job}-tail")
    topic = job_topics.prompts
    for i in range(5):
        with p.transaction():
            p.send(topic, Prompt(f"p{i}", "a", "1"))
    _abort_one(p, topic, Prompt("aborted", "b", "2"))
    tail = lambda n: [m.prompt_id for _, _, m in read_topic(bootstrap, topic, tail=n)]  # noqa: E731
    assert tail(1) == ["p4"]
    assert tail(3) == ["p2", "p3", "p4"]
    assert tail(9) == [f"p{i}" for i in range(5)]
