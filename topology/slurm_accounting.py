"""Device-hours from Slurm's own accounting of a run's jobs: its job completion log.

With ``JobCompType=jobcomp/filetxt`` slurmctld appends one line per finished job to
``JobCompLoc``: ``JobId=… Name=… JobState=… StartTime=… EndTime=… ProcCnt=… Tres=…``.
:func:`read_jobcomp` parses those lines; :func:`slurm_device_hours` keeps the jobs named
``<job>.<node_id>`` (as :mod:`.slurm` names them) and adds up, per pool, the hours each held
its allocation — from the scheduler's clock, so boot time, a node's last transaction after
SIGTERM and a job that was killed all count exactly as long as the devices were held —
times the devices one node of the pool holds (a trainer pool: times its hosts; the dataflow:
none, as :mod:`.accounting` counts them), its CPU-hours (``ProcCnt``) and its cost. The totals have
:class:`~.accounting.DeviceHours`' shape, so the two can be compared side by side.

A record of a job still running (``squeue``'s start time, ``EndTime`` now: :mod:`.slurm`) counts
the same way. It knows nothing about the commands that wrote the log, or about Kafka.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from .accounting import pool_totals
from .plan import PoolPlan

__all__ = ["JobcompTail", "pool_of", "read_jobcomp", "slurm_device_hours"]

_PAIR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


class JobcompTail:
    """The records a ``jobcomp/filetxt`` log gained since the last :meth:`read` (a missing file:
    none yet), so a live count reads each line once however long the log grows."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.offset, self.partial = Path(path), 0, b""

    def read(self) -> list[dict[str, str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")  # (a line being written waits)
        return [dict(_PAIR.findall(line.decode("utf-8", "replace").strip())) for line in lines
                if line.startswith(b"JobId=")]


def read_jobcomp(path: str | Path) -> list[dict[str, str]]:
    """Every record of a ``jobcomp/filetxt`` log, as key -> value."""
    return JobcompTail(path).read()


def pool_of(pools: dict[str, PoolPlan], node_id: str) -> PoolPlan | None:
    """The pool of a node id as the plan names them: ``<pool>-<i>``, or the pool's own name."""
    name, _, index = node_id.rpartition("-")
    if index.isdigit() and name in pools:
        return pools[name]
    return pools.get(node_id)


def _seconds(record: dict[str, str]) -> float:
    try:
        start, end = (datetime.fromisoformat(record[k]) for k in ("StartTime", "EndTime"))
    except (KeyError, ValueError):  # never started ("Unknown", "None")
        return 0.0
    return max(0.0, (end - start).total_seconds())


def slurm_device_hours(records: list[dict[str, str]], pools: dict[str, PoolPlan], job: str) -> dict:
    """Per pool, per device kind and in all, the hours the run's jobs held their allocations:
    ``{pools: {name: {role, kind, node_hours, device_hours, cpu_hours, cost, nodes, jobs}}, kinds,
    rollout, trainer, total, cost, jobs: {job id: {node, state, seconds, cpus}}}``."""
    out: dict[str, dict] = {}
    jobs: dict[str, dict] = {}
    prefix = f"{job}."
    for r in records:
        name = r.get("Name", "")
        if not name.startswith(prefix):
            continue
        node_id = name[len(prefix):]
        pool = pool_of(pools, node_id)
        if pool is None:
            continue
        seconds, cpus = _seconds(r), int(r.get("ProcCnt", "0") or 0)
        jobs[r.get("JobId", "?")] = {"node": node_id, "state": r.get("JobState", ""), "seconds": seconds, "cpus": cpus}
        # (the dataflow holds CPUs, which cpu_hours counts, but no device: as in .accounting)
        devices = 0 if pool.component == "dataflow" else \
            pool.devices_per_node * (len(pool.hosts) if pool.component == "trainer" else 1)
        p = out.setdefault(pool.name, {"role": pool.component, "kind": pool.device_kind, "node_hours": 0.0,
                                       "device_hours": 0.0, "cpu_hours": 0.0, "cost": 0.0, "nodes": set(), "jobs": 0})
        p["nodes"].add(node_id)
        p["jobs"] += 1
        p["node_hours"] += seconds / 3600
        p["device_hours"] += seconds * devices / 3600
        p["cpu_hours"] += seconds * cpus / 3600
        p["cost"] += seconds * devices / 3600 * pool.cost_per_device_hour
    for p in out.values():
        p["nodes"] = len(p["nodes"])
    return {**pool_totals(out), "jobs": jobs}
