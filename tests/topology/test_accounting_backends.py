"""Device-hours accounting from heartbeats, and the autoscaler's backends on real processes."""

from __future__ import annotations

import shlex
import sys
import time

import pytest
import yaml

from astraflow.topics import Heartbeat
from astraflow.topology.accounting import DeviceHours, starting_heartbeat
from astraflow.topology.backends import BackendError, CommandBackend, LocalBackend
from astraflow.topology.plan import resolve
from astraflow.topology.processes import supervise
from astraflow.topology.validation import load_topology
from tests.waiting import wait_until

from .test_topology_files import changed, write


def beat(node, ts, role="raas", status="alive", policy="policy"):
    return Heartbeat(node, role, policy, 1, ts=ts, status=status)


@pytest.fixture
def plan(tmp_path):
    data = changed(lambda d: d["regions"]["us"]["pools"]["trainer"].update(device={"kind": "h100", "count": 8},
                                                                           cost_per_device_hour=2.0))
    return resolve(load_topology(write(tmp_path, data)), "policy")


def test_device_hours_per_pool_and_kind_with_cost(plan):
    h = DeviceHours(plan, max_gap_s=10)
    h.observe(starting_heartbeat("fast-0", "raas", "policy", 0.0))
    for ts in (30.0, 32.0, 34.0):  # a 30 s boot counts: the device is held while the model loads
        h.observe(beat("fast-0", ts))
    h.observe(beat("fast-0", 36.0, status="stopping"))
    h.observe(beat("fast-0", 50.0))  # after stopping: a new life begins at its first beat
    h.observe(beat("fast-0", 52.0))
    for ts in (0.0, 2.0, 100.0, 102.0):  # the 98 s gap is time the node was down
        h.observe(beat("slow-0", ts))
    # the trainer's launcher calls it "trainer", the trainer beats as trainer.<policy>: one pool
    h.observe(starting_heartbeat("trainer", "trainer", "policy", 0.0))
    h.observe(beat("trainer.policy", 360.0, role="trainer"))
    h.observe(beat("stranger", 0.0))
    h.observe(beat("stranger", 3600.0 * 0 + 5.0))
    t = h.totals()
    assert t["pools"]["fast"]["node_hours"] == pytest.approx(38 / 3600)
    assert t["pools"]["slow"]["node_hours"] == pytest.approx(4 / 3600)
    assert t["pools"]["trainer"]["device_hours"] == pytest.approx(360 * 8 / 3600)
    assert t["pools"]["trainer"]["cost"] == pytest.approx(360 * 8 / 3600 * 2.0)
    assert t["pools"]["raas"]["kind"] == "unknown"  # a node no plan knows: counted under its role
    assert t["kinds"]["h100"]["device_hours"] == pytest.approx((38 + 360 * 8) / 3600)
    assert t["kinds"]["a10"]["cost"] == pytest.approx(4 / 3600 * 1.0)
    assert t["rollout"] == pytest.approx((38 + 4 + 5) / 3600)
    assert t["total"] == pytest.approx(t["rollout"] + t["trainer"])


SLEEPER = [sys.executable, "-c", "import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\nprint('ready', flush=True)\ntime.sleep(120)"]
STUBBORN = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(120)"]


def test_local_backend_starts_and_retires_processes_through_the_runner_loop(plan, tmp_path):
    b = LocalBackend(lambda node: SLEEPER, tmp_path / "logs")
    procs = []
    node = plan.node_spec(plan.pools["fast"], b.next_index("fast"))
    b.start(node)
    assert b.members("fast") == ["fast-0"] and procs == []  # nothing happens outside the runner's thread
    b.tick(procs)
    assert [p.node_id for p in procs] == ["fast-0"] and procs[0].alive()
    assert b.next_index("fast") == 1
    wait_until(lambda: "ready" in procs[0].log_path.read_text(), 30.0, "timed out", interval_s=0.1)
    b.retire("fast-0")
    assert b.members("fast") == []
    wait_until(lambda: (b.tick(procs), "fast-0" in b.exits)[1], 30.0, "timed out", interval_s=0.1)
    assert b.exits["fast-0"] == 0  # it stopped on SIGTERM, cleanly
    assert supervise(procs, 3, False) is None and not procs[0].alive()  # a retired node is not restarted
    with pytest.raises(KeyError):
        b.retire("fast-0")


# Leaves cleanly 1.5 s after SIGTERM; like a Python node whose interpreter is shutting down by
# then, a second SIGTERM meanwhile meets the default handler and kills it (exit -15).
WINDING_DOWN = [sys.executable, "-c", "import signal, sys, time\n"
                "def stop(*_):\n    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n    time.sleep(1.5)\n"
                "    sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(120)"]


def test_the_jobs_end_does_not_signal_a_retiring_node_again(plan, tmp_path):
    """The run can end while a retired node still finishes its in-flight work: stopping the
    job waits for it instead of sending a second SIGTERM into its shutdown."""
    from astraflow.topology.processes import stop_processes

    b = LocalBackend(lambda node: WINDING_DOWN, tmp_path / "logs")
    procs = []
    b.start(plan.node_spec(plan.pools["fast"], 0))
    b.tick(procs)
    wait_until(lambda: "ready" in procs[0].log_path.read_text(), 30.0, "timed out", interval_s=0.1)
    b.retire("fast-0")
    b.tick(procs)  # SIGTERM: it starts winding down
    time.sleep(0.3)
    stop_processes(procs)  # the job ends meanwhile
    b.tick(procs)
    assert b.exits["fast-0"] == 0


def test_local_backend_kills_a_node_that_outlives_its_retire_timeout(plan, tmp_path):
    b = LocalBackend(lambda node: STUBBORN, tmp_path / "logs", retire_timeout_s=0.5)
    procs = []
    b.start(plan.node_spec(plan.pools["slow"], 0))
    b.tick(procs)
    wait_until(lambda: "ready" in procs[0].log_path.read_text(), 30.0, "timed out", interval_s=0.1)
    b.retire("slow-0")
    wait_until(lambda: (b.tick(procs), "slow-0" in b.exits)[1], 30.0, "timed out", interval_s=0.1)
    assert b.exits["slow-0"] == -9


def test_command_backend_fills_the_templates_and_reports_failures(plan, tmp_path):
    script = tmp_path / "scheduler.py"
    script.write_text("import json, sys\nout, rest = sys.argv[1], sys.argv[2:]\n"
                      "open(out, 'a').write(json.dumps(rest) + '\\n')\n"
                      "sys.exit(3 if rest[0] == 'stop' and rest[1].startswith('slow') else 0)\n")
    log = tmp_path / "calls.jsonl"
    node_cmd = ["astraflow", "node", "--role", "raas", "--set", "rollout.device.slowdown=2.0", "--note", "a b"]
    b = CommandBackend(f"{sys.executable} {script} {log} start {{node_id}} {{host}} {{address}} {{cmd}}",
                       f"{sys.executable} {script} {log} stop {{node_id}} {{pool}}", lambda node: node_cmd, job="j")
    b.start(plan.node_spec(plan.pools["slow"], 0))
    b.start(plan.node_spec(plan.pools["fast"], 0))
    calls = [yaml.safe_load(line) for line in log.read_text().splitlines()]
    assert calls[0] == ["start", "slow-0", "eu-0", "10.0.0.9", shlex.join(node_cmd)]  # {cmd}: one word
    b.retire("fast-0")
    assert b.members("fast") == [] and b.members("slow") == ["slow-0"]
    with pytest.raises(BackendError, match=r"stop slow-0: .* exited with 3"):
        b.retire("slow-0")
    assert b.members("slow") == ["slow-0"]  # still running as far as anyone knows
    # at the end of the job every member is retired; a failure is reported, not raised
    b.start(plan.node_spec(plan.pools["fast"], b.next_index("fast")))
    assert b.retire_all() == ["slow-0"]
    assert b.members("fast") == [] and [c[:2] for c in map(yaml.safe_load, log.read_text().splitlines())][-2:] == [
        ["stop", "slow-0"], ["stop", "fast-1"]]
