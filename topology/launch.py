"""``astraflow topology check``, ``astraflow launch`` and ``astraflow node --topology``.

``check`` loads a topology (and optionally a job config), resolves its plan and prints it.
``launch`` runs a job on the whole deployment from one machine: the launcher's own run
(:func:`astraflow.launcher.run_job`: broker, topics, progress, restarts, run directory)
with the plan's processes instead of the job config's, and the autoscaler actor beside
them. ``node --topology F --host H`` is one host's share of the same plan on a real
deployment: its nodes as processes, supervised with the launcher's own functions, and
the autoscaler when it lives on this host; a host without a trainer or dataflow stops
when the trainer announces it is done.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from astraflow.config import JobConfig, load_config

from .plan import Plan, check_launchable, format_plan, resolve
from .schema import TopologyError, load_topology
from .validation import local_backend_misplaced, validate_for_job


def load_plan(topology: str | Path, cfg: JobConfig | None = None) -> Plan:
    t = load_topology(topology)
    if cfg is not None:
        validate_for_job(t, cfg.policy, cfg.kafka.task_partitions, cfg.source)
    return resolve(t, cfg.policy if cfg is not None else None)


def check_topology(path: str, *, job: str | None = None, overrides: dict | None = None,
                   as_json: bool = False) -> int:
    cfg = load_config(job, overrides) if job else None
    plan = load_plan(path, cfg)
    print(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))
    if not plan.shared_cluster:
        print(f"warning: {plan.notes[0]}", file=sys.stderr)
    print(f"{path}: valid" + (f" for {job}" if job else ""), file=sys.stderr)
    return 0
