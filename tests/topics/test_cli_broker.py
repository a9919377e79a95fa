"""`astraflow broker start|status|stop`: a detached broker that reports its ports and data dir."""

import re
import subprocess
import sys

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
