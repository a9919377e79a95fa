"""``astraflow status``: what a job is doing, read from its topics alone.

Policy versions (``versions``), RaaS nodes alive with their versions and throughput
(``control`` heartbeats), task lag of the ``raas.<policy>`` group, and the trainer's
wait time (``metrics``). Works against any cluster the job runs on.
"""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from astraflow.topics import Heartbeat, JobTopics, Metric, VersionAnnouncement
from astraflow.topics.replay import read_topic

ALIVE_S = 15.0


def _read_all(bootstrap: str, topic: str, tail: int | None = None) -> list:
    return [m for _, _, m in read_topic(bootstrap, topic, tail=tail)]


def job_status(bootstrap: str, job: str, policies: tuple[str, ...] = ("policy",)) -> dict:
    topics = JobTopics(job=job, policies=policies)
    versions = {m.policy: m for m in _read_all(bootstrap, topics.versions) if isinstance(m, VersionAnnouncement)}
    beats: dict[str, Heartbeat] = {}
    for m in _read_all(bootstrap, topics.control, tail=2000):
        if isinstance(m, Heartbeat):
            beats[m.node_id] = m
    metrics = [m for m in _read_all(bootstrap, topics.metrics, tail=5000) if isinstance(m, Metric)]
    now = time.time()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="astraflow-status")
    lag = {}
    try:
        probe = KafkaConsumer(bootstrap_servers=bootstrap, client_id="astraflow-status")
        for p in policies:
            topic = topics.tasks(p)
            parts = probe.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, i) for i in parts]
            ends = probe.end_offsets(tps) if tps else {}
            group = topics.rollout_group(p)
            committed = admin.list_group_offsets(group).get(group, {}) if tps else {}
            lag[p] = sum(max(0, ends[tp] - (committed[tp].offset if tp in committed and committed[tp].offset >= 0
                                            else 0)) for tp in tps)
        probe.close()
    finally:
        admin.close()
    hours = {m.labels.get("pool"): m for m in metrics if m.name == "devices.hours"}
    scalers: dict[str, dict] = {}  # policy -> newest autoscaler metric by name (one actor per policy)
    for m in metrics:
        if m.name.startswith("autoscaler."):
            scalers.setdefault(m.labels.get("policy") or "policy", {})[m.name] = m
    waits = [m for m in metrics if m.name == "trainer.wait_s"]
    trains = [m for m in metrics if m.name == "trainer.train_s"]
    return {
        "job": job,
        "versions": {p: {"version": v.version, "kind": v.kind, "snapshot": v.snapshot_version,
                         "age_s": round(now - v.created_at, 1)} for p, v in versions.items()},
        "nodes": [{"node": b.node_id, "role": b.role, "policy": b.policy, "version": b.version,
                   "tokens_per_s": round(b.tokens_per_s, 1), "alive": now - b.ts < ALIVE_S,
                   "last_seen_s": round(now - b.ts, 1)} for b in sorted(beats.values(), key=lambda b: b.node_id)],
        "task_lag": lag,
        "trainer_wait_s_total": round(sum(m.value for m in waits), 2),
        "trainer_train_s_total": round(sum(m.value for m in trains), 2),
        # written by the autoscaler actor of `astraflow launch` / `node --topology` (topology/accounting.py)
        "device_hours": {pool: {"kind": m.labels.get("kind"), "device_hours": round(m.value, 4),
                                "cost": round(float(m.labels.get("cost", 0.0)), 4)} for pool, m in hours.items()},
        "autoscalers": {policy: {"pool_size": sc["autoscaler.pool_size"].value,
                                 "wait_frac": sc["autoscaler.wait_frac"].value if "autoscaler.wait_frac" in sc else None,
                                 "last_decision": sc["autoscaler.target"].labels.get("reason")
                                 if "autoscaler.target" in sc else None}
                        for policy, sc in sorted(scalers.items()) if "autoscaler.pool_size" in sc},
    }


def format_status(s: dict) -> str:
    lines = [f"job {s['job']}"]
    for p, v in s["versions"].items() or {}.items():
        lines.append(f"  policy {p}: version {v['version']} ({v['kind']}, snapshot {v['snapshot']}, {v['age_s']}s ago)")
    if not s["versions"]:
        lines.append("  no version announced yet")
    lines.append(f"  task lag (offsets not yet committed by raas.<policy>, incl. transaction markers): "
                 f"{s['task_lag']}")
    lines.append(f"  trainer: {s['trainer_train_s_total']}s training, {s['trainer_wait_s_total']}s waiting for batches")
    for pool, h in s.get("device_hours", {}).items():
        lines.append(f"  device-hours {pool}: {h['device_hours']} ({h['kind']}), cost {h['cost']}")
    for policy, a in s.get("autoscalers", {}).items():
        lines.append(f"  autoscaler ({policy}): {a['pool_size']:.0f} nodes, trainer wait fraction {a['wait_frac']}; "
                     f"last decision: {a['last_decision']}")
    lines.append("  nodes:")
    for n in s["nodes"]:
        state = "alive" if n["alive"] else f"silent {n['last_seen_s']}s"
        lines.append(f"    {n['node']:24} {n['role']:8} v{n['version']:<5} {n['tokens_per_s']:>8} tok/s  {state}")
    return "\n".join(lines)
