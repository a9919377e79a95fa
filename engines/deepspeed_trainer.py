"""DeepSpeed implementation of ``TrainEngine``: RL policy updates for one HF causal LM.

Owns the DeepSpeed engine (ZeRO stage from config; gloo + fp32 on CPU, NCCL + bf16 on
GPU), the optimizer and LR schedule, the train step (what it prepares once per batch, the
updates, the loss assembly from ``losses.py``, the step's metrics) and the full weights
(``named_weights``). It delegates the process group and per-rank collectives to
``distributed.py``, the minibatch split, token-budget packing and collation to
``packing.py``, log-probs under the sampling distribution and their gap to the behaviour
ones to ``trainer_logprobs.py``, its checkpoint files (DeepSpeed state + RNG + the
caller's ``extra_state``, resharding on a world-size change) to
``deepspeed_checkpoint.py`` and the HF export to ``hf_export.py``. It does not read Kafka
or publish weights.

A LoRA policy (``cfg.lora``): the model is wrapped by peft (``lora.py``) so that only the
adapter's matrices train, and only they are in the optimizer (ZeRO partitions their state
as any other); ``named_weights`` is the adapter alone, under its published names;
checkpoints hold the adapter and its optimizer state (DeepSpeed's
``exclude_frozen_parameters``: the frozen base comes from the model directory); the
reference policy of the KL terms is the base itself, scored with the adapter disabled,
so no second model is held; the HF export is the peft adapter directory. Several LoRA
trainers in one process (``trainer.process``: one trainer process training several
policies' adapters of one base) hold the base once: each later one's frozen base parameters
are the first one's tensors (:func:`share_base`), only its adapter and optimizer its own.

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
import dataclasses
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from . import deepspeed_checkpoint
from .base import TrainBatch, TrainEngine
from .config import ZERO_SIZE_KEYS, TrainerConfig
from .distributed import Ranks, init_single_process_distributed
from .hf_export import export_hf_atomic
from .lora import is_adapter_name, peft_name, published_name, share_base, wrap
from .corrections import correction_weights
from .losses import BATCH_MASKS, POLICY_LOSSES, aggregate, grpo_advantages, kl_penalty, kl_shaped_rewards
from .packing import collate, minibatches, pack_rows, row_tokens
from .trainer_logprobs import batch_logprobs, logp_gaps, token_logprobs

__all__ = ["DeepSpeedTrainer", "StepPlan", "zero_optimization"]

# Per-token diagnostics a loss may return -> the metric reporting their token fraction.
_TOKEN_STATS = {"clipped": "clipped_frac", "iw_capped": "iw_capped_frac", "m2po_masked": "m2po_masked_frac", "kl": "kl",
                "correction_masked": "correction_masked_frac", "correction_capped": "correction_capped_frac"}


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


def zero_optimization(cfg: TrainerConfig) -> dict[str, int]:
    """DeepSpeed's ``zero_optimization`` section: the stage and the bucket and live-parameter
    sizes (``ZERO_SIZE_KEYS``, in elements) from the config."""
    return {"stage": cfg.zero_stage, **{key: getattr(cfg, key) for key in ZERO_SIZE_KEYS}}


def _import_deepspeed():
    """``import deepspeed`` without MLflow. DeepSpeed's config module imports its autotuner,
    which imports ``mlflow`` when it is installed (``tracking.mlflow`` installs it) to log
    autotuning experiments: a second or more of a trainer's start (measured by
    ``benchmarks/trainer_loss.py``; ~80 % of ``import deepspeed`` here), for a feature only
    the ``deepspeed --autotuning`` launcher runs. The autotuner catches the failed import;
    ``mlflow`` is hidden for this import only, so a later ``import mlflow`` works as before."""
    import sys

    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed
        return deepspeed
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        import deepspeed
    finally:
        if sys.modules.get("mlflow", False) is None:
            del sys.modules["mlflow"]
    return deepspeed


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", dtype=torch.float32, copy=True)


class DeepSpeedTrainer(TrainEngine):
    """Policy trainer for an HF causal LM directory."""

    def __init__(self, model_path: str | Path, cfg: TrainerConfig | None = None) -> None:
        cfg = cfg or TrainerConfig()
        self.cfg = cfg
        marks = [time.monotonic()]
        self.model_path = Path(model_path)
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        # DeepSpeed picks its accelerator at import; on CPU it must be told before that.
        if not use_cuda:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        deepspeed = _import_deepspeed()
        from transformers import AutoModelForCausalLM

        marks.append(time.monotonic())
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
        self.bf16 = use_cuda and cfg.bf16
        init_single_process_distributed("nccl" if use_cuda else "gloo", cfg.collective_timeout_s)
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.ranks = Ranks(self.rank, self.world, self.device)  #: the collectives the step uses
        torch.manual_seed(cfg.seed)
        marks.append(time.monotonic())

        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        self._tied = bool(getattr(model.config, "tie_word_embeddings", False))
        if cfg.gradient_checkpointing:  # before any wrapper: peft and DeepSpeed forward to these layers
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.lora = cfg.lora  #: the adapter's settings; None: every weight trains
        self._kl = cfg.kl_coef > 0 or cfg.kl_in_reward_coef > 0
        self.ref_model = None
        if self.lora is not None:
            model = wrap(model, self.lora)  # the reference is this model with its adapter disabled
        elif self._kl:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.ref_model.to(self.device, dtype=torch.bfloat16 if self.bf16 else torch.float32)

        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        ds_config = {
            # The batch is one TrainBatch; micro-batching is by token budget and the
            # accumulation boundary is set explicitly, so these counts are nominal.
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": cfg.grad_clip,
            "zero_optimization": zero_optimization(cfg),
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": self.bf16},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        # No DeepSpeed LR scheduler: it would count optimizer steps, and the schedule
        # counts versions (``_apply_lr``), which the checkpoint already holds.
        marks.append(time.monotonic())
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        #: frozen base parameters held in common with another LoRA trainer of this process
        #: (ZeRO-3 shards them per engine: not shared)
        self.shared_base_params = (share_base(self.engine.module, model_path)
                                   if self.lora is not None and cfg.zero_stage < 3 else 0)
        marks.append(time.monotonic())
        #: seconds each part of this constructor took (the trainer's start-up metrics)
        self.init_s = dict(zip(("imports", "process_group", "model_load", "deepspeed_initialize"),
                               (b - a for a, b in zip(marks, marks[1:]))))
        self._step = 0
        self.resharded = False  #: the last load_checkpoint changed the world size (see there)

    # --- TrainEngine -------------------------------------------------------------

    @property
    def step(self) -> int:
        return self._step

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One version: ``ppo_epochs`` x ``minibatches`` optimizer steps on ``batch``.

        Metrics: ``loss`` and ``grad_norm`` (means over the updates), token fractions
        ``clipped_frac`` / ``iw_capped_frac`` / ``m2po_masked_frac`` / ``correction_masked_frac`` /
        ``correction_capped_frac`` and the KL term ``kl`` over all updates, and, when a batch
        takes several updates, the same per update ``k = epoch * minibatches + j`` as
        ``<name>_mb<k>``; ``behav_logp_gap`` (and its ``_p99``), ``rollout_ratio_p01/p50/p99``
        and ``train_inference_logp_gap`` (see ``trainer_logprobs.logp_gaps``), ``kl_in_reward`` (mean
        per-sequence k1) when the KL is in the reward.
        """
        started = time.perf_counter()
        cfg = self.cfg
        samples = batch.samples
        splits = minibatches(len(samples), cfg.minibatches)
        plan = self.prepare(batch)
        lr = self._apply_lr()
        self.engine.train()
        # With one update per batch, that update's detached log-probs are the proximal ones.
        first_logp: list[torch.Tensor] | None = [None] * len(samples) if plan.logp_prox is None else None  # type: ignore[list-item]
        updates = [(idx, self._update(samples, idx, plan, first_logp))
                   for _ in range(cfg.ppo_epochs) for idx in splits]
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
            **logp_gaps(samples, self.ranks.own(plan.logp_prox) if plan.logp_prox else first_logp, trained_version,
                         self.ranks),
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
        if self.proximal_pass:
            logp_prox, full_old = batch_logprobs(self.engine, samples, cfg, self.ranks, self.device,
                                                 full=cfg.kl_in_reward_coef > 0,
                                                 keep_step=lambda: self._idle_pass(backward=False))
        if self._kl:
            logp_ref = self._reference_logprobs(samples)
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
        """fp32 CPU copies of the module's full state dict; for a LoRA policy, of the
        adapter's matrices alone, under their published names (``lora.published_name``).

        Under ZeRO-3 this is a collective — every rank must call it — that gathers one
        parameter at a time (DeepSpeed's ``GatheredParameters``), so no rank ever holds
        more than one full parameter beyond its shard. With ``rank0_only`` the ranks other
        than 0 take part in the gathers but copy nothing and return ``{}`` (the publisher
        lives on rank 0)."""
        import deepspeed

        keep = not rank0_only or self.rank == 0
        zero3 = self.cfg.zero_stage == 3
        state = self.engine.module.state_dict(keep_vars=zero3).items()
        if self.lora is not None:
            state = [(published_name(name), t) for name, t in state if is_adapter_name(name)]
        if not zero3:
            return {name: _cpu32(t) for name, t in state} if keep else {}
        out: dict[str, torch.Tensor] = {}
        for name, t in state:
            partitioned = hasattr(t, "ds_id")
            with deepspeed.zero.GatheredParameters([t]) if partitioned else contextlib.nullcontext():
                if keep:
                    out[name] = _cpu32(t)
        return out

    def barrier(self) -> None:
        """Wait for every rank (nothing in a world of one)."""
        self.ranks.barrier()

    def save_checkpoint(self, directory: str | Path, extra_state: Mapping[str, object]) -> None:
        """DeepSpeed's checkpoint of this rank (a collective: every rank calls it with the
        same directory; under ZeRO each writes its own optimizer/parameter shards), with
        the version, ``extra_state`` and the RNG (``deepspeed_checkpoint.save``)."""
        deepspeed_checkpoint.save(self.engine, directory, extra_state, step=self._step, ranks=self.ranks,
                                  zero_stage=self.cfg.zero_stage, device=self.device,
                                  sub_group_size=self.cfg.sub_group_size, adapter=self._adapter_layout)

    def load_checkpoint(self, directory: str | Path) -> dict[str, object]:
        """Resume from ``save_checkpoint``'s files (``deepspeed_checkpoint.load``): exactly
        with the world size it was saved with; with another one under ZeRO 1-3 the
        parameters are consolidated from the shards, the optimizer's moments start from
        zero and ``resharded`` becomes true. Returns the saved ``extra_state``."""
        restored = deepspeed_checkpoint.load(self.engine, directory, ranks=self.ranks,
                                             zero_stage=self.cfg.zero_stage, device=self.device,
                                             sub_group_size=self.cfg.sub_group_size,
                                             adapter=self._adapter_layout)
        self.resharded = restored.resharded
        self._step = restored.step
        return restored.extra_state

    def export_hf(self, directory: str | Path, weights: Mapping[str, torch.Tensor] | None = None) -> Path:
        """The current weights (or ``weights``, gathered already: the trainer passes the
        published ones) as an HF model directory, written atomically (``hf_export``); for a
        LoRA policy, peft's adapter directory (``adapter_config.json`` and the adapter's
        safetensors, for the base ``model_path``)."""
        named = self.named_weights() if weights is None else weights
        if self.lora is not None:
            named = {peft_name(k): v for k, v in named.items()}
        return export_hf_atomic(directory, self.engine.module, named, self.model_path)

    def close(self) -> None:
        self.engine = None  # type: ignore[assignment]
        self.ref_model = None

    # --- internals ---------------------------------------------------------------

    @property
    def _adapter_layout(self) -> dict | None:
        """The LoRA settings a checkpoint records and must be resumed with (None: full fine-tuning)."""
        return dataclasses.asdict(self.lora) if self.lora is not None else None

    def _reference_logprobs(self, samples) -> list[torch.Tensor]:
        """Full tempered log-probs under the reference policy: the frozen copy of the initial
        weights, or for a LoRA policy the base itself, the trained model with its adapter
        disabled (no second model; under ZeRO-3 its forward gathers, so a short rank keeps step)."""
        cfg = self.cfg
        if self.ref_model is not None:
            # A local copy: no collectives in its forward, so no pass to keep step with the ranks.
            _, ref = batch_logprobs(self.ref_model, samples, cfg, self.ranks, self.device, full=True, sampled=False)
            return ref
        with self.engine.module.disable_adapter():
            _, ref = batch_logprobs(self.engine, samples, cfg, self.ranks, self.device, full=True, sampled=False,
                                    keep_step=lambda: self._idle_pass(backward=False))
        return ref

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

    @property
    def proximal_pass(self) -> bool:
        """A step scores its batch under the weights before its first update (one no-grad pass):
        several updates per batch, a batch-level token mask, or KL in the reward."""
        return self._updates > 1 or self.cfg.loss in BATCH_MASKS or self.cfg.kl_in_reward_coef > 0

    def _apply_lr(self) -> float:
        """Set the rate of every optimizer step of the current batch: the schedule is a
        function of the version (``self._step``, checkpointed), not of optimizer steps."""
        lr = self.cfg.lr * self._lr_factor(self._step)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _idle_pass(self, backward: bool) -> None:
        """A zero-loss pass over a two-token dummy row: a rank with fewer micro-batches
        than its peers enters the collectives of theirs (ZeRO-3 parameter gathers in the
        forward, gradient reduction in the backward) without changing any gradient."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        logits = self.engine(input_ids=ids).logits
        if backward:
            self.engine.backward(logits.float().sum() * 0.0, scale_wrt_gas=False)

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
        micro = pack_rows(samples, self.ranks.shard(idx), cfg.token_budget)
        n_micro = self.ranks.common_count(len(micro))
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
            ids, mask, behav, prox, ref, keep = collate(
                part, self.device, pick(plan.logp_prox, rows), pick(plan.logp_ref if kl_term else None, rows),
                pick(plan.keep, rows))
            adv = plan.advantages[rows].to(self.device).unsqueeze(-1).expand_as(mask)
            logp, full, entropy = token_logprobs(self.engine, ids, mask, cfg, full=kl_term, entropy=True)
            if first_logp is not None:
                for j, i in enumerate(rows):
                    first_logp[i] = row_tokens(logp.detach(), j, part[j])
            trainer_logp = logp.detach() if prox is None else prox
            if cfg.correction is None:
                per_token, stats = loss_fn(logp, trainer_logp, behav, adv, mask, cfg.loss_params, keep)
            else:  # the loss's trust region around the trainer's log-probs; the correction owns the engine's gap
                c = cfg.correction
                weight, corr_stats = correction_weights(trainer_logp, behav, mask, c.method, c.cap, c.lo, c.hi)
                per_token, stats = loss_fn(logp, trainer_logp, trainer_logp, adv, mask, cfg.loss_params, keep)
                per_token = weight * per_token
                stats.update(corr_stats)
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
        sums = self.ranks.sum_over_ranks(sums)
        # Without ZeRO, DeepSpeed clips but does not record the norm; measure it here.
        pre_norm = self._grad_norm() if cfg.zero_stage == 0 else None
        self.engine.step()
        grad_norm = pre_norm if pre_norm is not None else self.engine.get_global_grad_norm()
        sums["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
        return sums
