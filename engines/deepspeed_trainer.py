"""DeepSpeed implementation of ``TrainEngine``: RL policy updates for one HF causal LM.

Owns the DeepSpeed engine (ZeRO stage from config; gloo + fp32 on CPU, NCCL + bf16 on
GPU), the optimizer and LR schedule, token-budget micro-batching, loss assembly from
``losses.py``, checkpoints (DeepSpeed state + RNG + the caller's ``extra_state``, e.g.
consumed Kafka offsets) and HF export. It does not read Kafka or publish weights.

A step over a ``TrainBatch``: compute advantages (GRPO from rewards + group ids unless
given), pack samples into micro-batches of at most ``token_budget`` padded tokens,
forward/backward each with the loss normalised by the *whole* batch's token (or
sequence) count, then one optimizer step. Because each update uses fresh weights, the
proximal policy of decoupled PPO equals the current weights before the update, so its
logprobs are the detached current logprobs (no extra forward pass).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from .base import TrainBatch, TrainEngine
from .config import TrainerConfig
from .losses import POLICY_LOSSES, aggregate, grpo_advantages, kl_penalty

__all__ = ["DeepSpeedTrainer", "init_single_process_distributed"]

CKPT_TAG = "latest_step"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_distributed(backend: str) -> None:
    """Make a world of one when no launcher set the usual env vars, then init DeepSpeed's
    process group (idempotent)."""
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


class DeepSpeedTrainer(TrainEngine):
    """Policy trainer for an HF causal LM directory."""

    def __init__(self, model_path: str | Path, cfg: TrainerConfig | None = None) -> None:
        cfg = cfg or TrainerConfig()
        self.cfg = cfg
        self.model_path = Path(model_path)
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        # DeepSpeed picks its accelerator at import; on CPU it must be told before that.
        if not use_cuda:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from transformers import AutoModelForCausalLM

        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
        self.bf16 = use_cuda and cfg.bf16
        init_single_process_distributed("nccl" if use_cuda else "gloo")
        torch.manual_seed(cfg.seed)

        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        self._tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.ref_model.to(self.device, dtype=torch.bfloat16 if self.bf16 else torch.float32)

        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self._lr_factor)
        ds_config = {
            # The batch is one TrainBatch; micro-batching is by token budget and the
            # accumulation boundary is set explicitly, so these counts are nominal.
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": {"stage": cfg.zero_stage},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": self.bf16},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self._step = 0

    # --- TrainEngine -------------------------------------------------------------

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        started = time.perf_counter()
        cfg = self.cfg
        samples = batch.samples
        advantages = self._advantages(batch)
        micro = self._micro_batches(samples)
        n_tokens = float(sum(len(s.completion_ids) for s in samples))
        n_seqs = float(len(samples))
        self.engine.train()
        sums: dict[str, float] = {}

        def acc(name: str, value: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0.0) + float(value)

        for k, idx in enumerate(micro):
            ids, mask, behav = self._collate([samples[i] for i in idx])
            adv = advantages[idx].to(self.device).unsqueeze(-1).expand_as(mask)
            logp, entropy = self._logprobs(self.engine, ids, with_entropy=True)
            per_token, stats = POLICY_LOSSES[cfg.loss](logp, logp.detach(), behav, adv, mask, cfg.loss_params)
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp, _ = self._logprobs(self.ref_model, ids)
                kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
                per_token = per_token + cfg.kl_coef * kl
                acc("kl", (kl.detach() * mask).sum())
            loss = aggregate(per_token, mask, cfg.aggregation, num_tokens=n_tokens, num_sequences=n_seqs)
            self.engine.set_gradient_accumulation_boundary(k == len(micro) - 1)
            self.engine.backward(loss, scale_wrt_gas=False)
            acc("loss", loss.detach())
            acc("entropy", (entropy * mask).sum())
            acc("behav_logp_gap", ((logp.detach() - behav).abs() * mask).sum())
            for name in ("clipped", "iw_capped", "m2po_masked"):
                if name in stats:
                    acc(name, (stats[name] * mask).sum())
        # Without ZeRO, DeepSpeed clips but does not record the norm; measure it here.
        pre_norm = self._grad_norm() if self.cfg.zero_stage == 0 else None
        lr = float(self.scheduler.get_last_lr()[0])  # the rate this step applies
        self.engine.step()
        self._step += 1

        elapsed = time.perf_counter() - started
        grad_norm = pre_norm if pre_norm is not None else self.engine.get_global_grad_norm()
        metrics = {
            "step": float(self._step),
            "loss": sums["loss"],
            "lr": lr,
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "entropy": sums["entropy"] / n_tokens,
            "behav_logp_gap": sums["behav_logp_gap"] / n_tokens,
            "advantage_mean": float(advantages.mean()),
            "reward_mean": float(sum(s.reward for s in samples) / n_seqs),
            "tokens": n_tokens,
            "samples": n_seqs,
            "micro_batches": float(len(micro)),
            "step_seconds": elapsed,
            "samples_per_s": n_seqs / elapsed,
        }
        for name in ("kl", "clipped", "iw_capped", "m2po_masked"):
            if name in sums:
                metrics[f"{name}_frac" if name != "kl" else "kl"] = sums[name] / n_tokens
        return metrics

    def named_weights(self) -> dict[str, torch.Tensor]:
        import deepspeed

        module = self.engine.module
        params = list(module.parameters())
        # ZeRO-3 partitions parameters; gather them to read full tensors.
        ctx = deepspeed.zero.GatheredParameters(params) if self.cfg.zero_stage == 3 else contextlib.nullcontext()
        with ctx:
            out = {name: t.detach().to("cpu", dtype=torch.float32, copy=True) for name, t in module.state_dict().items()}
        return out

    def save_checkpoint(self, directory: str | Path, extra_state: Mapping[str, object]) -> None:
        client = {
            "extra_state": dict(extra_state),
            "af_step": self._step,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
        }
        self.engine.save_checkpoint(str(directory), tag=CKPT_TAG, client_state=client)

    def load_checkpoint(self, directory: str | Path) -> dict[str, object]:
        path, client = self.engine.load_checkpoint(str(directory), tag=CKPT_TAG)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory} (tag {CKPT_TAG!r})")
        self._step = int(client["af_step"])
        torch.set_rng_state(client["torch_rng"])
        if client.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(client["cuda_rng"])
        return dict(client["extra_state"])

    def export_hf(self, directory: str | Path) -> Path:
        from transformers import AutoTokenizer

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        weights = self.named_weights()
        module = self.engine.module
        module.save_pretrained(str(out), state_dict=weights, safe_serialization=True)
        try:
            AutoTokenizer.from_pretrained(str(self.model_path)).save_pretrained(str(out))
        except (OSError, ValueError):
            pass  # a model directory without a tokenizer exports without one
        return out

    def close(self) -> None:
        self.engine = None  # type: ignore[assignment]
        self.ref_model = None

    # --- internals ---------------------------------------------------------------

    def _lr_factor(self, step: int) -> float:
        cfg = self.cfg
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "cosine":
            progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def _grad_norm(self) -> float:
        grads = [p.grad.detach().float() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0

    def _advantages(self, batch: TrainBatch) -> torch.Tensor:
        if batch.samples[0].advantage is not None:
            return torch.tensor([s.advantage for s in batch.samples], dtype=torch.float32)
        rewards = torch.tensor([s.reward for s in batch.samples], dtype=torch.float32)
        return grpo_advantages(rewards, [s.group_id for s in batch.samples], self.cfg.normalize_std)

    def _micro_batches(self, samples) -> list[list[int]]:
        """Greedy in-order packing: a micro-batch's padded size (rows x longest row)
        stays within ``token_budget``; a single over-long sample gets its own."""
        out: list[list[int]] = []
        cur: list[int] = []
        longest = 0
        for i, s in enumerate(samples):
            n = len(s.prompt_ids) + len(s.completion_ids)
            if cur and max(longest, n) * (len(cur) + 1) > self.cfg.token_budget:
                out.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        out.append(cur)
        return out

    def _collate(self, samples) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded ``prompt + completion`` ids [B, L] and, aligned with the
        *predicting* position (column j predicts token j + 1), the completion mask and
        behaviour logprobs [B, L - 1]."""
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.long)
        mask = torch.zeros((len(samples), width - 1))
        behav = torch.zeros((len(samples), width - 1))
        for i, s in enumerate(samples):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[i, : p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids))
            mask[i, p - 1 : p - 1 + c] = 1.0
            behav[i, p - 1 : p - 1 + c] = torch.tensor(s.behaviour_logprobs)
        return ids.to(self.device), mask.to(self.device), behav.to(self.device)

    def _logprobs(self, model, ids: torch.Tensor, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Right padding needs no attention mask: causal attention never looks right, and
        # padded positions are masked out of the loss.
        logits = model(input_ids=ids).logits[:, :-1].float() / self.cfg.temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy
