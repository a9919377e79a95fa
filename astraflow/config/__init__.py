"""Job configuration: typed sections, loaded from YAML and validated at load time.

Every section is a frozen dataclass whose keys carry their help and bounds. :func:`load_config`
is strict (the shared loader, :mod:`astraflow.typed_config`): an unknown key, a missing
required key or a value of the wrong type raises :class:`ConfigError` naming the dotted key
and the file. The package's modules, each with one job:

- :mod:`.job`: :class:`JobConfig`, :func:`load_config`, ``--set`` overrides and per-policy defaults;
- :mod:`.cross_checks`: what a job checks across its sections (pipelines, workflow and role
  bindings, evaluation keys, models, device sharing, principals);
- :mod:`.sections`: model, data, rollout, dataflow, trainer, eval, tracing, tracking, sandbox,
  audit, a policy's sections, the workflow;
- :mod:`.kafka`: the ``kafka`` section and topic retention;
- :mod:`.security`: how clients authenticate (one login shape, the job's principals, a
  cluster's own setting) and :func:`install_security`;

It sits above the engines, workflows and algorithms whose settings and names it validates,
and below the actors that read it.
"""

from astraflow.typed_config import ConfigError, from_dict

from .job import POLICY_SECTIONS, JobConfig, load_config
from .kafka import KafkaConfig, RetentionConfig, RetentionLimit
from .security import (POLICY_ROLES, PRINCIPAL_ROLES, ClusterSecurityConfig, KafkaPrincipal, KafkaSecurityConfig,
                       install_security, principal_role)
from .sections import (GENERATORS, AuditConfig, DataConfig, DataflowConfig, EvalConfig, ModelConfig, PolicyConfig,
                       RolloutConfig, SandboxConfig, TracingConfig, TrackingConfig, TrainerConfig, WorkflowConfig)

__all__ = ["AuditConfig", "ClusterSecurityConfig", "ConfigError", "DataConfig", "DataflowConfig", "EvalConfig",
           "GENERATORS", "JobConfig", "KafkaConfig", "KafkaPrincipal", "KafkaSecurityConfig", "ModelConfig",
           "POLICY_ROLES", "POLICY_SECTIONS", "PRINCIPAL_ROLES", "PolicyConfig", "RetentionConfig", "RetentionLimit",
           "RolloutConfig", "SandboxConfig", "TracingConfig", "TrackingConfig", "TrainerConfig", "WorkflowConfig",
           "from_dict", "install_security", "load_config", "principal_role"]
