"""One rank of the multi-rank trainer tests (``test_trainer_ranks.py``), run by torch's launcher.

``python -m torch.distributed.run --nproc-per-node N ranks_worker.py OUT_DIR`` trains the
same seeded batch as the tests' one-rank reference under every ZeRO stage, checks a
checkpoint round trip, and writes rank 0's results to ``OUT_DIR`` (``weights_z<S>.pt``,
``resume_z<S>.pt``, ``after1_z<S>.pt`` beside checkpoint ``ckpt_z<S>``, ``zero3.pt``,
``weights_lora.pt`` beside checkpoint ``ckpt_lora``, ``meta.json``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

STEPS = 2


def lora_settings() -> dict:
    """A LoRA policy with a KL term: under ZeRO-3 its reference pass (the adapter disabled) gathers too."""
    from astraflow.engines.config import LoraConfig

    return {"lora": LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj")), "kl_coef": 0.05}


def fixed_batch():
    """Seeded samples of varied lengths (uneven micro-batch counts per rank); 3 groups."""
    from astraflow.engines.base import TrainBatch, TrainSample

    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(9):
        prompt = torch.randint(3, 40, (5 + i % 3,), generator=g).tolist()
        n = 3 + i % 4
        completion = torch.randint(3, 40, (n,), generator=g).tolist()
        behaviour = (-torch.rand(n, generator=g) * 4).tolist()
        samples.append(TrainSample(tuple(prompt), tuple(completion), tuple(behaviour), reward=float(i % 3),
                                   group_id=i // 3, version=0))
    return TrainBatch(tuple(samples))


def trainer(path, zero_stage: int, **overrides):
    from astraflow.engines.config import TrainerConfig
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    return DeepSpeedTrainer(path, TrainerConfig(zero_stage=zero_stage, lr=1e-3, token_budget=30, seed=0, **overrides))


def main(out: Path) -> None:
    from astraflow.models.bootstrap import ensure_tiny_model

    torch.set_num_threads(1)
    path = ensure_tiny_model()
    batch = fixed_batch()
    rank = int(os.environ.get("RANK", 0))
    meta: dict = {}
    for z in (0, 1, 2, 3):
        t = trainer(path, z)
        metrics = [t.train_step(batch) for _ in range(STEPS)]
        w = t.named_weights(rank0_only=True)
        if rank == 0:
            torch.save(w, out / f"weights_z{z}.pt")
            meta[f"z{z}"] = {"world": t.world, "loss": metrics[-1]["loss"],
                             "micro_batches": metrics[-1]["micro_batches"],
                             **{k: metrics[-1][k] for k in ("behav_logp_gap", "behav_logp_gap_p99", "rollout_ratio_p50")}}
        else:
            assert w == {}, "ranks other than 0 must not hold a copy of the weights"
    for z in (2, 3):  # checkpoint after step 1 on N ranks, resume on N ranks, train step 2
        ckpt = out / f"ckpt_z{z}"
        t = trainer(path, z)
        t.train_step(batch)
        t.save_checkpoint(ckpt, {"batches_offset": 7})
        after1 = t.named_weights(rank0_only=True)
        if rank == 0:
            torch.save(after1, out / f"after1_z{z}.pt")
        resumed = trainer(path, z)
        extra = resumed.load_checkpoint(ckpt)
        resumed.train_step(batch)
        w = resumed.named_weights(rank0_only=True)
        if rank == 0:
            torch.save(w, out / f"resume_z{z}.pt")
            meta[f"resume_z{z}"] = {"extra": extra, "step": resumed.step}
    t = trainer(path, 3, **lora_settings())  # a LoRA policy under ZeRO-3; its checkpoint is the adapter's
    for _ in range(STEPS):
        t.train_step(batch)
    w = t.named_weights(rank0_only=True)
    t.save_checkpoint(out / "ckpt_lora", {"batches_offset": 3})
    if rank == 0:
        torch.save(w, out / "weights_lora.pt")
    # ZeRO-3: what rank 0 would publish vs DeepSpeed's own consolidation of the shards.
    t = trainer(path, 3)
    t.train_step(batch)
    published = t.named_weights(rank0_only=True)
    t.save_checkpoint(out / "ckpt_publish", {})
    t.barrier()
    if rank == 0:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        from astraflow.engines.deepspeed_checkpoint import CKPT_TAG
        consolidated = get_fp32_state_dict_from_zero_checkpoint(str(out / "ckpt_publish"), tag=CKPT_TAG)
        torch.save({"published": published, "consolidated": dict(consolidated)}, out / "zero3.pt")
        (out / "meta.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
