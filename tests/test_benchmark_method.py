"""The benchmarks' method: repeated numbers carry their spread and load, and each
comparison measures equal work on both sides (same rows, same token counts)."""

from __future__ import annotations

import json

import pytest
import torch

from astraflow.benchmarks import engine_throughput, results_io


def test_spread_keeps_median_min_max_and_every_run():
    s = results_io.spread([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert s["runs"] == [3.0, 1.0, 2.0, 10.0]
    r = results_io.ratio_spread(results_io.spread([2, 4, 6]), results_io.spread([1, 2, 2]))
    assert r["runs"] == [2.0, 2.0, 3.0] and r["median"] == 2.0
    with pytest.raises(ValueError, match="at least one"):
        results_io.spread([])
    with pytest.raises(ValueError, match="paired runs"):
        results_io.ratio_spread(results_io.spread([1, 2]), results_io.spread([1]))


def test_repeat_keeps_the_cold_run_apart():
    calls = iter([9.0, 1.0, 2.0, 3.0])
    out = results_io.repeat(lambda: next(calls), repeats=3)
    assert out["cold"] == 9.0 and out["warm"]["runs"] == [1.0, 2.0, 3.0]


def test_results_record_the_load_they_were_measured_under(tmp_path):
    before = results_io.load_now()
    results_io.write_results(tmp_path / "x.json", {"a": 1}, before)
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["load"]["before"] == before
    assert len(data["load"]["after"]["loadavg"]) == 3 and isinstance(data["load"]["busy"], bool)


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.engines.bootstrap import ensure_tiny_model
    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(str(path))


def test_hf_side_generates_exactly_the_engines_row_lengths(tiny_lm):
    """The engine rows' lengths drive HF generate, so both sides count the same tokens."""
    from astraflow.engines.base import SamplingParams
    from astraflow.engines.cpu import CpuEngine

    path, model, tok = tiny_lm
    model.generation_config.eos_token_id = None
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+7=", "3+4=", "55+21=", "9+9=")]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,), seed=7)
    lengths = [len(g.tokens) for g in CpuEngine(path).generate(prompts, params)]
    forced = [1, 5, 12, 3]
    assert engine_throughput.naive_generate(model, prompts, params, tok.pad_token_id, forced) == sum(forced)
    assert engine_throughput.naive_generate(model, prompts, params, tok.pad_token_id, lengths) == sum(lengths)


def test_compare_refuses_unequal_work():
    with pytest.raises(RuntimeError, match="different token counts"):
        engine_throughput.compare(lambda: 10, lambda: 11, repeats=3)
    out = engine_throughput.compare(lambda: 10, lambda: 10, repeats=3)
    assert out["tokens"] == 10 and out["speedup"]["n"] == 3 and "cold" in out
