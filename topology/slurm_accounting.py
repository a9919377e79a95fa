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

:func:`slurm_summary` is what a run's ``summary.json`` says under ``slurm``: each node's job ids
and these totals. It knows nothing about Kafka.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from .backends import BackendError
from .plan import Plan
from .slurm import Slurm, SlurmProc

__all__ = ["read_jobcomp", "slurm_device_hours", "slurm_summary"]

_PAIR = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


def read_jobcomp(path: str | Path) -> list[dict[str, str]]:
    """Every record of a ``jobcomp/filetxt`` log, as key -> value (a missing file: none yet)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [dict(_PAIR.findall(line.strip())) for line in text.splitlines() if line.startswith("JobId=")]


def _seconds(record: dict[str, str]) -> float:
    try:
        start, end = (datetime.fromisoformat(record[k]) for k in ("StartTime", "EndTime"))
    except (KeyError, ValueError):  # never started ("Unknown", "None")
        return 0.0
    return max(0.0, (end - start).total_seconds())


def slurm_device_hours(records: list[dict[str, str]], plan: Plan, job: str) -> dict:
    """Per pool, per device kind and in all, the hours the run's jobs held their allocations:
    ``{pools: {name: {role, kind, node_hours, device_hours, cpu_hours, cost, nodes, jobs}}, kinds,
    rollout, trainer, total, cost, jobs: {job id: {node, state, seconds, cpus}}}``."""
    pools: dict[str, dict] = {}
    jobs: dict[str, dict] = {}
    prefix = f"{job}."
    for r in records:
        name = r.get("Name", "")
        if not name.startswith(prefix):
            continue
        node_id = name[len(prefix):]
        pool = plan.pool_of(node_id)
        if pool is None:
            continue
        seconds, cpus = _seconds(r), int(r.get("ProcCnt", "0") or 0)
        jobs[r.get("JobId", "?")] = {"node": node_id, "state": r.get("JobState", ""), "seconds": seconds, "cpus": cpus}
        # (the dataflow holds CPUs, which cpu_hours counts, but no device: as in .accounting)
        devices = 0 if pool.component == "dataflow" else \
            pool.devices_per_node * (len(pool.hosts) if pool.component == "trainer" else 1)
        p = pools.setdefault(pool.name, {"role": pool.component, "kind": pool.device_kind, "node_hours": 0.0,
                                         "device_hours": 0.0, "cpu_hours": 0.0, "cost": 0.0, "nodes": set(),
                                         "jobs": 0})
        p["nodes"].add(node_id)
        p["jobs"] += 1
        p["node_hours"] += seconds / 3600
        p["device_hours"] += seconds * devices / 3600
        p["cpu_hours"] += seconds * cpus / 3600
        p["cost"] += seconds * devices / 3600 * pool.cost_per_device_hour
    for p in pools.values():
        p["nodes"] = len(p["nodes"])
    kinds: dict[str, dict] = {}
    for p in pools.values():
        k = kinds.setdefault(p["kind"], {"device_hours": 0.0, "cost": 0.0})
        k["device_hours"] += p["device_hours"]
        k["cost"] += p["cost"]

    def role(name: str) -> float:
        return sum(p["device_hours"] for p in pools.values() if p["role"] == name)
    return {"pools": pools, "kinds": kinds, "rollout": role("raas"), "trainer": role("trainer"),
            "total": sum(p["device_hours"] for p in pools.values()), "cost": sum(p["cost"] for p in pools.values()),
            "jobs": jobs}


def slurm_summary(slurm: Slurm, plan: Plan, job: str, procs) -> dict:
    """The run's Slurm jobs per node and device-hours from Slurm's own accounting (its job
    completion log; ``device_hours`` None, with the reason, when the cluster keeps none as text)."""
    jobs = {p.node_id: list(p.job_ids) for p in procs if isinstance(p, SlurmProc)}
    out: dict = {"conf": slurm.spec.conf, "jobs": jobs, "jobcomp": None, "device_hours": None}
    try:
        path = slurm.jobcomp_path()
    except BackendError as e:
        out["device_hours_unavailable"] = str(e)
        return out
    if path is None:
        out["device_hours_unavailable"] = "the cluster's JobCompType is not jobcomp/filetxt"
        return out
    out["jobcomp"] = str(path)
    out["device_hours"] = slurm_device_hours(read_jobcomp(path), plan, job)
    return out
