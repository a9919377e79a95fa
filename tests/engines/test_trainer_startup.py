"""A single-rank CPU trainer starts without building DeepSpeed's shared-memory collectives.

DeepSpeed JIT-compiles ``deepspeed_shm_comm`` into ``TORCH_EXTENSIONS_DIR`` when its CPU
process group starts (a minute or more of C++ on a fresh machine), which a world of one
never uses. The trainer is built in a fresh process (the process group is per process) with
an empty extensions dir; nothing may be compiled into it. Nor does it import MLflow, which
DeepSpeed's autotuner imports when installed (a second or more of every trainer restart).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys
from astraflow.engines.config import TrainerConfig
from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer
t = DeepSpeedTrainer(sys.argv[1], TrainerConfig(device="cpu", threads=1))
print("step", t.step)
"""


def test_single_rank_cpu_trainer_builds_no_shm_op(tiny_model_path, tmp_path):
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1"}
    for k in ("RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_path)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 0" in proc.stdout
    built = sorted(p.name for p in ext.rglob("*") if p.is_dir())
    assert not any("shm" in name for name in built), built


def test_a_single_rank_trainer_ignores_an_inherited_master_port_that_is_taken(tiny_model_path):
    """A process that trained in-process (a test, a benchmark, a launcher) leaves its own
    MASTER_PORT in the environment its children inherit, still bound by its store; a
    one-rank trainer started from there must take a fresh port, not fail EADDRINUSE."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(taken.getsockname()[1]), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_path)], env=env, capture_output=True,
                              text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 0" in proc.stdout


def test_a_single_rank_trainer_under_torch_launcher_joins_its_agent_store(tiny_model_path, tmp_path):
    """``torch.distributed.run --nproc-per-node 1`` (the scaling benchmark's one-rank configs):
    the agent serves the store at the MASTER_PORT it exported and the rank is its client, so
    the rank must keep that port; a fresh one left it waiting for a server that never came."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "one_rank.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "1",
                           "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
                           str(script), str(tiny_model_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 0" in proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed here")
def test_a_cpu_trainer_starts_without_importing_mlflow_and_times_its_parts(tiny_model_path):
    """``import deepspeed`` imports its autotuner, which imports ``mlflow`` when installed; the
    trainer never autotunes. It is hidden for that import only: ``import mlflow`` works later."""
    script = SCRIPT + """
print("mlflow imported:", "mlflow" in sys.modules)
print("parts:", sorted(t.init_s), min(t.init_s.values()) >= 0)
import mlflow
print("later:", mlflow.__name__)
"""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "1"}
    for k in ("RANK", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-c", script, str(tiny_model_path)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mlflow imported: False" in proc.stdout, proc.stdout
    assert "parts: ['deepspeed_initialize', 'imports', 'model_load', 'process_group'] True" in proc.stdout
    assert "later: mlflow" in proc.stdout
