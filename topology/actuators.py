"""Which actuator the autoscaler gets: the backend a topology's ``autoscaler.backend`` names.

``local`` (node processes on the autoscaler's host), ``command`` (the topology's start/stop
templates), ``slurm`` (a Slurm job per node; also every node of ``launch --backend slurm``) or
``kubernetes`` (the Helm chart's pool Deployments). Knows the backends' constructors and the
plan's keys; how each backend acts is its own module's.
"""

from __future__ import annotations

from pathlib import Path

from astraflow.config import JobConfig

from .backends import CommandBackend, LocalBackend
from .plan import Plan
from .schema import TopologyError
from .slurm import Slurm, SlurmBackend


def make_backend(plan: Plan, cfg: JobConfig, command_for, log_dir: Path, slurm: Slurm | None = None):
    """The autoscaler's actuator the topology names; ``slurm`` (``launch --backend slurm``'s
    client) turns the local backend into the Slurm one: the run's nodes are Slurm jobs."""
    a = plan.autoscaler
    if a["backend"] == "command":
        return CommandBackend(a["command"]["start"], a["command"]["stop"], command_for, cfg.job)
    if a["backend"] == "slurm" or slurm is not None:
        return SlurmBackend(slurm or Slurm(plan.slurm), command_for, log_dir, cfg.job, plan.pools,
                            retire_timeout_s=a["retire_timeout_s"])
    if a["backend"] == "kubernetes":
        # Imported here: the kubernetes client takes ~0.25 s to import (measured), paid only by this backend.
        try:
            from .k8s_backend import KubernetesBackend
        except ModuleNotFoundError as e:
            raise TopologyError(plan.source, "autoscaler.backend", f"kubernetes needs the Kubernetes client ({e}): "
                                                                   f"pip install 'astraflow[kubernetes]'") from None
        return KubernetesBackend.from_spec(a["kubernetes"], [p.name for p in plan.pools.values()
                                                             if p.component == "raas"], plan.source)
    return LocalBackend(command_for, log_dir, retire_timeout_s=a["retire_timeout_s"])
