import orjson
import pytest

from astraflow.topics import MESSAGE_TYPES, decode, encode
from astraflow.topics.exceptions import DecodeError

from .samples import SAMPLES


def test_every_registered_type_has_a_sample():
    assert set(SAMPLES) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("af_type", sorted(SAMPLES))
def test_codec_round_trip(af_type):
    msg = SAMPLES[af_type]
    value, headers = encode(msg, producer="test")
    assert dict(headers)["af-type"] == af_type.encode()
    assert dict(headers)["af-producer"] == b"test"
    assert isinstance(orjson.loads(value), dict)  # plain JSON object
    assert decode(value, headers) == msg


def test_round_trip_every_type_through_the_broker(job_topics, make_producer, make_consumer):
    producer = make_producer(client_id="rt")
    for i, (af_type, msg) in enumerate(sorted(SAMPLES.items())):
        producer.send(job_topics.trajectories, msg, key=af_type, partition=0)
    producer.flush()
    consumer = make_consumer(topics=[job_topics.trajectories], group_id="rt")
    got = []
    while len(got) < len(SAMPLES):
        batch = consumer.poll(5000)
        assert batch, f"only {len(got)} of {len(SAMPLES)} records came back"
        got.extend(batch)
    assert [d.message for d in got] == [msg for _, msg in sorted(SAMPLES.items())]
    assert [d.key for d in got] == sorted(SAMPLES)
    assert all(d.partition == 0 for d in got)
    assert [d.offset for d in got] == list(range(len(SAMPLES)))


def test_strict_decoding_rejects_unknown_and_missing_fields():
    value, headers = encode(SAMPLES["prompt"])
    data = orjson.loads(value)
    with pytest.raises(DecodeError, match="unknown field"):
        decode(orjson.dumps({**data, "surprise": 1}), headers)
    del data["answer"]
    with pytest.raises(DecodeError, match="answer"):
        decode(orjson.dumps(data), headers)


@pytest.mark.parametrize("af_type,old", [("heartbeat", {"busy_slots": 0, "total_slots": 1}),
                                         ("generation-request", {"reply_to": "raas-solver-0", "min_version": 2})])
def test_records_written_with_retired_fields_still_decode_and_new_ones_omit_them(af_type, old):
    msg = SAMPLES[af_type]
    value, headers = encode(msg)
    data = orjson.loads(value)
    assert not set(old) & set(data)  # never written again
    assert decode(orjson.dumps({**data, **old}), headers) == msg  # what older nodes wrote is read as before
    with pytest.raises(DecodeError, match="unknown field"):  # retiring a field is not a licence for any field
        decode(orjson.dumps({**data, **old, "surprise": 1}), headers)
