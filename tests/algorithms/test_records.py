"""Schema 2 of Batch and DataflowState: records written before it still decode."""

from __future__ import annotations

import orjson

from astraflow.topics import Batch, decode, encode
from astraflow.topics.messages import DataflowState


def _as_schema_1(msg, drop: tuple[str, ...]):
    value, headers = encode(msg)
    data = {k: v for k, v in orjson.loads(value).items() if k not in drop}
    return orjson.dumps(data), [(k, b"1" if k == "af-schema" else v) for k, v in headers]


def test_a_schema_1_batch_decodes_as_all_fresh():
    old = decode(*_as_schema_1(Batch("policy", 3, [], [], {"reward_mean": 0.5}), drop=("replay",)))
    assert old == Batch("policy", 3, [], [], {"reward_mean": 0.5}) and old.replay == []
    assert Batch.SCHEMA == 3  # schema 3: packed trajectory groups (tests/topics/test_packed.py)


def test_a_schema_1_dataflow_state_decodes_without_algorithms():
    old = decode(*_as_schema_1(DataflowState("policy", 4, 40, 2, ["t1"], [], 9.0),
                               drop=("prompt_epoch", "algorithms")))
    assert (old.prompt_epoch, old.algorithms, old.next_step, old.open_tasks) == (0, {}, 4, ["t1"])
    assert DataflowState.SCHEMA == 2


def test_the_new_fields_round_trip():
    state = DataflowState("policy", 4, 40, 2, prompt_epoch=3,
                          algorithms={"forced": 1, "algorithms": {"greso": {"p": {"easy": 0.51, "hard": 0.49}}}})
    assert decode(*encode(state)) == state
    batch = Batch("policy", 1, [], [], replay=[])
    assert decode(*encode(batch)) == batch
