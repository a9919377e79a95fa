"""`astraflow broker start|status|stop`: a detached broker that reports its ports and data dir."""

import re
import subprocess
import sys

import pytest
from kafka import KafkaAdminClient

from astraflow.topics.broker import pid_alive


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "astraflow", "broker", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_broker_start_status_stop(tmp_path):
    state = ["--state-dir", str(tmp_path / "state")]
    started = _cli("start", "--port", "0", "--heap", "256m", *state)
    assert started.returncode == 0, started.stderr
    m = re.search(r"pid=(\d+) bootstrap=(\S+) controller_port=(\d+) data_dir=(\S+)", started.stdout)
    assert m, started.stdout
    pid, bootstrap, data_dir = int(m.group(1)), m.group(2), m.group(4)
    assert data_dir == str(tmp_path / "state" / "data")
    try:
        status = _cli("status", *state)
        assert status.returncode == 0 and f"bootstrap={bootstrap}" in status.stdout
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)  # a real broker answers
        admin.list_topics()
        admin.close()
        again = _cli("start", "--port", "0", *state)
        assert "already running" in again.stdout
    finally:
        stopped = _cli("stop", *state)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not pid_alive(pid)  # no orphan JVM
    assert _cli("status", *state).returncode == 1


@pytest.mark.slow
def test_broker_start_nodes_3_runs_a_cluster_and_stops_every_node(tmp_path):
    state = ["--state-dir", str(tmp_path / "state")]
    started = _cli("start", "--nodes", "3", "--port", "0", "--heap", "384m", *state, timeout=300)
    assert started.returncode == 0, started.stderr
    bootstrap = re.search(r"3-node cluster bootstrap=(\S+)", started.stdout).group(1)
    pids = [int(p) for p in re.findall(r"node \d up: pid=(\d+)", started.stdout)]
    assert len(pids) == 3 and len(bootstrap.split(",")) == 3
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        brokers = admin.describe_cluster()["brokers"]
        admin.close()
        assert sorted(b["broker_id"] for b in brokers) == [1, 2, 3]
        assert _cli("status", *state).stdout.count(" up: ") == 3
    finally:
        stopped = _cli("stop", *state)
    assert stopped.returncode == 0
    assert not any(pid_alive(p) for p in pids)
