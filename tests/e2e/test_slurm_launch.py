"""The demo job through ``astraflow launch --backend slurm`` on a real single-node Slurm cluster
(Debian's slurm-wlm and munge, ``make slurm``; a cluster of the test's own in a temporary
directory, every daemon stopped at the end): every component a Slurm job, the autoscaler adding a
RaaS node with sbatch and releasing it with ``scancel --signal=TERM``, one RaaS node's job
SIGKILLed mid-run and resubmitted, device-hours from Slurm's job completion log, and the
conservation audit ok."""

from __future__ import annotations

import threading
import time

import pytest

from astraflow.launcher import launch
from astraflow.status import job_status
from astraflow.topics import Heartbeat, Metric, job_topics
from astraflow.topics.replay import read_topic
from astraflow.topology.slurm_cluster import LocalSlurmCluster, missing_slurm

from .test_elastic import FAST_SCALER, _actions, _conserved, _rows, _write

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    assert not missing_slurm(), f"Slurm is not installed ({', '.join(missing_slurm())}): `make slurm` installs it"
    # more CPUs than the machine's: every component's job runs at once, as processes would
    with LocalSlurmCluster(tmp_path / "slurm", cpus=16) as c:
        yield c
    assert not c.procs


def _kill_when_working(cluster, bootstrap, cfg, node: str, killed: dict, stop: threading.Event) -> None:
    """SIGKILL ``node``'s job step once it has committed rollouts (through Slurm, as an OOM killer
    or an admin would), once."""
    topics = job_topics(cfg)
    while not stop.is_set():
        worked = any(isinstance(m, Metric) and m.name == "raas.tasks" and m.labels.get("node") == node
                     for _, _, m in read_topic(bootstrap, topics.metrics))
        job = cluster.command("squeue", "--noheader", f"--name={cfg.job}.{node}", "--states=RUNNING",
                              "--format=%i").stdout.split()
        if worked and job:
            out = cluster.command("scancel", "--signal=KILL", "--full", job[0])
            killed.update(job=job[0], rc=out.returncode, at=time.time())
            return
        stop.wait(2)


def test_demo_job_on_slurm_scales_through_sbatch_and_scancel_survives_a_killed_job(make_job_config, bootstrap,
                                                                                    tmp_path, cluster):
    # long enough that the node it adds (~10 s to load and join) still finds work
    cfg = make_job_config({"trainer": {"steps": 120}, "rollout": {"tasks_per_call": 2}}, name="slurm")
    topology = _write(tmp_path, {
        "name": "slurm",
        "regions": {"local": {"hosts": ["h"], "pools": {
            "dataflow": {"component": "dataflow", "hosts": ["h"]},
            "trainer": {"component": "trainer", "hosts": ["h"], "slurm": {"mem": "4G"}},
            # an emulated slow device kind: one node starves the trainer, so the autoscaler adds one
            "raas": {"component": "raas", "hosts": ["h"], "count": 1, "min": 1, "max": 2, "threads": 1,
                     "device": {"kind": "a10", "slowdown": 6.0}, "cost_per_device_hour": 1.0,
                     "slurm": {"mem": "2G", "time_limit": "30"}}}}},
        "autoscaler": {**FAST_SCALER, "retire_timeout_s": 60},
        "slurm": {"conf": str(cluster.conf), "poll_s": 1},
    })
    killed: dict = {}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_working, args=(cluster, bootstrap, cfg, "raas-0", killed, stop),
                              daemon=True)
    killer.start()
    try:
        summary = launch(topology, cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False,
                         timeout_s=900, backend="slurm")
    finally:
        stop.set()
        killer.join(30)
    assert summary["error"] is None
    jobs = summary["slurm"]["jobs"]
    # every component ran as a Slurm job; raas-0's SIGKILLed job was resubmitted as a new one
    assert {"dataflow", "trainer", "raas-0"} <= set(jobs)
    assert killed.get("rc") == 0 and jobs["raas-0"][0] == killed["job"] and len(jobs["raas-0"]) == 2
    assert summary["restarts"]["raas-0"] == 1
    # the autoscaler added a node through sbatch, and it took tasks ...
    rows = _rows(summary)
    up = [r for r in _actions(rows) if r["label.action"] == "up"]
    assert up and up[0]["label.nodes"] == ["raas-1"] and "raas-1" in jobs
    assert "raas-1" in {r["label.node"] for r in rows if r["name"] == "raas.tasks"}
    # ... and released it with scancel --signal=TERM: it finished its transaction and left cleanly
    done = {j: s for j, s in ((j, summary["slurm"]["device_hours"]["jobs"].get(j, {})) for j in jobs["raas-1"])}
    assert all(s.get("state") == "COMPLETED" for s in done.values()), done
    last_beat = {m.node_id: m.status for _, _, m in read_topic(bootstrap, job_topics(cfg).control)
                 if isinstance(m, Heartbeat)}
    assert last_beat["raas-1"] == "stopping"
    assert set(summary["retired_exit_codes"].values()) <= {0}
    # nothing lost or doubled across the kill, the resubmission and the release
    _conserved(bootstrap, cfg, summary)
    # device-hours from Slurm's own accounting: every job of the run, the killed one included
    hours = summary["slurm"]["device_hours"]
    raas = {n: ids for n, ids in jobs.items() if n.startswith("raas-")}
    assert hours["pools"]["raas"]["jobs"] == sum(map(len, raas.values())) >= 3  # raas-0 twice, raas-1
    assert hours["pools"]["raas"]["nodes"] == len(raas)
    assert {j["node"] for j in hours["jobs"].values()} == set(jobs)
    assert hours["rollout"] > 0 and hours["trainer"] > 0
    assert hours["pools"]["raas"]["cost"] == pytest.approx(hours["pools"]["raas"]["device_hours"])
    beats = summary["device_hours"]["rollout"]  # the heartbeats' count of the same time
    assert 0.3 < hours["rollout"] / beats < 3
    # the autoscaler reported Slurm's count as the run went, beside the heartbeats'
    live = [r["value"] for r in rows if r["name"] == "devices.scheduler_total_hours"]
    assert live and max(live) > 0
    assert not cluster.jobs()  # nothing left queued
    assert job_status(bootstrap, cfg.job)["slurm_jobs"] == jobs  # `astraflow status` names them too
