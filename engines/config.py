"""Typed engine configuration: the ``rollout.engine`` and ``trainer.engine`` sections of a job config.

Owns the keys, their defaults and validation; ``from_dict`` builds a section from a mapping
with the shared loader (:mod:`astraflow.typed_config`: unknown keys, wrong types and numbers
out of bounds are refused by name). ``factory.py`` turns these into engines; nothing else
reads raw dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from astraflow import typed_config
from astraflow.typed_config import Bounds, setting

from .loss_names import CORRECTIONS, LOSS_PARAMS, RETIRED_LOSSES

__all__ = ["CorrectionConfig", "LoraConfig", "RolloutConfig", "SGLangConfig", "TrainerConfig", "ZERO_SIZE_KEYS", "from_dict"]

T = TypeVar("T")

#: TrainerConfig fields passed verbatim as DeepSpeed ``zero_optimization`` keys (each stage
#: reads the ones that apply to it and ignores the rest).
ZERO_SIZE_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                  "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                  "sub_group_size")


SEED = Bounds(0, 2**32 - 1)  #: what numpy and torch both take
TIMEOUT_S = Bounds(0, 86_400, lo_open=True)


def from_dict(cls: type[T], data: Mapping[str, Any] | T | None, where: str = "config") -> T:
    """Build dataclass ``cls`` from a mapping strictly (the job config's loader: an unknown
    key, a wrong type or a number out of bounds is a :class:`~astraflow.typed_config.ConfigError`,
    a ``ValueError``, naming the key under ``where``); None is the defaults, an instance itself."""
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    return typed_config.from_dict(cls, dict(data), "<dict>", f"{where}.")


@dataclass(frozen=True)
class SGLangConfig:
    """Server options for ``kind: sglang``."""

    host: str = setting("127.0.0.1", "interface the server binds")
    port: int = setting(0, "0 picks a free port", bounds=Bounds(0, 65_535))
    url: str = setting("", "use an already running server; launch nothing")
    tp_size: int = setting(1, "tensor-parallel GPUs per server", bounds=Bounds(1, 1024))
    mem_fraction_static: float = setting(0.8, "GPU memory share for weights + KV cache",
                                         bounds=Bounds(0, 1, lo_open=True))
    weight_transport: str = setting("disk", "disk | tensor")
    weights_dir: str = setting("", "where disk updates are written (default: a temp dir)")
    server_module: str = setting("sglang.launch_server", "module run with python -m (tests point it at a stub)")
    send_seed: bool = setting(False, "send each row's seed as sampling_seed (needs an SGLang that accepts it)")
    startup_timeout_s: float = setting(600.0, "how long the server may take to become ready", bounds=TIMEOUT_S)
    request_timeout_s: float = setting(600.0, "per /generate request", bounds=TIMEOUT_S)
    extra_args: tuple[str, ...] = setting((), "more sglang.launch_server arguments, verbatim")

    def __post_init__(self) -> None:
        if self.weight_transport not in ("disk", "tensor"):
            raise ValueError(f"sglang.weight_transport must be 'disk' or 'tensor', got {self.weight_transport!r}")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))


@dataclass(frozen=True)
class RolloutConfig:
    """``rollout:`` section.

    Keys: ``kind`` (cpu | sglang), ``model_path`` (HF directory; empty = the bootstrapped
    tiny model), ``threads`` (CPU engine torch threads; 0 = leave torch's default), ``dtype``
    (CPU engine: fp32 | bf16),
    ``seed`` (bootstrap seed when ``model_path`` is empty), ``sglang`` (SGLangConfig).
    """

    kind: str = setting("cpu", "cpu (embedded torch engine) | sglang (GPU server)")
    model_path: str = setting("", "HF model dir (empty: the job's `model`)")
    threads: int = setting(0, "CPU engine torch threads (0: torch's default)", bounds=Bounds(0, 1024))
    dtype: str = setting("fp32", "CPU engine: fp32 | bf16 (weights and forward in bfloat16, as a GPU engine runs: "
                                 "a real rollout-trainer mismatch against the fp32 trainer)")
    seed: int = setting(0, "bootstrap seed when model_path is empty", bounds=SEED)
    sglang: SGLangConfig = setting(SGLangConfig(), "server options of kind sglang")

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "sglang"):
            raise ValueError(f"rollout.kind must be 'cpu' or 'sglang', got {self.kind!r}")
        if self.threads < 0:
            raise ValueError(f"rollout.threads must be >= 0, got {self.threads}")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"rollout.engine.dtype must be 'fp32' or 'bf16', got {self.dtype!r}")
        if self.dtype != "fp32" and self.kind != "cpu":
            raise ValueError("rollout.engine.dtype applies to kind cpu; an SGLang server takes its dtype from "
                             "sglang.extra_args (--dtype)")


@dataclass(frozen=True)
class LoraConfig:
    """``trainer.engine.lora``: train the policy as a LoRA adapter of its model (peft).

    Only the adapter's matrices are trained and published; the model directory is the base,
    loaded once by every engine and never changed. The adapter of a module ``W`` is ``B @ A``
    (``A``: rank x in, ``B``: out x rank), scaled by ``alpha / rank``.
    """

    rank: int = setting(8, "rank r of each adapter (A is r x in, B is out x r)", bounds=Bounds(1, 4096))
    alpha: float = setting(16.0, "scale: the adapter adds (alpha / rank) * B @ A to each target's weight",
                           bounds=Bounds(0, 1e6, lo_open=True))
    dropout: float = setting(0.0, "dropout on the adapter's input while training (none in rollouts)",
                             bounds=Bounds(0, 1, hi_open=True))
    target_modules: tuple[str, ...] = setting(("q_proj", "v_proj"), "names of the linear modules that get an "
                                                                     "adapter (the last part of a module's name, "
                                                                     "e.g. q_proj, k_proj, v_proj, o_proj, "
                                                                     "gate_proj, up_proj, down_proj)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"trainer.engine.lora.target_modules must list module names (e.g. [q_proj, v_proj]), "
                             f"got {list(self.target_modules)!r}")


@dataclass(frozen=True)
class CorrectionConfig:
    """``trainer.engine.correction``: correct the gap between the rollout engine's log-probs and the
    trainer's (:mod:`astraflow.engines.corrections` has the formulas). ``method``: tis (weight
    ``min(ρ, cap)``) | mis_token (``ρ`` kept in ``[lo, hi]``, else 0) | mis_seq (the sequence
    ratio kept in ``[lo, hi]``) | icepop (tokens whose ``ρ`` leaves ``[lo, hi]`` get no gradient;
    IcePop's published band is ``[0.5, 5]``) | geo_seq (sequences whose geometric-mean ratio
    leaves ``[lo, hi]`` get no gradient)."""

    method: str = setting("tis", "tis | mis_token | mis_seq | icepop | geo_seq")
    cap: float = setting(2.0, "tis: the largest weight", bounds=Bounds(1, 1e6))
    lo: float = setting(0.5, "the masks: smallest ratio kept", bounds=Bounds(0, 1))
    hi: float = setting(2.0, "the masks: largest ratio kept", bounds=Bounds(1, 1e6))

    def __post_init__(self) -> None:
        if self.method not in CORRECTIONS:
            raise ValueError(f"trainer.engine.correction.method must be one of {sorted(CORRECTIONS)}, got {self.method!r}")


@dataclass(frozen=True)
class TrainerConfig:
    """``trainer:`` section (DeepSpeed).

    Keys: ``model_path`` (empty = bootstrapped tiny model), ``zero_stage`` (0-3),
    ``lr``, ``weight_decay``, ``betas``, ``warmup_steps`` (linear warm-up),
    ``lr_schedule`` (constant | cosine), ``total_steps`` (cosine horizon),
    ``grad_clip`` (max global grad norm; 0 disables), ``token_budget`` (padded tokens per
    micro-batch), ``gradient_checkpointing`` (recompute activations in the backward pass),
    ``ppo_epochs`` and ``minibatches`` (each batch is split into
    ``minibatches`` minibatches by sample index, one optimizer step each, for
    ``ppo_epochs`` passes), ``loss`` (grpo | decoupled_ppo | m2po), ``loss_params`` (e.g.
    ``clip_eps``, ``clip_eps_high``, ``iw_cap``, ``tau``), ``aggregation`` (token |
    sequence), ``normalize_std`` (GRPO std normalisation), ``kl_coef`` and
    ``kl_estimator`` (a KL loss term: k3 | k2), ``kl_in_reward_coef`` (k1 KL subtracted
    from each sequence's reward before advantages; a frozen copy of the initial weights
    is the reference for both, or for a LoRA policy the base, its adapter disabled),
    ``lora`` (train a LoRA adapter, :class:`LoraConfig`), ``correction`` (weights for the gap between
    the engine's and the trainer's log-probs, :class:`CorrectionConfig`), ``temperature``, ``top_p``, ``top_k`` (the rollout's
    sampling, so trainer logprobs are those of the distribution tokens were drawn from),
    ``seed``, ``device`` (auto | cpu | cuda), ``bf16`` (GPU only), ``threads``,
    ``collective_timeout_s`` (across ranks), and DeepSpeed's ``zero_optimization`` sizes
    under their DeepSpeed names (``ZERO_SIZE_KEYS``: bucket and live-parameter sizes in
    elements, CPU-sized by default; DeepSpeed's own defaults, 5e8-element buckets and 1e9
    live parameters, are sized for GPU jobs and cost GBs of fp32 on CPU).

    Steps and versions: one batch is one version (``step``) whatever ``ppo_epochs`` x
    ``minibatches`` optimizer steps it takes; ``warmup_steps``, ``total_steps`` and the
    LR schedule count versions, and every optimizer step of a batch uses that batch's
    rate.
    """

    model_path: str = setting("", "HF model dir (empty: the job's `model`)")
    zero_stage: int = setting(0, "DeepSpeed ZeRO stage 0-3", bounds=Bounds(0, 3))
    lr: float = setting(1e-4, "AdamW learning rate", bounds=Bounds(0, 10))
    weight_decay: float = setting(0.0, "AdamW weight decay", bounds=Bounds(0, 10))
    betas: tuple[float, float] = setting((0.9, 0.999), "AdamW betas", bounds=Bounds(0, 1, hi_open=True))
    warmup_steps: int = setting(0, "linear LR warm-up, in versions", bounds=Bounds(0, 10**7))
    lr_schedule: str = setting("constant", "constant | cosine (after warm-up, over total_steps)")
    total_steps: int = setting(0, "cosine horizon in versions (0: the job's trainer.steps)", bounds=Bounds(0, 10**7))
    grad_clip: float = setting(1.0, "max global gradient norm (0: off)", bounds=Bounds(0, 1e6))
    token_budget: int = setting(4096, "padded tokens per micro-batch (a memory knob: losses are normalised over the "
                                      "whole minibatch)", bounds=Bounds(1, 10**9))
    gradient_checkpointing: bool = setting(False, "recompute each layer's activations in the backward pass instead "
                                                  "of keeping them (a memory knob: SmolLM2's step peaks at 3.8 GB "
                                                  "instead of 6.3, ~27 % slower)")
    ppo_epochs: int = setting(1, "passes over each batch (PPO epochs)", bounds=Bounds(1, 1000))
    minibatches: int = setting(1, "optimizer steps per pass: the batch split by sample index; proximal log-probs "
                                  "come from one no-grad pass before the first", bounds=Bounds(1, 100_000))
    loss: str = setting("grpo", "grpo (PPO-clip vs the behaviour policy, group advantages) | decoupled_ppo | m2po")
    loss_params: Mapping[str, float] = setting({}, "clip_eps, clip_eps_high (grpo); clip_eps, iw_cap (decoupled_ppo); "
                                                   "tau (m2po)", bounds=Bounds(0, 1e6))
    aggregation: str = setting("token", "token | sequence loss aggregation")
    normalize_std: bool = setting(True, "GRPO: divide advantages by the group's reward std")
    kl_coef: float = setting(0.0, "KL loss term against the initial policy (0: off)", bounds=Bounds(0, 1000))
    kl_estimator: str = setting("k3", "k3 (low variance; expected gradient of KL(ref||pi)) | k2 (of KL(pi||ref))")
    kl_in_reward_coef: float = setting(0.0, "k1 KL summed per sequence, subtracted from its reward before "
                                            "advantages (verl's use_kl_in_reward; 0: off)", bounds=Bounds(0, 1000))
    temperature: float = setting(1.0, "set from rollout.temperature by the job", bounds=Bounds(0, 100, lo_open=True))
    top_p: float = setting(1.0, "set from rollout.top_p by the job: trainer log-probs use the sampled distribution",
                           bounds=Bounds(0, 1, lo_open=True))
    top_k: int = setting(0, "set from rollout.top_k by the job", bounds=Bounds(0, 1_000_000))
    seed: int = setting(0, "torch seed (0: the job's seed)", bounds=SEED)
    device: str = setting("auto", "auto | cpu | cuda")
    bf16: bool = setting(True, "bf16 on GPU (CPU always trains fp32)")
    threads: int = setting(0, "torch threads (0: torch's default)", bounds=Bounds(0, 1024))
    lora: LoraConfig | None = setting(None, "train a LoRA adapter of the model instead of all its weights "
                                            "({rank, alpha, dropout, target_modules}); versions carry the adapter "
                                            "only. null: full fine-tuning")
    correction: CorrectionConfig | None = setting(None, "rollout-trainer mismatch correction ({method: tis | "
                                                        "mis_token | mis_seq | icepop | geo_seq, cap, lo, hi}); "
                                                        "null: the loss sees the behaviour log-probs as they are")
    collective_timeout_s: float = setting(300.0, "bound on every collective across ranks: a rank whose peer died "
                                                 "fails after this instead of hanging", bounds=TIMEOUT_S)
    # DeepSpeed zero_optimization sizes, in elements (DeepSpeed's names; its defaults in brackets).
    reduce_bucket_size: int = setting(10_000_000, "ZeRO 1-3: gradient elements reduced per collective; ZeRO-3 touches "
                                                  "up to this much of its bucket buffer [DeepSpeed: 5e8]",
                                                  bounds=Bounds(1, 10**12))
    allgather_bucket_size: int = setting(10_000_000, "ZeRO 1-2: parameter elements all-gathered per collective after "
                                                     "each optimizer step [5e8]", bounds=Bounds(0, 10**12))
    stage3_prefetch_bucket_size: int = setting(10_000_000, "ZeRO-3: parameter elements fetched ahead of use [5e7]",
                                               bounds=Bounds(0, 10**12))
    stage3_param_persistence_threshold: int = setting(100_000, "ZeRO-3: parameters smaller than this stay whole on "
                                                               "every rank, never partitioned [1e5]",
                                                               bounds=Bounds(0, 10**12))
    stage3_max_live_parameters: int = setting(10_000_000, "ZeRO-3: gathered parameter elements a rank may hold "
                                                          "before releasing [1e9: the whole model]",
                                                          bounds=Bounds(0, 10**12))
    stage3_max_reuse_distance: int = setting(10_000_000, "ZeRO-3: keep a gathered parameter if it is used again "
                                                         "within this many elements [1e9]", bounds=Bounds(0, 10**12))
    sub_group_size: int = setting(10_000_000, "ZeRO-3: optimizer step tile, in elements: the step's flat gradient "
                                              "and AdamW temporaries are this size; a checkpoint resumes only under "
                                              "the size it was saved with [1e9]", bounds=Bounds(0, 10**12))

    def __post_init__(self) -> None:
        if self.collective_timeout_s <= 0:
            raise ValueError(f"trainer.collective_timeout_s must be > 0, got {self.collective_timeout_s}")
        for key in ZERO_SIZE_KEYS:
            value, least = getattr(self, key), 1 if key == "reduce_bucket_size" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"trainer.{key} must be a whole number of elements >= {least} (e.g. 10_000_000; "
                                 f"YAML reads 1e7 as a string), got {value!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"trainer.zero_stage must be 0..3, got {self.zero_stage}")
        if self.loss in RETIRED_LOSSES:
            raise ValueError(f"trainer.loss: {RETIRED_LOSSES[self.loss]}")
        if self.loss not in LOSS_PARAMS:
            raise ValueError(f"trainer.loss must be one of {sorted(LOSS_PARAMS)}, got {self.loss!r}")
        bad = sorted(set(self.loss_params) - LOSS_PARAMS[self.loss])
        if bad:
            raise ValueError(f"trainer.loss_params: {bad} do not apply to loss {self.loss!r}; allowed: {sorted(LOSS_PARAMS[self.loss])}")
        if self.aggregation not in ("token", "sequence"):
            raise ValueError(f"trainer.aggregation must be 'token' or 'sequence', got {self.aggregation!r}")
        if self.kl_estimator == "k1":
            raise ValueError("trainer.kl_estimator 'k1' has zero expected gradient as a loss term (E[∇ log π] = 0): "
                             "use kl_in_reward_coef for k1 in the reward, or kl_estimator 'k3' (or 'k2') for a loss term")
        if self.kl_estimator not in ("k2", "k3"):
            raise ValueError(f"trainer.kl_estimator must be 'k3' or 'k2', got {self.kl_estimator!r}")
        if self.kl_coef < 0 or self.kl_in_reward_coef < 0:
            raise ValueError(f"trainer.kl_coef and trainer.kl_in_reward_coef must be >= 0, got "
                             f"{self.kl_coef} and {self.kl_in_reward_coef}")
        if self.ppo_epochs < 1 or self.minibatches < 1:
            raise ValueError(f"trainer.ppo_epochs and trainer.minibatches must be >= 1, got "
                             f"{self.ppo_epochs} and {self.minibatches}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"trainer.lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and self.total_steps <= 0:
            raise ValueError("trainer.lr_schedule 'cosine' needs trainer.total_steps > 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"trainer.device must be auto | cpu | cuda, got {self.device!r}")
        if self.token_budget < 1 or self.temperature <= 0:
            raise ValueError("trainer.token_budget must be >= 1 and trainer.temperature > 0")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"trainer.top_p must be in (0, 1] and trainer.top_k >= 0, got {self.top_p} and {self.top_k}")
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "loss_params", dict(self.loss_params))
