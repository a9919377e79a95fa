"""CONTRACT TEST: ``engines/sglang.py`` against a local stub of the SGLang HTTP API.

The stub (``sglang_stub.py``) implements the request/response shapes of ``/health``,
``/generate``, ``/update_weights_from_disk``, ``/update_weights_from_tensor``,
``/pause_generation``, ``/continue_generation`` and ``/model_info``. This proves our
client speaks that contract and manages the server process; it does not prove SGLang
itself behaves (``benchmarks/gpu_check.sh`` does that on a GPU).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest
import torch

from astraflow.engines.base import SamplingParams
from astraflow.engines.config import SGLangConfig
from astraflow.engines.sglang import SGLangEngine, SGLangError

HERE = Path(__file__).parent


@pytest.fixture()
def stub_url(tiny_model_path):
    import sglang_stub

    server = sglang_stub.make_server(sglang_stub.StubState(str(tiny_model_path), "0"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def calls(url):
    with urllib.request.urlopen(url + "/stub/calls") as r:
        return json.loads(r.read())


def test_generate_request_and_response_shapes(tiny_model_path, stub_url):
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=stub_url))
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, stop_token_ids=(1,))
    gens = engine.generate([[20, 21, 27], [22, 15, 23, 29]], params)
    assert len(gens) == 2
    for g in gens:
        assert len(g.tokens) == len(g.logprobs) <= 5 and g.finish_reason in ("stop", "length")
        assert g.version == 0
    path, body = calls(stub_url)[-1]
    assert path == "/generate"
    assert body["input_ids"] == [[20, 21, 27], [22, 15, 23, 29]]
    assert body["return_logprob"] is True
    assert body["sampling_params"] == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_new_tokens": 5,
                                       "stop_token_ids": [1], "no_stop_trim": True}
    engine.close()


def test_disk_weight_update_pauses_loads_and_reports_version(tiny_model_path, stub_url):
    from safetensors.torch import load_file

    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=stub_url))
    prompts = [[20, 21, 27]]
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    before = engine.generate(prompts, params)[0]
    weights = load_file(str(tiny_model_path / "model.safetensors"))
    weights = {k: v + 0.01 for k, v in weights.items()}
    engine.load_weights(weights, version=7)
    assert engine.version == 7 and engine.server_version() == "7"
    after = engine.generate(prompts, params)[0]
    assert after.version == 7 and after.tokens != before.tokens  # the stub's tokens depend on the version

    log = calls(stub_url)
    paths = [p for p, _ in log]
    i = paths.index("/update_weights_from_disk")
    assert paths[i - 1] == "/pause_generation" and paths[i + 1] == "/continue_generation"
    upd = log[i][1]
    assert upd["weight_version"] == "7" and upd["flush_cache"] is True
    # The directory handed to the server holds exactly the published tensors.
    # (It is pruned only when a newer version replaces it.)
    written = load_file(str(Path(upd["model_path"]) / "model.safetensors"))
    assert set(written) == set(weights)
    torch.testing.assert_close(written["model.norm.weight"], weights["model.norm.weight"])
    engine.close()
    assert not Path(upd["model_path"]).exists()  # temp weight copies are cleaned up


def test_failed_update_raises_and_still_resumes(tiny_model_path, stub_url):
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=stub_url))
    with pytest.raises(SGLangError, match="shape"):
        engine.load_weights({"model.norm.weight": torch.zeros(3)}, version=2)
    assert engine.version == 0
    assert [p for p, _ in calls(stub_url)][-1] == "/continue_generation"
    engine.close()


def test_launches_server_subprocess_waits_for_health_and_stops_it(tiny_model_path, monkeypatch):
    # The stub stands in for `python -m sglang.launch_server` (same flags).
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    cfg = SGLangConfig(server_module="sglang_stub", startup_timeout_s=60)
    engine = SGLangEngine(tiny_model_path, cfg, version=3)
    proc, log_dir = engine._proc, engine._log_path.parent
    assert proc is not None and proc.poll() is None
    assert engine.server_version() == "3"
    assert len(engine.generate([[20, 21]], SamplingParams(max_new_tokens=3))[0].tokens) == 3
    engine.close()
    assert proc.poll() is not None
    assert not log_dir.exists()  # the server's temp log goes with it


def test_server_that_dies_at_startup_is_reported(tiny_model_path):
    cfg = SGLangConfig(server_module="astraflow_no_such_module", startup_timeout_s=30)
    with pytest.raises(SGLangError, match="exited"):
        SGLangEngine(tiny_model_path, cfg)


def test_factory_chooses_implementations(tiny_model_path, stub_url):
    from astraflow.engines.cpu import CpuEngine
    from astraflow.engines.factory import make_rollout_engine

    cpu = make_rollout_engine({"kind": "cpu", "model_path": str(tiny_model_path), "threads": 1})
    assert isinstance(cpu, CpuEngine)
    cpu.close()
    sg = make_rollout_engine({"kind": "sglang", "model_path": str(tiny_model_path), "sglang": {"url": stub_url}})
    assert isinstance(sg, SGLangEngine)
    sg.close()
    with pytest.raises(ValueError, match="nope"):
        make_rollout_engine({"kind": "cpu", "nope": 1})


def test_row_seeds_travel_as_per_request_sampling_seed(tiny_model_path, stub_url):
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=stub_url, send_seed=True))
    prompts = [[20, 21, 27], [22, 15, 23, 29], [20, 21]]
    engine.generate(prompts, SamplingParams(max_new_tokens=3), seeds=[2**62, 7, 12345])
    sent = calls(stub_url)[-1][1]["sampling_params"]
    assert [s["sampling_seed"] for s in sent] == [2**62, 7, 12345]
    engine.generate(prompts, SamplingParams(max_new_tokens=3, seed=40))  # params.seed: seed + row
    assert [s["sampling_seed"] for s in calls(stub_url)[-1][1]["sampling_params"]] == [40, 41, 42]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        engine.generate(prompts, SamplingParams(max_new_tokens=3), seeds=[1, 2])
    engine.close()


def test_stop_sequences_and_the_context_guard_reach_the_server(tiny_model_path, stub_url):
    """Stop strings go as ``stop`` (stop token ids as ``stop_token_ids``, the stop kept in the
    output); each row's budget is clipped to the model's 128 positions and a row whose prompt
    fills them alone is answered ``context`` without reaching the server."""
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=stub_url))
    assert engine.max_positions == 128
    params = SamplingParams(temperature=1.0, max_new_tokens=10, stop_token_ids=(1,), stop=("</tool>",))
    short, near, full = [20, 21, 27], [22] * 124, [23] * 128
    gens = engine.generate([short, near, full], params)
    path, body = calls(stub_url)[-1]
    assert path == "/generate" and body["input_ids"] == [short, near]  # the full row never went
    assert [s["max_new_tokens"] for s in body["sampling_params"]] == [10, 4]
    assert all(s["stop"] == ["</tool>"] and s["stop_token_ids"] == [1] and s["no_stop_trim"]
               for s in body["sampling_params"])
    assert gens[2].tokens == () and gens[2].finish_reason == "context"
    assert len(gens[1].tokens) <= 4 and gens[1].finish_reason in ("stop", "context")
    assert all(len(g.prompt_ids) + len(g.tokens) <= 128 for g in gens)
    engine.close()


@pytest.fixture()
def slow_stub(tiny_model_path):
    """The stub decoding one step every 20 ms, so a weight update lands while a request is in flight."""
    import sglang_stub

    state = sglang_stub.StubState(str(tiny_model_path), "0", token_delay_s=0.02)
    server = sglang_stub.make_server(state)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def stub_tokens(prompt, version, n, vocab=104):
    """What the stub generates for ``prompt`` under ``version`` (its deterministic rule)."""
    return [(sum(prompt) + 7 * step + 13 * version) % vocab for step in range(n)]


def test_partial_rollouts_abort_update_and_send_the_rest_again(tiny_model_path, slow_stub):
    from safetensors.torch import load_file

    url, state = slow_stub
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=url))
    weights = load_file(str(tiny_model_path / "model.safetensors"))
    asked = [0]

    def refresh():  # the node's subscriber: version 1 is there from the third ask on
        asked[0] += 1
        if asked[0] == 3 and engine.version == 0:
            engine.load_weights(weights, 1)

    engine.set_weight_refresh(refresh)
    prompts = [[20, 21, 27], [22, 15, 23, 29]]
    gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24))
    log = calls(url)
    paths = [p for p, _ in log]
    assert paths.count("/generate") == 2
    pause = next(b for p, b in log if p == "/pause_generation")
    assert pause == {"mode": "abort"}  # abort: the rows in flight come back with what they have
    first, second = [b for p, b in log if p == "/generate"]
    for row, (prompt, g) in enumerate(zip(prompts, gens)):
        k = g.token_versions.index(1)  # where the version changed
        assert 0 < k < 24 and g.token_versions == (0,) * k + (1,) * (24 - k)
        assert list(g.tokens[:k]) == stub_tokens(prompt, 0, k)  # the old version's tokens, kept
        # the rest was asked for again: prompt + the tokens so far, the remaining budget, under version 1
        assert second["input_ids"][row] == prompt + list(g.tokens[:k])
        assert second["sampling_params"][row]["max_new_tokens"] == 24 - k
        assert list(g.tokens[k:]) == stub_tokens(prompt + list(g.tokens[:k]), 1, 24 - k)
        assert g.version == 0 and len(g.logprobs) == 24 and g.finish_reason == "length"
    assert first["input_ids"] == prompts and engine.refreshes["rows"] == 2
    engine.close()


def test_partial_rollouts_respect_max_versions(tiny_model_path, slow_stub):
    url, _ = slow_stub
    engine = SGLangEngine(tiny_model_path, SGLangConfig(url=url))
    asked = [0]
    engine.set_weight_refresh(lambda: asked.__setitem__(0, asked[0] + 1), max_versions=1)
    (g,) = engine.generate([[20, 21, 27]], SamplingParams(temperature=1.0, max_new_tokens=10))
    assert asked[0] == 0 and g.token_versions == () and len(g.tokens) == 10  # never asked: one version per row
    engine.close()


def adapter_tensors(tiny_model_path, lora, seed: int):
    """An adapter version of the tiny model as the weights stream carries it (published names)."""
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from astraflow.engines.lora import is_adapter_name, published_name

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_path)),
                           PeftLora(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules)))
    return {published_name(k): v.detach().clone() for k, v in model.state_dict().items() if is_adapter_name(k)}


def test_a_lora_policy_loads_each_version_as_a_named_adapter(tiny_model_path, stub_url):
    from safetensors.torch import load_file

    from astraflow.engines.config import LoraConfig
    from astraflow.engines.factory import make_rollout_engine

    lora = LoraConfig(rank=4, target_modules=("q_proj", "v_proj"))
    engine = make_rollout_engine({"kind": "sglang", "model_path": str(tiny_model_path),
                                  "sglang": {"url": stub_url}}, lora=lora)
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    base = engine.generate([[20, 21, 27]], params)[0]
    assert "lora_path" not in calls(stub_url)[-1][1]  # version 0: the base (B = 0), no adapter named
    v1 = adapter_tensors(tiny_model_path, lora, 1)
    engine.load_weights(v1, 1)
    path, body = calls(stub_url)[-1]
    assert path == "/load_lora_adapter" and body["lora_name"] == "v1"
    saved = load_file(str(Path(body["lora_path"]) / "adapter_model.safetensors"))
    assert saved.keys() == v1.keys() and all(torch.equal(saved[k], v1[k]) for k in v1)
    config = json.loads((Path(body["lora_path"]) / "adapter_config.json").read_text())
    assert (config["r"], sorted(config["target_modules"])) == (4, ["q_proj", "v_proj"])
    g = engine.generate([[20, 21, 27]], params)[0]
    assert calls(stub_url)[-1][1]["lora_path"] == ["v1"] and g.version == 1 and g.tokens != base.tokens
    engine.load_weights(adapter_tensors(tiny_model_path, lora, 2), 2)
    assert [p for p, _ in calls(stub_url)[-2:]] == ["/load_lora_adapter", "/unload_lora_adapter"]
    assert calls(stub_url)[-1][1] == {"lora_name": "v1"}
    with pytest.raises(KeyError, match="not an adapter tensor"):
        engine.load_weights({"model.norm.weight": torch.zeros(3)}, 3)
    engine.close()


def test_a_shared_pool_serves_several_policies_adapters_on_one_server_each_row_under_its_own(tiny_model_path,
                                                                                            monkeypatch):
    """A shared pool on SGLang: one server launched for every adapter it will hold (the largest
    rank, the union of target modules, two versions of each per batch), each policy's versions
    loaded as ``<policy>-v<N>``, and one /generate holding both policies' rows, each naming its
    own adapter at its own version (None: an adapter's version 0, the base)."""
    from astraflow.engines.config import LoraConfig
    from astraflow.engines.factory import make_adapter_host

    monkeypatch.setenv("PYTHONPATH", str(HERE))
    solver = LoraConfig(rank=4, target_modules=("q_proj", "v_proj"))
    verifier = LoraConfig(rank=8, target_modules=("q_proj", "o_proj"))
    host = make_adapter_host({"kind": "sglang", "model_path": str(tiny_model_path),
                              "sglang": {"server_module": "sglang_stub", "startup_timeout_s": 60}},
                             {"solver": solver, "verifier": verifier})
    try:
        url = host.base_url
        s, v = host.adapter("solver"), host.adapter("verifier")
        params = SamplingParams(temperature=0.0, max_new_tokens=4)
        prompt = [20, 21, 27]
        base = host.generate([prompt, prompt], params, adapters=["solver", "verifier"])
        assert "lora_path" not in calls(url)[-1][1] and [g.version for g in base] == [0, 0]
        v.load_weights(adapter_tensors(tiny_model_path, verifier, 1), 3)  # rank 8 on o_proj: the launch allowed it
        path, body = calls(url)[-1]
        assert path == "/load_lora_adapter" and body["lora_name"] == "verifier-v3"
        assert (v.version, s.version) == (3, 0)
        mixed = host.generate([prompt, prompt], params, adapters=["solver", "verifier"])
        assert calls(url)[-1][1]["lora_path"] == [None, "verifier-v3"]
        assert [g.version for g in mixed] == [0, 3]
        assert mixed[0].tokens == base[0].tokens and mixed[1].tokens != base[1].tokens  # each row under its own
        s.load_weights(adapter_tensors(tiny_model_path, solver, 2), 1)
        v.load_weights(adapter_tensors(tiny_model_path, verifier, 3), 4)
        assert [(p, b.get("lora_name")) for p, b in calls(url)[-3:]] == [
            ("/load_lora_adapter", "solver-v1"), ("/load_lora_adapter", "verifier-v4"),
            ("/unload_lora_adapter", "verifier-v3")]  # the solver's stays loaded
        g = s.generate([prompt], params)[0]
        assert calls(url)[-1][1]["lora_path"] == ["solver-v1"] and g.version == 1
        with pytest.raises(KeyError, match="load_adapter"):
            host.load_weights(adapter_tensors(tiny_model_path, solver, 4), 5)
        with pytest.raises(KeyError, match="no adapter 'critic'"):
            host.adapter("critic")
        with pytest.raises(KeyError, match="no adapter 'critic'"):
            host.generate([prompt], params, adapters=["critic"])
    finally:
        host.close()

