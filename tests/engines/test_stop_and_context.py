"""Stop sequences per call and the context guard, on the real CPU engine with the tiny model."""

from __future__ import annotations

import pytest

from astraflow.engines.base import CONTEXT, SamplingParams, context_budgets

PROMPTS = ["12+34=", "7+5=", "98+76=", "45+8="]


def encode(tokenizer, texts):
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def cut_at_stop(tokenizer, tokens, stops):
    """The prefix of ``tokens`` up to the first token whose decoded completion holds a stop."""
    for n in range(1, len(tokens) + 1):
        if any(s in tokenizer.decode(list(tokens[:n]), skip_special_tokens=True) for s in stops):
            return tuple(tokens[:n]), True
    return tuple(tokens), False


@pytest.mark.parametrize("stops", [("4",), ("33", "<x>"), ("3",)])
def test_stop_strings_cut_each_row_at_its_first_stop_keeping_it(cpu_engine, tokenizer, stops):
    prompts = encode(tokenizer, PROMPTS) * 2
    free = cpu_engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, seed=11))
    cut = cpu_engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, seed=11, stop=stops))
    hits = 0
    for f, c in zip(free, cut):
        expected, hit = cut_at_stop(tokenizer, f.tokens, stops)
        assert c.tokens == expected  # same seed, same draws: the stopped row is the free row cut
        assert c.logprobs == pytest.approx(f.logprobs[:len(expected)], abs=1e-5)
        assert c.finish_reason == ("stop" if hit else f.finish_reason)
        if hit:
            text = tokenizer.decode(list(c.tokens), skip_special_tokens=True)
            assert any(text.endswith(s) or s in text for s in stops)  # the stop is kept in the output
            hits += 1
    if stops != ("33", "<x>"):
        assert hits, "no row met a stop that the tiny model writes in nearly every completion"


def test_stop_strings_and_stop_token_ids_together(cpu_engine, tokenizer):
    eos = tokenizer.eos_token_id
    prompts = encode(tokenizer, PROMPTS)
    gens = cpu_engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=5,
                                                       stop_token_ids=(eos,), stop=("9",)))
    for g in gens:
        if g.finish_reason == "stop":
            ends_eos = g.tokens[-1] == eos
            ends_nine = "9" in tokenizer.decode(list(g.tokens), skip_special_tokens=True)
            assert ends_eos or ends_nine
            assert eos not in g.tokens[:-1]


def test_sampling_mapping_carries_stop_sequences():
    p = SamplingParams.from_mapping({"temperature": 0.5, "stop": ["</tool>"], "stop_token_ids": [7]},
                                    stop_token_ids=(1,))
    assert p.stop == ("</tool>",) and p.stop_token_ids == (1, 7)
    with pytest.raises(ValueError, match="stop must be non-empty strings"):
        SamplingParams(stop=("",))


def test_no_row_generates_past_the_models_positions(cpu_engine, tokenizer):
    limit = cpu_engine.max_positions
    assert limit == 128  # the tiny model's
    short = encode(tokenizer, ["12+34="])[0]
    near = (short * 30)[: limit - 5]  # room for 5 tokens
    full = (short * 30)[:limit]  # no room at all
    over = (short * 30)[: limit + 7]  # longer than the window
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=3)
    gens = cpu_engine.generate([near, short, full, over], params, seeds=[1, 2, 3, 4])
    assert all(len(g.tokens) <= max(0, limit - len(g.prompt_ids)) for g in gens)
    assert len(gens[0].tokens) == 5 and gens[0].finish_reason == CONTEXT
    assert gens[2].tokens == gens[3].tokens == () and gens[2].finish_reason == gens[3].finish_reason == CONTEXT
    assert gens[1].finish_reason == "length" and len(gens[1].tokens) == 20
    # the rows beside a clipped or refused one are what they are alone (same seed)
    alone = cpu_engine.generate([short], params, seeds=[2])[0]
    assert alone.tokens == gens[1].tokens
    # a budget that fits is not clipped: the row ends on its own cap, not on the window
    fits = cpu_engine.generate([near], SamplingParams(temperature=1.0, max_new_tokens=5), seeds=[1])[0]
    assert fits.tokens == gens[0].tokens and fits.finish_reason == "length"


def test_context_budgets():
    assert context_budgets([[1] * 10, [1] * 126, [1] * 130], 8, 128) == [8, 2, -2]
    assert context_budgets([[1] * 500], 8, None) == [8]
