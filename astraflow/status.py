"""``astraflow status``: what a job is doing, read from its topics alone.

Whether the job exists at all (its topics), its policies (one ``tasks.<policy>`` topic
each, so every policy shows without naming it), its state (``done`` once every policy's
trainer reported ``trainer.done``; ``failed`` when a component stopped on a fatal error and
said so on ``control``; ``running`` while a component's heartbeat is fresh; ``stopped``
when none is; ``not started`` when nothing was written yet), policy versions
(``versions``), the components with their versions and throughput (``control``
heartbeats), the task lag of each ``raas.<policy>`` group while the job runs, and the
trainers' time, summed over every ``metrics`` record (what ``summary.json`` sums), and per
remote region of an ``astraflow launch`` its cluster, its mirror's lag, the bytes across its
link and its nodes (what the launcher's region watcher writes to ``metrics``), and under
``launch --backend slurm`` each node's Slurm job ids. Works
against any cluster the job runs on; ``--json`` prints the same dict for scripts.
"""

from __future__ import annotations

import time

from astraflow.errors import FatalError
from astraflow.topics import Heartbeat, JobTopics, KafkaError, Metric, TopicPartition, VersionAnnouncement
from astraflow.topics.replay import read_topic
from astraflow.topics import security

ALIVE_S = 15.0


class StatusError(FatalError, ValueError):
    """``astraflow status`` was asked about something the job does not have (a policy)."""


def _read_all(bootstrap: str, topic: str, tail: int | None = None) -> list:
    return [m for _, _, m in read_topic(bootstrap, topic, tail=tail)]


def _job_topics(bootstrap: str) -> set[str]:
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-status")
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def job_policies(names: set[str], job: str) -> tuple[str, ...]:
    """The policies of ``job`` among the topic ``names``: each has ``tasks.<p>`` and ``batches.<p>``."""
    topics = JobTopics(job=job)
    head = topics.tasks("")
    return tuple(sorted(n[len(head):] for n in names
                        if n.startswith(head) and len(n) > len(head) and topics.batches(n[len(head):]) in names))


def known_jobs(names: set[str]) -> list[str]:
    """Every job with topics on the cluster (its ``af.<job>.control``)."""
    return sorted(n[len("af."):-len(".control")] for n in names if n.startswith("af.") and n.endswith(".control"))


def job_state(policies, done, failed: bool, alive: bool, written: bool) -> str:
    """A job's state from what its topics hold: ``done`` once every one of ``policies`` is in
    ``done`` (its trainer reported ``trainer.done``), else ``failed`` when a component said it
    stopped on a fatal error, ``running`` while one's heartbeat is fresh, ``stopped`` when
    anything was ``written``, else ``not started`` (``status`` and the dashboard both say it)."""
    if policies and all(p in done for p in policies):
        return "done"
    if failed:
        return "failed"
    if alive:
        return "running"
    return "stopped" if written else "not started"


def job_status(bootstrap: str, job: str, policies: tuple[str, ...] | None = None) -> dict:
    """The job's status as a dict (what ``--json`` prints); ``policies``: only these (default: all)."""
    names = _job_topics(bootstrap)
    topics = JobTopics(job=job)
    if topics.control not in names:
        return {"job": job, "state": "unknown", "bootstrap_servers": bootstrap, "known_jobs": known_jobs(names)}
    found = job_policies(names, job)
    for p in policies or ():
        if p not in found:
            raise StatusError(f"--policy {p}: job {job} has no such policy (its policies: {', '.join(found)})")
    policies = tuple(policies or found)
    topics = JobTopics(job=job, policies=policies)
    versions = {m.policy: m for m in _read_all(bootstrap, topics.versions) if isinstance(m, VersionAnnouncement)}
    beats: dict[str, Heartbeat] = {}
    for m in _read_all(bootstrap, topics.control, tail=2000):
        if isinstance(m, Heartbeat):
            beats[m.node_id] = m
    # every record: the trainers' time is their sum (a tail would cut it short on a long job)
    metrics = [m for m in _read_all(bootstrap, topics.metrics) if isinstance(m, Metric)]
    now = time.time()
    done = {m.component.split(".", 1)[1]: m.step for m in metrics
            if m.name == "trainer.done" and m.component.startswith("trainer.")}
    failed = [b for b in beats.values() if b.status == "failed"]
    alive = [b for b in beats.values() if now - b.ts < ALIVE_S and b.status in ("alive", "starting")]
    state = job_state(policies, done, bool(failed), bool(alive), bool(versions or beats or metrics))
    hours = {m.labels.get("pool"): m for m in metrics if m.name == "devices.hours"}
    scalers: dict[str, dict] = {}  # policy -> newest autoscaler metric by name (one actor per policy)
    for m in metrics:
        if m.name.startswith("autoscaler."):
            scalers.setdefault(m.labels.get("policy") or "policy", {})[m.name] = m

    def trainer_s(name: str) -> dict[str, float]:
        out = {p: 0.0 for p in policies}
        for m in metrics:
            if m.name == name and m.component.startswith("trainer."):
                policy = m.component.split(".", 1)[1]
                if policy in out:
                    out[policy] += m.value
        return {p: round(v, 3) for p, v in out.items()}

    train, wait = trainer_s("trainer.train_s"), trainer_s("trainer.wait_s")
    nodes = [{"node": b.node_id, "role": b.role, "policy": b.policy, "version": b.version,
              "tokens_per_s": round(b.tokens_per_s, 1), "status": b.status,
              "alive": now - b.ts < ALIVE_S and b.status in ("alive", "starting"),
              "last_seen_s": round(now - b.ts, 1)} for b in sorted(beats.values(), key=lambda b: b.node_id)]
    from astraflow.topology.region_watch import regions_status
    return {
        "job": job,
        "state": state,
        "policies": list(policies),
        "done": {p: done[p] for p in policies if p in done},  #: policy -> the version its trainer finished at
        "failed": [{"node": b.node_id, "role": b.role, "policy": b.policy, "error": b.error}
                   for b in sorted(failed, key=lambda b: b.node_id)],
        "versions": {p: {"version": v.version, "kind": v.kind, "snapshot": v.snapshot_version,
                         "age_s": round(now - v.created_at, 1)} for p, v in sorted(versions.items())
                     if p in policies},
        "nodes": nodes,
        # written by `astraflow launch`'s region watcher (topology/region_watch.py): per remote region
        # its cluster, its mirror's lag, the bytes across its link, its nodes
        "regions": regions_status(metrics, nodes),
        # offsets not yet committed by raas.<policy>: work waiting, only while the job runs
        "task_lag": None if state == "done" else _task_lag(bootstrap, topics, policies),
        "trainer_train_s": train,
        "trainer_wait_s": wait,
        "trainer_train_s_total": round(sum(train.values()), 3),
        "trainer_wait_s_total": round(sum(wait.values()), 3),
        # written by the autoscaler actor of `astraflow launch` / `node --topology` (topology/accounting.py)
        "device_hours": {pool: {"kind": m.labels.get("kind"), "device_hours": round(m.value, 4),
                                "cost": round(float(m.labels.get("cost", 0.0)), 4)} for pool, m in hours.items()},
        # written by `astraflow launch --backend slurm` (topology/launch.py): node -> its jobs' ids
        "slurm_jobs": _slurm_jobs(metrics),
        "autoscalers": {policy: {"pool_size": sc["autoscaler.pool_size"].value,
                                 "wait_frac": sc["autoscaler.wait_frac"].value if "autoscaler.wait_frac" in sc else None,
                                 "last_decision": sc["autoscaler.target"].labels.get("reason")
                                 if "autoscaler.target" in sc else None}
                        for policy, sc in sorted(scalers.items()) if "autoscaler.pool_size" in sc},
    }


def _task_lag(bootstrap: str, topics: JobTopics, policies: tuple[str, ...]) -> dict[str, int]:
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-status")
    lag = {}
    try:
        probe = security.consumer(bootstrap_servers=bootstrap, client_id="astraflow-status")
        for p in policies:
            topic = topics.tasks(p)
            parts = probe.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, i) for i in parts]
            ends = probe.end_offsets(tps) if tps else {}
            group = topics.rollout_group(p)
            committed = _group_offsets(admin, group) if tps else {}
            lag[p] = sum(max(0, ends[tp] - (committed[tp].offset if tp in committed and committed[tp].offset >= 0
                                            else 0)) for tp in tps)
        probe.close()
    finally:
        admin.close()
    return lag


def _group_offsets(admin: security.KafkaAdminClient, group: str, wait_s: float = 15.0) -> dict:
    """The group's committed offsets; a broker that has not yet placed group coordinators (a
    fresh one, on the first group lookup) answers with a retriable error for a few seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return admin.list_group_offsets(group).get(group, {})
        except KafkaError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _slurm_jobs(metrics: list[Metric]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in metrics:
        if m.name == "slurm.job":
            out.setdefault(str(m.labels.get("node")), []).append(str(m.labels.get("job_id")))
    return out


def format_status(s: dict) -> str:
    if s["state"] == "unknown":
        others = ", ".join(s["known_jobs"]) or "none"
        return (f"job {s['job']}: unknown at {s['bootstrap_servers']} (no topics af.{s['job']}.*); "
                f"jobs there: {others}")
    lines = [f"job {s['job']}: {s['state']}" + (f" (policies: {', '.join(s['policies'])})"
                                               if len(s["policies"]) > 1 else "")]
    for f in s["failed"]:
        lines.append(f"  {f['node']} failed: {f['error']}")
    for p in s["policies"]:
        v = s["versions"].get(p)
        if p in s["done"]:
            what = f"done at version {s['done'][p]}"
        elif v is not None:
            what = f"version {v['version']} ({v['kind']}, snapshot {v['snapshot']}, {v['age_s']}s ago)"
        else:
            what = "no version announced yet"
        lines.append(f"  policy {p}: {what}; trainer {s['trainer_train_s'][p]}s training, "
                     f"{s['trainer_wait_s'][p]}s waiting for batches")
    if s["task_lag"] is not None:
        lag = ", ".join(f"{p} {n}" for p, n in s["task_lag"].items())
        lines.append(f"  task lag (offsets not yet committed by raas.<policy>, incl. transaction markers): {lag}")
    for pool, h in s.get("device_hours", {}).items():
        lines.append(f"  device-hours {pool}: {h['device_hours']} ({h['kind']}), cost {h['cost']}")
    if s.get("slurm_jobs"):
        lines.append("  slurm jobs: " + ", ".join(f"{n} {'/'.join(ids)}" for n, ids in sorted(s["slurm_jobs"].items())))
    for policy, a in s.get("autoscalers", {}).items():
        lines.append(f"  autoscaler ({policy}): {a['pool_size']:.0f} nodes, trainer wait fraction {a['wait_frac']}; "
                     f"last decision: {a['last_decision']}")
    for region, r in s.get("regions", {}).items():
        versions = sorted({n["version"] for n in s["nodes"] if n["node"] in r["nodes"]})
        lag, behind = r["mirror_lag_records"], r.get("mirror_lag_versions")
        mirror = ("no mirror" if lag is None else "mirror lag unknown (not measurable)" if lag < 0
                  else f"mirror lag {lag} records" if behind is None or behind < 0
                  else f"mirror lag {behind} versions ({lag} records)")
        link = (f"; link {r['link_bytes_down']} B down, {r['link_bytes_up']} B up"
                if r["link_bytes_down"] is not None else "")
        if r.get("mirrored_weight_bytes") is not None:  # measured at the region, emulated link or not
            link += (f"; mirrored {r['mirrored_weight_bytes']:,} B of weights "
                     f"({r.get('mirrored_versions') or 0} versions)")
        lines.append(f"  region {region}: cluster {r['cluster']}, {mirror}{link}; nodes "
                     f"{', '.join(r['nodes']) or 'none'}" + (f" at versions {versions}" if versions else ""))
    if s["nodes"]:
        lines.append("  nodes:")
    for n in s["nodes"]:
        state = "alive" if n["alive"] else n["status"] if n["status"] in ("stopping", "failed") \
            else f"silent {n['last_seen_s']}s"
        lines.append(f"    {n['node']:24} {n['role']:8} {n['policy']:10} v{n['version']:<5} "
                     f"{n['tokens_per_s']:>8} tok/s  {state}")
    return "\n".join(lines)
