"""Least-privilege ACLs of a job's component principals, derived from its topic registry.

On a cluster that enforces ACLs (``StandardAuthorizer``, :mod:`.secured`), a principal may
do only what an ACL allows. :func:`plan` lists what each role of a job needs, from the
job's own :class:`~.registry.JobTopics` (so the plan follows the topics when they change):

- ``raas`` (a RaaS node of policy ``p``): read ``tasks.p`` in its group, write
  ``trajectories`` in transactions (ids ``af.<job>.raas.*``), read ``versions`` and
  ``weights.p`` (its weights), write ``metrics``/``control``/``dlq``; it may *not* write
  ``versions``, ``weights.*``, ``batches.*`` or ``tasks.*``;
- ``trainer`` (of ``p``): read ``batches.p``, write ``weights.p`` (and trim it) and
  ``versions``; it may not write ``trajectories``, ``tasks.*`` or ``batches.*``;
- ``dataflow`` (and the evaluator in its process): read ``prompts``, ``trajectories``,
  ``versions``, ``weights.*``; write ``prompts``, ``tasks.*``, ``batches.*``, ``drops.*`` and
  its restart state in transactions (ids ``af.<job>.dataflow.*``); it may not write
  ``versions`` or ``weights.*``;
- ``admin`` (the launcher, ``astraflow status``/``replay``/``export``, the operator's tools):
  everything on the job's topics and groups (it creates them) — not the cluster's.

:func:`apply` creates them with Kafka's CreateAcls admin API (kafka-python's
``create_acls``), as the process's installed client (the super user's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .registry import JobTopics

__all__ = ["AclEntry", "ROLES", "apply", "format_plan", "plan"]

ROLES = ("raas", "trainer", "dataflow", "admin")


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


def plan(topics: JobTopics, principals: dict[str, str]) -> list[AclEntry]:
    """The ALLOW rules of each role in ``principals`` (role -> user name) for ``topics``.
    Roles absent from ``principals`` get none (a role sharing the admin's user needs none)."""
    t, out = topics, []
    multi = any(s.name == t.replies for s in t.specs())
    for role, user in sorted(principals.items()):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
        who = f"User:{user}"
        common = (_topic(who, role, t.metrics, "WRITE") + _topic(who, role, t.dlq, "WRITE")
                  + _topic(who, role, t.control, "READ", "WRITE"))
        if role == "admin":
            out += [AclEntry(who, "TOPIC", t.prefix, "ALL", "PREFIXED", role),
                    AclEntry(who, "GROUP", t.prefix, "ALL", "PREFIXED", role),
                    AclEntry(who, "TRANSACTIONAL_ID", t.prefix, "ALL", "PREFIXED", role)]
            continue
        out += common
        if role == "raas":
            for p in t.policies:
                out += _topic(who, role, t.tasks(p), "READ")
                out += [AclEntry(who, "GROUP", t.rollout_group(p), "READ", "LITERAL", role)]
                out += _topic(who, role, t.weights(p), "READ")
                if multi:  # role calls between policies' pools (generation.py)
                    out += _topic(who, role, t.generate(p), "READ", "WRITE")
                    out += [AclEntry(who, "GROUP", t.generation_group(p), "READ", "LITERAL", role)]
            out += _topic(who, role, t.trajectories, "WRITE")
            out += _topic(who, role, t.versions, "READ")
            if multi:
                out += _topic(who, role, t.replies, "READ", "WRITE")
            out += [AclEntry(who, "TRANSACTIONAL_ID", f"{t.prefix}raas.", op, "PREFIXED", role)
                    for op in ("WRITE", "DESCRIBE")]
        elif role == "trainer":
            for p in t.policies:
                out += _topic(who, role, t.batches(p), "READ")
                out += _topic(who, role, t.weights(p), "READ", "WRITE", "DELETE")
            out += _topic(who, role, t.versions, "READ", "WRITE")
        elif role == "dataflow":
            out += _topic(who, role, t.prompts, "READ", "WRITE")
            out += _topic(who, role, t.trajectories, "READ")
            out += _topic(who, role, t.versions, "READ")
            for p in t.policies:
                out += _topic(who, role, t.tasks(p), "WRITE")
                out += _topic(who, role, t.batches(p), "READ", "WRITE")
                out += _topic(who, role, t.drops(p), "WRITE")
                out += _topic(who, role, t.dataflow_state(p), "READ", "WRITE")
                out += _topic(who, role, t.weights(p), "READ")  # the evaluator scores each version
                out += [AclEntry(who, "GROUP", g, "READ", "LITERAL", role)
                        for g in (t.dataflow_group(p), t.dataflow_group(p) + ".trajectories")]
            out += [AclEntry(who, "TRANSACTIONAL_ID", f"{t.prefix}dataflow.", op, "PREFIXED", role)
                    for op in ("WRITE", "DESCRIBE")]
    return sorted(set(out))


def format_plan(entries: Iterable[AclEntry]) -> str:
    """One line per rule, grouped by role, kafka-acls' vocabulary."""
    lines, role = [], None
    for e in sorted(entries, key=lambda e: (ROLES.index(e.role) if e.role in ROLES else 9, e)):
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
