"""DeepSpeed implementation of ``TrainEngine``: RL policy updates for one HF causal LM.

Owns the DeepSpeed engine (ZeRO stage from config; gloo + fp32 on CPU, NCCL + bf16 on
GPU), the optimizer and LR schedule, token-budget micro-batching, loss assembly from
``losses.py``, checkpoints (DeepSpeed state + RNG + the caller's ``extra_state``, e.g.
consumed Kafka offsets) and HF export. It does not read Kafka or publish weights.

A step over a ``TrainBatch`` (one batch = one version):

1. ``prepare``: the no-grad passes the step needs, each once per batch and before any
   update — proximal log-probs (the weights before the first update; AReaL's decoupled
   objective) when the batch takes several updates or the loss/KL needs them, reference
   log-probs for KL terms — then k1-shaped rewards, advantages (GRPO from rewards + group
   ids unless given) and the loss's batch-level token mask (M2PO), so none of these
   depends on how the batch is split.
2. ``ppo_epochs`` passes over ``minibatches`` contiguous minibatches, one optimizer step
   each; a minibatch is packed into micro-batches of at most ``token_budget`` padded
   tokens whose losses are normalised by the minibatch's token (or sequence) count.

Trainer log-probs are those of the rollout's sampling distribution (temperature, top-k,
top-p), so they agree with the behaviour log-probs the engine recorded; the step reports
the residual gap on tokens generated at the trained version.

Across ranks (a world of N, set up by torch's launcher from ``RANK``/``WORLD_SIZE``/
``MASTER_ADDR``/``MASTER_PORT``): every rank is given the same batch and works on its
shard — a contiguous slice by sample index of each minibatch (and of the batch for the
no-grad passes, whose results are all-gathered so advantages, KL shaping and batch masks
are computed on the whole batch as with one rank). A shard's loss is normalised by the
*global* token (or sequence) count and scaled by N, because DeepSpeed averages gradients
over ranks: the all-reduced gradient is then the one-rank gradient. Ranks may need
different numbers of token-budget micro-batches; the shorter ones run zero-loss passes
so every rank enters the same collectives (ZeRO-3 gathers parameters in every forward,
ZeRO-2 reduces gradients in every backward). ZeRO 1-3 partition optimizer state,
gradients and parameters over the N ranks; ``named_weights`` gathers ZeRO-3 parameters
with DeepSpeed's ``GatheredParameters``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import TrainBatch, TrainEngine
from .config import TrainerConfig
from .losses import BATCH_MASKS, POLICY_LOSSES, aggregate, grpo_advantages, kl_penalty, kl_shaped_rewards
from .sampling import sampling_logprobs

__all__ = ["DeepSpeedTrainer", "StepPlan", "init_single_process_distributed"]

CKPT_TAG = "latest_step"
#: Beside DeepSpeed's files: the world size and ZeRO stage a checkpoint was saved with.
WORLD_FILE = "astraflow_world.json"
# Trainer log-prob of a token outside the truncated sampling support (see ``_logprobs``):
# e^-100 is 0 in every ratio, yet finite, so masked products stay 0 rather than NaN.
LOGP_FLOOR = -100.0

# Per-token diagnostics a loss may return -> the metric reporting their token fraction.
_TOKEN_STATS = {"clipped": "clipped_frac", "iw_capped": "iw_capped_frac", "m2po_masked": "m2po_masked_frac", "kl": "kl"}


@dataclass(frozen=True)
class StepPlan:
    """What a step computes once per batch before any update (``DeepSpeedTrainer.prepare``).

    Per-sample lists hold one 1-D tensor per sample, over its completion tokens.
    """

    advantages: torch.Tensor  #: [N]
    rewards: torch.Tensor  #: [N], after KL shaping
    #: sampling log-probs under the weights before the first update; None when the batch
    #: takes a single update (its own detached log-probs are then exactly these)
    logp_prox: list[torch.Tensor] | None
    logp_ref: list[torch.Tensor] | None  #: full tempered log-probs under the reference
    keep: list[torch.Tensor] | None  #: the loss's batch-level token selection (M2PO)
    kl_in_reward: torch.Tensor | None  #: [N] per-sequence k1 subtracted from the rewards


def _saved_layout(directory: Path) -> dict | None:
    """``{"world", "zero_stage"}`` a checkpoint was saved with (None: saved before it was recorded)."""
    try:
        return json.loads((directory / WORLD_FILE).read_text())
    except FileNotFoundError:
        return None


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", dtype=torch.float32, copy=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_single_process_distributed(backend: str, timeout_s: float = 300.0) -> None:
    """Make a world of one when no launcher set the usual env vars (a launcher's
    ``RANK``/``WORLD_SIZE``/``MASTER_*`` win), then init DeepSpeed's process group
    (idempotent). ``timeout_s`` bounds every collective: a rank whose peer died without
    closing its sockets fails after it instead of hanging."""
    import datetime

    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if os.environ.get("WORLD_SIZE", "1") == "1":
        # A world of one meets no peer, so its store takes a fresh port whatever an inherited
        # environment names: a parent that trained in-process leaves its own, still-bound
        # MASTER_PORT there, and reusing it fails with EADDRINUSE on every restart.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
    if backend == "gloo":
        _skip_shm_collectives()
    deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=datetime.timedelta(seconds=timeout_s))


def _skip_shm_collectives() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op
    (``deepspeed_shm_comm``) when its process group starts: a C++ build of a minute or more
    on a fresh machine or checkout, on the critical path to the first trained step. The op
    serves DeepSpeed's inference all-reduce only; training collectives go through
    torch.distributed's gloo ones whether it exists or not, so the trainer does without it."""
    import importlib

    # By module path: the attribute ``deepspeed.comm.torch`` is the torch package itself.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


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
        init_single_process_distributed("nccl" if use_cuda else "gloo", cfg.collective_timeout_s)
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)

        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        self._tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self.ref_model = None
        if cfg.kl_coef > 0 or cfg.kl_in_reward_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.ref_model.to(self.device, dtype=torch.bfloat16 if self.bf16 else torch.float32)

        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
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
        # No DeepSpeed LR scheduler: it would count optimizer steps, and the schedule
        # counts versions (``_apply_lr``), which the checkpoint already holds.
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self._step = 0
        self.resharded = False  #: the last load_checkpoint changed the world size (see there)

    # --- TrainEngine -------------------------------------------------------------

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One version: ``ppo_epochs`` x ``minibatches`` optimizer steps on ``batch``.

        Metrics: ``loss`` and ``grad_norm`` (means over the updates), token fractions
        ``clipped_frac`` / ``iw_capped_frac`` / ``m2po_masked_frac`` and the KL term
        ``kl`` over all updates, and, when a batch takes several updates, the same per
        update ``k = epoch * minibatches + j`` as ``<name>_mb<k>``; ``behav_logp_gap``
        and ``train_inference_logp_gap`` (see ``_logp_gaps``), ``kl_in_reward`` (mean
        per-sequence k1) when the KL is in the reward.
        """
        started = time.perf_counter()
        cfg = self.cfg
        samples = batch.samples
        minibatches = self._minibatches(len(samples))
        plan = self.prepare(batch)
        lr = self._apply_lr()
        self.engine.train()
        # With one update per batch, that update's detached log-probs are the proximal ones.
        first_logp: list[torch.Tensor] | None = [None] * len(samples) if plan.logp_prox is None else None  # type: ignore[list-item]
        updates = [(idx, self._update(samples, idx, plan, first_logp))
                   for _ in range(cfg.ppo_epochs) for idx in minibatches]
        trained_version = self._step
        self._step += 1

        elapsed = time.perf_counter() - started
        n_tokens = float(sum(s.trained_tokens for s in samples))
        n_seqs = float(len(samples))

        def total(name: str) -> float:
            return sum(sums[name] for _, sums in updates)

        metrics = {
            "step": float(self._step),
            "loss": total("loss") / len(updates),
            "lr": lr,
            "grad_norm": total("grad_norm") / len(updates),
            "entropy": total("entropy") / (n_tokens * cfg.ppo_epochs),
            "advantage_mean": float(plan.advantages.mean()),
            "reward_mean": float(sum(s.reward for s in samples) / n_seqs),
            "tokens": n_tokens,
            "samples": n_seqs,
            "updates": float(len(updates)),
            "micro_batches": total("micro_batches"),
            "step_seconds": elapsed,
            "samples_per_s": n_seqs / elapsed,
            **self._logp_gaps(samples, self._own(plan.logp_prox) if plan.logp_prox else first_logp, trained_version),
        }
        if plan.kl_in_reward is not None:
            metrics["kl_in_reward"] = float(plan.kl_in_reward.mean())
        # Per update: how far each one had moved from the proximal policy.
        for name, key in _TOKEN_STATS.items():
            if name in updates[0][1]:
                metrics[key] = total(name) / (n_tokens * cfg.ppo_epochs)
                for k, (idx, sums) in enumerate(updates if len(updates) > 1 else ()):
                    metrics[f"{key}_mb{k}"] = sums[name] / sum(samples[i].trained_tokens for i in idx)
        for k, (_, sums) in enumerate(updates if len(updates) > 1 else ()):
            metrics[f"loss_mb{k}"] = sums["loss"]
            metrics[f"grad_norm_mb{k}"] = sums["grad_norm"]
        return metrics

    def prepare(self, batch: TrainBatch) -> StepPlan:
        """What a step computes once per batch, before any update: the proximal and
        reference log-probs it needs (one no-grad pass each), KL-shaped rewards, the
        advantages and the loss's batch-level token selection. ``train_step`` calls it;
        it is public so callers can inspect what a step will train on."""
        cfg = self.cfg
        samples = batch.samples
        logp_prox = full_old = logp_ref = None
        if self._updates > 1 or cfg.loss in BATCH_MASKS or cfg.kl_in_reward_coef > 0:
            logp_prox, full_old = self._no_grad_logprobs(self.engine, samples, full=cfg.kl_in_reward_coef > 0)
        if self.ref_model is not None:
            _, logp_ref = self._no_grad_logprobs(self.ref_model, samples, full=True, sampled=False)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        kl_seq = None
        if cfg.kl_in_reward_coef > 0:
            if samples[0].advantage is not None:
                raise ValueError("trainer.kl_in_reward_coef needs rewards, but this batch carries precomputed "
                                 "advantages; put the KL into those advantages or set kl_in_reward_coef to 0")
            rewards, kl_seq = kl_shaped_rewards(rewards, full_old, logp_ref, cfg.kl_in_reward_coef)
        if samples[0].advantage is not None:
            advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        else:
            advantages = grpo_advantages(rewards, [s.group_id for s in samples], cfg.normalize_std)
        keep = None
        if cfg.loss in BATCH_MASKS:
            behav = [torch.tensor(s.behaviour_logprobs, dtype=torch.float32, device=self.device) for s in samples]
            flat_prox, flat_behav = torch.cat(logp_prox), torch.cat(behav)
            flat_mask = torch.tensor([m for s in samples for m in s.mask_values()], dtype=torch.float32,
                                     device=self.device)
            flat = BATCH_MASKS[cfg.loss](flat_prox, flat_behav, flat_mask, cfg.loss_params)
            keep = list(flat.split([len(b) for b in behav]))
        return StepPlan(advantages=advantages, rewards=rewards, logp_prox=logp_prox, logp_ref=logp_ref,
                        keep=keep, kl_in_reward=kl_seq)

    def named_weights(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """fp32 CPU copies of the module's full state dict.

        Under ZeRO-3 this is a collective — every rank must call it — that gathers one
        parameter at a time (DeepSpeed's ``GatheredParameters``), so no rank ever holds
        more than one full parameter beyond its shard. With ``rank0_only`` the ranks other
        than 0 take part in the gathers but copy nothing and return ``{}`` (the publisher
        lives on rank 0)."""
        import deepspeed

        keep = not rank0_only or self.rank == 0
        module = self.engine.module
        if self.cfg.zero_stage != 3:
            return {name: _cpu32(t) for name, t in module.state_dict().items()} if keep else {}
        out: dict[str, torch.Tensor] = {}
        for name, t in module.state_dict(keep_vars=True).items():
            partitioned = hasattr(t, "ds_id")
            with deepspeed.zero.GatheredParameters([t]) if partitioned else contextlib.nullcontext():
                if keep:
                    out[name] = _cpu32(t)
        return out

    def barrier(self) -> None:
        """Wait for every rank (nothing in a world of one)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def save_checkpoint(self, directory: str | Path, extra_state: Mapping[str, object]) -> None:
        """DeepSpeed's checkpoint of this rank (a collective: every rank calls it with the
        same directory; under ZeRO each writes its own optimizer/parameter shards)."""
        client = {
            "extra_state": dict(extra_state),
            "af_step": self._step,
            "af_world": self.world,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
        }
        self.engine.save_checkpoint(str(directory), tag=CKPT_TAG, client_state=client)
        if self.rank == 0:  # read before loading: a world-size change loads differently
            (Path(directory) / WORLD_FILE).write_text(json.dumps({"world": self.world, "zero_stage": self.cfg.zero_stage}))

    def load_checkpoint(self, directory: str | Path) -> dict[str, object]:
        """Resume from ``save_checkpoint``'s files. With the world size it was saved with,
        everything is restored exactly (DeepSpeed's own load: every rank its shards). With
        another world size, ZeRO 1-3 shards do not fit: the parameters are consolidated
        from all shards with DeepSpeed's ``zero_to_fp32`` and loaded, the step, extra
        state and RNG are restored, and the optimizer's moments start from zero (a warning
        says so; ``resharded`` becomes true). ZeRO-0 checkpoints hold no shards and load
        exactly at any world size."""
        saved = _saved_layout(Path(directory))
        self.resharded = bool(saved and saved["world"] != self.world and saved["zero_stage"] > 0)
        if self.resharded:
            client = self._load_consolidated(Path(directory), saved)
        else:
            path, client = self.engine.load_checkpoint(str(directory), tag=CKPT_TAG)
            if path is None:
                raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory} (tag {CKPT_TAG!r})")
        self._step = int(client["af_step"])
        torch.set_rng_state(client["torch_rng"])
        if client.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(client["cuda_rng"])
        return dict(client["extra_state"])

    def _load_consolidated(self, directory: Path, saved: dict) -> dict:
        import logging

        import deepspeed
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        logging.getLogger(__name__).warning(
            "checkpoint %s was saved by %d rank(s) under ZeRO-%d and is loaded by %d: parameters are consolidated "
            "from its shards; the optimizer moments restart from zero", directory, saved["world"],
            saved["zero_stage"], self.world)
        full = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=CKPT_TAG)
        module = self.engine.module
        for name, p in module.named_parameters():
            if name not in full:
                raise KeyError(f"{directory}: the consolidated checkpoint has no parameter {name!r}")
            partitioned = hasattr(p, "ds_id")
            with deepspeed.zero.GatheredParameters([p], modifier_rank=0) if partitioned else contextlib.nullcontext():
                if not partitioned or self.rank == 0:
                    with torch.no_grad():
                        p.data.copy_(full[name].to(p.device, p.dtype))
        if self.cfg.zero_stage > 0:
            self.engine.optimizer._restore_from_bit16_weights()  # the fp32 master partitions follow
        states = sorted((directory / CKPT_TAG).glob("*mp_rank_00_model_states.pt"))
        if not states:
            raise FileNotFoundError(f"no DeepSpeed model states under {directory / CKPT_TAG}")
        return torch.load(states[0], map_location="cpu", weights_only=False)

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

    @property
    def _updates(self) -> int:
        return self.cfg.ppo_epochs * self.cfg.minibatches

    def _apply_lr(self) -> float:
        """Set the rate of every optimizer step of the current batch: the schedule is a
        function of the version (``self._step``, checkpointed), not of optimizer steps."""
        lr = self.cfg.lr * self._lr_factor(self._step)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _shard(self, rows: list[int]) -> list[int]:
        """This rank's contiguous slice of ``rows`` (all of them in a world of one)."""
        n = len(rows)
        return rows[self.rank * n // self.world:(self.rank + 1) * n // self.world]

    def _own(self, values: list) -> list:
        """``values`` (one per sample) with the entries outside this rank's shard of the
        batch set to None, so per-sample sums over ranks count every sample once."""
        mine = set(self._shard(list(range(len(values)))))
        return [v if i in mine else None for i, v in enumerate(values)]

    def _common_count(self, n: int) -> int:
        """The largest ``n`` over ranks: how many passes every rank makes so that all of
        them enter the same collectives."""
        if self.world == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _all_gather(self, obj):
        """Every rank's ``obj``, in rank order (``[obj]`` in a world of one)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _sum_over_ranks(self, sums: dict[str, float]) -> dict[str, float]:
        """Per-key sums over ranks (a rank without samples reports fewer keys)."""
        total: dict[str, float] = {}
        for part in self._all_gather(sums):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def _idle_pass(self, backward: bool) -> None:
        """A zero-loss pass over a two-token dummy row: a rank with fewer micro-batches
        than its peers enters the collectives of theirs (ZeRO-3 parameter gathers in the
        forward, gradient reduction in the backward) without changing any gradient."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        logits = self.engine(input_ids=ids).logits
        if backward:
            self.engine.backward(logits.float().sum() * 0.0, scale_wrt_gas=False)

    def _minibatches(self, n: int) -> list[list[int]]:
        """Contiguous slices of the batch by sample index (GRPO groups stay together
        where the sizes allow); the same batch always splits the same way."""
        m = self.cfg.minibatches
        if m > n:
            raise ValueError(f"trainer.minibatches is {m} but the batch has only {n} samples; "
                             f"lower minibatches or raise the batch size")
        return [list(range(j * n // m, (j + 1) * n // m)) for j in range(m)]

    def _update(self, samples, idx: list[int], plan: StepPlan, first_logp: list | None) -> dict[str, float]:
        """One optimizer step on the minibatch ``idx`` (token-budget micro-batches, the
        loss normalised by the minibatch's token or sequence count); returns its sums.
        Fills ``first_logp`` (detached current log-probs per sample) when given."""
        cfg = self.cfg
        loss_fn = POLICY_LOSSES[cfg.loss]
        kl_term = cfg.kl_coef > 0
        # Normalised by the whole minibatch's counts, on every rank: the shards' losses sum
        # to the one-rank loss.
        n_tokens = float(sum(samples[i].trained_tokens for i in idx))
        n_seqs = float(len(idx))
        mine = self._shard(idx)
        micro = [[mine[j] for j in m] for m in self._micro_batches([samples[i] for i in mine])] if mine else []
        n_micro = self._common_count(len(micro))
        sums: dict[str, float] = {"micro_batches": float(len(micro))}

        def acc(name: str, value: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0.0) + float(value)

        def pick(values: list[torch.Tensor] | None, rows: list[int]) -> list[torch.Tensor] | None:
            return None if values is None else [values[i] for i in rows]

        for k in range(n_micro):
            # One accumulation boundary per update on every rank: the last pass, real or idle.
            self.engine.set_gradient_accumulation_boundary(k == n_micro - 1)
            if k >= len(micro):  # this rank's share ran out: keep step with the others
                self._idle_pass(backward=True)
                continue
            rows = micro[k]
            part = [samples[i] for i in rows]
            ids, mask, behav, prox, ref, keep = self._collate(
                part, pick(plan.logp_prox, rows), pick(plan.logp_ref if kl_term else None, rows), pick(plan.keep, rows))
            adv = plan.advantages[rows].to(self.device).unsqueeze(-1).expand_as(mask)
            logp, full, entropy = self._logprobs(self.engine, ids, mask, full=kl_term, entropy=True)
            if first_logp is not None:
                for j, i in enumerate(rows):
                    first_logp[i] = self._row_tokens(logp.detach(), j, part[j])
            per_token, stats = loss_fn(logp, logp.detach() if prox is None else prox, behav, adv, mask,
                                       cfg.loss_params, keep)
            if kl_term:
                kl = kl_penalty(full, ref, cfg.kl_estimator)
                per_token = per_token + cfg.kl_coef * kl
                stats["kl"] = kl.detach()
            loss = aggregate(per_token, mask, cfg.aggregation, num_tokens=n_tokens, num_sequences=n_seqs)
            # DeepSpeed averages gradients over ranks; the shards' gradients must add up.
            self.engine.backward(loss * self.world if self.world > 1 else loss, scale_wrt_gas=False)
            acc("loss", loss.detach())
            acc("entropy", (entropy * mask).sum())
            for name in _TOKEN_STATS:
                if name in stats:
                    acc(name, (stats[name] * mask).sum())
        sums = self._sum_over_ranks(sums)
        # Without ZeRO, DeepSpeed clips but does not record the norm; measure it here.
        pre_norm = self._grad_norm() if cfg.zero_stage == 0 else None
        self.engine.step()
        grad_norm = pre_norm if pre_norm is not None else self.engine.get_global_grad_norm()
        sums["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        return sums

    def _logp_gaps(self, samples, logp: list[torch.Tensor], version: int) -> dict[str, float]:
        """Mean |logp_trainer - logp_behaviour| over all tokens (``behav_logp_gap``:
        staleness plus mismatch) and over the tokens generated at ``version``, the
        weights the trainer held before this step (``train_inference_logp_gap``: the
        training-inference mismatch alone). The latter is absent when no token of the
        batch was generated at ``version`` (nothing to compare)."""
        total = at_version = 0.0
        n_total = n_at = 0
        for s, lp in zip(samples, logp):
            if lp is None:  # another rank's sample: it adds its own
                continue
            own = torch.tensor(s.mask_values(), dtype=torch.bool)  # context tokens have no behaviour logprob
            gap = (lp.float().cpu() - torch.tensor(s.behaviour_logprobs, dtype=torch.float32)).abs()[own]
            versions = torch.tensor(s.token_versions or (s.version,) * len(s.completion_ids))[own]
            total += float(gap.sum())
            n_total += gap.numel()
            at_version += float(gap[versions == version].sum())
            n_at += int((versions == version).sum())
        if self.world > 1:
            parts = self._all_gather((total, n_total, at_version, n_at))
            total, n_total, at_version, n_at = (sum(p[j] for p in parts) for j in range(4))
        out = {"behav_logp_gap": total / max(n_total, 1)}
        if n_at:
            out["train_inference_logp_gap"] = at_version / n_at
        return out

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

    def _collate(self, samples, *per_token: list[torch.Tensor] | None) -> tuple[torch.Tensor | None, ...]:
        """Right-padded ``prompt + completion`` ids [B, L] and, aligned with the
        *predicting* position (column j predicts token j + 1), the completion mask, the
        behaviour logprobs and each of ``per_token`` (per-sample completion-token values,
        or None) as [B, L - 1]."""
        width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.long)
        aligned = [torch.zeros((len(samples), width - 1)) for _ in range(2 + len(per_token))]
        for i, s in enumerate(samples):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[i, : p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids))
            aligned[0][i, p - 1 : p - 1 + c] = torch.tensor(s.mask_values(), dtype=torch.float32)
            aligned[1][i, p - 1 : p - 1 + c] = torch.tensor(s.behaviour_logprobs)
            for values, out in zip(per_token, aligned[2:]):
                if values is not None:
                    out[i, p - 1 : p - 1 + c] = values[i].detach().float().cpu()
        tensors = [t.to(self.device) for t in aligned]
        extra = [None if v is None else t for v, t in zip(per_token, tensors[2:])]
        return (ids.to(self.device), tensors[0], tensors[1], *extra)

    @staticmethod
    def _row_tokens(values: torch.Tensor, row: int, sample) -> torch.Tensor:
        """A sample's completion-token values from a collated [B, L - 1] tensor."""
        p = len(sample.prompt_ids)
        return values[row, p - 1 : p - 1 + len(sample.completion_ids)]

    @torch.no_grad()
    def _no_grad_logprobs(self, model, samples, full: bool, sampled: bool = True
                          ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]:
        """Per-sample completion-token log-probs of ``model`` in eval mode, micro-batched
        by budget: under the sampling distribution (``sampled``) and the full tempered
        softmax (``full``)."""
        was_training = model.training
        model.eval()
        out_sampled: dict[int, torch.Tensor] = {}
        out_full: dict[int, torch.Tensor] = {}
        mine = self._shard(list(range(len(samples))))
        micro = [[mine[j] for j in m] for m in self._micro_batches([samples[i] for i in mine])] if mine else []
        try:
            if model is self.engine:  # the reference model is a local copy: no collectives in its forward
                for _ in range(len(micro), self._common_count(len(micro))):
                    self._idle_pass(backward=False)
            for rows in micro:
                part = [samples[i] for i in rows]
                ids, mask, _ = self._collate(part)
                logp, logp_full, _ = self._logprobs(model, ids, mask, full=full, sampled=sampled)
                for j, i in enumerate(rows):
                    if sampled:
                        out_sampled[i] = self._row_tokens(logp, j, part[j])
                    if full:
                        out_full[i] = self._row_tokens(logp_full, j, part[j])
        finally:
            model.train(was_training)
        if self.world > 1:  # every rank needs the whole batch's values (advantages, KL shaping, batch masks)
            for part in self._all_gather(({i: t.cpu() for i, t in out_sampled.items()},
                                          {i: t.cpu() for i, t in out_full.items()})):
                out_sampled.update({i: t.to(self.device) for i, t in part[0].items()})
                out_full.update({i: t.to(self.device) for i, t in part[1].items()})
        return ([out_sampled[i] for i in range(len(samples))] if sampled else None,
                [out_full[i] for i in range(len(samples))] if full else None)

    def _logprobs(self, model, ids: torch.Tensor, mask: torch.Tensor, full: bool = False, entropy: bool = False,
                  sampled: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Log-probs of the next tokens under the rollout's sampling distribution
        (temperature, top-k, top-p: ``sampling.sampling_logprobs``, what the engine
        recorded), under the full tempered softmax (``full``: what KL terms compare,
        since truncated distributions have no finite KL to one another), and the entropy
        of the latter. Positions outside ``mask`` are 0."""
        cfg = self.cfg
        # Right padding needs no attention mask: causal attention never looks right, and
        # padded positions are masked out of the loss.
        logits = model(input_ids=ids).logits[:, :-1]
        target = ids[:, 1:].unsqueeze(-1)
        on = mask > 0
        truncated = cfg.top_p < 1.0 or cfg.top_k > 0
        full_all = torch.log_softmax(logits.float() / cfg.temperature, dim=-1) if (truncated or not sampled) else None
        logp = None
        if sampled:
            sampled_all = sampling_logprobs(logits, cfg.temperature, cfg.top_p, cfg.top_k)
            full_all = sampled_all if full_all is None else full_all
            # A token outside the trainer's truncated support (a stale sample the current
            # weights would no longer draw) has logp -inf: floor it so its ratio is 0 and
            # no inf * 0 turns a loss into NaN; its gradient is 0 either way.
            logp = torch.where(on, sampled_all.gather(-1, target).squeeze(-1).clamp(min=LOGP_FLOOR), 0.0)
        logp_full = torch.where(on, full_all.gather(-1, target).squeeze(-1), 0.0) if full else None
        ent = None
        if entropy:
            with torch.no_grad():
                ent = -(full_all.exp() * full_all).sum(-1)
        return logp, logp_full, ent
