"""The DeepSpeed trainer across 2 ranks (gloo on CPU, torch's launcher): every ZeRO stage
trains the same global batch to the weights one rank reaches, checkpoints round-trip on
2 ranks and load on 1 rank (consolidated), and what rank 0 publishes under ZeRO-3 is
DeepSpeed's own consolidation of the partitioned parameters, bit for bit; a LoRA policy
under ZeRO-3 too (its adapter, its KL reference pass, its adapter-only checkpoint).

Tolerance: 2 ranks sum a gradient from two shards where one rank sums micro-batches in
order, so fp32 results differ in the last bits; after 2 AdamW steps at lr 1e-3 we allow
2e-5 absolute (2 % of one step's update), as the micro-batching test does.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
TOL = 2e-5

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_model_path):
    """Run ranks_worker.py on 2 ranks once; its outputs for every test here."""
    out = tmp_path_factory.mktemp("ranks")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(HERE / "ranks_worker.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out, json.loads((out / "meta.json").read_text())


def _one_rank(tiny_model_path, zero_stage: int) -> tuple[dict, dict]:
    sys.path.insert(0, str(HERE))
    try:
        import ranks_worker
    finally:
        sys.path.remove(str(HERE))
    t = ranks_worker.trainer(tiny_model_path, zero_stage)
    batch = ranks_worker.fixed_batch()
    metrics = [t.train_step(batch) for _ in range(ranks_worker.STEPS)]
    return t.named_weights(), metrics[-1]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_two_ranks_train_the_global_batch_like_one(two_ranks, tiny_model_path, zero_stage):
    out, meta = two_ranks
    got = torch.load(out / f"weights_z{zero_stage}.pt")
    want, metrics = _one_rank(tiny_model_path, zero_stage)
    initial = _initial(tiny_model_path)
    assert meta[f"z{zero_stage}"]["world"] == 2
    # The shards' losses add up to the one-rank loss, and both ranks' micro-batches count.
    assert meta[f"z{zero_stage}"]["loss"] == pytest.approx(metrics["loss"], abs=1e-5)
    assert meta[f"z{zero_stage}"]["micro_batches"] >= metrics["micro_batches"]
    # The gap metrics are over every rank's tokens (gathered), as on one rank.
    for key in ("behav_logp_gap", "behav_logp_gap_p99", "rollout_ratio_p50"):
        assert meta[f"z{zero_stage}"][key] == pytest.approx(metrics[key], abs=1e-5), key
    assert _max_diff(got, want) <= TOL
    # Not vacuous: training moved the weights by far more than the tolerance.
    assert _max_diff(want, initial) > 50 * TOL


def test_checkpoint_resume_on_two_ranks_is_bit_identical(two_ranks):
    out, meta = two_ranks
    for z in (2, 3):
        straight = torch.load(out / f"weights_z{z}.pt")
        resumed = torch.load(out / f"resume_z{z}.pt")
        assert meta[f"resume_z{z}"] == {"extra": {"batches_offset": 7}, "step": 2}
        for k in straight:
            assert torch.equal(straight[k], resumed[k]), (z, k)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_a_two_rank_checkpoint_resumes_on_one_rank_with_consolidated_weights(two_ranks, tiny_model_path,
                                                                             zero_stage):
    sys.path.insert(0, str(HERE))
    try:
        import ranks_worker
    finally:
        sys.path.remove(str(HERE))
    out, _ = two_ranks
    t = ranks_worker.trainer(tiny_model_path, zero_stage)
    extra = t.load_checkpoint(out / f"ckpt_z{zero_stage}")
    assert t.resharded and t.step == 1 and extra == {"batches_offset": 7}
    saved = torch.load(out / f"after1_z{zero_stage}.pt")
    got = t.named_weights()
    for k in saved:
        assert torch.equal(got[k], saved[k]), k
    m = t.train_step(ranks_worker.fixed_batch())  # trains on from there (fresh optimizer moments)
    assert t.step == 2 and m["grad_norm"] > 0


def test_zero3_published_weights_are_the_gathered_parameters(two_ranks):
    out, _ = two_ranks
    both = torch.load(out / "zero3.pt")
    published, consolidated = both["published"], both["consolidated"]
    # Tied embeddings: the consolidation lists each parameter once.
    for name, t in consolidated.items():
        assert torch.equal(published[name], t.float()), name
    assert set(consolidated) <= set(published)


_INITIAL: dict = {}


def _initial(path) -> dict:
    if not _INITIAL:
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        _INITIAL.update({k: v.detach().clone() for k, v in m.state_dict().items()})
    return _INITIAL


def test_a_lora_policy_under_zero3_trains_on_two_ranks_like_one_and_its_checkpoint_resumes_on_one(
        two_ranks, tiny_model_path):
    from astraflow.engines.lora import is_adapter_name

    sys.path.insert(0, str(HERE))
    try:
        import ranks_worker
    finally:
        sys.path.remove(str(HERE))
    out, _ = two_ranks
    got = torch.load(out / "weights_lora.pt")
    one = ranks_worker.trainer(tiny_model_path, 3, **ranks_worker.lora_settings())
    for _ in range(ranks_worker.STEPS):
        one.train_step(ranks_worker.fixed_batch())
    want = one.named_weights()
    assert got.keys() == want.keys() and got and all(is_adapter_name(k) for k in got)
    assert _max_diff(got, want) <= TOL
    assert max(float(t.abs().max()) for k, t in want.items() if ".lora_B." in k) > 20 * TOL  # B started at 0
    resumed = ranks_worker.trainer(tiny_model_path, 3, **ranks_worker.lora_settings())
    assert resumed.load_checkpoint(out / "ckpt_lora") == {"batches_offset": 3}
    assert resumed.resharded and resumed.step == ranks_worker.STEPS
    for k, t in resumed.named_weights().items():
        assert torch.equal(t, got[k]), k
