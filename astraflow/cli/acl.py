"""``astraflow acl plan|apply``: a job's least-privilege ACLs, printed or put in force.

The plan is :mod:`astraflow.job_acls`'s; this module reads the flags (``--principal``
pairs, which of ``--config``/``--job``/``--topology``/``--region`` go together), prints the
plan and its warnings, and applies it as the environment's client (the super user's
``ASTRAFLOW_KAFKA_*``), never as one of the job's own principals. Handlers import the plan
when they run: it loads the config, Kafka and topology modules (about two seconds).
"""

from __future__ import annotations

import argparse
import sys

from .args import UsageError, name, overrides

__all__ = ["add_parsers"]


def _given(pairs: list[str] | None, policies: tuple[str, ...]) -> dict[str, str]:
    """``--principal ROLE[.POLICY]=USER`` pairs as principal key -> user."""
    from astraflow.job_acls import is_principal, principal_forms
    out = {}
    for pair in pairs or []:
        key, _, user = pair.partition("=")
        if not user or not is_principal(key, policies):
            raise UsageError(f"--principal {pair!r}: expected ROLE=USER or ROLE.POLICY=USER, "
                             f"{principal_forms(policies)}")
        out[key] = user
    return out


def _cmd_acl(args: argparse.Namespace) -> int:
    from astraflow import job_acls  # lazy: see the module docstring
    from astraflow.config import load_config
    from astraflow.topics import JobTopics, job_topics
    from astraflow.topics.acls import apply, format_plan
    cfg = load_config(args.config, overrides(args.set)) if args.config else None
    if cfg is None and not args.job:
        raise UsageError("give --config (or --job and --policy)")
    if args.topology and cfg is None:
        raise UsageError("--topology: give --config too (the job whose topics and principals it runs)")
    topics = job_topics(cfg) if cfg else JobTopics(job=args.job, policies=tuple(args.policy or ["policy"]))
    if args.region:
        return _mirror_acl(args, cfg, topics)
    users = job_acls.users_of(cfg, topics.policies, _given(args.principal, topics.policies))
    serves = {}
    if args.topology:
        try:
            users, serves = job_acls.topology_principals(args.topology, cfg, users)
        except job_acls.AclPlanError as e:
            raise UsageError(f"--topology {args.topology}: {e}") from None
    for role, served in serves.items():
        if len(served) > 1:
            print(f"astraflow acl: warning: principal {role!r} (user {users[role]!r}) serves policies "
                  f"{', '.join(served)} of topology {args.topology} under one login: a node of any of them "
                  f"(any region) holds every one's rights; name one principal per policy "
                  f"({', '.join(f'kafka.security.principals.{role}.{p}' for p in served)})", file=sys.stderr)
    try:
        entries = job_acls.job_acls(topics, users, serves)
    except job_acls.AclPlanError as e:
        raise UsageError(str(e)) from None
    if args.action == "plan":
        print(format_plan(entries))
        return 0
    bootstrap = args.bootstrap_servers or (cfg.kafka.bootstrap_servers if cfg else None)
    if not bootstrap:
        raise UsageError("apply: give --bootstrap-servers (or kafka.bootstrap_servers in the config)")
    if args.users:
        if cfg is None:
            raise UsageError("apply --users: give --config (the principals' password files)")
        from astraflow.topics.secured import add_users
        add_users(bootstrap, job_acls.passwords(cfg, users))
    n = apply(bootstrap, entries)
    print(f"acl: {n} ACLs in force for {len(set(users.values()))} principals of job {topics.job} on {bootstrap}")
    return 0


def _mirror_acl(args: argparse.Namespace, cfg, topics) -> int:
    """``--region R``: the ACLs of region R's mirror principal (``regions.R.kafka_security.username``,
    or ``--principal mirror=USER``) on R's own cluster, where MirrorMaker 2 writes the job's
    weights (a region that shares another's cluster: that cluster and its one mirror, named
    after the region that declares it)."""
    from astraflow import job_acls
    from astraflow.topics.acls import apply, format_plan
    if not args.topology or cfg is None:
        raise UsageError("--region: give --topology and --config (the region's cluster and the job)")
    try:
        cluster = job_acls.region_cluster(args.topology, cfg, args.region)
    except job_acls.AclPlanError as e:
        raise UsageError(f"--region {e}") from None
    given = dict(p.partition("=")[::2] for p in args.principal or [])
    user = given.pop("mirror", None) or (cluster.security.username if cluster.security else None)
    if given or not user:
        raise UsageError(f"--region {args.region}: the mirror's user is "
                         f"regions.{cluster.declared_by}.kafka_security.username or --principal mirror=USER"
                         + (f" (other principals are not planned with --region: {', '.join(given)})" if given else ""))
    entries = job_acls.mirror_acls(topics, user)
    if args.action == "plan":
        print(format_plan(entries))
        return 0
    bootstrap = args.bootstrap_servers or (None if cluster.embedded else cluster.name)
    if not bootstrap:
        raise UsageError(f"apply --region {args.region}: its cluster is embedded; give --bootstrap-servers")
    n = apply(bootstrap, entries)
    print(f"acl: {n} ACLs in force for mirror principal {user!r} of region {args.region} (job {topics.job}) on "
          f"{bootstrap}")
    return 0


def add_parsers(sub) -> None:
    """Add ``acl`` to the CLI's subcommands."""
    ac = sub.add_parser("acl", help="least-privilege ACLs of a job's component principals: plan (print) or apply "
                                    "(docs/security.md)")
    ac.add_argument("action", choices=["plan", "apply"])
    ac.add_argument("--config", help="the job config: its topics and kafka.security.principals")
    ac.add_argument("--job", type=name, help="without --config: the job name")
    ac.add_argument("--policy", action="append", type=name, help="without --config: policy (repeatable)")
    ac.add_argument("--principal", action="append", metavar="ROLE[.POLICY]=USER",
                    help="a role's user (raas, trainer, dataflow, admin), or one policy's (raas.P, trainer.P); "
                         "default: the config's principals, else af-<role>")
    ac.add_argument("--topology", metavar="FILE",
                    help="with --config: only the principals the topology's pools run, each policy's where "
                         "principals are per policy")
    ac.add_argument("--region", help="with --topology and --config: the ACLs of that region's mirror principal "
                                     "(regions.R.kafka_security.username, or --principal mirror=USER) on the "
                                     "region's own cluster, where MirrorMaker 2 writes the weights")
    ac.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    ac.add_argument("--bootstrap-servers", help="apply: the cluster (default: kafka.bootstrap_servers; with "
                                                "--region, the region's cluster)")
    ac.add_argument("--users", action="store_true",
                    help="apply: also create each principal's SCRAM-SHA-512 credential from its password file or "
                         "variable in the config")
    ac.set_defaults(func=_cmd_acl)
