"""gpu_check.sh's real-shape stage on the CPU: benchmarks/gpu_real_shape.py's smoke path runs the real
DeepSpeed trainer and the weight codec on a shrunk SmolLM2 shape and writes the section gpu_check.json
gets on a GPU, labelled as CPU numbers; benchmarks/gpu_env.py brings a GPU machine without a package
index what the stage needs (wheels it lacks, this checkout as the astraflow package)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from astraflow.benchmarks import gpu_env, gpu_real_shape

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--device", "cpu", "--layers", "2", "--vocab", "2048", "--groups", "2", "--samples", "4",
         "--prompt-tokens", "16", "--completion-tokens", "8", "--steps", "3", "--repeats", "3",
         "--codec-threads", "1", "--threads", "1"]


def test_cpu_smoke_trains_encodes_and_writes_the_section_as_cpu_numbers(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    assert gpu_real_shape.main([*SMOKE, "--out", str(out)]) == 0
    s = json.loads(out.read_text())[gpu_real_shape.SECTION]
    assert s["ok"] and s["device"] == "cpu" and s["device_name"] == "cpu"
    assert s["measured_on"].startswith("cpu") and "not GPU numbers" in s["measured_on"]
    assert s["model"]["layers"] == 2 and not s["model"]["full_shape"] and s["model"]["config"]["vocab_size"] == 2048
    assert s["model"]["config"]["hidden_size"] == 576 and s["model"]["parameters"] > 1e6
    assert s["versions"]["deepspeed"] and s["trainer"]["config"]["zero_stage"] == 2
    (row,) = s["trainer"]["rows"]
    assert row["batch"]["samples_total"] == 8 and row["batch"]["tokens"] > row["batch"]["trained_tokens"] > 0
    for key in ("step_s", "tokens_per_s", "samples_per_s"):
        assert row[key]["n"] == 3 and 0 < row[key]["min"] <= row[key]["median"] <= row[key]["max"]
    assert all(math.isfinite(x) for x in row["loss"]) and row["peak_rss_mb"] > 0
    assert "peak_gpu_mb" not in row and s["trainer"]["resident_after_init_gpu_mb"] is None  # no GPU numbers on a CPU
    c = s["codec"]
    assert c["dtype"] == "bfloat16" and c["raw_bytes"] > 0
    assert c["tied_duplicates"] == ["lm_head.weight"] and c["tied_duplicate_bytes"] == 2048 * 576 * 2
    assert 0 < c["delta"]["bytes"] < c["snapshot"]["bytes"] < c["raw_bytes"]  # one step moves few bf16 bits
    assert 0 < c["delta"]["changed_fraction"] < 1 and c["delta"]["bit_exact"]
    assert c["apply_in_place_kept_storage"] and not c["copied_to_host"] and c["where"]["input"] == "cpu tensors"
    for key in ("encode_s", "decode_s"):
        assert c["snapshot"][key]["n"] == 3
    assert c["delta"]["apply_in_place_s"]["n"] == 3 and c["device_to_host_s"]["n"] == 3
    assert "hundreds of MB" in s["not_run_here"]["sglang"]
    assert "not GPU numbers" in capsys.readouterr().out  # the table says so too


def test_cpu_numbers_are_never_written_into_gpu_check_json(capsys):
    with pytest.raises(SystemExit):
        gpu_real_shape.main([*SMOKE, "--out", str(gpu_real_shape.GPU_CHECK)])
    assert "CPU numbers are never written" in capsys.readouterr().err


def test_without_cuda_the_stage_says_skipped_and_writes_nothing(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "gpu_check.json"
    assert gpu_real_shape.main(["--device", "cuda", "--out", str(out)]) == 0
    assert "skipped: no CUDA" in capsys.readouterr().out and not out.exists()


def test_the_shape_is_smollm2_135m(smol_random):
    """The config in the repo is the real model's: its non-shape keys as the fetched model's config says
    them (smol_random keeps them, shrinking only the layers), its 134.5 M parameters as the issue counts."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    real = json.loads((smol_random / "config.json").read_text())
    cfg = gpu_real_shape.SMOLLM2_135M
    for key in ("vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                "model_type"):
        assert cfg[key] == real[key], key
    assert cfg["rms_norm_eps"] == pytest.approx(real["rms_norm_eps"])
    assert cfg["rope_theta"] == real["rope_parameters"]["rope_theta"]
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert (model.config.num_hidden_layers, model.config.num_key_value_heads, model.config.head_dim) == (30, 3, 64)


def test_carried_wheels_pin_what_pyproject_pins():
    """The wheels a GPU machine gets are the versions the project is tested with."""
    pins = dict(re.match(r"([A-Za-z0-9_.-]+)==(\S+)", d).groups()
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if "==" in d)
    lines = [ln for ln in (ROOT / "benchmarks" / "gpu_wheels.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    wheels = dict(ln.split("==") for ln in lines)
    assert {"deepspeed", "zstandard", "blake3"} <= set(wheels)
    for name in set(wheels) & set(pins):
        assert wheels[name] == pins[name], name


def test_only_wheels_of_missing_distributions_are_installed(tmp_path):
    for name in ("zstandard-0.25.0-cp312-cp312-manylinux2014_x86_64.whl", "pydantic_core-2.50.5-cp312-cp312-x.whl",
                 "surely_absent_dist_af58-1.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert [w.name for w in gpu_env.missing_wheels(tmp_path)] == ["surely_absent_dist_af58-1.0-py3-none-any.whl"]
    assert gpu_env.missing_wheels(tmp_path / "absent") == []


def test_the_link_tree_is_the_astraflow_package_and_needs_a_safe_path(tmp_path):
    """With no install, the tree makes every sub-package importable from this checkout; the checkout's own
    astraflow/ folder (the top package alone) would shadow it unless Python runs with PYTHONSAFEPATH."""
    pkg = gpu_env.package_tree(tmp_path)
    assert {p.name for p in pkg.iterdir()} >= {"__init__.py", "engines", "weights", "benchmarks", "models"}
    probe = ("import astraflow.benchmarks.lib.stats as s, astraflow.engines.loss_names as n, astraflow as a; "
             "print(a.__file__, s.__file__, n.__file__)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": str(tmp_path)}
    # -S: no site-packages, so no installed astraflow: the tree is all there is
    safe = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, env=env | {"PYTHONSAFEPATH": "1"},
                          capture_output=True, text=True)
    assert safe.returncode == 0, safe.stderr
    assert all(f.startswith(str(tmp_path)) for f in safe.stdout.split())
    unsafe = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
    assert unsafe.returncode != 0 and "No module named 'astraflow.benchmarks'" in unsafe.stderr
