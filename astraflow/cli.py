"""astraflow: RL post-training of LLMs as autonomous components that share only Kafka topics.

Each subcommand is a small function; heavy imports (torch, DeepSpeed) happen inside the
commands that need them so that ``astraflow broker status`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from . import __version__
from .errors import FatalError


class InputError(FatalError, ValueError):
    """A command-line argument is unusable; the message names it."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the argument (the usage is one --help away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _name(value: str) -> str:
    """A job, policy or node name from the command line: a safe topic- and path-part."""
    from astraflow.typed_config import check_name
    problem = check_name(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _reachable(servers: str, source: str) -> None:
    """A clear error within the bound instead of a client's 30 s timeout and traceback."""
    from astraflow.topics.bootstrap import wait_reachable
    wait_reachable(servers, source)


def _cmd_broker(args: argparse.Namespace) -> int:
    from astraflow.topics import broker as b
    from astraflow.topics.runtime import libs_dir

    state_path = Path(args.state_dir) / "state.json" if args.state_dir else b.state_file()
    state = json.loads(state_path.read_text()) if state_path.exists() else None
    if state and "nodes" not in state:  # a state file written before clusters existed
        state = {"bootstrap_servers": state["bootstrap_servers"], "nodes": [state]}
    nodes = state["nodes"] if state else []
    alive = [n for n in nodes if b.pid_alive(n["pid"])]
    if args.action == "fetch":
        print(f"Kafka jars: {libs_dir()}")
        return 0
    if args.action == "status":
        if not alive:
            print("broker: not running" + (f" (stale state {state_path})" if state else ""))
            return 1
        down = [n for n in nodes if n not in alive]
        print(f"broker: running bootstrap={state['bootstrap_servers']}"
              + (f" ({len(down)} of {len(nodes)} nodes down)" if down else ""))
        _print_nodes(nodes, alive)
        return 0 if not down else 1
    if args.action == "stop":
        if not alive:
            print("broker: not running")
            state_path.unlink(missing_ok=True)
            return 0
        for n in alive:  # all at once: stopped one by one, the last nodes lose their quorum
            os.kill(n["pid"], signal.SIGTERM)
        deadline = time.monotonic() + 30
        while any(b.pid_alive(n["pid"]) for n in alive) and time.monotonic() < deadline:
            time.sleep(0.2)
        for n in alive:
            if b.pid_alive(n["pid"]):
                os.kill(n["pid"], signal.SIGKILL)
        state_path.unlink(missing_ok=True)
        print(f"broker: stopped pid={','.join(str(n['pid']) for n in alive)} "
              f"(data kept in {', '.join(n['data_dir'] for n in nodes)})")
        return 0
    # start
    if alive:
        print(f"broker: already running at {state['bootstrap_servers']} (pid {alive[0]['pid']})")
        return 0
    if args.nodes < 1:
        raise SystemExit(f"astraflow broker start: --nodes must be >= 1, got {args.nodes}")
    data_dir = Path(args.data_dir or state_path.parent / "data")
    secure = None
    if (data_dir / "secure").exists() != args.secure and (data_dir / "meta").exists():
        raise SystemExit(f"astraflow broker start: {data_dir} holds a {'secured' if not args.secure else 'plaintext'} "
                         f"broker; {'add' if not args.secure else 'drop'} --secure or give another --data-dir")
    if args.secure:
        if args.nodes != 1:
            raise SystemExit("astraflow broker start: --secure starts a lone node; drop --nodes")
        from astraflow.topics.secured import SecureSetup
        secure = SecureSetup.create(data_dir / "secure")
    if args.nodes == 1:
        if (data_dir / "cluster.json").exists():
            raise SystemExit(f"astraflow broker start: {data_dir} holds a multi-node cluster; "
                             f"give its --nodes or another --data-dir")
        broker = b.EmbeddedBroker(data_dir, port=args.port, controller_port=args.controller_port,
                                  heap=args.heap or "1g", detach=True, secure=secure,
                                  startup_timeout=180 if secure else 90).start()
        infos, bootstrap = [broker.info()], broker.bootstrap_servers
    else:
        from astraflow.topics.cluster import EmbeddedCluster
        cluster = EmbeddedCluster(data_dir, nodes=args.nodes, port=args.port, heap=args.heap or "512m",
                                  detach=True).start()
        infos, bootstrap = cluster.info(), cluster.bootstrap_servers
    nodes = [i.__dict__ for i in infos]
    state_path.parent.mkdir(parents=True, exist_ok=True)
    mtls = broker.mtls_bootstrap_servers if secure is not None else None
    state_path.write_text(json.dumps({"bootstrap_servers": bootstrap, "nodes": nodes,
                                      **({"secure": {**secure.describe(), "mtls_bootstrap_servers": mtls}}
                                         if secure else {})}))
    if len(nodes) == 1:
        n = nodes[0]
        print(f"broker: started pid={n['pid']} bootstrap={bootstrap} controller_port={n['controller_port']} "
              f"data_dir={n['data_dir']} log={n['log_path']}")
        if secure is not None:
            d = secure.describe()
            print(f"broker: secured: SASL_SSL {d['sasl_mechanism']}, ACLs enforced; super user {d['super_user']} "
                  f"(password in {d['password_file']}), CA {d['ca_file']}, Kafka tools: --command-config "
                  f"{d['command_config']}\nclients as the super user:\n  export "
                  + " ".join(f"ASTRAFLOW_KAFKA_{k}={v}" for k, v in (
                      ("SECURITY_PROTOCOL", "SASL_SSL"), ("SASL_MECHANISM", d["sasl_mechanism"]),
                      ("USERNAME", d["super_user"]), ("PASSWORD_FILE", d["password_file"]),
                      ("CA_FILE", d["ca_file"]))))
            print(f"broker: mutual-TLS listener {mtls}: a client certificate of that CA is required and its CN is "
                  f"the principal (astraflow.topics.secured.SecureSetup.client_certificate issues one)")
    else:
        print(f"broker: started a {len(nodes)}-node cluster bootstrap={bootstrap} data_dir={data_dir}")
        _print_nodes(nodes, nodes)
    return 0


def _print_nodes(nodes: list[dict], alive: list[dict]) -> None:
    for i, n in enumerate(nodes, 1):
        mark = "up" if n in alive else "down"
        print(f"  node {i} {mark}: pid={n['pid']} port={n['port']} controller_port={n['controller_port']} "
              f"data_dir={n['data_dir']} log={n['log_path']}")


def _cmd_kafka(args: argparse.Namespace) -> int:
    """Run one of Kafka's own tools from the project's jars, streaming its output."""
    import subprocess

    from astraflow.topics.runtime import TOOLS, java_command
    if args.tool not in TOOLS:
        print(f"unknown tool {args.tool!r}; known: {', '.join(sorted(TOOLS))}", file=sys.stderr)
        return 2
    return subprocess.call(java_command(TOOLS[args.tool], args.args))


def _cmd_topics(args: argparse.Namespace) -> int:
    from astraflow.topics import JobTopics, ensure_topics
    topics = JobTopics(job=args.job, policies=tuple(args.policy or ["policy"]))
    created = ensure_topics(args.bootstrap_servers, topics.specs())
    for s in topics.specs():
        mark = "created" if s.name in created else "verified"
        print(f"{mark:8} {s.name:40} partitions={s.partitions} cleanup={s.cleanup_policy}")
    return 0


def _acl_users(cfg, policies: tuple[str, ...], pairs: list[str]) -> dict[str, str]:
    """Principal key (``<role>`` or ``<role>.<policy>``) -> user: the config's principals
    (a ``<role>`` that every policy's ``<role>.<policy>`` replaces is left out), else
    ``af-<role>``; then ``--principal`` pairs."""
    from astraflow.config import POLICY_ROLES, PRINCIPAL_ROLES
    sec = cfg.kafka.security if cfg else None
    users = {}
    for r in PRINCIPAL_ROLES:
        per_policy = {p: sec.username_of(r, p) for p in policies
                      if sec and r in POLICY_ROLES and sec.principal_key(r, p) == f"{r}.{p}"}
        users.update({f"{r}.{p}": u for p, u in per_policy.items()})
        if len(per_policy) < len(policies) or r not in POLICY_ROLES:
            users[r] = (sec.username_of(r) if sec else None) or f"af-{r}"
    for pair in pairs or []:
        key, _, user = pair.partition("=")
        role, _, policy = key.partition(".")
        if (role not in PRINCIPAL_ROLES or not user or (policy and (role not in POLICY_ROLES
                                                                    or policy not in policies))):
            raise SystemExit(f"astraflow acl: --principal {pair!r}: expected ROLE=USER or ROLE.POLICY=USER, ROLE "
                             f"one of {', '.join(PRINCIPAL_ROLES)} (per policy: {', '.join(POLICY_ROLES)}), POLICY "
                             f"one of {', '.join(policies)}")
        users[key] = user
    return users


def _mirror_acl(args: argparse.Namespace, cfg, topics) -> int:
    """``acl plan|apply --topology T --config C --region R``: the ACLs of region R's mirror
    principal (``regions.R.kafka_security.username``, or ``--principal mirror=USER``) on R's
    own cluster, where MirrorMaker 2 writes the job's weights (a region that shares another's
    cluster: that cluster and its one mirror, named after the region that declares it)."""
    from astraflow.topics.acls import apply, format_plan, mirror_plan
    from astraflow.topology.launch import load_plan
    from astraflow.topology.job_mirror import claim_group
    from astraflow.topology.plan import region_clusters
    from astraflow.topology.regional import HOME_ALIAS
    if not args.topology or cfg is None:
        raise SystemExit("astraflow acl --region: give --topology and --config (the region's cluster and the job)")
    plan = load_plan(args.topology, cfg)
    own = region_clusters(plan)
    if args.region not in own:
        raise SystemExit(f"astraflow acl --region {args.region}: not a region with a cluster of its own in "
                         f"{args.topology} (regions with one: {', '.join(own) or 'none'})")
    cluster = own[args.region]
    given = dict(p.partition("=")[::2] for p in args.principal or [])
    user = given.pop("mirror", None) or (cluster.security.username if cluster.security else None)
    if given or not user:
        raise SystemExit(f"astraflow acl --region {args.region}: the mirror's user is "
                         f"regions.{cluster.declared_by}.kafka_security.username or --principal mirror=USER"
                         + (f" (other principals are not planned with --region: {', '.join(given)})" if given else ""))
    entries = mirror_plan(topics, user, source_alias=HOME_ALIAS, claim_group=claim_group(topics.job))
    if args.action == "plan":
        print(format_plan(entries))
        return 0
    bootstrap = args.bootstrap_servers or (None if cluster.embedded else cluster.name)
    if not bootstrap:
        raise SystemExit(f"astraflow acl apply --region {args.region}: its cluster is embedded; give "
                         f"--bootstrap-servers")
    n = apply(bootstrap, entries)
    print(f"acl: {n} ACLs in force for mirror principal {user!r} of region {args.region} (job {topics.job}) on "
          f"{bootstrap}")
    return 0


def _cmd_acl(args: argparse.Namespace) -> int:
    """Plan (print) or apply a job's ACLs; ``apply`` runs as the environment's client (the
    super user's ``ASTRAFLOW_KAFKA_*``), never as one of the job's own principals."""
    from astraflow.config import load_config
    from astraflow.topics import JobTopics, job_topics
    from astraflow.topics.acls import apply, format_plan, plan, principals_of
    cfg = load_config(args.config, _overrides(args.set)) if args.config else None
    if cfg is None and not args.job:
        raise SystemExit("astraflow acl: give --config (or --job and --policy)")
    if args.topology and cfg is None:
        raise SystemExit("astraflow acl --topology: give --config too (the job whose topics and principals it runs)")
    topics = job_topics(cfg) if cfg else JobTopics(job=args.job, policies=tuple(args.policy or ["policy"]))
    if args.region:
        return _mirror_acl(args, cfg, topics)
    users = _acl_users(cfg, topics.policies, args.principal)
    serves: dict[str, tuple[str, ...]] = {}
    if args.topology:  # only the principals the topology's pools run (and the launcher's admin)
        from astraflow.topology.launch import load_plan
        pools = load_plan(args.topology, cfg).pools.values()
        running = {("admin", None)} | {(p.component, None if p.component == "dataflow" else p.policy or cfg.policy)
                                       for p in pools}
        try:
            users = principals_of(sorted(running, key=str), users)
        except ValueError as e:
            raise SystemExit(f"astraflow acl --topology {args.topology}: {e}") from None
        # A plain raas/trainer principal gets the policies its pools serve here, not every policy.
        for role, policy in running:
            if policy is not None and f"{role}.{policy}" not in users and role in users:
                serves[role] = tuple(sorted({*serves.get(role, ()), policy}))
        for role, served in sorted(serves.items()):
            if len(served) > 1:
                print(f"astraflow acl: warning: principal {role!r} (user {users[role]!r}) serves policies "
                      f"{', '.join(served)} of topology {args.topology} under one login: a node of any of them "
                      f"(any region) holds every one's rights; name one principal per policy "
                      f"({', '.join(f'kafka.security.principals.{role}.{p}' for p in served)})", file=sys.stderr)
    try:
        entries = plan(topics, users, serves)
    except ValueError as e:
        raise SystemExit(f"astraflow acl: {e}") from None
    if args.action == "plan":
        print(format_plan(entries))
        return 0
    bootstrap = args.bootstrap_servers or (cfg.kafka.bootstrap_servers if cfg else None)
    if not bootstrap:
        raise SystemExit("astraflow acl apply: give --bootstrap-servers (or kafka.bootstrap_servers in the config)")
    if args.users:
        if cfg is None:
            raise SystemExit("astraflow acl apply --users: give --config (the principals' password files)")
        from astraflow.topics.secured import add_users
        sec, passwords = cfg.kafka.security, {}
        for key in users:
            role, _, policy = key.partition(".")
            if sec.username_of(role, policy or None) == users[key]:  # configured, so its password is too
                passwords[users[key]] = sec.client(role, cfg.config_dir, cfg.source, policy=policy or None).password
        add_users(bootstrap, passwords)
    n = apply(bootstrap, entries)
    print(f"acl: {n} ACLs in force for {len(set(users.values()))} principals of job {topics.job} on {bootstrap}")
    return 0


def _cmd_roundtrip(args: argparse.Namespace) -> int:
    from astraflow.examples.topics_demo import run
    return run(args.bootstrap_servers)


def _overrides(pairs: list[str] | None) -> dict:
    import yaml
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise InputError(f"--set {pair}: the value is not YAML ({getattr(e, 'problem', None) or e})") from None
        # YAML 1.1 reads 1e-3 (no dot) as a string; on the command line it means a number.
        out[key] = float(parsed) if isinstance(parsed, str) and _SCIENTIFIC.fullmatch(parsed) else parsed
    return out


_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def done_line(summary: dict, lead: str) -> str:
    """The run's last word on what it learnt: held-out accuracy from -> to. For a team: the
    team's first (the job's result), the lead policy's alone beside it, then every policy's
    mean role reward in the held-out team evaluation (what each policy contributes, the
    lead's included), each from its first to its last measured version; then the
    conservation audit's verdict, when the run audited."""
    fmt = lambda curve: " -> ".join(f"v{v}:{a:.3f}" for v, a in curve.items()) or "not measured"  # noqa: E731
    head = f"done: {summary['steps_trained']} versions in {summary['wall_s']:.0f}s; held-out accuracy"
    team = summary.get("team_accuracy_by_version")
    if team is None:
        line = f"{head} {fmt(summary['accuracy_by_version'])}"
    else:
        line = (f"{head} of the team {fmt(_ends(team))}; of {lead} alone "
                f"{fmt(_ends(summary['accuracy_by_version']))}")
        roles = summary.get("policy_reward_by_version") or {}
        if roles:
            line += "; held-out role reward " + ", ".join(f"of {p} {fmt(_ends(curve))}" for p, curve in roles.items())
    return _with_audit(line, summary)


def _ends(curve: dict) -> dict:
    """The first and the last point of a curve keyed by version (as ints or their strings)."""
    if len(curve) <= 2:
        return dict(curve)
    keys = sorted(curve, key=int)
    return {keys[0]: curve[keys[0]], keys[-1]: curve[keys[-1]]}


def _with_audit(line: str, summary: dict) -> str:
    from astraflow.job_audit import audit_line
    verdict = audit_line(summary)
    return f"{line}; {verdict}" if verdict else line


def _audit_exit(summary: dict) -> int:
    """A finished run whose audit failed exits non-zero, the cause as its last line."""
    if summary.get("audit", {}).get("ok") is False:
        from astraflow.job_audit import AuditFailed, Verdict
        a = summary["audit"]
        failed = [d for d in a.get("during", []) if not d["ok"]] or [a["final"]]
        raise AuditFailed(Verdict.from_dict(failed[0]))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from astraflow.config import load_config
    from astraflow.launcher import run_job
    cfg = load_config(args.config, _overrides(args.set))
    if not args.bootstrap_servers and cfg.kafka.bootstrap_servers:
        _reachable(cfg.kafka.bootstrap_servers, f"kafka.bootstrap_servers of {args.config}")
    summary = run_job(cfg, bootstrap=args.bootstrap_servers or cfg.kafka.bootstrap_servers,
                      overrides=args.set or [], run_dir=args.run_dir, progress=not args.quiet,
                      dashboard=args.dashboard)
    if summary["interrupted"]:
        print(f"interrupted after {summary['steps_trained']} versions; everything stopped. "
              f"run dir: {summary['run_dir']}")
        return 130
    print(done_line(summary, cfg.lead_policy))
    for component, d in summary.get("emulated", {}).items():
        calls = ", ".join(f"{call} {s.get('modelled_s', 0):.1f} s (CPU {100 * s.get('cpu_fraction', 0):.0f}% of holds)"
                          for call, s in d.items() if isinstance(s, dict))
        print(f"EMULATED {component} on {d['profile']} x{d['devices']:g}: modelled {calls}")
    for policy, path in summary.get("models", {}).items():
        print(f"trained model ({policy}, Hugging Face): {path}")
    print(f"run dir: {summary['run_dir']}")
    return _audit_exit(summary)


def _cmd_node(args: argparse.Namespace) -> int:
    from astraflow.topology.processes import watch_launcher
    from astraflow.trainer_group import FlagError, is_rank_process
    if not is_rank_process():  # first thing: a launcher may die while this one still imports (a rank watches its agent)
        watch_launcher(args.node_id or f"node-{os.getpid()}")
    from astraflow.config import install_security, load_config
    from astraflow.node import run_node
    cfg = load_config(args.config, _overrides(args.set))
    # (run_node installs its role's again; a trainer group's agent and a host's launcher need one first)
    install_security(cfg, args.role if args.role in ("raas", "trainer", "dataflow") else "admin", args.policy)
    if args.topology or args.host:
        if not (args.topology and args.host):
            raise FlagError("--topology and --host go together: the file, and which of its hosts this is")
        placed = [f for f in ("role", "node_id", "nnodes", "node_rank", "master_addr", "master_port")
                  if getattr(args, f) is not None]
        if placed:
            raise FlagError(f"--{placed[0].replace('_', '-')} places one node; with --topology the file places "
                            f"every node of --host {args.host}")
        from astraflow.topology.launch import run_host
        return run_host(args.topology, cfg, args.host, bootstrap=args.bootstrap_servers,
                        run_dir=args.run_dir or str(Path(cfg.run_dir) / cfg.job), overrides=args.set or [])
    if args.role is None:
        raise FlagError("--role is required (or --topology FILE --host NAME to start a host's share of a topology)")
    if args.policy is not None:
        if args.policy not in cfg.policy_names:
            raise FlagError(f"--policy {args.policy}: no such policy in {args.config} "
                            f"(policies: {', '.join(cfg.policy_names)})")
        cfg = cfg.view(args.policy)
    elif len(cfg.policy_names) > 1 and args.role != "dataflow":
        raise FlagError(f"--role {args.role} serves one policy: give --policy (one of {', '.join(cfg.policy_names)})")
    bootstrap = args.bootstrap_servers or cfg.kafka.bootstrap_servers
    if not bootstrap:
        raise SystemExit("astraflow node: --bootstrap-servers is required (or kafka.bootstrap_servers in the config)")
    run_dir = args.run_dir or str(Path(cfg.run_dir) / cfg.job)
    group = {"nnodes": args.nnodes, "node_rank": args.node_rank, "master_addr": args.master_addr,
             "master_port": args.master_port}
    given = {k: v for k, v in group.items() if v is not None}
    reach = lambda: _reachable(bootstrap, "--bootstrap-servers" if args.bootstrap_servers  # noqa: E731
                               else f"kafka.bootstrap_servers of {args.config}")  # the flags first, then the cluster
    if args.role != "trainer":
        if given:
            from astraflow.trainer_group import FlagError
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise FlagError(f"{flags} place trainer ranks; --role {args.role} takes none")
        reach()
        return run_node(args.role, cfg, bootstrap, run_dir, args.node_id)
    from astraflow import trainer_group
    topo = trainer_group.Topology(cfg.trainer.ranks, **given)
    reach()
    if topo.world_size > 1 and not trainer_group.is_rank_process():
        return trainer_group.run_trainer_group(cfg, topo, bootstrap=bootstrap, run_dir=run_dir,
                                               node_id=args.node_id or f"trainer-{os.getpid()}",
                                               overrides=args.set or [])
    return run_node(args.role, cfg, bootstrap, run_dir, args.node_id)


def _cmd_mirror(args: argparse.Namespace) -> int:
    from astraflow.config import install_security, load_config
    from astraflow.topology.mirror_run import run_mirror
    cfg = load_config(args.config, _overrides(args.set))
    install_security(cfg, "admin", None)
    return run_mirror(args.topology, cfg, args.region, bootstrap=args.bootstrap_servers,
                      run_dir=args.run_dir or str(Path(cfg.run_dir) / cfg.job))


def _cmd_topology(args: argparse.Namespace) -> int:
    from astraflow.topology.launch import check_topology
    return check_topology(args.file, job=args.job, overrides=_overrides(args.set), as_json=args.json)


def _cmd_launch(args: argparse.Namespace) -> int:
    from astraflow.config import load_config
    from astraflow.launcher import launch
    summary = launch(args.topology, load_config(args.job, _overrides(args.set)), overrides=args.set or [],
                     run_dir=args.run_dir, bootstrap=args.bootstrap_servers, progress=not args.quiet,
                     dashboard=args.dashboard)
    if summary["interrupted"]:
        print(f"interrupted after {summary['steps_trained']} versions; everything stopped. "
              f"run dir: {summary['run_dir']}")
        return 130
    d = summary["device_hours"]
    print(_with_audit(f"done: {summary['steps_trained']} versions in {summary['wall_s']:.0f}s; device-hours "
                      f"{d['total']:.4f} (rollout {d['rollout']:.4f}, trainer {d['trainer']:.4f}), "
                      f"cost {d['cost']:.4f}", summary))
    print(f"run dir: {summary['run_dir']}")
    return _audit_exit(summary)


def _cmd_status(args: argparse.Namespace) -> int:
    from astraflow.status import format_status, job_status
    s = job_status(args.bootstrap_servers, args.job, tuple(args.policy) if args.policy else None)
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 1 if s["state"] == "unknown" else 0


def _cmd_config(args: argparse.Namespace) -> int:
    import dataclasses

    from astraflow.config import describe, load_config
    if args.action == "keys":
        for key, default, help_ in describe():
            print(f"{key:44} {default:14} {help_}")
        return 0
    if not args.config:
        raise SystemExit("astraflow config check: give the config file")
    from astraflow.checks import check_data, check_model
    cfg = load_config(args.config, _overrides(args.set))
    # Inputs too, not just keys: a bad row or a wrong model path is a config error the
    # user wants to see now, not after the job has started.
    data, model = check_data(cfg), check_model(cfg)
    print(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
    print(f"data: {data}\nmodel: {model}\n{args.config}: valid", file=sys.stderr)
    return 0


def _cmd_model(args: argparse.Namespace) -> int:
    from astraflow.models.bootstrap import main as model_main
    return model_main(args.args)


def _cmd_replay(args: argparse.Namespace) -> int:
    import dataclasses

    from astraflow.config import load_config
    from astraflow.replay import WHAT_IF_PREFIXES, RecordError, ReplayRequest, replay
    if not args.config:
        raise RecordError("astraflow replay needs --config: a job's topics record its batches and weights, not its "
                          "config; pass the file `astraflow run` used, with its --set overrides written into it")
    changes = _overrides(args.set)
    for key in changes:
        if not key.startswith(WHAT_IF_PREFIXES):
            allowed = " and ".join(p + "*" for p in WHAT_IF_PREFIXES)
            raise RecordError(f"replay --set {key}: a replay changes only {allowed} keys; the recorded batches "
                              "fix the data, rollout and dataflow")
    job = {"job": args.job, **({"policy": args.policy} if args.policy else {})}
    recorded = dataclasses.replace(load_config(args.config), **job)
    from astraflow.config import install_security
    install_security(recorded, "admin")  # it reads the job's topics as the operator
    summary = replay(ReplayRequest(recorded, dataclasses.replace(load_config(args.config, changes), **job),
                                   args.bootstrap_servers, from_step=args.from_step or 0,
                                   from_checkpoint=Path(args.from_checkpoint) if args.from_checkpoint else None,
                                   to_step=args.to_step, run_dir=Path(args.run_dir) if args.run_dir else None,
                                   evaluate=not args.no_eval))
    print(f"run dir: {summary['run_dir']}")
    div = summary["first_divergence"]
    if summary["mode"] == "what-if":
        acc, rec = summary["accuracy_final"], summary["recorded_accuracy_final"]
        print(f"what-if lineage {summary['lineage']}: {summary['steps_replayed']} steps to v{summary['steps_trained']}"
              + (f"; held-out accuracy {acc:.3f}" if acc is not None else "")
              + (f" (the job recorded {rec:.3f})" if rec is not None else "")
              + (f"; left the recorded lineage at step {div['step']} (v{div['version']})" if div else ""))
        return 0 if summary["reproduced_recorded_history"] else 1
    if div is not None:
        tensors = div.get("tensors")
        print(f"astraflow: replay diverged at step {div['step']} (v{div['version']})"
              + (f", tensor {tensors[0]}" + (f" (+{len(tensors) - 1} more)" if len(tensors) > 1 else "")
                 if tensors else ""), file=sys.stderr)
        return 1
    print(f"bit-exact: {summary['versions_matched']} of {summary['steps_replayed']} replayed versions match the "
          f"recorded weights ({summary['versions_unrecorded']} no longer recorded)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from astraflow.replay import export_trajectories
    if args.model:
        from astraflow.replay.model_export import cli_export_model
        return cli_export_model(args)
    meta = export_trajectories(args.bootstrap_servers, args.job, args.out, policy=args.policy,
                               tokenizer=args.tokenizer)
    print(f"exported {meta['rows']} samples of {meta['groups']} groups ({meta['groups_trained']} trained, "
          f"{meta['groups_dropped']} dropped, {meta['groups_failed']} failed) to {args.out}")
    return 0


def _cmd_track(args: argparse.Namespace) -> int:
    from astraflow.tracking import track_command
    return track_command(args)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from astraflow.dashboard import dashboard_command
    return dashboard_command(args)


def _cmd_env(args: argparse.Namespace) -> int:
    import signal
    import threading

    from astraflow.workflows.http_env import EnvServer
    from astraflow.workflows.api import get_environment
    params = _overrides(args.param)
    if args.module:
        import importlib
        importlib.import_module(args.module)
    try:
        get_environment(args.env)
    except KeyError as e:
        raise InputError(f"astraflow env serve: --env: {e.args[0]}") from None
    server = EnvServer(args.env, params, host=args.host, port=args.port, idle_s=args.idle_s).start()
    print(f"environment {args.env!r} served at {server.address}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    stats = server.stats()
    server.close()
    print(f"stopped: {stats['started']} sessions started, {stats['finished']} finished, "
          f"cancelled {stats['cancelled'] or 0}", flush=True)
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    from astraflow.runs import main as runs_main
    return runs_main(args)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="astraflow", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"astraflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    br = sub.add_parser("broker", help="the embedded Kafka broker (fetch jars, start, stop, status)")
    br.add_argument("action", choices=["fetch", "start", "stop", "status"])
    br.add_argument("--data-dir", help="broker data dir (default: the cache dir's broker/data)")
    br.add_argument("--port", type=int, default=9092, help="client port (0: a free one)")
    br.add_argument("--controller-port", type=int, default=0, help="KRaft controller port (0: a free one)")
    br.add_argument("--nodes", type=int, default=1,
                    help="start: KRaft nodes (broker + controller each); 3 survives the loss of one. "
                         "Client ports are --port, --port+1, ...")
    br.add_argument("--heap", help="JVM max heap per node (default: 1g alone, 512m in a cluster)")
    br.add_argument("--state-dir", help="where the running broker's pid/ports are recorded "
                                        "(default: the cache dir's broker/)")
    br.add_argument("--secure", action="store_true",
                    help="start: SASL_SSL (SCRAM-SHA-512) with a CA made for this data dir, ACLs enforced; prints "
                         "the super user's settings (docs/security.md)")
    br.set_defaults(func=_cmd_broker)

    ac = sub.add_parser("acl", help="least-privilege ACLs of a job's component principals: plan (print) or apply "
                                    "(docs/security.md)")
    ac.add_argument("action", choices=["plan", "apply"])
    ac.add_argument("--config", help="the job config: its topics and kafka.security.principals")
    ac.add_argument("--job", type=_name, help="without --config: the job name")
    ac.add_argument("--policy", action="append", type=_name, help="without --config: policy (repeatable)")
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

    kt = sub.add_parser("kafka", help="run one of Kafka's own tools (kafka-topics, kafka-consumer-groups, "
                                      "kafka-console-consumer, kafka-producer-perf-test, ...)")
    kt.add_argument("tool")
    kt.add_argument("args", nargs=argparse.REMAINDER)
    kt.set_defaults(func=_cmd_kafka)

    tp = sub.add_parser("topics", help="create (or verify) a job's topics on a cluster")
    tp.add_argument("--job", required=True, type=_name)
    tp.add_argument("--policy", action="append", type=_name, help="policy name (repeatable; default: policy)")
    tp.add_argument("--bootstrap-servers", required=True)
    tp.set_defaults(func=_cmd_topics)

    dm = sub.add_parser("roundtrip", help="start a broker, create a job's topics, round-trip typed records (a quick check of Kafka)")
    dm.add_argument("--bootstrap-servers", help="use an existing cluster instead of the embedded broker")
    dm.set_defaults(func=_cmd_roundtrip)

    rn = sub.add_parser("run", help="run a job: broker, dataflow, trainer and RaaS node processes, progress, run dir")
    rn.add_argument("config")
    rn.add_argument("--bootstrap-servers", help="use an existing Kafka cluster (starts no broker)")
    rn.add_argument("--run-dir", help="run directory (default: <run_dir>/<job>-<time>)")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    rn.add_argument("--quiet", action="store_true", help="no progress bar")
    rn.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                    help="serve the job's live dashboard while it runs (on PORT; default: a free port; the URL "
                         "is printed at start)")
    rn.set_defaults(func=_cmd_run)

    nd = sub.add_parser("node", help="run one component against any Kafka cluster (multi-host deployments)")
    nd.add_argument("--role", choices=["dataflow", "raas", "trainer"])
    nd.add_argument("--topology", help="a topology file: start every node it places on --host (and the "
                                       "autoscaler, if it lives there) instead of one --role")
    nd.add_argument("--host", help="with --topology: which of its hosts this is")
    nd.add_argument("--config", required=True)
    nd.add_argument("--bootstrap-servers")
    nd.add_argument("--run-dir", help="checkpoints and traces (default: <run_dir>/<job>)")
    nd.add_argument("--node-id", type=_name, help="stable id (RaaS: its transactional id; default: role-pid)")
    nd.add_argument("--policy", type=_name, help="multi-policy jobs: which policy this trainer / RaaS node serves")
    nd.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    tr = nd.add_argument_group(
        "trainer ranks", "a trainer world of trainer.ranks x --nnodes > 1 makes this process its host's group "
                         "agent: it starts the host's ranks with torch's launcher (node ids <node-id>.rank<R>) "
                         "and exits when any of them fails; restart every host's agent to resume the group "
                         "from its checkpoint, which needs a --run-dir shared by all hosts")
    tr.add_argument("--nnodes", type=int, help="hosts running trainer ranks, one agent each (default 1)")
    tr.add_argument("--node-rank", type=int,
                    help="this host's index, 0..nnodes-1; its ranks are node-rank x trainer.ranks + 0.. (default 0)")
    tr.add_argument("--master-addr", help="host 0's address, reachable from every host (default 127.0.0.1)")
    tr.add_argument("--master-port", type=int,
                    help="host 0's rendezvous port, the same on every host; required with --nnodes > 1 "
                         "(default 0: a free port, one host only)")
    nd.set_defaults(func=_cmd_node)

    mr = sub.add_parser("mirror", help="a region's MirrorMaker 2 on a multi-host deployment: the job's weights and "
                                       "versions from the home cluster into the region's own (existing) cluster, "
                                       "restarted when it dies, until the trainer is done")
    mr.add_argument("--topology", required=True, help="the topology file (the region's kafka: its bootstrap servers)")
    mr.add_argument("--region", required=True, help="the region with a cluster of its own to mirror into")
    mr.add_argument("--config", required=True, help="the job config (its topics)")
    mr.add_argument("--bootstrap-servers", help="the home cluster as this machine reaches it (default: the job's "
                                                "kafka.bootstrap_servers, else the home region's kafka)")
    mr.add_argument("--run-dir", help="MirrorMaker's config and logs under RUN/regions/REGION/mirror "
                                      "(default: <run_dir>/<job>)")
    mr.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    mr.set_defaults(func=_cmd_mirror)

    tg = sub.add_parser("topology", help="validate a topology file and print its resolved plan (check FILE)")
    tg.add_argument("action", choices=["check"])
    tg.add_argument("file")
    tg.add_argument("--job", help="also check it against this job config (policy, task partitions)")
    tg.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    tg.add_argument("--json", action="store_true", help="the plan as JSON")
    tg.set_defaults(func=_cmd_topology)

    la = sub.add_parser("launch", help="run a job on the deployment a topology file describes, every node as a "
                                       "process of this machine (the autoscaler acts when the topology enables it)")
    la.add_argument("topology")
    la.add_argument("job")
    la.add_argument("--bootstrap-servers", help="use an existing Kafka cluster (starts no broker)")
    la.add_argument("--run-dir", help="run directory (default: <run_dir>/<job>-<time>)")
    la.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    la.add_argument("--quiet", action="store_true", help="no progress bar")
    la.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                    help="serve the job's live dashboard while it runs, nodes grouped by region (on PORT; default: "
                         "a free port; the URL is printed at start)")
    la.set_defaults(func=_cmd_launch)

    st = sub.add_parser("status", help="a job's state (running, done, failed, ...), versions per policy, "
                                       "components, task lag and trainer time")
    _source_flags(st)
    st.add_argument("--job", required=True, type=_name)
    st.add_argument("--policy", action="append", type=_name, help="only this policy (repeatable; default: every "
                                                                    "policy of the job)")
    st.add_argument("--json", action="store_true", help="the status as JSON, for scripts")
    st.set_defaults(func=_cmd_status)

    cf = sub.add_parser("config", help="list every job-config key (keys) or validate a config (check CONFIG)")
    cf.add_argument("action", choices=["keys", "check"])
    cf.add_argument("config", nargs="?")
    cf.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    cf.set_defaults(func=_cmd_config)

    md = sub.add_parser("model", help="tiny-model bootstrap (`astraflow model init --help`)")
    md.add_argument("args", nargs=argparse.REMAINDER)
    md.set_defaults(func=_cmd_model)

    rp = sub.add_parser("replay", help="re-train a job from its recorded batches (no rollout): check its weights bit "
                                       "for bit, or with --set a what-if lineage on the same batches")
    rp.add_argument("--job", required=True, type=_name, help="the job whose topics are read (never written)")
    _source_flags(rp, "--recorded-run-dir")
    rp.add_argument("--config", help="the job's config file (required: topics do not record it)")
    rp.add_argument("--policy", type=_name, help="policy to replay (default: the config's)")
    start = rp.add_mutually_exclusive_group()
    start.add_argument("--from-step", type=int, help="branch at step K (steps before it retrain with the recorded "
                                                     "settings, rebuilding the optimizer state exactly)")
    start.add_argument("--from-checkpoint", help="start from a checkpoint of the job (a store with LATEST, or a "
                                                 "step_N directory)")
    rp.add_argument("--to-step", type=int, help="stop at version N (default: every recorded batch)")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="what-if: change a trainer.engine.* (lr, loss, loss_params, kl_coef, grad_clip, ...) or "
                         "eval.* key (repeatable)")
    rp.add_argument("--run-dir", help="the replay's run directory (default: <run_dir>/<job>-replay-<time>)")
    rp.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    rp.set_defaults(func=_cmd_replay)

    ex = sub.add_parser("export", help="a job's recorded trajectories as a Parquet dataset (rewards, versions, "
                                       "behaviour log-probs, batch steps), or with --model a trained version "
                                       "as a Hugging Face model directory")
    ex.add_argument("--job", required=True, type=_name)
    _source_flags(ex)
    ex.add_argument("--out", required=True, help="directory for part-*.parquet and export.json (new or empty), or "
                                                 "with --model for the model (new, or an earlier export to replace)")
    ex.add_argument("--model", action="store_true", help="export a policy version's weights, rebuilt from the "
                                                         "weights topic (snapshot + deltas), as an HF directory")
    ex.add_argument("--version", type=int, help="with --model: the version (default: the newest announced)")
    ex.add_argument("--base-model", help="with --model: the HF dir whose config and tokenizer go with the weights "
                                         "(default: the job's model from --config, else the run dir's own exports)")
    ex.add_argument("--config", help="with --model: the job's config file (names its model)")
    ex.add_argument("--policy", action="append", type=_name, help="policy to export (repeatable; default: all)")
    ex.add_argument("--tokenizer", help="HF tokenizer dir to decode token ids where the record holds no text")
    ex.set_defaults(func=_cmd_export)
    tk = sub.add_parser("track", help="a job's metrics into TensorBoard event files and an MLflow run, read from "
                                      "its metrics topic (for jobs no launcher follows: node --topology)")
    tk.add_argument("--job", type=_name, help="the job (default: --config's)")
    tk.add_argument("--bootstrap-servers", help="the job's Kafka cluster (default: the Kafka log of --run-dir, "
                                                "a finished run's directory)")
    tk.add_argument("--run-dir", metavar="RUN", help="where tensorboard/ and mlruns/ go (default: <run_dir>/<job>, "
                                                     "as astraflow node's)")
    tk.add_argument("--config", help="the job's config: its tracking section and run_dir")
    tk.add_argument("--tensorboard", action="store_true", help="TensorBoard event files (RUN/tensorboard)")
    tk.add_argument("--mlflow", nargs="?", const=True, metavar="URI", help="an MLflow run: a local file store "
                                                                           "RUN/mlruns, or at the tracking URI")
    tk.add_argument("--experiment", help="the MLflow experiment (default: the job name)")
    tk.add_argument("--run-name", help="the MLflow run's name (default: RUN's name)")
    tk.add_argument("--from-now", action="store_true", help="only metrics written from now on (default: the "
                                                            "topic from its beginning)")
    tk.add_argument("--until-idle", type=float, metavar="S", help="also stop after S seconds without a metric")
    tk.add_argument("--settle", type=float, default=60.0, metavar="S",
                    help="once every trainer is done, wait at most S seconds for the final evaluation (default 60)")
    tk.set_defaults(func=_cmd_track)

    db = sub.add_parser("dashboard", help="a live page of a job: reward, held-out accuracy, versions, staleness, "
                                          "trainer wait, the RaaS pool, weights, dead letters (from its topics)")
    db.add_argument("--job", type=_name, help="the job (default: --config's)")
    db.add_argument("--config", help="the job's config (its job name and heartbeat interval)")
    _source_flags(db)
    db.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1; 0.0.0.0 "
                                                        "for every interface)")
    db.add_argument("--port", type=int, default=8050, help="the port to serve on (default 8050; 0: a free one)")
    db.add_argument("--topology", help="the job's topology file: nodes grouped by region, each region's lag")
    db.add_argument("--alive-s", type=float, metavar="S", help="a node whose newest heartbeat is older than S "
                    "seconds shows as gone (default: 3 heartbeat intervals of --config plus 1 s, else 15)")
    db.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the job's "
                                                                         "topics to exist (default: none)")
    db.set_defaults(func=_cmd_dashboard)

    ev = sub.add_parser("env", help="serve a registered environment over HTTP for agent episodes elsewhere "
                                    "(`env serve --env NAME`; the protocol: docs/agentic.md)")
    ev.add_argument("action", choices=["serve"])
    ev.add_argument("--env", required=True, help="the registered environment (e.g. text_game)")
    ev.add_argument("--module", help="a module to import first (one that registers --env)")
    ev.add_argument("--param", action="append", metavar="KEY=VALUE", help="a keyword of the environment's factory "
                                                                          "(YAML value; repeatable)")
    ev.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    ev.add_argument("--port", type=int, default=0, help="the port (default 0: a free one, printed at start)")
    ev.add_argument("--idle-s", type=float, default=300.0, metavar="S", help="cancel a session idle for S "
                                                                             "seconds (default 300)")
    ev.set_defaults(func=_cmd_env)

    ru = sub.add_parser("runs", help="finished run directories: prune (bound the disk they take)")
    ru.add_argument("action", choices=["prune"])
    ru.add_argument("--root", default="runs", help="the directory holding the run dirs (the config's run_dir; "
                                                   "default: runs)")
    which = ru.add_mutually_exclusive_group(required=True)
    which.add_argument("--keep", type=int, metavar="N", help="keep the newest N runs, prune the others")
    which.add_argument("--older-than", metavar="D", help="prune runs older than D (30m, 12h, 7d, 2w)")
    ru.add_argument("--kafka-only", action="store_true", help="remove only their Kafka logs and checkpoints (the "
                                                              "HF model, summary, metrics and plot stay)")
    ru.add_argument("--dry-run", action="store_true", help="print what would be removed")
    ru.set_defaults(func=_cmd_runs)
    from astraflow.chaos_cli import add_parser as add_chaos_parser
    add_chaos_parser(sub)
    return p


def _source_flags(parser: argparse.ArgumentParser, run_flag: str = "--run-dir") -> None:
    """Where a reading command finds the job: a live cluster, or a finished run's directory."""
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--bootstrap-servers", help="a live Kafka cluster (or the path of a run dir, as " + run_flag + ")")
    g.add_argument(run_flag, dest="run_dir_log", metavar="RUN", help="a finished run's directory: its Kafka log is "
                   "opened by a broker started (and stopped) for this command, on a free port (docs/run-dir.md)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from .offline import offline
        with offline(args):  # a run dir's log instead of a live cluster
            if getattr(args, "bootstrap_servers", None) and args.func is not _cmd_node:  # (node: after its flags)
                _reachable(args.bootstrap_servers, "--bootstrap-servers")
            return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a CLI reports errors as one clear line
        from astraflow.errors import EXIT_FATAL, AstraflowError, one_line
        if type(e).__module__.split(".")[0] == "kafka":  # the cluster's answer, not a bug here
            print(f"astraflow: error: Kafka at {getattr(args, 'bootstrap_servers', None) or 'the cluster'}: "
                  f"{type(e).__name__}: {one_line(e)}", file=sys.stderr, flush=True)
            return 1
        if not isinstance(e, AstraflowError):
            raise
        log_path = getattr(e, "log_path", None)
        if log_path:
            print(f"astraflow: {getattr(e, 'node_id', None) or 'job'} stopped; its log: {log_path}", file=sys.stderr)
        # The cause is the last line: that is where a user (and a launcher) looks.
        print(f"astraflow: error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1 if e.retriable else EXIT_FATAL


if __name__ == "__main__":
    sys.exit(main())
