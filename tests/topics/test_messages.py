import dataclasses

import orjson
import pytest

from astraflow.topics import MESSAGE_TYPES, decode, encode
from astraflow.topics import messages as m
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


@pytest.mark.parametrize("af_type", sorted(SAMPLES))
def test_decoded_messages_are_their_fields_in_class_order_and_re_encode_to_the_same_bytes(af_type):
    """Decoding skips ``__init__`` for a record written by this code; what it makes must be
    indistinguishable from the constructed message, down to the bytes it encodes to."""
    msg = SAMPLES[af_type]
    value, headers = encode(msg)
    back = decode(value, headers)
    assert back == msg and repr(back) == repr(msg) and type(back) is type(msg)
    assert encode(back)[0] == value
    assert list(vars(back)) == [f.name for f in dataclasses.fields(msg)]


def test_a_record_with_fields_reordered_or_left_to_their_defaults_decodes_in_class_order():
    from astraflow.topics import Heartbeat
    msg = Heartbeat("raas-0", "raas", "policy", 3)
    value, headers = encode(msg)
    data = orjson.loads(value)
    shuffled = dict(reversed(list(data.items())))
    minimal = {k: data[k] for k in ("node_id", "role", "policy", "version")}
    for variant in (shuffled, minimal):
        back = decode(orjson.dumps(variant), headers)
        assert back == msg and encode(back)[0] == value


def test_defaults_decoded_from_a_record_are_not_shared_between_messages():
    value, headers = encode(SAMPLES["prompt"])
    data = orjson.loads(value)
    del data["metadata"]
    a, b = (decode(orjson.dumps(data), headers) for _ in range(2))
    assert a.metadata == {} and a.metadata is not b.metadata


@pytest.mark.parametrize("field,bad,match", [
    ("samples", 5, "samples: expected a JSON array, got int"),  # once a TypeError that killed the consumer
    ("samples", "abc", "expected a JSON array, got str"),
    ("samples", [7], "Sample: expected a JSON object, got int"),
    ("samples", [{"tokens": [1]}], "Sample: missing field"),
    ("prompt_ids", None, "prompt_ids: expected integers in int32 \\(a hex string or a JSON array\\), got NoneType"),
    ("samples", None, "samples: expected a JSON array, got null"),  # once decoded: a group of no list
])
def test_nested_records_of_the_wrong_shape_are_decode_errors(field, bad, match):
    value, headers = encode(SAMPLES["trajectory-group"])
    data = orjson.loads(value)
    data[field] = bad
    with pytest.raises(DecodeError, match=match):
        decode(orjson.dumps(data), headers)


@pytest.mark.parametrize("headers,match", [
    ([("af-type", None)], "af-type header has no value"),
    ([("af-type", b"prompt"), ("af-schema", None)], "is not an integer"),
    ([("af-type", b"prompt"), ("af-schema", b"one")], "is not an integer"),
    ([("af-producer", b"x")], "no af-type header"),
])
def test_forged_type_headers_are_decode_errors(headers, match):
    value, _ = encode(SAMPLES["prompt"])
    with pytest.raises(DecodeError, match=match):
        decode(value, headers)


def test_schema_checks_are_remembered_only_for_the_header_values_checked():
    """Accepted (af-type, af-schema) pairs are cached; a newer schema of the same type, or the
    first of two headers, is still what counts."""
    from astraflow.topics.exceptions import UnsupportedSchema
    value, headers = encode(SAMPLES["task"])
    assert decode(value, headers) == SAMPLES["task"]
    for schema in (str(m.Task.SCHEMA + 1).encode(), b"99"):  # (schema 4 added prompt_ids)
        with pytest.raises(UnsupportedSchema):
            decode(value, [("af-type", b"task"), ("af-schema", schema)])
        with pytest.raises(UnsupportedSchema):  # the first af-schema header is the one read
            decode(value, [("af-type", b"task"), ("af-schema", schema), ("af-schema", b"1")])
    assert decode(value, [("af-type", b"task")]) == SAMPLES["task"]  # no af-schema: schema 1


def test_the_cache_of_checked_headers_is_bounded():
    from astraflow.topics import codec
    value, _ = encode(SAMPLES["prompt"])
    for i in range(codec._CHECKED_MAX + 50):
        decode(value, [("af-type", b"prompt"), ("af-schema", f"-{i}".encode())])
    assert len(codec._checked) <= codec._CHECKED_MAX


def test_a_dead_letter_keeps_a_null_header_value():
    """Kafka headers may carry null values (kafka-python cannot send one, other clients can)."""
    from astraflow.topics import DeadLetters

    class Sink:
        def send_sync(self, *args, **kw):
            pass

    letter = DeadLetters(Sink(), "dlq").put("t", 0, 7, None, b"{}", [("af-type", None), ("x", b"\xff")],
                                            DecodeError("record's af-type header has no value"))
    assert letter.headers == {"af-type": None, "x": "\xff"}
    assert decode(*encode(letter)) == letter


@pytest.mark.parametrize("kind,path,bad,match", [
    ("trajectory-group", ("samples", 0, "reward"), "lots", r"Sample.reward: expected float, got str"),
    ("trajectory-group", ("samples", 0, "tokens"), [1, 2.5, 3], r"Sample.tokens: expected integers in int32 .*got a list"),
    ("trajectory-group", ("samples", 0, "logprobs"), [-0.1, None, -0.3], r"Sample.logprobs: expected numbers"),
    # packed arrays (hex of little-endian items) that are not: bad digits, a partial item, too big an id
    ("trajectory-group", ("samples", 0, "tokens"), "01000000zz000000", r"Sample.tokens: .*got a string of 16"),
    ("trajectory-group", ("samples", 0, "tokens"), "010000000200", r"Sample.tokens: .*not a multiple of item size"),
    ("trajectory-group", ("samples", 0, "tokens"), [1, 2 ** 40, 3], r"Sample.tokens: .*int"),
    ("trajectory-group", ("samples", 0, "loss_mask"), {"x": 1}, r"Sample.loss_mask: expected integers in -128..127"),
    ("trajectory-group", ("samples", 0, "logprobs"), "00" * 16, "logprobs has 2 entries but tokens has 3"),
    ("trajectory-group", ("samples", 0, "logprobs"), [-0.1], "logprobs has 1 entries but tokens has 3"),
    ("trajectory-group", ("samples", 0, "versions"), [0], "versions has 1 entries but tokens has 3"),
    ("trajectory-group", ("samples", 0, "token_roles"), [0], "token_roles has 1 entries but tokens has 3"),
    ("trajectory-group", ("samples", 0, "loss_mask"), [1, 2, 1], "loss_mask holds"),
    ("trajectory-group", ("status",), "maybe", "status is 'maybe'"),
    ("trajectory-group", ("stats",), {"team_reward": "high"}, r"stats\['team_reward'\] is str"),
    ("batch", ("step",), -1, "step is -1"),
    ("batch", ("step",), True, r"Batch.step: expected int, got bool"),
    ("batch", ("sources",), [], "sources has 0 entries but groups has 1"),
    ("heartbeat", ("version",), "3", r"Heartbeat.version: expected int, got str"),
    ("prompt", ("answer",), 4, r"Prompt.answer: expected str, got int"),
    ("task", ("n_samples",), 0, "n_samples is 0"),
    ("task", ("sampling",), {"temperature": "hot"}, r"sampling\['temperature'\] is 'hot'"),
    ("task", ("sampling",), {"max_new_tokens": 0}, r"sampling\['max_new_tokens'\] is 0"),
    ("version", ("kind",), "rumour", "kind is 'rumour'"),
    ("dead-letter", ("headers",), {"x": 5}, r"DeadLetter.headers: expected dict\[str, str \| None\]"),
])
def test_values_of_the_wrong_type_or_out_of_bounds_are_invalid_records(kind, path, bad, match):
    """Scalar types inside otherwise valid records are checked, and each type's bounds: a
    consumer dead-letters these instead of handing them to code that would fail on them."""
    from astraflow.topics import InvalidRecord
    value, headers = encode(SAMPLES[kind])
    data = target = orjson.loads(value)
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = bad
    with pytest.raises(InvalidRecord, match=match):
        decode(orjson.dumps(data), headers)


def test_numbers_that_are_not_finite_never_decode():
    """JSON has no NaN; orjson refuses a number that overflows to infinity, and writes a NaN
    or an infinity as null, which a float field refuses: a decoded float is finite."""
    import math
    value, headers = encode(SAMPLES["metric"])
    with pytest.raises(DecodeError, match="not JSON"):
        decode(value.replace(b'"value":0.25', b'"value":1e999'), headers)
    for x in (math.nan, math.inf):
        bad = encode(m.Metric("trainer", "loss", x))
        with pytest.raises(DecodeError, match="Metric.value: expected float, got NoneType"):
            decode(*bad)


def test_a_null_record_is_accepted_only_where_the_field_is_optional():
    value, headers = encode(SAMPLES["version"])
    data = orjson.loads(value)
    data["snapshot_manifest"] = None  # ChunkManifest | None
    assert decode(orjson.dumps(data), headers).snapshot_manifest is None
    data["manifest"] = None  # ChunkManifest: once decoded, and the subscriber failed on it
    with pytest.raises(DecodeError, match="VersionAnnouncement.manifest: expected a JSON object, got null"):
        decode(orjson.dumps(data), headers)


@pytest.mark.parametrize("af_type", sorted(SAMPLES))
def test_the_compiled_fast_path_builds_what_the_general_path_builds(af_type):
    """Each class's compiled builder (the path a record as this code writes it takes) makes the
    message the general one makes, field for field and in the same order."""
    from astraflow.topics.codec import _builder
    msg = SAMPLES[af_type]
    value, _ = encode(msg)
    builder = _builder(type(msg))
    fast, general = builder.fast(orjson.loads(value)), builder(orjson.loads(value))
    assert fast == general == msg
    assert list(vars(fast)) == list(vars(general)) == [f.name for f in dataclasses.fields(msg)]


def test_the_fused_field_checks_answer_as_the_checks_one_by_one():
    """``fieldcheck.all_of`` compiles a record's checks into one expression: for every hint and
    every kind of value it says what the check of that hint says (a ``TypeError`` is a no)."""
    from typing import Any

    from astraflow.topics.fieldcheck import all_of, checker
    values = ["s", "", 1, 0, -3, True, False, 1.5, None, [], [1, 2], [1, 2.5], [0.5, 1.5], [1, "x"], [True],
              [None], [[1]], ["a"], {}, {"a": 1}, {"a": "b"}, {"a": None}, {"a": [1]}]
    hints = [str, int, float, bool, list[int], list[float], list[str], list[list[int]], int | None,
             float | None, list[int] | None, dict[str, str], dict[str, Any], dict[str, str | None],
             dict[str, int], list[Any]]
    for tp in hints:
        check = checker(tp)
        assert check is not None, tp
        fused = all_of((("f", check), ("g", checker(str))))
        for v in values:
            for g in ("ok", 7):
                try:
                    answer = fused({"f": v, "g": g})
                except TypeError:
                    answer = False
                assert bool(answer) == (check(v) and g == "ok"), (tp, v, g)
