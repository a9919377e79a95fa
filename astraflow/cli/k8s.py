"""``astraflow k8s render TOPOLOGY JOB``: the Helm chart's values for a job on Kubernetes.

The chart is ``deploy/helm/astraflow``; the values (:mod:`astraflow.k8s_values`) come from a
topology file and a job config. Handlers import the config and topology packages when they run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .args import overrides

__all__ = ["add_parsers"]


def _cmd_k8s(args: argparse.Namespace) -> int:
    import yaml

    from astraflow.k8s_values import render_values  # lazy: see the module docstring
    values = render_values(args.topology, args.job, overrides(args.set), image=args.image, strimzi=args.strimzi)

    class Dumper(yaml.SafeDumper):  # the job config as a block, as it reads in its own file
        pass

    Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                                  style="|" if "\n" in v else None))
    text = (f"# Values of deploy/helm/astraflow for {args.job} on {args.topology} (astraflow k8s render).\n"
            "# Secrets: fill secrets.env at install (helm install ... --set secrets.env.NAME=...).\n"
            + yaml.dump(values, Dumper=Dumper, sort_keys=False, width=100))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}; install with: helm install RELEASE deploy/helm/astraflow -f {args.output}",
              file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_parsers(sub) -> None:
    """Add ``k8s`` to the CLI's subcommands."""
    k8 = sub.add_parser("k8s", help="Kubernetes: the Helm chart's values for a job on a topology (render TOPOLOGY JOB)")
    k8.add_argument("action", choices=["render"])
    k8.add_argument("topology", help="the topology file: its pools become the chart's Deployments and StatefulSets")
    k8.add_argument("job", help="the job config (held in a ConfigMap; passwords stay in the Secret)")
    k8.add_argument("-o", "--output", help="write the values here (default: standard output)")
    k8.add_argument("--image", default="astraflow:0.1.0", help="the container image (repository:tag)")
    k8.add_argument("--strimzi", action="store_true", help="a Strimzi-managed Kafka cluster with the job's topics "
                                                           "and users, instead of the topology's cluster")
    k8.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a job-config key (repeatable)")
    k8.set_defaults(func=_cmd_k8s)
