"""Schema 2 trajectory groups (roles, loss masks) and schema 3 tasks: old records still
decode with their one-role defaults; records newer than the code are refused by name."""

from __future__ import annotations

import orjson
import pytest

from astraflow.actors.common import to_train_batch
from astraflow.topics import Batch, Sample, Task, TrajectoryGroup, decode, encode
from astraflow.topics.exceptions import UnsupportedSchema


def _schema1_group() -> tuple[bytes, list]:
    """A trajectory group as a schema-1 writer produced it (no role fields)."""
    value = orjson.dumps({"task_id": "t1", "prompt_id": "p1", "policy": "policy", "node_id": "raas-0",
                          "prompt_ids": [1, 2], "samples": [{"tokens": [5, 6], "logprobs": [-0.1, -0.2],
                                                             "versions": [3, 3], "reward": 1.0,
                                                             "finish_reason": "stop", "text": "56"}]})
    return value, [("af-type", b"trajectory-group"), ("af-schema", b"1")]


def test_a_schema_1_group_decodes_as_one_role_with_every_token_trained():
    g = decode(*_schema1_group())
    assert isinstance(g, TrajectoryGroup)
    assert (g.role, g.roles, g.role_policies, g.group_key) == ("", [], {}, "t1")
    s = g.samples[0]
    assert (s.loss_mask, s.token_roles, s.prompt_ids, s.trained(), s.own_versions()) == ([], [], [], 2, [3, 3])


def test_a_record_newer_than_the_code_is_refused_with_its_schema():
    value, headers = _schema1_group()
    group = TrajectoryGroup.SCHEMA + 1  # (schema 4 added Sample.context_generated)
    with pytest.raises(UnsupportedSchema, match=f"trajectory-group schema {group} is newer"):
        decode(value, [("af-type", b"trajectory-group"), ("af-schema", str(group).encode())])
    newer = Task.SCHEMA + 1  # (schema 4 added prompt_ids)
    with pytest.raises(UnsupportedSchema, match=f"task schema {newer} is newer"):
        decode(b"{}", [("af-type", b"task"), ("af-schema", str(newer).encode())])


def test_multi_role_fields_round_trip_and_reach_the_trainer_masked():
    roles = {"solver": "solver", "verifier": "verifier"}
    s = Sample([5, 6, 7, 8], [-0.1, 0.0, 0.0, -0.3], [4, 0, 0, 5], 1.0, "stop", "8", prompt_ids=[1, 2, 3],
               loss_mask=[1, 0, 0, 1], token_roles=[1, 2, 0, 1], info={"attempt": 2})
    g = TrajectoryGroup("t9", "p9", "solver", "raas-0", [1, 2], [s], role="solver",
                        roles=["env", "solver", "verifier"], role_policies=roles, stats={"team_reward": 1.0})
    back = decode(*encode(g))
    assert back == g and back.group_key == "t9/solver"
    assert back.samples[0].own_versions() == [4, 5] and back.samples[0].trained() == 2
    t = Task("t9", "p9", "solver", "1+1=", "2", 4, workflow="solver_verifier", roles=roles, train=["solver"],
             metadata={"tests": [[[1], 2]]})
    assert decode(*encode(t)) == t
    batch = to_train_batch(Batch("solver", 0, [back], []))
    (ts,) = batch.samples
    # the sample's own context is its prompt, the mask reaches the trainer, the version is its own tokens'
    assert ts.prompt_ids == (1, 2, 3) and ts.loss_mask == (1, 0, 0, 1) and ts.version == 4
    assert ts.group_id == "t9/solver" and ts.trained_tokens == 2


@pytest.mark.parametrize("token_roles, stats, error", [
    ([1, 3, 0, 1], {}, r"samples\[1\]\.token_roles names writers 0\.\.3 but the group has 3 role"),
    ([1, -1, 0, 1], {}, r"samples\[1\]\.token_roles names writers -1\.\.1"),
    ([1, 2, 0, 1], {"reward_mean": "0.5"}, r"stats\['reward_mean'\] is str, not a number"),
])
def test_a_group_naming_writers_it_lacks_or_a_stat_that_is_no_number_is_refused(token_roles, stats, error):
    from astraflow.topics.exceptions import InvalidRecord

    good = Sample([5, 6, 7, 8], [-0.1, 0.0, 0.0, -0.3], [4, 0, 0, 5], 1.0, "stop", "8", loss_mask=[1, 0, 0, 1],
                  token_roles=[1, 2, 0, 1])
    bad = Sample([5, 6, 7, 8], [-0.1, 0.0, 0.0, -0.3], [4, 0, 0, 5], 1.0, "stop", "8", loss_mask=[1, 0, 0, 1],
                 token_roles=token_roles)
    g = TrajectoryGroup("t9", "p9", "solver", "raas-0", [1, 2], [good, bad], role="solver",
                        roles=["env", "solver", "verifier"], stats=stats)
    with pytest.raises(InvalidRecord, match=error):
        decode(*encode(g))
    plain = TrajectoryGroup("t9", "p9", "solver", "raas-0", [1, 2], [good], roles=["env", "solver", "verifier"])
    assert decode(*encode(plain)) == plain
