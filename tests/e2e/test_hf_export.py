"""A job's trained model out: the trainer's HF exports, and the same versions rebuilt offline from its run dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _astraflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True, text=True, timeout=600,
                          cwd=str(ROOT))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_run_exports_its_model_and_its_run_dir_rebuilds_it_offline(make_job_config, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from astraflow.engines.hf_export import HFExports
    from astraflow.launcher import run_job

    cfg = make_job_config({"trainer": {"steps": 2, "export_every": 1}})
    run = tmp_path / "run"
    summary = run_job(cfg, bootstrap=None, run_dir=run, progress=False, timeout_s=900)  # its own embedded broker
    exports = HFExports(run / "hf" / "policy")
    assert exports.versions() == [1, 2] and exports.final() == exports.path(2).resolve()
    assert summary["models"] == {"policy": str(exports.path(2).resolve())}
    model = AutoModelForCausalLM.from_pretrained(str(exports.final()))
    assert not torch.equal(model.state_dict()["model.embed_tokens.weight"],
                           load_file(str(exports.path(1) / "model.safetensors"))["model.embed_tokens.weight"])

    # The job's broker is gone: status and export --model open the run dir's log themselves.
    st = _astraflow("status", "--run-dir", str(run), "--job", cfg.job)
    assert st.returncode == 0 and "version 2" in st.stdout, st.stdout + st.stderr[-2000:]
    for version in (1, 2):
        out = tmp_path / f"log-v{version}"
        ex = _astraflow("export", "--model", "--job", cfg.job, "--run-dir", str(run), "--version", str(version),
                        "--out", str(out))  # config and tokenizer from the run's own exports
        assert ex.returncode == 0, ex.stderr[-2000:]
        mine, trainers = (load_file(str(d / "model.safetensors")) for d in (out, exports.path(version)))
        assert mine.keys() == trainers.keys()
        for name, t in trainers.items():
            assert torch.equal(mine[name], t), (version, name)
