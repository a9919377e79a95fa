"""Cross-checks of a topology: every reference resolves and the deployment can run.

:func:`load_topology` reads a topology file: the shapes and per-field checks of
:mod:`.schema`, then these cross-checks.

:func:`validate` needs the file alone: pools name hosts of their own region, host and pool
names are unique across regions (node ids derive from pool names), one dataflow, one
trainer per policy and at least one RaaS pool per trained policy, ``region:<name>``
cluster references resolve, links join two known regions, and the autoscaler has an
elastic pool to act on and, with the local backend, those pools on its own host.
:func:`validate_for_job` adds what a job config decides: the policy, and enough
``tasks.<policy>`` partitions for the most nodes a policy may have.

Each failure is a :class:`~.schema.TopologyError` naming the file and the dotted key.
"""

from __future__ import annotations

import string
from collections import Counter
from pathlib import Path

from astraflow.topics.bootstrap import BadBootstrapServers, parse_bootstrap
from astraflow.typed_config import check_name, load_yaml

from .schema import EMBEDDED, REGION_REF, Topology, TopologyError, parse_topology


def load_topology(path: str | Path) -> Topology:
    """Read, type-check and cross-check a topology file (:class:`TopologyError` names file and key)."""
    path = Path(path)
    data = load_yaml(path, "a mapping with name and regions", TopologyError)
    topo = parse_topology(data, str(path))
    validate(topo)
    return topo


def validate(t: Topology) -> None:
    f = t.source
    if not t.regions:
        raise TopologyError(f, "regions", "no regions; a topology needs at least one")
    _check_names(t)
    _unique_names(t)
    for rname, region in t.regions.items():
        if not region.hosts:
            raise TopologyError(f, f"regions.{rname}.hosts", "no hosts; name at least one")
        _check_kafka(t, rname)
        for pname, pool in region.pools.items():
            key = f"regions.{rname}.pools.{pname}"
            for i, h in enumerate(pool.hosts):
                if h not in region.hosts:
                    raise TopologyError(f, f"{key}.hosts[{i}]", f"unknown host {h!r} (hosts of region {rname}: "
                                                                  f"{', '.join(region.hosts)})")
            _check_pool(f, key, pool)
    _check_components(t)
    _check_home_cluster(t)
    _check_links(t)
    _check_autoscaler(t)


def validate_for_job(t: Topology, job_policy: str | tuple[str, ...], task_partitions: int, job_file: str,
                     served_by: dict[str, str] | None = None, trained_by: dict[str, str] | None = None) -> None:
    """What the job config decides: pools serve its policies, and partitions cover the most nodes.

    ``job_policy`` is the job's policy, or all of a multi-policy job's policies; there a
    trainer or RaaS pool must name the policy it serves, and every policy needs both, except
    that a policy in ``served_by`` (policy -> the policy whose pool serves its rows: the job's
    ``rollout.pool``) has no RaaS pool of its own, and one in ``trained_by`` (policy -> the
    policy whose trainer process trains it: ``trainer.process``) no trainer pool."""
    served_by, trained_by = served_by or {}, trained_by or {}
    policies = (job_policy,) if isinstance(job_policy, str) else tuple(job_policy)
    multi = len(policies) > 1
    nodes: dict[str, int] = {}
    served: dict[str, set[str]] = {}
    for rname, pname, pool in pools(t):
        if pool.component == "dataflow":
            continue
        if pool.policy is None and multi:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}.policy",
                                f"the job ({job_file}) trains several policies ({', '.join(policies)}): name the "
                                f"one this {pool.component} pool serves")
        policy = pool.policy or policies[0]
        if policy not in policies:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}.policy",
                                f"serves policy {pool.policy!r} but the job ({job_file}) trains "
                                f"{' and '.join(repr(p) for p in policies)}")
        if pool.component == "raas" and policy in served_by:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}.policy",
                                f"policy {policy!r}'s rows are served by {served_by[policy]!r}'s pool (rollout.pool "
                                f"in {job_file}): it has no RaaS pool of its own; remove this pool")
        if pool.component == "trainer" and policy in trained_by:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}.policy",
                                f"policy {policy!r} is trained in {trained_by[policy]!r}'s trainer process "
                                f"(trainer.process in {job_file}): it has no trainer pool of its own; remove this pool")
        served.setdefault(policy, set()).add(pool.component)
        if pool.component == "raas":
            nodes[policy] = nodes.get(policy, 0) + pool.hi
    if multi:
        for policy in policies:
            needs = {"trainer", "raas"} - ({"raas"} if policy in served_by else set()) - \
                ({"trainer"} if policy in trained_by else set())
            missing = needs - served.get(policy, set())
            if missing:
                raise TopologyError(t.source, "regions.*.pools",
                                    f"policy {policy!r} of {job_file} has no {' and no '.join(sorted(missing))} pool")
    for policy, n in nodes.items():
        if n > task_partitions:
            raise TopologyError(t.source, "regions.*.pools.*.max",
                                f"the RaaS pools may run {n} nodes but tasks.{policy} has {task_partitions} "
                                f"partitions (kafka.task_partitions in {job_file}); nodes beyond that get no tasks. "
                                f"Raise kafka.task_partitions or lower the pools' max")


def pools(t: Topology):
    """``(region, pool name, pool)`` of every pool, in file order."""
    for rname, region in t.regions.items():
        for pname, pool in region.pools.items():
            yield rname, pname, pool


def _check_names(t: Topology) -> None:
    """Region, host and pool names become node ids, log and trace file names; policies topic names."""
    for rname, region in t.regions.items():
        named = [(f"regions.{rname}", rname), *((f"regions.{rname}.hosts.{h}", h) for h in region.hosts),
                 *((f"regions.{rname}.pools.{p}", p) for p in region.pools),
                 *((f"regions.{rname}.pools.{p}.policy", pool.policy) for p, pool in region.pools.items()
                   if pool.policy is not None)]
        for key, name in named:
            problem = check_name(name)
            if problem:
                raise TopologyError(t.source, key, problem)


def _unique_names(t: Topology) -> None:
    seen: dict[str, str] = {}
    for rname, region in t.regions.items():
        for h in region.hosts:
            if h in seen:
                raise TopologyError(t.source, f"regions.{rname}.hosts.{h}",
                                    f"host {h!r} is also in region {seen[h]}; a host belongs to one region")
            seen[h] = rname
    seen = {}
    for rname, pname, _ in pools(t):
        if pname in seen:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}",
                                f"pool {pname!r} is also in region {seen[pname]}; pool names are unique "
                                f"(node ids are <pool>-<i>)")
        seen[pname] = rname


def _check_kafka(t: Topology, rname: str) -> None:
    kafka, key = t.regions[rname].kafka.strip(), f"regions.{rname}.kafka"
    sec = t.regions[rname].kafka_security
    if sec is not None:
        if kafka == EMBEDDED or kafka.startswith(REGION_REF):
            raise TopologyError(t.source, f"regions.{rname}.kafka_security",
                                f"set, but kafka is {kafka!r}: it describes an existing cluster named by bootstrap "
                                f"servers (an embedded broker is set by the job's kafka.security; a region:<name> "
                                f"reference by that region's kafka_security)")
        _check_security(t.source, f"regions.{rname}.kafka_security", sec)
    if kafka == EMBEDDED:
        return
    if kafka.startswith(REGION_REF):
        other = kafka[len(REGION_REF):].strip()
        if other not in t.regions:
            raise TopologyError(t.source, key, f"names region {other!r}, which the topology does not have "
                                               f"(regions: {', '.join(t.regions)})")
        if other == rname:
            raise TopologyError(t.source, key, "names its own region; use 'embedded' or bootstrap servers")
        if t.regions[other].kafka.strip().startswith(REGION_REF):
            raise TopologyError(t.source, key, f"names region {other!r}, whose kafka is itself a reference; name "
                                               f"the region that declares the cluster")
        return
    try:
        parse_bootstrap(kafka, "bootstrap servers")
    except BadBootstrapServers as e:
        raise TopologyError(t.source, key, f"{kafka!r} is neither 'embedded', 'region:<name>' nor bootstrap "
                                           f"servers host:port[,host:port] ({e})") from None


def _check_security(f: str, key: str, sec) -> None:
    """The shape of a cluster's ``kafka_security`` (its files and variables are read where it is used)."""
    bad = sec.problem()
    if bad is not None:
        raise TopologyError(f, f"{key}.{bad[0]}", bad[1])


def _check_pool(f: str, key: str, pool) -> None:
    c = pool.component
    if c != "raas":
        for k in ("min", "max"):
            if getattr(pool, k) is not None:
                raise TopologyError(f, f"{key}.{k}", f"only RaaS pools are elastic; a {c} pool has a fixed count")
    if c == "dataflow" and (pool.count != 1 or len(pool.hosts) != 1):
        raise TopologyError(f, f"{key}.count", f"a job has one dataflow: count 1 on one host "
                                               f"(got count {pool.count} on {len(pool.hosts)} host(s))")
    if c == "trainer":
        if pool.count != len(pool.hosts):
            raise TopologyError(f, f"{key}.count", f"a trainer runs one group agent per host: count must equal the "
                                                   f"number of hosts ({len(pool.hosts)}), got {pool.count}")
        if len(set(pool.hosts)) != len(pool.hosts):
            raise TopologyError(f, f"{key}.hosts", "a host is named twice; one trainer agent per host")
        if len(pool.hosts) > 1 and not pool.master_port:
            raise TopologyError(f, f"{key}.master_port", f"a trainer on {len(pool.hosts)} hosts needs the port "
                                                         f"host 0's agent listens on for the others")
    if c == "raas":
        if pool.hi < 1:
            raise TopologyError(f, f"{key}.max", f"a RaaS pool needs max >= 1, got {pool.hi}")
        if not pool.lo <= pool.count <= pool.hi:
            raise TopologyError(f, f"{key}.count", f"must lie within min..max ({pool.lo}..{pool.hi}), "
                                                   f"got {pool.count}")
        if pool.lo < 0:
            raise TopologyError(f, f"{key}.min", f"must be >= 0, got {pool.lo}")


def _check_components(t: Topology) -> None:
    kinds = Counter(p.component for _, _, p in pools(t))
    if kinds["dataflow"] != 1:
        raise TopologyError(t.source, "regions.*.pools", f"a job has exactly one dataflow pool, found "
                                                          f"{kinds['dataflow']}")
    trainers: dict[str | None, str] = {}
    for rname, pname, p in pools(t):
        if p.component == "trainer":
            if p.policy in trainers:
                raise TopologyError(t.source, f"regions.{rname}.pools.{pname}",
                                    f"policy {p.policy or '(the job policy)'} already has trainer pool "
                                    f"{trainers[p.policy]}; one trainer per policy")
            trainers[p.policy] = pname
    if not trainers:
        raise TopologyError(t.source, "regions.*.pools", "no trainer pool")
    for policy, trainer in trainers.items():
        raas = [p for _, _, p in pools(t) if p.component == "raas" and p.policy == policy]
        if not raas and policy is None:
            raise TopologyError(t.source, "regions.*.pools", f"policy {policy or '(the job policy)'} has trainer "
                                                              f"pool {trainer} but no RaaS pool")
        # A named policy without a RaaS pool may have its rows served by another policy's pool
        # (a shared pool of LoRA adapters: the job's rollout.pool); validate_for_job decides.
        if raas and sum(p.lo for p in raas) < 1:
            raise TopologyError(t.source, "regions.*.pools.*.min",
                                f"the RaaS pools of policy {policy or '(the job policy)'} may shrink to 0 nodes; "
                                f"at least one pool needs min >= 1")
    for rname, pname, p in pools(t):
        # (a named policy may be trained in another policy's trainer process: the job's
        # trainer.process; validate_for_job decides)
        if p.component == "raas" and p.policy not in trainers and (p.policy is None or None in trainers):
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}.policy",
                                f"no trainer pool trains policy {p.policy or '(the job policy)'}")


def cluster_key(t: Topology, rname: str) -> str:
    """Which cluster a region uses: ``embedded:<declaring region>`` or its sorted bootstrap servers."""
    k = t.regions[rname].kafka.strip()
    owner = k[len(REGION_REF):].strip() if k.startswith(REGION_REF) else rname
    k = t.regions[owner].kafka.strip()
    return f"{EMBEDDED}:{owner}" if k == EMBEDDED else ",".join(sorted(s.strip() for s in k.split(",")))


def _check_home_cluster(t: Topology) -> None:
    """With several clusters only weights and versions are mirrored, home -> a region's own cluster
    (docs/cross_region_mirror.md): the trainers run on the dataflow's cluster, and a region with a
    cluster of its own holds RaaS pools only."""
    dataflow = next(r for r, _, p in pools(t) if p.component == "dataflow")
    home = cluster_key(t, dataflow)
    for rname, pname, p in pools(t):
        if p.component != "raas" and cluster_key(t, rname) != home:
            raise TopologyError(t.source, f"regions.{rname}.pools.{pname}",
                                f"a {p.component} runs on the home cluster, the one of the dataflow's region "
                                f"{dataflow}; region {rname} has a cluster of its own (kafka: "
                                f"{t.regions[rname].kafka.strip()}), which receives only weights and versions from "
                                f"home. Put the pool in a region of the home cluster, or give {rname} "
                                f"'kafka: region:{dataflow}'")


def _check_links(t: Topology) -> None:
    seen = set()
    for i, link in enumerate(t.links):
        key = f"links[{i}].between"
        for r in link.between:
            if r not in t.regions:
                raise TopologyError(t.source, key, f"unknown region {r!r} (regions: {', '.join(t.regions)})")
        if link.between[0] == link.between[1]:
            raise TopologyError(t.source, key, "a link joins two different regions")
        pair = frozenset(link.between)
        if pair in seen:
            raise TopologyError(t.source, key, f"a second link between {' and '.join(sorted(pair))}")
        seen.add(pair)


def _check_autoscaler(t: Topology) -> None:
    a = t.autoscaler
    hosts = {h: r for r, region in t.regions.items() for h in region.hosts}
    if a.host is not None and a.host not in hosts:
        raise TopologyError(t.source, "autoscaler.host", f"unknown host {a.host!r} (hosts: {', '.join(hosts)})")
    if a.backend == "command":
        _check_templates(t)
    if not a.enabled:
        return
    if not any(p.component == "raas" and p.elastic for _, _, p in pools(t)):
        raise TopologyError(t.source, "autoscaler.enabled", "no RaaS pool is elastic (min < max); nothing to scale")


def local_backend_misplaced(t: Topology) -> tuple[str, str, str] | None:
    """``(key, pool, host)`` of an elastic pool the local backend cannot reach on a real deployment.

    The local backend starts processes on the autoscaler's own host: fine for ``astraflow
    launch`` (every host is this machine), not for ``astraflow node --topology`` on
    several hosts.
    """
    if not t.autoscaler.enabled or t.autoscaler.backend != "local":
        return None
    home = autoscaler_host(t)
    for r, n, p in pools(t):
        if p.component == "raas" and p.elastic:
            away = [h for h in p.hosts if h != home]
            if away:
                return f"regions.{r}.pools.{n}.hosts", n, away[0]
    return None


def autoscaler_host(t: Topology) -> str:
    if t.autoscaler.host:
        return t.autoscaler.host
    return next(p.hosts[0] for _, _, p in pools(t) if p.component == "trainer")


_PLACEHOLDERS = {"cmd", "node_id", "pool", "policy", "host", "address", "region", "job"}


def _check_templates(t: Topology) -> None:
    for which in ("start", "stop"):
        template = getattr(t.autoscaler.command, which)
        key = f"autoscaler.command.{which}"
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as e:
            raise TopologyError(t.source, key, f"not a valid template: {e}") from None
        unknown = names - _PLACEHOLDERS
        if unknown:
            raise TopologyError(t.source, key, f"unknown placeholder {{{sorted(unknown)[0]}}} (known: "
                                               f"{', '.join('{' + p + '}' for p in sorted(_PLACEHOLDERS))})")
        if which == "start" and "cmd" not in names:
            raise TopologyError(t.source, key, "the start template must run {cmd}, the node's command line")
        if which == "stop" and not names & {"node_id", "cmd"}:
            raise TopologyError(t.source, key, "the stop template must name the node ({node_id})")
