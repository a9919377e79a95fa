import base64

import gc

import orjson
import pytest
from kafka import TopicPartition

from astraflow.topics import DeadLetter, DeadLetters, DecodeError, Prompt
from astraflow.topics import consumer as topics_consumer
from astraflow.topics.codec import encode

from .samples import GROUP

GOOD = Prompt("p-good", "1+1=", "2")


def test_bad_records_go_to_dlq_with_coordinates_and_consumer_continues(job_topics, make_producer,
                                                                      make_consumer):
    producer = make_producer(client_id="feeder")
    topic = job_topics.prompts
    bad = [
        (b"\x00\xffnot json", [("af-type", b"prompt"), ("af-schema", b"1")], "DecodeError"),
        (b'{"x": 1}', [("af-type", b"no-such-type")], "UnknownMessageType"),
        (b'{"prompt_id": "p"}', [("af-type", b"prompt"), ("af-schema", b"99")], "UnsupportedSchema"),
        (b'{"prompt_id": "p"}', [], "DecodeError"),
        # a forged group whose samples are no list: once a TypeError that stopped the consumer
        (orjson.dumps({**orjson.loads(encode(GROUP)[0]), "samples": 5}), [("af-type", b"trajectory-group")],
         "DecodeError"),
    ]
    for value, headers, _ in bad:
        producer.send_raw(topic, value, key=b"k", headers=headers)
    producer.send_sync(topic, GOOD, key="p-good")

    dlq = DeadLetters(make_producer(client_id="dlq-writer"), job_topics.dlq, consumer_name="c1")
    consumer = make_consumer(topics=[topic], group_id="dlq-test", dead_letters=dlq)
    got = []
    while not got:
        got = consumer.poll(5000)
        assert got or dlq.count, "nothing consumed"
    assert [d.message for d in got] == [GOOD]
    assert got[0].offset == len(bad)  # the good record came after all the bad ones
    assert dlq.count == len(bad)
    # the consumer's position covers the dead-lettered records, so a commit skips them
    assert list(consumer.pending_offsets().values()) == [len(bad) + 1]

    reader = make_consumer(topics=[job_topics.dlq], group_id="dlq-reader")
    letters = []
    while len(letters) < len(bad):
        batch = reader.poll(5000)
        assert batch
        letters.extend(d.message for d in batch)
    assert all(isinstance(x, DeadLetter) for x in letters)
    assert [x.offset for x in letters] == list(range(len(bad)))
    assert {x.source_topic for x in letters} == {topic}
    assert [x.error_type for x in letters] == [b[2] for b in bad]
    assert [base64.b64decode(x.value) for x in letters] == [b[0] for b in bad]
    assert all(x.consumer == "c1" and x.partition == 0 for x in letters)
    assert "newer than this code supports" in letters[2].error
    assert "samples: expected a JSON array" in letters[4].error


def test_bad_records_between_good_ones_are_dead_lettered_in_place(job_topics, make_producer, make_consumer):
    """One poll: every good record is handed out in order, each bad one dead-lettered with
    its own offset, and the position covers them all."""
    producer = make_producer()
    topic = job_topics.prompts
    for i in range(5):
        if i % 2:
            producer.send_raw(topic, b"junk", key=b"k", headers=[("af-type", b"prompt")], partition=0)
        else:
            producer.send(topic, Prompt(f"p{i}", "q", "a"), key=f"p{i}", partition=0)
    producer.flush()
    dlq = DeadLetters(make_producer(), job_topics.dlq, consumer_name="mixed")
    consumer = make_consumer(partitions=[TopicPartition(topic, 0)], dead_letters=dlq)
    got = []
    for _ in range(10):
        got += consumer.poll(2000)
        if len(got) + dlq.count >= 5:
            break
    assert [(d.offset, d.message.prompt_id, d.key) for d in got] == [(0, "p0", "p0"), (2, "p2", "p2"),
                                                                      (4, "p4", "p4")]
    assert dlq.count == 2 and consumer.pending_offsets() == {TopicPartition(topic, 0): 5}
    reader = make_consumer(topics=[job_topics.dlq], group_id="dlq-reader")
    letters = []
    while len(letters) < 2:
        batch = reader.poll(5000)
        assert batch
        letters += [d.message for d in batch]
    assert [(x.offset, x.error_type) for x in letters] == [(1, "DecodeError"), (3, "DecodeError")]


def test_poll_pauses_the_collector_only_while_it_decodes(job_topics, make_producer, make_consumer, monkeypatch):
    """Decoding runs with automatic collection paused; writing a dead letter (it waits for the
    broker) and whatever follows the poll run with it on, and an application's own
    ``gc.disable()`` is left as it was."""
    producer = make_producer()
    topic = job_topics.prompts
    producer.send(topic, Prompt("p0", "q", "a"), partition=0)
    producer.send_raw(topic, b"junk", headers=[("af-type", b"prompt")], partition=0).get(10)
    seen = {"decode": [], "dead letter": []}
    real_decode, real_put = topics_consumer.decode, DeadLetters.put

    def decode(value, headers):
        seen["decode"].append(gc.isenabled())
        return real_decode(value, headers)

    def put(self, *args):
        seen["dead letter"].append(gc.isenabled())
        return real_put(self, *args)

    monkeypatch.setattr(topics_consumer, "decode", decode)
    monkeypatch.setattr(DeadLetters, "put", put)
    dlq = DeadLetters(make_producer(), job_topics.dlq)
    consumer = make_consumer(partitions=[TopicPartition(topic, 0)], dead_letters=dlq)
    got = []
    for _ in range(10):
        got += consumer.poll(2000)
        assert gc.isenabled()
        if got and dlq.count:
            break
    assert len(got) == 1 and dlq.count == 1
    assert seen["decode"] and not any(seen["decode"]) and seen["dead letter"] == [True]

    strict = make_consumer(partitions=[TopicPartition(topic, 0)])  # no dead-letter topic: raises
    with pytest.raises(DecodeError):
        for _ in range(10):
            strict.poll(2000)
    assert gc.isenabled()

    gc.disable()
    try:
        again = make_consumer(partitions=[TopicPartition(topic, 0)], dead_letters=dlq)
        for _ in range(10):
            if again.poll(2000):
                break
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_decode_error_without_dlq_raises(job_topics, make_producer, make_consumer):
    make_producer().send_raw(job_topics.prompts, b"junk", headers=[("af-type", b"prompt")]).get(10)
    consumer = make_consumer(topics=[job_topics.prompts], group_id="strict")
    with pytest.raises(DecodeError):
        for _ in range(10):
            consumer.poll(2000)


def test_records_of_an_unexpected_type_are_dead_lettered_with_their_bytes(job_topics, make_producer,
                                                                         make_consumer):
    from astraflow.topics import Task
    from astraflow.topics.codec import encode
    producer = make_producer()
    value, _ = encode(GOOD)
    producer.send_sync(job_topics.tasks("policy"), GOOD, key="not-a-task", partition=0)
    dlq = DeadLetters(make_producer(), job_topics.dlq, consumer_name="raas")
    consumer = make_consumer(partitions=[TopicPartition(job_topics.tasks("policy"), 0)],
                             dead_letters=dlq, expect=(Task,))
    for _ in range(5):
        assert consumer.poll(2000) == []
        if dlq.count:
            break
    assert dlq.count == 1
    reader = make_consumer(topics=[job_topics.dlq], group_id="dlq-reader")
    letters = []
    while not letters:
        letters = reader.poll(5000)
    letter = letters[0].message
    assert letter.error_type == "DecodeError" and "not prompt" in letter.error
    assert base64.b64decode(letter.value) == value  # the original bytes, not a placeholder


def test_expected_types_can_differ_per_topic(job_topics, make_producer, make_consumer):
    """One consumer on two topics (the dataflow's: trajectories and versions), each with its own
    record type: a record that is right for the other topic is still dead-lettered."""
    from astraflow.topics import Task
    producer = make_producer()
    task = Task("t-1", "p-1", "policy", "1+1=", "2", 4)
    producer.send_sync(job_topics.prompts, GOOD, key="p-good")  # right
    producer.send_sync(job_topics.prompts, task, key="t-1")  # a task on the prompts topic: wrong
    producer.send_sync(job_topics.tasks("policy"), task, key="t-1", partition=0)  # right
    producer.send_sync(job_topics.tasks("policy"), GOOD, key="p-good", partition=0)  # wrong
    dlq = DeadLetters(make_producer(), job_topics.dlq, consumer_name="two-topics")
    consumer = make_consumer(partitions=[TopicPartition(job_topics.prompts, 0),
                                         TopicPartition(job_topics.tasks("policy"), 0)],
                             dead_letters=dlq, expect={job_topics.prompts: (Prompt,),
                                                       job_topics.tasks("policy"): (Task,)})
    got = []
    for _ in range(10):
        got += consumer.poll(1000)
        if len(got) + dlq.count >= 4:
            break
    assert sorted((d.topic, type(d.message).__name__) for d in got) == \
        sorted([(job_topics.prompts, "Prompt"), (job_topics.tasks("policy"), "Task")])
    assert dlq.count == 2


def _letters(bootstrap, topic):
    from astraflow.topics.replay import read_topic
    return [m for _, _, m in read_topic(bootstrap, topic) if isinstance(m, DeadLetter)]


def test_a_record_as_large_as_its_topic_takes_is_dead_lettered_with_its_size_hash_and_a_prefix(
        bootstrap, job_topics, make_producer, make_consumer):
    """Once a 3 MB garbage record on ``trajectories`` stopped its consumer: its letter (the
    whole value, base64) was over the producer's limit, so it could not be written. A letter
    now holds a bounded prefix and names the whole by size and SHA-256."""
    import hashlib
    import os
    from astraflow.topics import TrajectoryGroup
    from astraflow.topics.dead_letters import DEAD_LETTER_VALUE_BYTES
    topic = job_topics.trajectories
    limit = job_topics.max_message_bytes(topic)
    garbage = os.urandom(limit - 64 * 1024)  # random: zstd cannot shrink it below the limit
    raw = make_producer(max_request_size=limit)
    raw.send_raw(topic, garbage, key=b"k" * 5000, headers=[("af-type", b"trajectory-group"), ("x", b"y" * 5000)],
                 partition=0).get(30)
    raw.send_sync(topic, GROUP, key="task-1", partition=0)
    dlq = DeadLetters(make_producer(), job_topics.dlq, consumer_name="dataflow.policy")  # the default limit
    consumer = make_consumer(partitions=[TopicPartition(topic, 0)], dead_letters=dlq,
                             expect=(TrajectoryGroup,))
    got = []
    for _ in range(20):
        got += consumer.poll(2000)
        if got:
            break
    assert [d.offset for d in got] == [1] and dlq.count == 1
    (letter,) = _letters(bootstrap, job_topics.dlq)
    assert (letter.source_topic, letter.partition, letter.offset) == (topic, 0, 0)
    assert letter.error_type == "DecodeError" and "not JSON" in letter.error
    assert letter.value_size == len(garbage) and letter.value_sha256 == hashlib.sha256(garbage).hexdigest()
    assert base64.b64decode(letter.value) == garbage[:DEAD_LETTER_VALUE_BYTES] and letter.truncated
    assert len(base64.b64decode(letter.key)) == 1024 and len(letter.headers["x"]) == 1024


def test_every_topic_takes_what_its_producers_may_send_and_refuses_more_at_the_producer(
        job_topics, make_producer):
    """One limit per topic for both sides: a producer made with a topic's limit gets a record
    of nearly that size acknowledged, and one over it refused before it leaves the producer."""
    import os
    from kafka.errors import MessageSizeTooLargeError
    from astraflow.topics.registry import BATCH_RECORD_MAX_BYTES, RECORD_MAX_BYTES
    specs = {s.name: s.max_message_bytes for s in job_topics.specs()}
    assert specs[job_topics.batches("policy")] == BATCH_RECORD_MAX_BYTES
    assert {v for k, v in specs.items() if k != job_topics.batches("policy")} == {RECORD_MAX_BYTES}
    from astraflow.topics.producer import Producer
    assert Producer.__init__.__kwdefaults__["max_request_size"] == RECORD_MAX_BYTES
    for topic in (job_topics.trajectories, job_topics.batches("policy")):
        limit = job_topics.max_message_bytes(topic)
        producer = make_producer(max_request_size=limit)
        producer.send_raw(topic, os.urandom(limit - 16 * 1024), partition=0).get(60)
        with pytest.raises(MessageSizeTooLargeError):  # kafka-python refuses it in send()
            producer.send_raw(topic, os.urandom(limit + 1), partition=0)


def test_a_consumer_restarted_behind_a_record_it_dead_lettered_writes_no_second_letter(
        bootstrap, job_topics, make_producer, make_consumer):
    """A reader that starts again before a poison record (no commit past it yet, or one that
    reads a topic from its beginning) passes it over without a second letter; another
    reader that gives up on the same record writes its own."""
    topic = job_topics.prompts
    producer = make_producer()
    producer.send_raw(topic, b"{]", key=b"k", headers=[("af-type", b"prompt")], partition=0).get(10)
    producer.send_sync(topic, GOOD, key="p-good", partition=0)

    def read(name: str) -> DeadLetters:
        dlq = DeadLetters(make_producer(), job_topics.dlq, consumer_name=name, recall=bootstrap)
        consumer = make_consumer(partitions=[TopicPartition(topic, 0)], dead_letters=dlq)
        got = []
        for _ in range(20):
            got += consumer.poll(1000)
            if got:
                break
        assert [d.message for d in got] == [GOOD]
        consumer.close()
        return dlq

    first, again, other = read("reader"), read("reader"), read("another")
    assert (first.count, first.repeats) == (1, 0)
    assert (again.count, again.repeats) == (0, 1)
    assert (other.count, other.repeats) == (1, 0)
    assert sorted(x.consumer for x in _letters(bootstrap, job_topics.dlq)) == ["another", "reader"]
