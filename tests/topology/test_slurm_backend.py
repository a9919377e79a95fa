"""The Slurm backend against a real single-node Slurm cluster (Debian's slurm-wlm and munge,
``make slurm``) that each module starts in a temporary directory of its own
(:class:`~astraflow.topology.slurm_cluster.LocalSlurmCluster`): nodes submitted with sbatch show
in squeue, a retired node gets SIGTERM through ``scancel --signal=TERM`` and leaves within its
grace period, a stubborn one is cancelled after it, a killed one is resubmitted by the same
supervision as a local process, and Slurm's job completion log gives the device-hours."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import pytest

from astraflow.errors import EXIT_FATAL
from astraflow.topology.plan import resolve
from astraflow.topology.processes import stop_processes, supervise
from astraflow.topology.schema import SlurmResources, SlurmSpec, TopologyError
from astraflow.topology.slurm import (Slurm, SlurmBackend, SlurmError, check_slurm_launchable, exit_code,
                                      sbatch_resources, slurm_proc)
from astraflow.topology.slurm_accounting import read_jobcomp, slurm_device_hours
from astraflow.topology.slurm_cluster import LocalSlurmCluster, missing_slurm
from astraflow.topology.validation import load_topology
from tests.waiting import wait_until

from .test_topology_files import changed, error_of, write

# On SIGTERM: says so, then leaves cleanly (a node finishing its transaction).
GRACEFUL = [sys.executable, "-c", "import signal, sys, time\n"
            "def stop(*_):\n    print('got SIGTERM', flush=True)\n    time.sleep(0.5)\n    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(300)"]
STUBBORN = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(300)"]
FATAL = [sys.executable, "-c", f"print('error: bad config', flush=True); raise SystemExit({EXIT_FATAL})"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    assert not missing_slurm(), f"Slurm is not installed ({', '.join(missing_slurm())}): `make slurm` installs it"
    with LocalSlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=8) as c:
        yield c
    assert not c.procs  # every daemon it started has stopped


@pytest.fixture
def plan(tmp_path):
    data = changed(lambda d: (d["regions"]["us"]["pools"]["fast"].update(
        device={"kind": "cpu"}, threads=2, slurm={"mem": "100M", "time_limit": "10"}),
        d["regions"]["us"]["pools"]["trainer"].update(device={"kind": "h100", "count": 8},
                                                      cost_per_device_hour=2.0)))
    return resolve(load_topology(write(tmp_path, data)), "policy")


@pytest.fixture
def slurm(cluster):
    return Slurm(SlurmSpec(conf=str(cluster.conf), poll_s=0.2))


def ready(p) -> bool:
    return p.log_path.exists() and "ready" in p.log_path.read_text()


# -- configuration ---------------------------------------------------------------------------------

def test_topology_slurm_keys_load_typed_and_bad_ones_name_their_key(tmp_path):
    data = changed(lambda d: (d.update(slurm={"conf": "cluster/slurm.conf", "partition": "gpu", "time_limit": "1-0"}),
                              d["autoscaler"].update(backend="slurm"),
                              d["regions"]["us"]["pools"]["fast"].update(slurm={"cpus": 4, "mem": "16G",
                                                                                "extra": ["--qos=high"]})))
    plan = resolve(load_topology(write(tmp_path, data)), "policy")
    assert plan.autoscaler["backend"] == "slurm"
    assert plan.slurm.conf == str(tmp_path.resolve() / "cluster" / "slurm.conf")  # relative to the file
    assert sbatch_resources(plan.pools["fast"], plan.slurm) == [
        "--cpus-per-task=4", "--gres=gpu:1", "--mem=16G", "--partition=gpu", "--time=1-0", "--qos=high"]
    # an emulated device holds no GPU; a pool's own partition wins over the topology's
    assert sbatch_resources(plan.pools["slow"], plan.slurm) == ["--cpus-per-task=1", "--partition=gpu", "--time=1-0"]
    for edit, key in ((lambda d: d.update(slurm={"time_limit": "soon"}), "slurm"),
                      (lambda d: d["regions"]["us"]["pools"]["fast"].update(slurm={"mem": "lots"}),
                       "regions.us.pools.fast.slurm"),
                      (lambda d: d["regions"]["us"]["pools"]["fast"].update(slurm={"extra": ["--output=x"]}),
                       "regions.us.pools.fast.slurm"),
                      (lambda d: d["regions"]["us"]["pools"]["fast"].update(slurm={"gpu": 1}),
                       "regions.us.pools.fast.slurm.gpu"),
                      (lambda d: d["autoscaler"].update(backend="pbs"), "autoscaler.backend")):
        assert error_of(tmp_path, changed(edit)).key == key


def test_the_slurm_backend_is_built_from_the_topology_or_from_launch_backend_slurm(tmp_path):
    from astraflow.config import JobConfig
    from astraflow.topology.backends import CommandBackend, LocalBackend
    from astraflow.topology.launch import make_backend

    def backend(edit, slurm=None):
        plan = resolve(load_topology(write(tmp_path, changed(edit))), "policy")
        return make_backend(plan, JobConfig(job="j"), lambda n: [], tmp_path / "logs", slurm)

    assert isinstance(backend(lambda d: None), LocalBackend)
    built = backend(lambda d: d.update(slurm={"conf": "/x/slurm.conf"}, autoscaler={"backend": "slurm"}))
    assert isinstance(built, SlurmBackend) and built.slurm.spec.conf == "/x/slurm.conf"
    assert isinstance(backend(lambda d: None, Slurm()), SlurmBackend)  # launch --backend slurm
    command = {"backend": "command", "command": {"start": "run {cmd}", "stop": "stop {node_id}"}}
    assert isinstance(backend(lambda d: d.update(autoscaler=command), Slurm()), CommandBackend)  # named: kept


def test_launch_refuses_what_slurm_jobs_cannot_be(tmp_path):
    linked = resolve(load_topology(write(tmp_path, changed(lambda d: None))), "policy")
    with pytest.raises(TopologyError) as e:
        check_slurm_launchable(linked)
    assert e.value.key == "emulate_links"
    two_hosts = changed(lambda d: (d.update(emulate_links=False),
                                   d["regions"]["us"]["pools"]["trainer"].update(hosts=["us-0", "us-1"],
                                                                                 count=2, master_port=29500)))
    with pytest.raises(TopologyError) as e:
        check_slurm_launchable(resolve(load_topology(write(tmp_path, two_hosts)), "policy"))
    assert e.value.key == "regions.us.pools.trainer.hosts"


def test_exit_codes_read_like_popen_and_never_a_false_clean_exit():
    assert exit_code("COMPLETED", 0) == 0
    assert exit_code("FAILED", 3 << 8) == 3
    assert exit_code("CANCELLED", 9) == -9  # killed by a signal
    assert exit_code("CANCELLED", 0) == -15  # cancelled before it ever ran
    assert exit_code("NODE_FAIL", 0) == -1


# -- against the cluster ------------------------------------------------------------------------------

def test_a_started_node_is_in_squeue_and_a_retired_one_leaves_on_sigterm(cluster, slurm, plan, tmp_path):
    b = SlurmBackend(slurm, lambda node: GRACEFUL, tmp_path / "logs", "job1", plan.pools, retire_timeout_s=30)
    node = plan.node_spec(plan.pools["fast"], b.next_index("fast"))
    b.start(node)
    assert b.members("fast") == ["fast-0"] and b.next_index("fast") == 1
    [job] = b.jobs()["fast-0"]
    assert job in cluster.jobs()  # queued at once, whatever the runner does
    procs = []
    b.tick(procs)  # handed to the runner's loop, which supervises it
    assert [p.node_id for p in procs] == ["fast-0"]
    wait_until(lambda: ready(procs[0]), 60, lambda: f"never ran: {slurm.states().get(job)}", interval_s=0.2)
    assert slurm.states(newer_than=time.monotonic())[job][0] == "RUNNING"
    time.sleep(2)  # (the completion log counts whole seconds)
    live = b.accounted_hours()  # while it runs: from squeue's start time
    assert live["jobs"][job]["state"] == "RUNNING" and live["pools"]["fast"]["node_hours"] >= 1 / 3600
    t0 = time.monotonic()
    b.retire("fast-0")
    assert b.members("fast") == []
    wait_until(lambda: (b.tick(procs), "fast-0" in b.exits)[1], 30, "retired node never left", interval_s=0.2)
    assert time.monotonic() - t0 < 30  # within its grace period: no scancel needed
    assert b.exits["fast-0"] == 0  # it left cleanly on SIGTERM
    assert "got SIGTERM" in procs[0].log_path.read_text()
    assert supervise(procs, 3, False) is None and procs[0].job_ids == [job]  # a retired node is not resubmitted
    assert job not in cluster.jobs()
    # Slurm's own accounting of it: one job of pool fast, with the 2 CPUs of its pool's threads
    wait_until(lambda: any(r.get("JobId") == job for r in read_jobcomp(cluster.jobcomp)), 30, "no jobcomp record")
    record = next(r for r in read_jobcomp(cluster.jobcomp) if r["JobId"] == job)
    assert record["Name"] == "job1.fast-0" and record["JobState"] == "COMPLETED" and record["ProcCnt"] == "2"
    hours = slurm_device_hours(read_jobcomp(cluster.jobcomp), plan.pools, "job1")
    assert set(hours["pools"]) == {"fast"} and hours["pools"]["fast"]["jobs"] == 1
    seconds = hours["jobs"][job]["seconds"]
    assert 2 <= seconds < 60
    assert hours["pools"]["fast"]["cpu_hours"] == pytest.approx(2 * seconds / 3600)
    assert hours["rollout"] == hours["total"] == pytest.approx(seconds / 3600)  # kind cpu, 1 device
    assert b.accounted_hours()["jobs"][job] == hours["jobs"][job]  # once it ended: from the completion log


def test_a_node_ignoring_sigterm_is_cancelled_after_its_grace_period(slurm, plan, tmp_path):
    b = SlurmBackend(slurm, lambda node: STUBBORN, tmp_path / "logs", "job2", plan.pools, retire_timeout_s=2)
    b.start(plan.node_spec(plan.pools["slow"], 0))
    procs = []
    b.tick(procs)
    wait_until(lambda: ready(procs[0]), 60, "never ran", interval_s=0.2)
    t0 = time.monotonic()
    b.retire("slow-0")
    wait_until(lambda: (b.tick(procs), "slow-0" in b.exits)[1], 60, "never cancelled", interval_s=0.2)
    assert time.monotonic() - t0 >= 2  # SIGTERM was ignored: it stayed until its grace period ran out
    assert b.exits["slow-0"] < 0  # then scancel ended it with a signal


def test_a_killed_job_is_resubmitted_and_a_fatal_exit_stops_the_run(cluster, slurm, plan, tmp_path):
    p = slurm_proc(slurm, plan.node_spec(plan.pools["fast"], 0), plan.pools["fast"], GRACEFUL, tmp_path / "logs",
                   "job3")
    p.start()
    wait_until(lambda: ready(p), 60, "never ran", interval_s=0.2)
    first = p.job_ids[0]
    assert cluster.command("scancel", "--signal=KILL", "--full", first).returncode == 0  # its job step, SIGKILLed
    wait_until(lambda: not p.alive(), 30, "still alive after SIGKILL", interval_s=0.2)
    assert p.popen.returncode < 0  # ended by a signal (Slurm reports the cancellation's)
    assert supervise([p], 3, False) is None  # resubmitted, as a local process is restarted
    assert p.restarts == 1 and len(p.job_ids) == 2 and p.job_ids[1] in cluster.jobs()
    wait_until(lambda: p.log_path.read_text().count("ready") == 2, 60, "resubmission never ran", interval_s=0.2)
    stop_processes([p], timeout=20)
    assert not p.alive() and p.popen.returncode == 0  # SIGTERM through Slurm, a clean exit

    fatal = slurm_proc(slurm, plan.node_spec(plan.pools["fast"], 1), plan.pools["fast"], FATAL, tmp_path / "logs",
                       "job3")
    fatal.start()
    wait_until(lambda: not fatal.alive(), 60, "never ended", interval_s=0.2)
    failed = supervise([fatal], 3, False)
    assert failed is not None and not failed.retriable and "bad config" in failed.cause
    assert len(fatal.job_ids) == 1


def test_a_refused_submission_is_a_backend_error_naming_the_command(slurm, plan, tmp_path):
    nowhere = replace(plan.pools["fast"], slurm=SlurmResources(partition="nosuch"))  # the cluster has "debug"
    b = SlurmBackend(slurm, lambda node: GRACEFUL, tmp_path / "logs", "job4", {"fast": nowhere})
    with pytest.raises(SlurmError) as e:
        b.start(plan.node_spec(nowhere, 0))
    assert "sbatch" in str(e.value) and "--partition=nosuch" in str(e.value) and "partition" in str(e.value).lower()
    assert b.members("fast") == []  # not a member: the autoscaler may try again
