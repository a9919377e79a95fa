"""Least-privilege ACLs of a job's component principals, derived from its topic registry.

On a cluster that enforces ACLs (``StandardAuthorizer``, :mod:`.secured`), a principal may
do only what an ACL allows. :func:`plan` lists what each role of a job needs, from the
job's own :class:`~.registry.JobTopics` (so the plan follows the topics when they change):

- ``raas`` (a RaaS node of policy ``p``): read ``tasks.p`` in its group, write
  ``trajectories`` in transactions (ids ``af.<job>.raas.<p>.<node>``), read ``versions`` and
  ``weights.p`` (its weights), write ``metrics``/``control``/``dlq``; in a multi-policy job
  read ``generate.p`` in its generation group (the role calls it serves), write the other
  policies' ``generate.q`` (the role calls it makes), read and write ``replies``; it may
  *not* write ``versions``, ``weights.*``, ``batches.*`` or ``tasks.*``;
- ``trainer`` (of ``p``): read ``batches.p``, write ``weights.p`` (and trim it) and
  ``versions``; it may not write ``trajectories``, ``tasks.*`` or ``batches.*``;
- ``dataflow`` (and the evaluator in its process): read ``prompts``, ``trajectories``,
  ``versions``, ``weights.*``; write ``prompts``, ``tasks.*``, ``batches.*``, ``drops.*`` and
  its restart state in transactions (ids ``af.<job>.dataflow.*``); it may not write
  ``versions`` or ``weights.*``;
- ``admin`` (the launcher, ``astraflow status``/``replay``/``export``, the operator's tools):
  create, describe and read every topic of the job and read its groups' offsets; write only
  ``metrics``, ``control`` and ``dlq``. It may *not* write ``versions``, ``weights.*``,
  ``batches.*``, ``tasks.*`` or ``trajectories``, delete records or change a topic's settings:
  only the cluster's super user does everything.

A principal named ``raas`` or ``trainer`` serves every policy and gets those rules for each;
one named ``raas.<p>`` or ``trainer.<p>`` gets only policy ``p``'s: ``trainer.a`` writes
``weights.a`` and not ``weights.b``; ``raas.a`` reads ``tasks.a`` and ``weights.a``, uses
only transactional ids ``af.<job>.raas.a.*`` and, in a multi-policy job, reads only its own
``generate.a`` and writes only the others'. ``versions`` is one topic for all policies, so
every trainer principal may write it; each announcement is Ed25519-signed with its policy's
key, and subscribers drop one that another policy's key signed.

:func:`apply` creates them with Kafka's CreateAcls admin API (kafka-python's
``create_acls``), as the process's installed client (the super user's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .claim import CLAIM_TOPIC
from .mirror_plan import connect_group, internal_topics, weight_topics
from .registry import JobTopics

__all__ = ["AclEntry", "POLICY_ROLES", "ROLES", "apply", "format_plan", "mirror_plan", "plan", "principals_of"]

ROLES = ("raas", "trainer", "dataflow", "admin")
POLICY_ROLES = ("raas", "trainer")  #: roles a principal may serve one policy of: ``<role>.<policy>``
#: What the admin may do on every topic of its job (PREFIXED): make and read them, not write them.
ADMIN_TOPIC_OPS = ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ")


@dataclass(frozen=True, order=True)
class AclEntry:
    """One ALLOW rule: ``principal`` may ``operation`` the ``resource`` named ``name``
    (``pattern`` LITERAL: that name; PREFIXED: every name starting with it)."""

    principal: str  #: ``User:<name>``
    resource: str  #: TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    name: str
    operation: str  #: READ, WRITE, DESCRIBE, DELETE, CREATE, ALL, ...
    pattern: str = "LITERAL"
    role: str = ""  #: the role it was planned for (not part of Kafka's ACL)

    def line(self) -> str:
        return f"{self.principal:24} {self.operation:9} {self.resource:16} {self.pattern:8} {self.name}"

    def to_kafka(self):
        from kafka.admin import (ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern,
                                 ResourceType)
        return ACL(principal=self.principal, host="*", operation=ACLOperation[self.operation],
                   permission_type=ACLPermissionType.ALLOW,
                   resource_pattern=ResourcePattern(ResourceType[self.resource], self.name,
                                                    ACLResourcePatternType[self.pattern]))


def _topic(who: str, role: str, name: str, *ops: str, pattern: str = "LITERAL") -> list[AclEntry]:
    # WRITE and READ imply DESCRIBE in Kafka's authorizer; DESCRIBE is listed where only metadata is read.
    return [AclEntry(who, "TOPIC", name, op, pattern, role) for op in ops]


def _split(key: str, policies: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``"raas"`` -> ``("raas", every policy)``; ``"raas.a"`` -> ``("raas", ("a",))``."""
    role, _, policy = key.partition(".")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if not policy:
        return role, policies
    if role not in POLICY_ROLES:
        raise ValueError(f"{key}: the {role} serves every policy; per policy: "
                         f"{', '.join(f'{r}.<policy>' for r in POLICY_ROLES)}")
    if policy not in policies:
        raise ValueError(f"{key}: no policy {policy!r} (policies: {', '.join(policies)})")
    return role, (policy,)


def plan(topics: JobTopics, principals: dict[str, str],
         serves: dict[str, tuple[str, ...]] | None = None) -> list[AclEntry]:
    """The ALLOW rules of each principal in ``principals`` (``<role>`` or ``<role>.<policy>``
    -> user name) for ``topics``: a ``<role>`` principal gets its role's rules for every
    policy — or, named in ``serves``, for only the policies listed there (those a topology's
    pools run it for) — a ``<role>.<policy>`` one (raas, trainer) only its own policy's. Roles
    absent from ``principals`` get none (a role sharing the admin's user needs none). Each
    rule's ``role`` is the principal's key."""
    t, out = topics, []
    multi = any(s.name == t.replies for s in t.specs())
    for key, user in sorted(principals.items()):
        role, mine = _split(key, t.policies)
        if serves and key in serves and role in POLICY_ROLES:
            mine = tuple(p for p in mine if p in serves[key])
        scoped = "." in key or mine != t.policies  # <role>.<policy>, or a topology's subset: ids scoped to them
        who = f"User:{user}"
        common = (_topic(who, key, t.metrics, "WRITE") + _topic(who, key, t.dlq, "WRITE")
                  + _topic(who, key, t.control, "READ", "WRITE"))
        if role == "admin":
            # It creates and reads every topic of the job and writes only what a launcher or an
            # operator writes: never versions, weights.*, batches.*, tasks.* or trajectories, so
            # a stolen launcher password cannot steer training (the super user still can).
            out += [AclEntry(who, "TOPIC", t.prefix, op, "PREFIXED", key) for op in ADMIN_TOPIC_OPS]
            out += common
            out += [AclEntry(who, "GROUP", t.prefix, op, "PREFIXED", key) for op in ("READ", "DESCRIBE")]
            continue
        out += common
        if role == "raas":
            for p in mine:
                out += _topic(who, key, t.tasks(p), "READ")
                out += [AclEntry(who, "GROUP", t.rollout_group(p), "READ", "LITERAL", key)]
                out += _topic(who, key, t.weights(p), "READ")
                if multi:  # serving p's role calls from the other policies' episodes (generation.py)
                    out += _topic(who, key, t.generate(p), "READ")
                    out += [AclEntry(who, "GROUP", t.generation_group(p), "READ", "LITERAL", key)]
            if multi:  # calling the roles the other policies play (any, when it serves several)
                out += [e for q in t.policies if q not in mine or len(mine) > 1
                        for e in _topic(who, key, t.generate(q), "WRITE")]
                out += _topic(who, key, t.replies, "READ", "WRITE")
            out += _topic(who, key, t.trajectories, "WRITE")
            out += _topic(who, key, t.versions, "READ")
            # Transactional ids are af.<job>.raas.<policy>.<node> (JobTopics.rollout_transactional_id).
            tids = [t.rollout_transactional_id(p, "") for p in mine] if scoped else [f"{t.prefix}raas."]
            out += [AclEntry(who, "TRANSACTIONAL_ID", tid, op, "PREFIXED", key)
                    for tid in tids for op in ("WRITE", "DESCRIBE")]
        elif role == "trainer":
            for p in mine:
                out += _topic(who, key, t.batches(p), "READ")
                out += _topic(who, key, t.weights(p), "READ", "WRITE", "DELETE")
            # versions is one topic for every policy: each announcement is Ed25519-signed by its
            # policy's key, so a trainer that may write it still cannot announce another's version.
            out += _topic(who, key, t.versions, "READ", "WRITE")
        elif role == "dataflow":
            out += _topic(who, key, t.prompts, "READ", "WRITE")
            out += _topic(who, key, t.trajectories, "READ")
            out += _topic(who, key, t.versions, "READ")
            for p in mine:
                out += _topic(who, key, t.tasks(p), "WRITE")
                out += _topic(who, key, t.batches(p), "READ", "WRITE")
                out += _topic(who, key, t.drops(p), "WRITE")
                out += _topic(who, key, t.dataflow_state(p), "READ", "WRITE")
                out += _topic(who, key, t.weights(p), "READ")  # the evaluator scores each version
                out += [AclEntry(who, "GROUP", g, "READ", "LITERAL", key)
                        for g in (t.dataflow_group(p), t.dataflow_group(p) + ".trajectories")]
            out += [AclEntry(who, "TRANSACTIONAL_ID", f"{t.prefix}dataflow.", op, "PREFIXED", key)
                    for op in ("WRITE", "DESCRIBE")]
    return sorted(set(out))


def mirror_plan(topics: JobTopics, user: str, *, source_alias: str, claim_group: str) -> list[AclEntry]:
    """The ALLOW rules of a region's mirror principal ``user`` on that region's cluster, the
    target of the one-way flow of :mod:`.mirror` (MirrorMaker 2 in dedicated mode, exactly-once
    source, connect-cluster group ``<source_alias>-mm2``; home's cluster alias ``source_alias``).

    It may write only the mirrored weight topics (``versions`` and ``weights.<p>``: create them
    with their own bound, describe, write), run MirrorMaker's Connect worker (its group, its
    three internal topics, the transactional ids of exactly-once source: the leader's
    ``connect-cluster-<group>`` and the tasks' ``<group>-<connector>-<task>``), and hold the
    job's mirror claim (:mod:`.claim`: a group on a one-partition topic, never written). It may
    not write tasks, trajectories, batches or anything else of the job on that cluster; the
    region's RaaS nodes only read what it writes. At home MirrorMaker reads as the process's
    own login (the job's admin principal reads every topic of the job)."""
    who, key, group = f"User:{user}", "mirror", connect_group(source_alias)
    out: list[AclEntry] = []
    for name in weight_topics(topics):
        out += _topic(who, key, name, "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "WRITE", "READ")
    for name in internal_topics(source_alias).values():
        out += _topic(who, key, name, "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE")
    out += [AclEntry(who, "GROUP", group, op, "LITERAL", key) for op in ("READ", "DESCRIBE")]
    out += [AclEntry(who, "TRANSACTIONAL_ID", name, op, pattern, key)
            for name, pattern in ((f"connect-cluster-{group}", "LITERAL"), (f"{group}-", "PREFIXED"))
            for op in ("WRITE", "DESCRIBE")]
    out += _topic(who, key, CLAIM_TOPIC, "CREATE", "DESCRIBE", "READ")
    out += [AclEntry(who, "GROUP", claim_group, op, "LITERAL", key) for op in ("READ", "DESCRIBE")]
    return sorted(set(out))


def principals_of(components: Iterable[tuple[str, str | None]], users: dict[str, str]) -> dict[str, str]:
    """The principals a set of running ``(role, policy)`` components log in as: ``<role>.<policy>``
    where ``users`` has one, else ``<role>``; ``users`` maps those keys to user names."""
    out = {}
    for role, policy in components:
        key = f"{role}.{policy}" if policy is not None and f"{role}.{policy}" in users else role
        if key not in users:
            raise ValueError(f"no user for principal {key!r}")
        out[key] = users[key]
    return out


def format_plan(entries: Iterable[AclEntry]) -> str:
    """One line per rule, grouped by role, kafka-acls' vocabulary."""
    lines, role = [], None
    def order(e: AclEntry):
        role, _, policy = e.role.partition(".")
        return (ROLES.index(role) if role in ROLES else 9, policy, e)
    for e in sorted(entries, key=order):
        if e.role != role:
            role = e.role
            lines.append(f"# {role}")
        lines.append(e.line())
    return "\n".join(lines)


def apply(bootstrap_servers: str, entries: list[AclEntry]) -> int:
    """Create ``entries`` on the cluster (an existing one is kept: creating it again is a
    no-op); the number created. :class:`~.exceptions.TopicsError` names a refused one."""
    from .exceptions import TopicsError
    from .security import admin

    client = admin(bootstrap_servers=bootstrap_servers, client_id="astraflow-acl")
    try:
        result = client.create_acls([e.to_kafka() for e in entries])
    finally:
        client.close()
    if result["failed"]:
        raise TopicsError(f"the cluster refused {len(result['failed'])} of {len(entries)} ACLs: "
                          f"{result['failed'][0]!r} (is this process's client the super user?)")
    return len(result["succeeded"])
