"""Partial rollouts on an emulated device (``emulation/partial.py``): a load while a call is
held cuts each live row where the schedule has decoded it and generates its rest under the
new weights. The tokens kept are the old call's, the versions change exactly at the cut,
every token's log-prob is a fresh forward pass under the version that produced it, and
``max_versions`` holds the load back."""

from __future__ import annotations

import pytest

from astraflow.emulation import DeviceConfig, EmulatedDevice, EmulatedRolloutEngine
from astraflow.emulation.batching import BatchingClock
from astraflow.emulation.cost import CostModel
from astraflow.emulation.profile import load_profile
from astraflow.engines.base import SamplingParams
from tests.engines.test_partial_rollouts import PARAMS, fresh_logprob, prompts, versions  # noqa: F401 (fixture)


@pytest.fixture()
def emulated(tiny_model_path, versions):  # noqa: F811
    from astraflow.engines.cpu import CpuEngine

    inner = CpuEngine(tiny_model_path)
    inner.load_weights(versions[0], 0)
    # 4 rows x 12 real tokens x 256 modelled each: ~20 modelled s of decode, held ~4 s of wall (a
    # call computed slowly on a loaded machine still leaves most of its decode to be cut)
    device = EmulatedDevice(DeviceConfig(kind="emulated", profile="h100-qwen3-8b", token_scale=256,
                                         prompt_token_scale=16, dilation=0.2), "raas-test")
    engine = EmulatedRolloutEngine(inner, device)
    yield engine
    engine.close()


def offer(engine, versions, at: int, version: int, max_versions: int = 0) -> list[int]:  # noqa: F811
    """A refresh that loads ``version`` on its ``at``-th ask (a node's asks the weight subscriber);
    returns the count of asks."""
    asked = [0]

    def refresh():
        asked[0] += 1
        if asked[0] == at:
            engine.load_weights(versions[version], version)
    engine.set_weight_refresh(refresh, max_versions)
    return asked


def test_a_load_while_a_call_is_held_continues_its_live_rows_under_the_new_weights(emulated, versions, tokenizer,
                                                                                   tiny_model_path):
    rows, seeds = prompts(tokenizer), [1, 2, 3, 4]
    plain = emulated.inner.generate(rows, PARAMS, seeds=seeds)  # what the call computes before it is held
    asked = offer(emulated, versions, at=1, version=1)
    gens = emulated.generate(rows, PARAMS, seeds=seeds)
    assert asked[0] >= 1 and emulated.version == 1
    cut = [g for g in gens if g.token_versions]
    assert cut, "no row was in flight at the load"
    assert emulated.refreshes["rows"] >= len(cut)
    for p, g, old in zip(rows, gens, plain):
        versions_of = g.versions()
        k = versions_of.index(1) if 1 in versions_of else len(g.tokens)
        assert set(versions_of[:k]) <= {0} and set(versions_of[k:]) <= {1}
        assert g.tokens[:k] == old.tokens[:k] and g.logprobs[:k] == old.logprobs[:k]  # what was decoded stays
        for j, (t, lp, v) in enumerate(zip(g.tokens, g.logprobs, versions_of)):
            assert lp == pytest.approx(fresh_logprob(tiny_model_path, versions[v], list(p) + list(g.tokens[:j]), t),
                                       abs=1e-4)
    # the cut is where the schedule had decoded: inside the rows, not at their ends
    assert any(0 < g.versions().index(1) < len(g.tokens) for g in cut)


def test_max_versions_holds_the_load_back_until_the_call_ends(emulated, versions, tokenizer):
    asked = offer(emulated, versions, at=1, version=1, max_versions=1)
    gens = emulated.generate(prompts(tokenizer), PARAMS, seeds=[1, 2, 3, 4])
    assert asked[0] == 0 and emulated.version == 0  # never asked while a live row would span two versions
    assert all(not g.token_versions and g.version == 0 for g in gens)
    assert emulated.refreshes == {"rows": 0, "recomputed_tokens": 0}


def test_a_slowdown_device_refuses_partial_rollouts(tiny_model_path):
    from astraflow.engines.cpu import CpuEngine
    engine = EmulatedRolloutEngine(CpuEngine(tiny_model_path),
                                   EmulatedDevice(DeviceConfig(kind="emulated", slowdown=2.0), "raas-test"))
    with pytest.raises(NotImplementedError, match="slowdown device holds whole calls"):
        engine.set_weight_refresh(lambda: None)
    engine.close()


def test_the_clock_says_how_far_each_row_is_decoded_and_takes_a_new_length():
    cost = CostModel(load_profile("h100-qwen3-8b"), token_scale=256, prompt_token_scale=16)

    def held(resettle: bool) -> float:
        clock = BatchingClock(cost, 1, dilation=0.02)
        call = clock.admit([6, 6], 12, clock.now())
        clock.settle(call, [12, 3])
        assert clock.wait(call, 0.0, until=clock.now() + 2.0) is None  # not done after 2 modelled s
        first, second = clock.progress(call)
        assert 0 < first < 12 * 256 and (second is None or second < 3 * 256)
        if resettle:  # its rest regenerated shorter: the row now ends at 5 real tokens
            clock.resettle(call, 0, 5)
        timing = clock.wait(call, 0.0)
        assert timing is not None and clock.progress(call) == []
        return timing.latency_s

    assert held(True) < 0.6 * held(False)  # modelled seconds: 5 tokens' decode, not 12
