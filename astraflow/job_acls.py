"""A job's ACL plan: which principals it runs, as which users, and the rules each one gets.

:mod:`astraflow.topics.acls` knows the rules of a role on a job's topics; this module picks
the principals to plan for from what the job says: its config's ``kafka.security.principals``
(else ``af-<role>``) and users given by name, narrowed by a topology to the principals its
pools run, or a region's MirrorMaker principal on the region's own cluster. ``astraflow acl``
prints or applies the result. It knows nothing about the command line or about applying:
errors name config keys and topology regions, and the caller adds its flags.
"""

from __future__ import annotations

from astraflow.config import POLICY_ROLES, PRINCIPAL_ROLES, JobConfig
from astraflow.topics import JobTopics
from astraflow.topics.acls import AclEntry, mirror_plan, plan, principals_of
from astraflow.topology.launch import load_plan
from astraflow.topology.job_mirror import claim_group
from astraflow.topology.plan import Cluster, region_clusters
from astraflow.topology.regional import HOME_ALIAS

__all__ = ["AclPlanError", "is_principal", "job_acls", "mirror_acls", "passwords", "principal_forms", "region_cluster",
           "topology_principals", "users_of"]


class AclPlanError(ValueError):
    """The principals asked for cannot be planned (an unknown role, policy or region)."""


def is_principal(key: str, policies: tuple[str, ...]) -> bool:
    """Whether ``key`` (``<role>`` or ``<role>.<policy>``) names a principal of a job with ``policies``."""
    role, _, policy = key.partition(".")
    return role in PRINCIPAL_ROLES and (not policy or (role in POLICY_ROLES and policy in policies))


def principal_forms(policies: tuple[str, ...]) -> str:
    """What :func:`is_principal` accepts, in words."""
    return (f"ROLE one of {', '.join(PRINCIPAL_ROLES)} (per policy: {', '.join(POLICY_ROLES)}), POLICY one of "
            f"{', '.join(policies)}")


def users_of(cfg: JobConfig | None, policies: tuple[str, ...], given: dict[str, str] | None = None) -> dict[str, str]:
    """Principal key (``<role>`` or ``<role>.<policy>``) -> user: the config's principals (a
    ``<role>`` that every policy's ``<role>.<policy>`` replaces is left out), else ``af-<role>``;
    then ``given`` (keys :func:`is_principal` accepts) over them."""
    sec = cfg.kafka.security if cfg else None
    users = {}
    for r in PRINCIPAL_ROLES:
        per_policy = {p: sec.username_of(r, p) for p in policies
                      if sec and r in POLICY_ROLES and sec.principal_key(r, p) == f"{r}.{p}"}
        users.update({f"{r}.{p}": u for p, u in per_policy.items()})
        if len(per_policy) < len(policies) or r not in POLICY_ROLES:
            users[r] = (sec.username_of(r) if sec else None) or f"af-{r}"
    return {**users, **(given or {})}


def topology_principals(topology: str, cfg: JobConfig, users: dict[str, str]
                          ) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Of ``users``, the principals the topology's pools run (and the launcher's admin), and
    the policies each plain ``raas``/``trainer`` principal serves there (the rules it gets)."""
    pools = load_plan(topology, cfg).pools.values()
    running = {("admin", None)} | {(p.component, None if p.component == "dataflow" else p.policy or cfg.policy)
                                   for p in pools}
    try:
        users = principals_of(sorted(running, key=str), users)
    except ValueError as e:
        raise AclPlanError(str(e)) from None
    serves: dict[str, tuple[str, ...]] = {}
    for role, policy in running:
        if policy is not None and f"{role}.{policy}" not in users and role in users:
            serves[role] = tuple(sorted({*serves.get(role, ()), policy}))
    return users, dict(sorted(serves.items()))


def job_acls(topics: JobTopics, users: dict[str, str], serves: dict[str, tuple[str, ...]] | None = None
             ) -> list[AclEntry]:
    """The rules of ``users``' principals on ``topics`` (a plain principal in ``serves``: of those
    policies only)."""
    try:
        return plan(topics, users, serves or {})
    except ValueError as e:
        raise AclPlanError(str(e)) from None


def region_cluster(topology: str, cfg: JobConfig, region: str) -> Cluster:
    """The :class:`~astraflow.topology.plan.Cluster` of ``region`` (one of its own, where
    MirrorMaker 2 writes the job's weights; a region that shares another's cluster: that one)."""
    own = region_clusters(load_plan(topology, cfg))
    if region not in own:
        raise AclPlanError(f"{region}: not a region with a cluster of its own in {topology} (regions with one: "
                           f"{', '.join(own) or 'none'})")
    return own[region]


def mirror_acls(topics: JobTopics, user: str) -> list[AclEntry]:
    """The rules of a region's MirrorMaker principal ``user`` on the region's own cluster."""
    return mirror_plan(topics, user, source_alias=HOME_ALIAS, claim_group=claim_group(topics.job))


def passwords(cfg: JobConfig, users: dict[str, str]) -> dict[str, str]:
    """User -> password of every principal in ``users`` whose user the config names (so its
    password file or variable too)."""
    sec, out = cfg.kafka.security, {}
    for key, user in users.items():
        role, _, policy = key.partition(".")
        if sec.username_of(role, policy or None) == user:
            out[user] = sec.client(role, cfg.config_dir, cfg.source, policy=policy or None).password
    return out
