"""What a chaos run shows, read from the topics: the report JSON and its one printed table.

The conservation audit (:mod:`.invariants`) says *whether* the law held; this module adds
the counts the issue asks for, each computed from the log:

* **samples lost**: samples of tasks that have no committed group, plus samples of ok
  groups that are neither in a batch nor named by a drop record (the audit's violations,
  counted in samples; must be 0);
* **duplicates trained**: extra fresh trainings of one task's group (a task trained in
  two batches counts 1; replay-marked groups are not duplicates; must be 0);
* **tasks redone**: tasks whose rollout ran more than once. A task records no attempt
  count, so two observable kinds of redo are unioned: *discarded rollouts* (a node sent
  the group in a transaction that was then aborted: fenced zombie, timed-out transaction,
  broker gone mid-commit; visible to a ``read_uncommitted`` reader only) and *redelivered
  tasks* (at a fault on a RaaS node, the tasks on its assigned partitions past the group's
  committed offset, answered after the fault by another node, or by the node's restarted
  self after a SIGKILL). The second also counts tasks the victim had fetched but not begun;
  either way the group protocol handed them to someone else. A task with two *committed*
  groups (an audit violation) was redone too and is counted as well;
* **recovery time** of each fault: from its injection until the trainer has stepped after
  the fault ended *and* the faulted component works again (a RaaS node heartbeats, having
  rejoined; the trainer steps; the dataflow writes a batch or an evaluation); either alone
  when the job ended before the other; None when neither happened;
* **weights**: the trainer's final ``weights_digest`` against every RaaS node's last
  heartbeat and the evaluator's final evaluation (the evaluator lives in the dataflow).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from astraflow.chaos.invariants import Audit, JobLog
from astraflow.topics import Heartbeat, Metric, TopicPartition, TrajectoryGroup
from astraflow.topics import security


@dataclass
class FaultRecord:
    """One injected fault, as it happened."""

    kind: str
    target: str  #: the node id, or the broker ("broker-<id>"), that took it; "rogue" for rogue_batch
    planned: str  #: what the schedule said ("step 3", "40s", "random")
    started: float  #: epoch seconds of the injection
    ended: float | None = None  #: when the fault was lifted (a SIGKILL ends as it starts)
    detail: dict[str, Any] = field(default_factory=dict)
    recovery_s: float | None = None
    #: uncommitted tasks on the victim's partitions at the fault: {partition: [from, to)}
    window: dict[int, tuple[int, int]] = field(default_factory=dict)


def snapshot_assignment(bootstrap: str, group: str, topic: str, node_id: str) -> dict[int, tuple[int, int]]:
    """The offsets [committed, end) of the partitions ``node_id`` holds in ``group``: the tasks a
    fault on it puts back into the group's hands. Empty when it holds none (or the broker is away)."""
    try:
        admin = security.admin(bootstrap_servers=bootstrap, client_id="chaos-snapshot", request_timeout_ms=5000)
    except Exception:  # noqa: BLE001 - no broker, no snapshot: the report then counts fewer redos
        return {}
    consumer = None
    try:
        desc = admin.describe_groups([group]).get(group, {})
        mine: list[int] = []
        for m in desc.get("members", []):
            if m.get("client_id") == node_id and isinstance(m.get("member_assignment"), dict):
                for a in m["member_assignment"].get("assigned_partitions", []):
                    if a["topic"] == topic:
                        mine += a["partitions"]
        if not mine:
            return {}
        committed = admin.list_group_offsets({group: None}).get(group, {})
        consumer = security.consumer(bootstrap_servers=bootstrap, client_id="chaos-snapshot",
                                     isolation_level="read_committed")
        tps = [TopicPartition(topic, p) for p in mine]
        ends = consumer.end_offsets(tps)
        out = {}
        for tp in tps:
            c = committed.get(tp)
            start = c.offset if c is not None and c.offset >= 0 else 0
            if ends[tp] > start:
                out[tp.partition] = (start, ends[tp])
        return out
    except Exception:  # noqa: BLE001 - see above
        return {}
    finally:
        admin.close()
        if consumer is not None:
            consumer.close()


def read_uncommitted(bootstrap: str, topic: str) -> list[tuple[int, int, int, Any]]:
    """``(partition, offset, timestamp_ms, message)`` of every record, aborted ones included."""
    from astraflow.topics.replay import read_topic
    return read_topic(bootstrap, topic, uncommitted=True, timestamps=True)


def read_task_partitions(bootstrap: str, topic: str) -> dict[tuple[int, int], str]:
    """``(partition, offset) -> task_id`` on a tasks topic."""
    from astraflow.topics import Task
    from astraflow.topics.replay import read_topic
    return {(p, o): m.task_id for p, o, m in read_topic(bootstrap, topic) if isinstance(m, Task)}


# -- counts ---------------------------------------------------------------------------------

def conservation_counts(log: JobLog) -> dict[str, int]:
    """Samples lost and duplicates trained, by the definitions in the module docstring."""
    answered = {g.task_id for _, _, g in log.groups}
    lost_tasks = [t for t in log.tasks if t.task_id not in answered]
    settled = {(d.source.partition, d.source.offset) for d in log.drops}
    fresh: Counter = Counter()
    for b in log.batches:
        for j, (src, g) in enumerate(zip(b.sources, b.groups)):
            if not b.is_replay(j):
                settled.add((src.partition, src.offset))
                fresh[g.task_id] += 1
    unsettled = [g for p, o, g in log.groups if (p, o) not in settled]
    return {
        "samples_lost": sum(t.n_samples for t in lost_tasks) + sum(len(g.samples) for g in unsettled),
        "tasks_unanswered": len(lost_tasks),
        "groups_unsettled": len(unsettled),
        "duplicates_trained": sum(n - 1 for n in fresh.values() if n > 1),
    }


def tasks_redone(log: JobLog, records: list[tuple[int, int, int, Any]], tasks_at: dict[tuple[int, int], str],
                 faults: list[FaultRecord], policy: str) -> dict[str, Any]:
    """Discarded rollouts, redelivered tasks and their union (see the module docstring)."""
    committed = {(p, o) for p, o, _ in log.groups}
    discarded = {m.task_id for p, o, _, m in records
                 if isinstance(m, TrajectoryGroup) and m.policy == policy and (p, o) not in committed}
    answer = {}  # task_id -> (node, timestamp s) of its committed group
    for p, o, ts, m in records:
        if isinstance(m, TrajectoryGroup) and (p, o) in committed:
            answer[m.task_id] = (m.node_id, ts / 1000.0)
    redelivered: set[str] = set()
    for f in faults:
        for part, (lo, hi) in f.window.items():
            for off in range(lo, hi):
                tid = tasks_at.get((part, off))
                if tid is None or tid not in answer:
                    continue
                node, ts = answer[tid]
                if ts >= f.started and (node != f.target or f.kind == "sigkill"):
                    redelivered.add(tid)
    twice = {tid for tid, n in Counter(g.task_id for _, _, g in log.groups).items() if n > 1}
    return {"tasks_redone": len(discarded | redelivered | twice), "rollouts_discarded": len(discarded),
            "tasks_redelivered": len(redelivered), "tasks_answered_twice": len(twice)}


# -- recovery and weights -------------------------------------------------------------------

def back_at(node: str, after: float, metrics: list[Metric], beats: list[Heartbeat]) -> float | None:
    """When ``node`` (a component process) was working again after ``after``: a RaaS node's
    first heartbeat (it beats once it has rejoined), the trainer's next step, the dataflow's
    next batch or evaluation."""
    if node.startswith("raas"):
        return min((b.ts for b in beats if b.node_id == node and b.ts >= after and b.status == "alive"), default=None)
    names = {"trainer": ("trainer.samples",), "dataflow": ("dataflow.batch_reward", "eval.accuracy")}.get(node, ())
    return min((m.ts for m in metrics if m.name in names and m.ts >= after), default=None)


def recovery(f: FaultRecord, metrics: list[Metric], beats: list[Heartbeat]) -> float | None:
    """Seconds from the injection until the trainer stepped after the fault ended and the faulted
    component (if a process) was working again; the first alone when the job ended before the other."""
    after = f.ended if f.ended is not None else f.started
    step = min((m.ts for m in metrics if m.name == "trainer.samples" and m.ts >= after), default=None)
    back = back_at(f.target, after, metrics, beats) if _is_process(f.target) else None
    f.detail.update(to_next_step_s=None if step is None else round(step - f.started, 2),
                    target_back_s=None if back is None else round(back - f.started, 2))
    known = [t for t in (step, back) if t is not None]
    return round(max(known) - f.started, 2) if known else None


def _is_process(target: str) -> bool:
    return target.startswith("raas") or target in ("trainer", "dataflow")


def final_digests(metrics: list[Metric], heartbeats: list[Heartbeat], steps: int) -> dict[str, Any]:
    """The trainer's final digest and every other holder's (RaaS nodes, the evaluator)."""
    done = [m for m in metrics if m.name == "trainer.done"]
    trainer = str(done[-1].labels.get("weights_digest", "")) if done else ""
    nodes: dict[str, dict[str, Any]] = {}
    for hb in sorted(heartbeats, key=lambda h: h.ts):
        if hb.role == "raas" and hb.weights_digest:
            nodes[hb.node_id] = {"version": hb.version, "digest": hb.weights_digest}
    final_eval = [m for m in metrics if m.name == "eval.accuracy" and m.step == steps]
    if final_eval:
        nodes["evaluator (dataflow)"] = {"version": final_eval[-1].step,
                                         "digest": str(final_eval[-1].labels.get("weights_digest", ""))}
    mismatched = sorted(n for n, v in nodes.items() if v["digest"] != trainer)
    return {"trainer": trainer, "nodes": nodes, "mismatched": mismatched,
            "match": bool(trainer) and bool(nodes) and not mismatched}


# -- the report -----------------------------------------------------------------------------

def build_report(*, scenario: str, job: str, brokers: int, seed: int, started: float, faults: list[FaultRecord],
                 skipped: list[str], audit: Audit, counts: dict[str, int], redone: dict[str, Any],
                 weights: dict[str, Any], restarts: dict[str, int], completed: bool, error: str | None,
                 run_dir: str) -> dict[str, Any]:
    recoveries = [f.recovery_s for f in faults if f.recovery_s is not None]
    ok = audit.ok and weights["match"] and completed and error is None
    return {
        "scenario": scenario, "job": job, "brokers": brokers, "seed": seed, "run_dir": run_dir,
        "ok": ok, "completed": completed, "error": error,
        "duration_s": round(time.time() - started, 1),
        "faults_injected": len(faults),
        "faults_by_kind": dict(Counter(f.kind for f in faults)),
        "faults_not_injected": skipped,
        "recovery_s_median": round(statistics.median(recoveries), 2) if recoveries else None,
        "recovery_s_max": max(recoveries, default=None),
        **counts, **redone,
        "audit": {"ok": audit.ok, "tasks": audit.tasks, "groups": audit.groups, "batches": audit.batches,
                  "batched_groups": audit.batched_groups, "failed_groups": audit.failed_groups,
                  "drops": dict(audit.drops), "max_staleness_seen": audit.max_staleness_seen,
                  "violations": audit.violations[:50], "violations_total": len(audit.violations)},
        "weights": weights,
        "component_restarts": restarts,
        "faults": [{k: v for k, v in asdict(f).items() if k != "window"} | {"tasks_at_risk": sum(
            hi - lo for lo, hi in f.window.values())} for f in faults],
    }


def format_table(r: dict[str, Any]) -> str:
    """The one table a run prints: every fault, then the verdicts."""
    lines = [f"chaos scenario {r['scenario']} (job {r['job']}, {r['brokers']} broker(s), seed {r['seed']}): "
             f"{r['duration_s']:.0f}s",
             f"{'#':>3}  {'kind':15} {'target':12} {'planned':9} {'at_s':>7} {'lasted_s':>8} {'recovery_s':>10}"]
    t0 = r["faults"][0]["started"] if r["faults"] else 0.0
    for i, f in enumerate(r["faults"]):
        lasted = f["ended"] - f["started"] if f["ended"] is not None else 0.0
        rec = f"{f['recovery_s']:.1f}" if f["recovery_s"] is not None else "-"
        lines.append(f"{i:>3}  {f['kind']:15} {f['target'] or '-':12} {f['planned']:9} "
                     f"{f['started'] - t0:7.1f} {lasted:8.1f} {rec:>10}")
    a, w = r["audit"], r["weights"]
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(r["faults_by_kind"].items())) or "none"
    verdict = [
        ("faults injected", f"{r['faults_injected']} ({by_kind})"
         + (f"; NOT injected: {', '.join(r['faults_not_injected'])}" if r["faults_not_injected"] else "")),
        ("recovery s (median / max)", f"{r['recovery_s_median']} / {r['recovery_s_max']}"),
        ("tasks redone", f"{r['tasks_redone']} ({r['tasks_redelivered']} redelivered, "
                         f"{r['rollouts_discarded']} rollouts discarded, {r['tasks_answered_twice']} answered twice)"),
        ("samples lost", f"{r['samples_lost']}" + ("" if r["samples_lost"] == 0 else "  <-- must be 0")),
        ("duplicates trained", f"{r['duplicates_trained']}" + ("" if r["duplicates_trained"] == 0
                                                                else "  <-- must be 0")),
        ("audit", f"{'PASS' if a['ok'] else 'FAIL'}: {a['tasks']} tasks, {a['groups']} groups, {a['batches']} "
                  f"batches, drops {a['drops'] or 0}, {a['violations_total']} violation(s)"),
        ("final weights", ("every node on the trainer's digest " if w["match"] else
                           f"MISMATCH {', '.join(w['mismatched']) or '(no digests)'} ")
         + f"({len(w['nodes'])} holders, {w['trainer'][:12] or '-'})"),
        ("component restarts", ", ".join(f"{k} {v}" for k, v in sorted(r["component_restarts"].items())) or "none"),
    ]
    lines += [f"{k:>27}: {v}" for k, v in verdict]
    lines += [f"{'':>27}  {v}" for v in a["violations"][:5]]
    if r["error"]:
        lines.append(f"{'error':>27}: {r['error']}")
    lines.append(f"{'result':>27}: {'PASS' if r['ok'] else 'FAIL'}")
    return "\n".join(lines)
