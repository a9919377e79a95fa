"""The job config: :class:`JobConfig` (every section of a job) and :func:`load_config`.

:func:`load_config` reads a YAML file strictly (:mod:`astraflow.typed_config`: an unknown key,
a missing required key or a value of the wrong type or out of bounds is a
:class:`ConfigError` naming the dotted key and the file), applies ``--set`` overrides, and
starts each ``policies.<p>`` section from the top-level one. A loaded job then runs its
cross-section checks (:mod:`.cross_checks`) and answers what its components ask of it: its
policies, each policy's view, its data sources. The sections themselves are
:mod:`.sections`', :mod:`.kafka`'s and :mod:`.security`'s. The components read it; it knows
nothing about running them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from astraflow.typed_config import ConfigError, from_dict, load_yaml
from astraflow.typed_config import setting
from astraflow.workflows.api import get_workflow

from .cross_checks import CrossSectionChecks
from .kafka import KafkaConfig
from .security import POLICY_ROLES
from .sections import (GENERATORS, SEED, AuditConfig, DataConfig, DataflowConfig, EvalConfig, ModelConfig,
                       PolicyConfig, RolloutConfig, SandboxConfig, TracingConfig, TrackingConfig, TrainerConfig,
                       WorkflowConfig)

#: The sections a policy of a multi-policy job has of its own (``policies.<p>.<section>``).
POLICY_SECTIONS = ("model", "rollout", "dataflow", "trainer")


@dataclass(frozen=True)
class JobConfig(CrossSectionChecks):
    job: str = setting(help="job name; topics are af.<job>.*")
    mode: Literal["async", "sync"] = setting("async", "async overlaps rollout and training; sync alternates them")
    policy: str = setting("policy", "policy name")
    seed: int = setting(0, "job seed", bounds=SEED)
    run_dir: str = setting("runs", "where run directories are created")
    kafka: KafkaConfig = setting(KafkaConfig(), "Kafka")
    model: ModelConfig = setting(ModelConfig(), "model")
    data: DataConfig = setting(DataConfig(), "dataset")
    rollout: RolloutConfig = setting(RolloutConfig(), "RaaS nodes")
    dataflow: DataflowConfig = setting(DataflowConfig(), "dataflow")
    trainer: TrainerConfig = setting(TrainerConfig(), "trainer")
    eval: EvalConfig = setting(EvalConfig(), "evaluation")
    tracing: TracingConfig = setting(TracingConfig(), "tracing")
    tracking: TrackingConfig = setting(TrackingConfig(), "the metrics in TensorBoard and MLflow too (docs/tracking.md)")
    sandbox: SandboxConfig = setting(SandboxConfig(), "the sandbox model-written code runs in (sandbox/)")
    audit: AuditConfig = setting(AuditConfig(), "the conservation audit of the job's topics (at the end, and every N "
                                                "versions)")
    policies: dict[str, PolicyConfig] = setting({}, "multi-policy jobs: name -> {model, rollout, dataflow, trainer}, "
                                                    "each section merged over the top-level one; empty: one policy "
                                                    "named `policy` made of the top-level sections")
    workflow: WorkflowConfig = setting(WorkflowConfig(), "the episode: a registered workflow and its role -> policy "
                                                         "binding")
    barrier: Literal["async", "lockstep"] = setting("async", "async: each policy trains as soon as its own batch is "
                                                             "full; lockstep: every policy steps together (the "
                                                             "trainer-centred schedule, for comparison)")
    source: str = setting("<dict>", "file it was loaded from", compare=False)

    @classmethod
    def normalize_config(cls, data: dict, file: str) -> dict:
        """Before the keys are checked: each ``policies.<p>`` section starts from the top-level one."""
        return _with_policy_defaults(data, file)

    def __post_init__(self) -> None:
        self.check_sections()

    @property
    def data_sources(self) -> tuple[str, ...]:
        """Every prompt source of the job: the mixing curator's sources, else ``data.source``."""
        for spec in self.dataflow.algorithms:
            if spec.name == "mixing":
                return tuple(spec.params.sources)
        return (self.data.source,)

    @property
    def heldout_fraction(self) -> float:
        """The fraction of each dataset file's distinct prompts held out (``eval.holdout``, or its default)."""
        if self.eval.holdout is not None:
            return self.eval.holdout
        return 0.1 if self.eval.data is None and any(s not in GENERATORS for s in self.data_sources) else 0.0

    @property
    def config_dir(self) -> str:
        """What relative data paths are relative to: the config file's folder."""
        return str(Path(self.source).parent) if self.source != "<dict>" else "."

    # -- policies ----------------------------------------------------------------------
    @property
    def policy_names(self) -> tuple[str, ...]:
        """Every policy of the job; a single-policy job has one, named ``policy``."""
        return tuple(self.policies) if self.policies else (self.policy,)

    @property
    def role_policies(self) -> dict[str, str]:
        """Role -> policy: ``workflow.roles``, or every role of the workflow played by ``policy``."""
        if self.workflow.roles:
            return dict(self.workflow.roles)
        return {role: self.policy for role in get_workflow(self.workflow.name).roles}

    @property
    def lead_policy(self) -> str:
        """The policy whose pool runs the episodes: the one playing the workflow's first role."""
        return self.role_policies[get_workflow(self.workflow.name).roles[0]]

    def pool_of(self, policy: str) -> str:
        """The policy whose RaaS pool serves ``policy``'s rows: ``rollout.pool``, or its own."""
        return (self.policies[policy].rollout.pool or policy) if self.policies else policy

    def pool_policies(self, policy: str) -> tuple[str, ...]:
        """The policies whose rows ``policy``'s pool serves, itself first; () when another
        policy's pool serves it (it has no nodes of its own)."""
        if self.pool_of(policy) != policy:
            return ()
        return (policy, *(p for p in self.policy_names if p != policy and self.pool_of(p) == policy))

    def trainer_process_of(self, policy: str) -> str:
        """The policy whose trainer process trains ``policy``: ``trainer.process``, or its own."""
        return (self.policies[policy].trainer.process or policy) if self.policies else policy

    def trainer_policies(self, policy: str) -> tuple[str, ...]:
        """The policies ``policy``'s trainer process trains, itself first; () when another
        policy's trainer process trains it (it has no trainer process of its own)."""
        if self.trainer_process_of(policy) != policy:
            return ()
        return (policy, *(p for p in self.policy_names if p != policy and self.trainer_process_of(p) == policy))

    def pool_device_shares(self) -> set[str]:
        """The ``device.share`` names a RaaS pool takes turns on (with its own policy's trainer);
        a share named by trainers alone is LoRA trainers of one base taking turns."""
        secs = self.policies.values() if self.policies else (self,)
        return {sec.rollout.device.share for sec in secs if sec.rollout.device.share}

    def view(self, policy: str) -> "JobConfig":
        """This job as seen by one policy's components: ``policy``, ``model``, ``rollout``,
        ``dataflow`` and ``trainer`` are that policy's. A single-policy job is its own view."""
        if not self.policies:
            if policy != self.policy:
                raise KeyError(f"no policy {policy!r} (policies: {self.policy})")
            return self
        if policy not in self.policies:
            raise KeyError(f"no policy {policy!r} (policies: {', '.join(self.policies)})")
        p = self.policies[policy]
        return dataclasses.replace(self, policy=policy, model=p.model, rollout=p.rollout, dataflow=p.dataflow,
                                   trainer=p.trainer)

    @property
    def effective_staleness(self) -> int:
        """Sync mode is the zero-staleness schedule of the same components."""
        return 0 if self.mode == "sync" else self.dataflow.max_staleness


_PRINCIPALS = ("kafka", "security", "principals")


def _override_path(dotted: str) -> list[str]:
    """A ``--set`` key's path of section names. Below ``kafka.security.principals`` an entry of
    a policy's node is itself dotted (``raas.solver``): ``...principals.raas.solver.username``
    sets ``principals["raas.solver"].username``."""
    parts = dotted.split(".")
    n = len(_PRINCIPALS)
    if tuple(parts[:n]) == _PRINCIPALS and len(parts) == n + 3 and parts[n] in POLICY_ROLES:
        return [*parts[:n], f"{parts[n]}.{parts[n + 1]}", parts[n + 2]]
    return parts


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read and validate a YAML job config; ``overrides`` are dotted keys (``trainer.steps``)."""
    path = Path(path)
    data = load_yaml(path, "a mapping of sections")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = _override_path(dotted)
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(str(path), ".".join(parents[:i + 1]), f"is not a section, so {dotted} cannot be "
                                                                        "set (an override of a key inside it)")
        node[last] = value
    return from_dict(JobConfig, {**data, "source": str(path)}, str(path))


def _merge(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``, recursively for mappings."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) if k in base else v for k, v in over.items()}}
    return over


def _with_policy_defaults(data: dict, file: str) -> dict:
    """Each ``policies.<p>`` section starts from the top-level section of the same name."""
    policies = data.get("policies")
    if not policies:
        return data
    if not isinstance(policies, dict):
        raise ConfigError(file, "policies", f"expected a mapping of policy name -> sections, got {policies!r}")
    merged = {}
    for name, own in policies.items():
        own = own or {}
        if not isinstance(own, dict):
            raise ConfigError(file, f"policies.{name}", f"expected a mapping of sections, got {own!r}")
        for key in own:
            if key not in POLICY_SECTIONS:
                raise ConfigError(file, f"policies.{name}.{key}",
                                  f"unknown key (allowed in policies.{name}: {', '.join(POLICY_SECTIONS)})")
        merged[str(name)] = {k: _merge(data.get(k, {}) or {}, own[k]) if k in own else (data.get(k, {}) or {})
                             for k in POLICY_SECTIONS}
    out = {**data, "policies": merged}
    out.setdefault("policy", next(iter(merged)))
    return out
