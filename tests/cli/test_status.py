"""``astraflow status`` tells the truth, read from a job's topics on the real broker: an unknown
job, every policy of a multi-policy job, the trainers' whole time, done and failed jobs, ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from astraflow.status import StatusError, format_status, job_status
from astraflow.topics import Heartbeat, JobTopics, Metric, Producer, ensure_topics


@pytest.fixture
def two_policy_job(bootstrap):
    topics = JobTopics(job=f"st-{uuid.uuid4().hex[:8]}", policies=("solver", "verifier"), task_partitions=2)
    ensure_topics(bootstrap, topics.specs())
    p = Producer(bootstrap, client_id="test-status")
    yield topics, p
    p.close(timeout=5)


def _metric(p: Producer, topics: JobTopics, component: str, name: str, value: float, step: int) -> None:
    p.send(topics.metrics, Metric(component, name, value, step, time.time(), {}), key=component)


def _beat(p: Producer, topics: JobTopics, node: str, policy: str, **kw) -> None:
    p.send(topics.control, Heartbeat(node, kw.pop("role", "raas"), policy, 3, ts=time.time(), **kw), key=node)


def test_an_unknown_job_says_so(bootstrap, two_policy_job):
    topics, _ = two_policy_job
    s = job_status(bootstrap, "no-such-job-" + uuid.uuid4().hex[:6])
    assert s["state"] == "unknown" and topics.job in s["known_jobs"]
    assert "unknown at" in format_status(s) and "not started" not in format_status(s)
    assert job_status(bootstrap, topics.job)["state"] == "not started"


def test_every_policy_shows_and_the_trainer_time_is_the_whole_sum(bootstrap, two_policy_job):
    topics, p = two_policy_job
    # more metrics than any tail: the sum must cover all of them (what summary.json sums)
    for i in range(6000):
        _metric(p, topics, "trainer.solver", "trainer.train_s", 0.25, i // 100)
    for i in range(10):
        _metric(p, topics, "trainer.verifier", "trainer.train_s", 0.5, i)
        _metric(p, topics, "trainer.verifier", "trainer.wait_s", 0.1, i)
    _beat(p, topics, "raas-solver-0", "solver")
    _beat(p, topics, "raas-verifier-0", "verifier")
    p.flush(timeout=30)
    s = job_status(bootstrap, topics.job)
    assert s["state"] == "running" and s["policies"] == ["solver", "verifier"]
    assert set(s["task_lag"]) == {"solver", "verifier"}
    assert s["trainer_train_s"] == {"solver": 1500.0, "verifier": 5.0} and s["trainer_train_s_total"] == 1505.0
    assert s["trainer_wait_s"] == {"solver": 0.0, "verifier": 1.0}
    text = format_status(s)
    assert "policy solver:" in text and "policy verifier:" in text and "task lag" in text
    only = job_status(bootstrap, topics.job, ("verifier",))
    assert only["policies"] == ["verifier"] and set(only["task_lag"]) == {"verifier"}
    with pytest.raises(StatusError, match="job .* has no such policy \\(its policies: solver, verifier\\)"):
        job_status(bootstrap, topics.job, ("policy",))

    # one trainer done: still running; both done: done, and no task lag to mislead
    _metric(p, topics, "trainer.solver", "trainer.done", 60, 60)
    p.flush(timeout=30)
    assert job_status(bootstrap, topics.job)["state"] == "running"
    _metric(p, topics, "trainer.verifier", "trainer.done", 10, 10)
    p.flush(timeout=30)
    s = job_status(bootstrap, topics.job)
    assert s["state"] == "done" and s["done"] == {"solver": 60, "verifier": 10} and s["task_lag"] is None
    text = format_status(s)
    assert text.startswith(f"job {topics.job}: done") and "done at version 60" in text and "task lag" not in text


def test_a_failed_component_and_the_json_for_scripts(bootstrap, two_policy_job):
    topics, p = two_policy_job
    _beat(p, topics, "raas-solver-0", "solver", status="failed", error="16 episodes in a row failed ... ValueError")
    p.flush(timeout=30)
    r = subprocess.run([sys.executable, "-m", "astraflow", "status", "--bootstrap-servers", bootstrap,
                        "--job", topics.job, "--json"], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["state"] == "failed" and s["failed"][0]["node"] == "raas-solver-0"
    assert "ValueError" in s["failed"][0]["error"]
    r = subprocess.run([sys.executable, "-m", "astraflow", "status", "--bootstrap-servers", bootstrap,
                        "--job", "nosuch-" + topics.job], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and f"job nosuch-{topics.job}: unknown at {bootstrap}" in r.stdout, r.stdout
