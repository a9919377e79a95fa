"""Packed number arrays (topics/packed.py): what they hold on the wire, how they read as the
lists they replace, and that records written before packing decode to the same values."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import orjson
import pytest
import torch

from astraflow.topics import Batch, Sample, SourceOffset, TrajectoryGroup, decode, encode
from astraflow.topics.packed import Flags, Floats, Ints


def _group() -> TrajectoryGroup:
    s = Sample([5, 6, 7, 8], [-0.1, 0.0, 0.0, -0.3], [4, 0, 0, 5], 1.0, "stop", "8", prompt_ids=[1, 2, 3],
               loss_mask=[1, 0, 0, 1], token_roles=[1, 2, 0, 1])
    return TrajectoryGroup("t1", "p1", "solver", "raas-0", [1, 2], [s], role="solver",
                           roles=["env", "solver", "verifier"], role_policies={"solver": "solver", "verifier": "v"})


def test_a_sample_built_from_lists_holds_packed_arrays_that_read_as_those_lists():
    s = _group().samples[0]
    assert (type(s.tokens), type(s.logprobs), type(s.versions)) == (Ints, Floats, Ints)
    assert (type(s.prompt_ids), type(s.loss_mask), type(s.token_roles)) == (Ints, Flags, Flags)
    assert s.tokens == [5, 6, 7, 8] and [5, 6, 7, 8] == s.tokens and s.tokens == (5, 6, 7, 8)
    assert s.tokens != [5, 6, 7] and s.tokens != [5, 6, 7, 9] and not (s.tokens == [5, 6, 7, 9])
    assert s.logprobs == [-0.1, 0.0, 0.0, -0.3]  # float64: a Python float exactly
    assert s.tokens[1:3] == [6, 7] and type(s.tokens[1:3]) is Ints and s.tokens[-1] == 8
    assert s.prompt_ids + s.tokens == [1, 2, 3, 5, 6, 7, 8] and type(s.prompt_ids + s.tokens) is Ints
    assert [0] + s.tokens == [0, 5, 6, 7, 8] and s.tokens + [9] == [5, 6, 7, 8, 9]
    assert sum(s.loss_mask) == 2 and max(s.token_roles) == 2 and list(s.versions) == [4, 0, 0, 5]
    assert s.own_versions() == [4, 5] and s.trained() == 2
    assert Sample([], [], [], 0.0, "stop").tokens == [] and not Sample([], [], [], 0.0, "stop").loss_mask


def test_packed_arrays_reach_torch_numpy_pickle_and_copies_as_their_values():
    s = _group().samples[0]
    assert torch.tensor(s.tokens).tolist() == [5, 6, 7, 8] and torch.tensor(s.tokens).dtype == torch.int64
    assert np.frombuffer(s.logprobs, dtype="<f8").tolist() == [-0.1, 0.0, 0.0, -0.3]
    for other in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s), copy.copy(s)):
        assert other == s and type(other.tokens) is Ints
    deep = copy.deepcopy(s)
    deep.tokens.append(9)
    assert s.tokens == [5, 6, 7, 8]  # a deep copy has arrays of its own


def test_the_wire_holds_little_endian_hex_and_the_record_round_trips():
    g = _group()
    value, headers = encode(g)
    data = orjson.loads(value)
    assert data["prompt_ids"] == "0100000002000000"  # int32 1, 2
    assert data["samples"][0]["loss_mask"] == "01000001"  # int8
    assert bytes.fromhex(data["samples"][0]["logprobs"]) == np.array([-0.1, 0.0, 0.0, -0.3], "<f8").tobytes()
    back = decode(value, headers)
    assert back == g and type(back.samples[0].logprobs) is Floats and type(back.prompt_ids) is Ints
    batch = Batch("solver", 0, [g], [SourceOffset("t", 0, 1)])
    assert decode(*encode(batch)) == batch
    with pytest.raises(TypeError, match="not a string"):
        Ints("0100")  # a hex string is the wire's business, never a constructor's
    with pytest.raises(TypeError, match="typecode 'i'"):
        Ints("d", [1.5])
    grown = Ints([1])
    grown += [2, 3]
    assert grown == [1, 2, 3] and type(grown) is Ints


def test_a_schema_2_record_with_json_arrays_decodes_to_the_same_packed_values():
    """Records written before packing (schema 2: JSON arrays) are still read, as the same types."""
    g = _group()
    data = orjson.loads(encode(g)[0])

    def unpack(d):
        return {k: (list(getattr(g.samples[0], k)) if k in ("tokens", "logprobs", "versions", "prompt_ids",
                                                              "loss_mask", "token_roles") else v)
                for k, v in d.items()}
    data["samples"] = [unpack(x) for x in data["samples"]]
    data["prompt_ids"] = [1, 2]
    back = decode(orjson.dumps(data), [("af-type", b"trajectory-group"), ("af-schema", b"2")])
    assert back == g and type(back.samples[0].tokens) is Ints and type(back.samples[0].token_roles) is Flags
