"""Context a model generated is priced as generated, wherever it is read again.

Table 2's accounting fault (issue 60, item 0): the solver's answer inside the verifier's
prompt, and answer and verdict inside a retry, were priced at the prompt's scale though they
were generated at the emulated one, and training priced the retry's restated problem (the
environment's text) at the generated scale. A prompt now says how many of its tokens a model
wrote (:class:`PromptRow`), the count travels with the row and the turn it yields, and both
the emulated engine and the emulated trainer price by it.
"""

from __future__ import annotations

import types

import pytest

from astraflow.emulation import CostModel, DeviceConfig, EmulatedDevice, EmulatedRolloutEngine, EmulatedTrainEngine
from astraflow.emulation.engines import dealt_s
from astraflow.emulation.profile import load_profile
from astraflow.engines.base import PromptRow, SamplingParams, TrainBatch, TrainSample, generated_context, prompt_rows
from astraflow.topics import GenerationRequest, Sample
from astraflow.topics.codec import DecodeError, decode, encode
from astraflow.workflows.api import ENV, Trajectory, Turn


def _cost(**kw) -> CostModel:
    return CostModel(load_profile("h100-qwen3-8b"), token_scale=256, prompt_token_scale=16, **kw)


def test_a_prompt_row_is_its_ids_and_keeps_its_count_through_copies():
    row = PromptRow([5, 6, 7, 8], 2)
    assert row == [5, 6, 7, 8] and generated_context(row) == 2 and generated_context([5, 6]) == 0
    assert [generated_context(p) for p in prompt_rows([row, [1, 2]])] == [2, 0]
    with pytest.raises(ValueError, match="4 tokens cannot hold 5"):
        PromptRow([5, 6, 7, 8], 5)


def test_generated_context_costs_what_it_cost_to_generate_and_written_text_what_a_prompt_costs():
    cost = _cost()
    assert cost.prompt_units(10) == 10 and cost.prompt_units(10, 4) == 6 + 4 * 16  # 256 / 16
    assert cost.prompt_token_scale * cost.prompt_units(10, 4) == 16 * 6 + 256 * 4
    assert cost.modelled_tokens(6, 4) == 16 * 6 + 256 * 4
    with pytest.raises(ValueError, match="cannot hold"):
        cost.prompt_units(3, 4)
    # a verifier's call on 256 rows whose prompts carry a 6-token answer: read as generated, its
    # prefill and KV context are ~16x the written reading's, and the call is slower for it
    written = [(11, 5, 1.0, 16)] * 256
    generated = [(cost.prompt_units(11, 6), 5, 1.0, 16)] * 256
    assert dealt_s(cost, generated, 1) > 1.1 * dealt_s(cost, written, 1)


def test_the_emulated_engine_prices_each_rows_generated_context(cpu_engine, tokenizer):
    prompt = tokenizer.encode("12+7=19|", add_special_tokens=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop_token_ids=(tokenizer.eos_token_id,))
    device = EmulatedDevice(DeviceConfig(kind="emulated", profile="h100-qwen3-8b", token_scale=256,
                                         prompt_token_scale=16, dilation=1e-4), "test")
    engine = EmulatedRolloutEngine(cpu_engine, device)
    engine.rows = []
    out = engine.generate([PromptRow(prompt, 2), list(prompt)], params, seeds=[1, 1])
    assert out[0].tokens == out[1].tokens  # the engine reads the same ids
    (answered, plain), = engine.rows
    assert answered[0] == len(prompt) - 2 + 2 * 16 and plain[0] == len(prompt)


def test_training_prices_generated_context_as_generated_and_the_environments_text_as_written():
    """A retry: prompt = the problem (written); completion = first answer (the solver's, masked),
    separator (ENV), verdict (the verifier's, masked), restated problem (ENV), second answer
    (trained). Before: every completion token at 256. Now: answer, verdict and the trained
    answer at 256, the problem, separators and restated problem at 16."""
    problem, answer, sep, verdict, again, second = [1] * 5, [2] * 2, [3], [4] * 3, [1] * 6, [5] * 2
    completion = answer + sep + verdict + again + second
    mask = [0] * (len(completion) - 2) + [1, 1]
    retry = TrainSample(tuple(problem), tuple(completion), (-0.5,) * len(completion), loss_mask=tuple(mask),
                        context_generated=len(answer) + len(verdict))
    device = EmulatedDevice(DeviceConfig(kind="emulated", profile="h100-qwen3-8b", token_scale=256,
                                         prompt_token_scale=16), "test")
    engine = EmulatedTrainEngine(types.SimpleNamespace(), device)  # only its price is read here
    cost = _cost()
    written = len(problem) + len(sep) + len(again)
    assert engine._modelled(TrainBatch((retry,))) == pytest.approx(
        cost.train_step_s(16 * written + 256 * (len(answer) + len(verdict) + len(second))))
    # a sample that says more context was generated than it holds is refused
    with pytest.raises(ValueError, match="context has 17 tokens"):
        TrainSample(tuple(problem), tuple(completion), (-0.5,) * len(completion), loss_mask=tuple(mask),
                    context_generated=18)


def test_a_chain_counts_the_roles_context_as_generated_and_the_environments_as_written():
    answer = Turn((1, 2), (7, 8), (-0.1, -0.2), 0, "stop", "78", "solver", "solver")
    check = Turn((1, 2, 7, 8, 3), (9,), (-0.3,), 0, "stop", "9", "verifier", "verifier", context_generated=2)
    retry = Turn((1, 2, 7, 8, 3, 9, 4, 1, 2), (6,), (-0.4,), 0, "stop", "6", "solver", "solver",
                 context_generated=3)
    chain = Trajectory.chain([1, 2], [("solver", [7, 8]), (ENV, [3]), check, (ENV, [4, 1, 2]), retry], "solver", 1.0)
    assert chain.context_generated == 3  # the first answer (as context) and the verdict
    assert Trajectory.of(check, 1.0).context_generated == 2
    assert Trajectory.chain(PromptRow([1, 2], 1), [answer], "solver", 0.0).context_generated == 1


def test_the_count_travels_on_the_records_and_a_forged_one_is_refused():
    s = Sample([5, 6], [-0.1, -0.2], [0, 0], 1.0, "stop", context_generated=3)
    assert s.context_generated == 3
    req = GenerationRequest("r1", "ep", "verifier", "verifier", [[1, 2, 3], [4]], [1, 2], {},
                            context_generated=[2, 0])
    assert decode(*encode(req)).context_generated == [2, 0]
    value, headers = encode(GenerationRequest("r2", "ep", "verifier", "verifier", [[1, 2, 3]], [1], {}))
    assert decode(value, headers).context_generated == []  # none said: every prompt token written
    forged = value.replace(b'"context_generated":[]', b'"context_generated":[4]')
    with pytest.raises(DecodeError, match=r"context_generated\[0\] is 4; prompts\[0\] has 3 tokens"):
        decode(forged, headers)
