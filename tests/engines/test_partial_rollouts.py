"""Partial rollouts in the CPU engine: rows in flight when newer weights arrive go on under
them. Per-token versions change exactly where the weights did, every token's log-prob is what
a fresh forward pass of its whole prefix under the version that produced it gives, and
``max_versions`` holds a load back until the call ends."""

from __future__ import annotations

import pytest
import torch

from astraflow.engines.base import SamplingParams
from astraflow.engines.sampling import sampling_logprobs

PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=11)


@pytest.fixture(scope="module")
def versions(tiny_model_path):
    """Three weight versions of the tiny model: the model itself and two perturbations of it."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32).state_dict()
    gen = torch.Generator().manual_seed(0)
    out = [base]
    for scale in (0.02, 0.04):
        out.append({n: (t + scale * torch.randn(t.shape, generator=gen) * t.std()) if t.is_floating_point()
                    and t.numel() > 1 else t.clone() for n, t in base.items()})
    return out


@pytest.fixture()
def engine(tiny_model_path, versions):
    from astraflow.engines.cpu import CpuEngine

    e = CpuEngine(tiny_model_path)
    e.load_weights(versions[0], 0)
    yield e
    e.close()


def offer_at(engine, versions, at: dict[int, int]):
    """A refresh that loads version ``v`` on its ``n``-th call (``at``: n -> v); returns the call count."""
    calls = [0]

    def refresh():
        calls[0] += 1
        v = at.get(calls[0])
        if v is not None:
            engine.load_weights(versions[v], v)

    engine.set_weight_refresh(refresh)
    return calls


def prompts(tokenizer):
    # different lengths: the rows are left-padded, before and after the second prefill
    return [tokenizer.encode(t, add_special_tokens=False) for t in ("12+30=", "7+5=", "41+17=", "3+9=")]


def fresh_logprob(tiny_model_path, weights, prefix: list[int], token: int) -> float:
    from transformers import AutoModelForCausalLM

    model = fresh_logprob.models.get(id(weights))
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
        model.load_state_dict(weights)
        model.eval()
        fresh_logprob.models[id(weights)] = model
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prefix])).logits[:, -1].float()
    return float(sampling_logprobs(logits, PARAMS.temperature, PARAMS.top_p, PARAMS.top_k)[0, token])


fresh_logprob.models = {}


def test_rows_continue_under_new_weights_with_exact_logprobs(engine, versions, tokenizer, tiny_model_path):
    # version 1 arrives before token 4 is sampled, version 2 before token 8
    offer_at(engine, versions, {4: 1, 8: 2})
    gens = engine.generate(prompts(tokenizer), PARAMS, seeds=[1, 2, 3, 4])
    assert engine.version == 2 and engine.refreshes["rows"] > 0
    continued = 0
    for g in gens:
        n = len(g.tokens)
        expect = tuple(0 if t < 4 else 1 if t < 8 else 2 for t in range(n))
        assert g.versions() == expect and g.version == 0
        if n > 4:
            continued += 1
            assert g.token_versions == expect
        for t in range(n):
            weights = versions[expect[t]]
            want = fresh_logprob(tiny_model_path, weights, list(g.prompt_ids) + list(g.tokens[:t]), g.tokens[t])
            assert g.logprobs[t] == pytest.approx(want, abs=2e-4), (t, expect[t])
    assert continued, "no row was long enough to cross a version: the test proves nothing"


def test_the_logprobs_are_not_those_of_the_old_weights(engine, versions, tokenizer, tiny_model_path):
    """The check above can fail: the tokens after the switch do not fit the old version."""
    offer_at(engine, versions, {2: 2})
    (g,) = engine.generate(prompts(tokenizer)[:1], PARAMS, seeds=[5])
    assert len(g.tokens) > 3 and g.token_versions[2:] == (2,) * (len(g.tokens) - 2)
    gaps = [abs(g.logprobs[t] - fresh_logprob(tiny_model_path, versions[0], list(g.prompt_ids) + list(g.tokens[:t]),
                                              g.tokens[t])) for t in range(2, len(g.tokens))]
    assert max(gaps) > 1e-3


def test_without_a_refresh_every_token_is_the_call_versions(engine, versions, tokenizer):
    gens = engine.generate(prompts(tokenizer), PARAMS, seeds=[1, 2, 3, 4])
    assert all(g.token_versions == () and g.versions() == (0,) * len(g.tokens) for g in gens)


def test_max_versions_holds_a_load_until_the_call_ends(engine, versions, tokenizer):
    calls = offer_at(engine, versions, {2: 1, 3: 2, 4: 2})
    engine.set_weight_refresh(engine._refresh, max_versions=2)
    gens = engine.generate(prompts(tokenizer), PARAMS, seeds=[1, 2, 3, 4])
    # version 1 came in at token 2; with every live row at two versions, no refresh is asked for again
    assert calls[0] == 2 and engine.version == 1
    assert all(set(g.versions()) <= {0, 1} for g in gens)
    engine.set_weight_refresh(engine._refresh, max_versions=1)  # a row may never cross a version
    gens = engine.generate(prompts(tokenizer), PARAMS, seeds=[1, 2, 3, 4])
    assert calls[0] == 2 and all(g.token_versions == () for g in gens)


def test_an_adapter_engine_refuses(tiny_model_path):
    from astraflow.engines.config import LoraConfig
    from astraflow.engines.cpu import CpuEngine

    e = CpuEngine(tiny_model_path, lora=LoraConfig())
    with pytest.raises(ValueError, match="loads them between calls only"):
        e.set_weight_refresh(lambda: None)
    e.close()
