"""The values of the Helm chart (``deploy/helm/astraflow``) for a topology and a job config.

``astraflow k8s render TOPOLOGY JOB`` writes them: the job config's text (a ConfigMap; it never
holds a password — a job names ``password_env`` or ``password_file`` and the chart's Secret
carries the value), the cluster (the topology's home Kafka cluster, or a Strimzi cluster with
the job's topics and one user per component principal with the ACLs ``astraflow acl plan``
gives), one trainer StatefulSet per trainer pool (its hosts become pods, each a rank-group
agent of ``trainer.ranks`` ranks), one RaaS Deployment per RaaS pool (replicas, min, max), the
GPUs each pod requests (a pool's ``device.count`` of a device kind other than cpu) and, with
``autoscaler.backend: kubernetes``, the autoscaler's pod with the topology it reads.
Knows nothing about Kubernetes' API; the chart's templates turn these values into objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astraflow.config import ConfigError, JobConfig, load_config
from astraflow.job_acls import job_acls, users_of
from astraflow.topics import job_topics
from astraflow.topology.launch import check_keys_on_hosts, load_plan

__all__ = ["K8sRenderError", "render_values"]

#: default pod sizes per component (the user edits them in the values file)
MEMORY = {"dataflow": "4Gi", "trainer": "32Gi", "raas": "16Gi"}
DEFAULT_MASTER_PORT = 29500
#: the resource types of Kafka's ACLs in Strimzi's names
_STRIMZI_TYPES = {"TOPIC": "topic", "GROUP": "group", "TRANSACTIONAL_ID": "transactionalId", "CLUSTER": "cluster"}


class K8sRenderError(ConfigError):
    """A topology or job that cannot run as this chart's release (one line, naming the key)."""


def render_values(topology: str | Path, job: str | Path, overrides: dict | None = None, *,
                  image: str = "astraflow:0.1.0", strimzi: bool = False) -> dict[str, Any]:
    """The chart's values for ``job`` deployed as ``topology`` describes (see the module docstring)."""
    cfg = load_config(job, overrides)
    plan = load_plan(topology, cfg)
    if len(plan.clusters) > 1:
        regional = ", ".join(c.declared_by for c in plan.clusters[1:])
        raise K8sRenderError(str(topology), "regions", f"regions with a Kafka cluster of their own ({regional}): one "
                                                       f"release runs on one cluster; render one release per region")
    home = plan.clusters[0].name
    if home == "embedded" and not strimzi:
        raise K8sRenderError(str(topology), "regions.<home>.kafka", "'embedded' is a broker `astraflow launch` starts "
                                                                    "on one machine: name the cluster's bootstrap "
                                                                    "servers, or render with --strimzi")
    repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    values: dict[str, Any] = {
        "image": {"repository": repo, "tag": tag},
        "job": {"name": cfg.job, "config": Path(job).read_text(encoding="utf-8"),
                "args": [f"--set={k}={v}" for k, v in (overrides or {}).items()]},
        "kafka": {"bootstrap": "" if strimzi else home, "strimzi": _strimzi(cfg) if strimzi else {"enabled": False}},
        "secrets": {"create": True, "env": {name: "" for name in password_envs(cfg)}, "files": {}},
        "dataflow": {"enabled": False},
        "trainers": [],
        "raasPools": [],
        "autoscaler": _autoscaler(plan, topology),
    }
    if values["autoscaler"]["enabled"]:
        # its pod runs `node --topology`, which refuses key pairs each host would make up itself
        check_keys_on_hosts(plan, cfg)
    for pool in plan.pools.values():
        policy = pool.policy or cfg.policy
        gpus = pool.devices_per_node if pool.device_kind != "cpu" and not pool.device.emulated else 0
        if pool.component == "dataflow":
            values["dataflow"] = {"enabled": True, "resources": {"cpu": "1", "memory": MEMORY["dataflow"]}}
        elif pool.component == "trainer":
            view = cfg.view(policy)
            threads = pool.threads or view.trainer.engine.threads or 1
            values["trainers"].append({
                "name": pool.name, "policy": policy, "hosts": pool.count, "ranksPerHost": view.trainer.ranks,
                "masterPort": _master_port(plan, pool.name) or DEFAULT_MASTER_PORT, "gpus": gpus,
                "resources": {"cpu": str(threads * view.trainer.ranks), "memory": MEMORY["trainer"]}})
        else:
            view = cfg.view(policy)
            threads = pool.threads or view.rollout.engine.threads or 1
            values["raasPools"].append({
                "name": pool.name, "policy": policy, "replicas": pool.count, "min": pool.min, "max": pool.max,
                "gpus": gpus, "threads": threads, "resources": {"cpu": str(threads), "memory": MEMORY["raas"]}})
    return values


def _autoscaler(plan, topology: str | Path) -> dict[str, Any]:
    """The chart's autoscaler pod: on with ``autoscaler.backend: kubernetes`` (another backend starts
    processes, which a release does not: its pools keep their replicas). The pod runs ``astraflow
    node --topology`` for the autoscaler's host, which must hold no pool, or it would run those too."""
    a = plan.autoscaler
    if not a["enabled"] or a["backend"] != "kubernetes":
        return {"enabled": False}
    host = plan.autoscaler_host
    held = [n.node_id for n in plan.nodes_on(host)]
    if held:
        raise K8sRenderError(str(topology), "autoscaler.host", f"{host} holds nodes ({', '.join(held)}); in a release "
                                                               f"the autoscaler's pod runs only the autoscaler: name "
                                                               f"a host of the topology that holds no pool")
    return {"enabled": True, "host": host, "topology": Path(topology).read_text(encoding="utf-8"),
            "resources": {"cpu": "500m", "memory": "1Gi"}}


def password_envs(cfg: JobConfig) -> list[str]:
    """The environment variables the job's Kafka logins read their passwords from."""
    sec = cfg.kafka.security
    logins = [sec, *getattr(sec, "principals", {}).values()] if sec is not None else []
    return sorted({login.password_env for login in logins if getattr(login, "password_env", None)})


def _master_port(plan, pool: str) -> int | None:
    """The rendezvous port the plan gives a trainer pool on several hosts (its nodes' flags)."""
    for node in plan.nodes:
        if node.pool == pool and "--master-port" in node.flags:
            return int(node.flags[node.flags.index("--master-port") + 1])
    return None


def _strimzi(cfg: JobConfig) -> dict[str, Any]:
    """Strimzi's KafkaTopic and KafkaUser settings: the job's topics and its principals' ACLs."""
    topics = job_topics(cfg)
    specs = [{"name": s.name, "partitions": s.partitions, "config": s.configs()} for s in topics.specs()]
    users = users_of(cfg, cfg.policy_names)
    acls: dict[str, list[dict]] = {}
    for entry in job_acls(topics, users):
        user = entry.principal.removeprefix("User:")
        resource = {"type": _STRIMZI_TYPES[entry.resource],
                    "patternType": "prefix" if entry.pattern == "PREFIXED" else "literal"}
        if entry.resource != "CLUSTER":
            resource["name"] = entry.name
        acls.setdefault(user, []).append({"resource": resource, "operations": [entry.operation.title()],
                                          "host": "*"})
    return {"enabled": True, "topics": specs, "users": [{"name": u, "acls": a} for u, a in sorted(acls.items())]}
