"""Topologies launched for real on one machine, and the autoscaler acting on real runs.

Device kinds are emulated on CPU (a pool's or the trainer's ``device.slowdown``): a slow
RaaS pool starves the trainer, which the autoscaler answers by starting nodes; a slow
trainer leaves an oversized pool idle, which it answers by retiring nodes. Each run ends
with the conservation audit: a retired node's tasks are answered exactly once.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from astraflow.chaos.harness import JobHarness
from astraflow.chaos.invariants import audit
from astraflow.launcher import launch
from astraflow.status import job_status
from astraflow.topics import Heartbeat, ensure_topics, job_topics
from astraflow.topics.replay import read_topic
from astraflow.topology.backends import retire_process

pytestmark = pytest.mark.slow

#: Decisions every 2 s over a 16 s window, 2 agreeing decisions, 16 s between actions.
FAST_SCALER = {"enabled": True, "interval_s": 2, "window_s": 16, "cooldown_s": 16, "confirm": 2}


def _write(tmp_path, data) -> str:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _rows(summary) -> list[dict]:
    with open(f"{summary['run_dir']}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def _conserved(bootstrap, cfg, summary) -> None:
    report = audit(bootstrap, job_topics(cfg), cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations[:10]
    assert report.batches == summary["steps_trained"] == cfg.trainer.steps
    freed = report.drops["failed"] + report.drops["stale"]
    assert report.tasks == report.groups == cfg.trainer.steps * cfg.dataflow.groups_per_batch + freed


def _actions(rows, policy="policy") -> list[dict]:
    return [r for r in rows if r["name"] == "autoscaler.scaled"]


def _within_bounds_and_cooled_down(rows, lo, hi, cooldown_s) -> None:
    sizes = [r["value"] for r in rows if r["name"] == "autoscaler.pool_size"]
    assert sizes and lo <= min(sizes) and max(sizes) <= hi
    # no flapping inside the cooldown (releasing the pool once the trainer is done waits for none)
    acted = [r["ts"] for r in _actions(rows) if not r["label.reason"].startswith("the trainer is done")]
    assert all(b - a >= cooldown_s for a, b in zip(acted, acted[1:]))


def test_two_regions_on_one_machine_idle_pool_scaled_down_nothing_lost(make_job_config, bootstrap, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 12}, "rollout": {"tasks_per_call": 2}}, name="elastic-down")
    topology = _write(tmp_path, {
        "name": "two-regions",
        "regions": {
            "us": {"kafka": "embedded", "hosts": ["us-0"], "pools": {
                "dataflow": {"component": "dataflow", "hosts": ["us-0"]},
                # an emulated slow trainer device: the pool below is more than it needs
                "trainer": {"component": "trainer", "hosts": ["us-0"], "device": {"kind": "h100", "slowdown": 10.0},
                            "cost_per_device_hour": 4.0},
                "raas-us": {"component": "raas", "hosts": ["us-0"], "count": 1, "threads": 1,
                            "device": {"kind": "h100"}, "cost_per_device_hour": 4.0}}},
            "eu": {"kafka": "region:us", "hosts": ["eu-0"], "pools": {
                "raas-eu": {"component": "raas", "hosts": ["eu-0"], "count": 2, "min": 0, "max": 2, "threads": 1,
                            "device": {"kind": "a10"}, "cost_per_device_hour": 1.0}}}},
        "links": [{"between": ["us", "eu"], "bandwidth_mbps": 1000, "latency_ms": 40}],
        "autoscaler": {**FAST_SCALER, "host": "us-0"},
    })
    summary = launch(topology, cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=900)
    rows = _rows(summary)
    assert summary["error"] is None and "share one Kafka cluster" in " ".join(summary["topology"]["notes"])
    # both regions' nodes rolled out
    workers = {r["label.node"] for r in rows if r["name"] == "raas.tasks"}
    assert "raas-us-0" in workers and workers & {"raas-eu-0", "raas-eu-1"}
    # the idle pool shrank towards the demand, never below min (1 fixed us node + 0 eu nodes)
    down = [r for r in _actions(rows) if r["label.action"] == "down"]
    assert down and down[0]["label.current"] == 3
    _within_bounds_and_cooled_down(rows, 1, 3, FAST_SCALER["cooldown_s"])
    assert all(r["value"] >= 0 for r in rows if r["name"] == "autoscaler.pool_nodes")
    # retired nodes finished their in-flight rollouts and left the group: nothing lost or doubled
    assert summary["retired_exit_codes"] and set(summary["retired_exit_codes"].values()) == {0}
    last_beat = {m.node_id: m.status for _, _, m in read_topic(bootstrap, job_topics(cfg).control)
                 if isinstance(m, Heartbeat)}
    assert all(last_beat[n] == "stopping" for n in summary["retired_exit_codes"])
    _conserved(bootstrap, cfg, summary)
    # device-hours per pool and per device kind, with cost, in the summary and in status
    d = summary["device_hours"]
    assert {"trainer", "raas-us", "raas-eu"} <= set(d["pools"]) and {"h100", "a10"} <= set(d["kinds"])
    assert d["total"] == pytest.approx(d["rollout"] + d["trainer"]) and d["rollout"] > 0 and d["trainer"] > 0
    assert d["cost"] == pytest.approx(4.0 * (d["pools"]["trainer"]["device_hours"]
                                             + d["pools"]["raas-us"]["device_hours"])
                                      + 1.0 * d["pools"]["raas-eu"]["device_hours"])
    status = job_status(bootstrap, cfg.job)
    assert status["device_hours"]["raas-eu"]["kind"] == "a10" and status["autoscalers"]["policy"]["pool_size"] >= 1


def test_slow_pool_is_scaled_up_within_max(make_job_config, bootstrap, tmp_path):
    # long enough that the nodes it starts (~10 s to load and join) still find work on a quiet machine
    cfg = make_job_config({"trainer": {"steps": 60}, "rollout": {"tasks_per_call": 2}}, name="elastic-up")
    topology = _write(tmp_path, {
        "name": "one-region",
        "regions": {"local": {"hosts": ["h"], "pools": {
            "dataflow": {"component": "dataflow", "hosts": ["h"]},
            "trainer": {"component": "trainer", "hosts": ["h"]},
            # an emulated slow device kind: one node starves the trainer
            "raas": {"component": "raas", "hosts": ["h"], "count": 1, "min": 1, "max": 3, "threads": 1,
                     "device": {"kind": "a10", "slowdown": 6.0}}}}},
        "autoscaler": FAST_SCALER,
    })
    summary = launch(topology, cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=900)
    rows = _rows(summary)
    up = [r for r in _actions(rows) if r["label.action"] == "up"]
    assert up and up[0]["label.current"] == 1 and "trainer waits" in up[0]["label.reason"]
    _within_bounds_and_cooled_down(rows, 1, 3, FAST_SCALER["cooldown_s"])
    # the nodes it started joined the group and took tasks
    started = {n for r in up for n in r["label.nodes"]}
    assert started <= {"raas-1", "raas-2"}
    assert started & {r["label.node"] for r in rows if r["name"] == "raas.tasks"}
    _conserved(bootstrap, cfg, summary)
    assert set(summary["device_hours"]["pools"]["raas"]) and summary["device_hours"]["pools"]["raas"]["nodes"] >= 2


def test_node_retired_mid_rollout_finishes_it_and_loses_nothing(make_job_config, bootstrap, tmp_path):
    # every rollout call stretched x6, so a busy node is inside one almost all the time
    cfg = make_job_config({"trainer": {"steps": 6}, "rollout": {"tasks_per_call": 2, "device": {"kind": "emulated", "slowdown": 6.0}}},
                          name="elastic-retire")
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    for role, node in (("dataflow", "dataflow"), ("trainer", "trainer"), ("raas", "raas-0"), ("raas", "raas-1")):
        h.start(role, node)
    try:
        h.wait_for(lambda m: m.name == "raas.tasks" and m.labels.get("node") == "raas-0", 600, "raas-0 working")
        asked = time.time()
        retire_process(h.procs["raas-0"])  # what the local backend does: SIGTERM
        assert h.wait_exit("raas-0", 120) == 0
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    # it committed the rollout it held when asked to stop, then left ...
    assert [m for m in h.metrics if m.name == "raas.tasks" and m.labels.get("node") == "raas-0" and m.ts > asked]
    beats = [m for _, _, m in read_topic(bootstrap, h.topics.control) if isinstance(m, Heartbeat)
             and m.node_id == "raas-0"]
    assert beats[-1].status == "stopping"
    # ... and raas-1 answered everything after: every task exactly once
    assert report.ok, report.violations[:10]
    assert report.batches == cfg.trainer.steps
    freed = report.drops["failed"] + report.drops["stale"]
    assert report.tasks == report.groups == cfg.trainer.steps * cfg.dataflow.groups_per_batch + freed


def test_each_host_starts_its_share_with_node_topology(make_job_config, bootstrap, tmp_path):
    """Two hosts (on one machine): ``astraflow node --topology F --host H`` on each, nothing else."""
    import subprocess
    import sys
    from astraflow.weights.signing import ensure_key_pair
    for name in ("trainer", "raas"):  # several hosts: the pairs are configured, not made up per run dir
        ensure_key_pair(tmp_path / f"{name}.pem", tmp_path / f"{name}.pub")
    keys = {section: {"signing_key": str(tmp_path / f"{name}.pem"), "verify_key": str(tmp_path / f"{name}.pub")}
            for section, name in (("trainer", "trainer"), ("rollout", "raas"))}
    cfg = make_job_config({"trainer": {"steps": 3, **keys["trainer"]}, "rollout": keys["rollout"]}, name="elastic-hosts")
    topology = _write(tmp_path, {
        "name": "two-hosts",
        "regions": {"dc": {"kafka": bootstrap, "hosts": {"trainer-0": {}, "raas-0": {}}, "pools": {
            "dataflow": {"component": "dataflow", "hosts": ["trainer-0"]},
            "trainer": {"component": "trainer", "hosts": ["trainer-0"]},
            "raas": {"component": "raas", "hosts": ["raas-0"], "count": 1, "threads": 1}}}},
    })
    ensure_topics(bootstrap, job_topics(cfg).specs())  # `astraflow run`/`launch` do this; a real cluster has them
    hosts = {h: subprocess.Popen([sys.executable, "-m", "astraflow", "node", "--topology", topology, "--host", h,
                                  "--config", cfg.source, "--run-dir", str(tmp_path / h)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for h in ("trainer-0", "raas-0")}
    try:
        out = {h: p.communicate(timeout=600)[0] for h, p in hosts.items()}
    finally:
        for p in hosts.values():
            if p.poll() is None:
                p.kill()
    assert {h: p.returncode for h, p in hosts.items()} == {"trainer-0": 0, "raas-0": 0}, out
    assert "host trainer-0: dataflow, trainer; the autoscaler" in out["trainer-0"]
    # the RaaS host has no trainer of its own: it stopped when the trainer said it was done
    assert "host raas-0: raas-0" in out["raas-0"] and out["raas-0"].rstrip().endswith("host raas-0: done")
    report = audit(bootstrap, job_topics(cfg), cfg.policy, cfg.effective_staleness)
    assert report.ok and report.batches == cfg.trainer.steps, report.violations[:10]
