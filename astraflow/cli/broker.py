"""``astraflow broker | kafka | topics | roundtrip``: the Kafka side of the command line.

``broker`` starts, stops and reports the detached embedded broker
(:mod:`astraflow.topics.detached` does it; this module checks the flags and prints);
``kafka`` runs one of Kafka's own tools from the project's jars; ``topics`` creates a job's
topics; ``roundtrip`` is a quick check of a cluster. Handlers import what they run when they
run: ``astraflow.topics`` loads kafka-python (about a second), which ``--help`` and the other
commands should not pay.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import UsageError, name

__all__ = ["add_parsers"]


def _cmd_broker(args: argparse.Namespace) -> int:
    from astraflow.topics import detached  # lazy: kafka-python, see the module docstring
    from astraflow.topics.broker import state_file
    from astraflow.topics.runtime import libs_dir

    if args.action == "fetch":
        print(f"Kafka jars: {libs_dir()}")
        return 0
    state_path = Path(args.state_dir) / "state.json" if args.state_dir else state_file()
    state = detached.read_state(state_path)
    nodes = state.nodes if state else []
    alive = detached.alive(nodes)
    if args.action == "status":
        if not alive:
            print("broker: not running" + (f" (stale state {state_path})" if state else ""))
            return 1
        down = [n for n in nodes if n not in alive]
        print(f"broker: running bootstrap={state.bootstrap_servers}"
              + (f" ({len(down)} of {len(nodes)} nodes down)" if down else ""))
        _print_nodes(nodes, alive)
        return 0 if not down else 1
    if args.action == "stop":
        if not alive:
            print("broker: not running")
            state_path.unlink(missing_ok=True)
            return 0
        detached.stop(state_path, alive)
        print(f"broker: stopped pid={','.join(str(n['pid']) for n in alive)} "
              f"(data kept in {', '.join(n['data_dir'] for n in nodes)})")
        return 0
    if alive:
        print(f"broker: already running at {state.bootstrap_servers} (pid {alive[0]['pid']})")
        return 0
    return _start(args, state_path)


def _start(args: argparse.Namespace, state_path: Path) -> int:
    from astraflow.topics import detached
    if args.nodes < 1:
        raise UsageError(f"--nodes must be >= 1, got {args.nodes}")
    if args.secure and args.nodes != 1:
        raise UsageError("--secure starts a lone node; drop --nodes")
    data_dir = Path(args.data_dir or state_path.parent / "data")
    try:
        started = detached.start(state_path, data_dir, nodes=args.nodes, port=args.port,
                                 controller_port=args.controller_port, heap=args.heap, secure=args.secure)
    except detached.DataDirConflict as e:
        advice = (f"give its --nodes or another --data-dir" if e.held == "multi-node cluster" else
                  f"{'drop' if args.secure else 'add'} --secure or give another --data-dir")
        raise UsageError(f"{e}; {advice}") from None
    nodes, bootstrap = started.nodes, started.bootstrap_servers
    if len(nodes) > 1:
        print(f"broker: started a {len(nodes)}-node cluster bootstrap={bootstrap} data_dir={data_dir}")
        _print_nodes(nodes, nodes)
        return 0
    n = nodes[0]
    print(f"broker: started pid={n['pid']} bootstrap={bootstrap} controller_port={n['controller_port']} "
          f"data_dir={n['data_dir']} log={n['log_path']}")
    if started.secure is not None:
        d = started.secure
        print(f"broker: secured: SASL_SSL {d['sasl_mechanism']}, ACLs enforced; super user {d['super_user']} "
              f"(password in {d['password_file']}), CA {d['ca_file']}, Kafka tools: --command-config "
              f"{d['command_config']}\nclients as the super user:\n  export "
              + " ".join(f"ASTRAFLOW_KAFKA_{k}={v}" for k, v in (
                  ("SECURITY_PROTOCOL", "SASL_SSL"), ("SASL_MECHANISM", d["sasl_mechanism"]),
                  ("USERNAME", d["super_user"]), ("PASSWORD_FILE", d["password_file"]),
                  ("CA_FILE", d["ca_file"]))))
        print(f"broker: mutual-TLS listener {d['mtls_bootstrap_servers']}: a client certificate of that CA is "
              f"required and its CN is the principal (astraflow.topics.secured.SecureSetup.client_certificate "
              f"issues one)")
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
        raise UsageError(f"unknown tool {args.tool!r}; known: {', '.join(sorted(TOOLS))}")
    return subprocess.call(java_command(TOOLS[args.tool], args.args))


def _cmd_topics(args: argparse.Namespace) -> int:
    from astraflow.topics import JobTopics, ensure_topics
    topics = JobTopics(job=args.job, policies=tuple(args.policy or ["policy"]))
    created = ensure_topics(args.bootstrap_servers, topics.specs())
    for s in topics.specs():
        mark = "created" if s.name in created else "verified"
        print(f"{mark:8} {s.name:40} partitions={s.partitions} cleanup={s.cleanup_policy}")
    return 0


def _cmd_roundtrip(args: argparse.Namespace) -> int:
    from astraflow.examples.topics_demo import run
    return run(args.bootstrap_servers)


def add_parsers(sub) -> None:
    """Add ``broker``, ``kafka``, ``topics`` and ``roundtrip`` to the CLI's subcommands."""
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

    kt = sub.add_parser("kafka", help="run one of Kafka's own tools (kafka-topics, kafka-consumer-groups, "
                                      "kafka-console-consumer, kafka-producer-perf-test, ...)")
    kt.add_argument("tool")
    kt.add_argument("args", nargs=argparse.REMAINDER)
    kt.set_defaults(func=_cmd_kafka)

    tp = sub.add_parser("topics", help="create (or verify) a job's topics on a cluster")
    tp.add_argument("--job", required=True, type=name)
    tp.add_argument("--policy", action="append", type=name, help="policy name (repeatable; default: policy)")
    tp.add_argument("--bootstrap-servers", required=True)
    tp.set_defaults(func=_cmd_topics)

    dm = sub.add_parser("roundtrip", help="start a broker, create a job's topics, round-trip typed records "
                                          "(a quick check of Kafka)")
    dm.add_argument("--bootstrap-servers", help="use an existing cluster instead of the embedded broker")
    dm.set_defaults(func=_cmd_roundtrip)
