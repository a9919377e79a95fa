"""A job's processes end with it: an orphaned component stops on its own, and the embedded
broker's death stops the run with the broker log's path as the last line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

PARENT = '''
import sys, time
from pathlib import Path
from astraflow.config import load_config
from astraflow.topology.processes import Proc, node_command
cfg = load_config(sys.argv[1])
run_dir = Path(sys.argv[3])
p = Proc("dataflow", "dataflow", node_command("dataflow", cfg, sys.argv[2], run_dir, "dataflow", []),
         run_dir / "dataflow.log")
p.start()
print(p.popen.pid, flush=True)
time.sleep(600)
'''


def _kill_group(pid: int) -> None:
    """Whatever of a test's process group is left (nothing, when the test passed)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_an_orphaned_component_stops_on_its_own(bootstrap, make_job_config, tmp_path):
    """Its launcher SIGKILLed (no chance to stop anything), a component notices it was re-parented
    and stops within ORPHAN_GRACE_S instead of working on for a job nobody runs."""
    from astraflow.topics import ensure_topics, job_topics
    from astraflow.topology.processes import ORPHAN_GRACE_S
    cfg = make_job_config(name="orphan")
    ensure_topics(bootstrap, job_topics(cfg).specs())
    parent = subprocess.Popen([sys.executable, "-c", PARENT, cfg.source, bootstrap, str(tmp_path / "run")],
                              stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        log = tmp_path / "run" / "dataflow.log"
        # under way: it has logged (its signal handlers and the launcher watch are set up by then)
        _wait_for(lambda: log.exists() and "INFO" in log.read_text(), 120, "the component never started")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        child.wait(timeout=ORPHAN_GRACE_S + 10)  # psutil.TimeoutExpired: still running
    finally:
        _kill_group(parent.pid)
    assert f"its launcher (pid {parent.pid}) is gone; stopping" in log.read_text()


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running: not gone, not exited (a zombie an orphan's new parent has not reaped)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # exited meanwhile
        return []


def _run(cfg, tmp_path) -> tuple[subprocess.Popen, list[psutil.Process], psutil.Process]:
    """``astraflow run`` with its own broker, once its three components are up: (launcher, components, broker)."""
    p = subprocess.Popen([sys.executable, "-m", "astraflow", "run", cfg.source, "--run-dir", str(tmp_path / "run")],
                         text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    launcher = psutil.Process(p.pid)
    nodes = lambda: [c for c in launcher.children() if "node" in _cmdline(c)]  # noqa: E731
    try:
        _wait_for(lambda: len(nodes()) == 3, 180, "the run's components did not start")
        [broker] = [c for c in launcher.children() if "kafka.Kafka" in _cmdline(c)]
    except BaseException:
        _kill_group(p.pid)
        raise
    return p, nodes(), broker


@pytest.mark.slow
def test_killing_the_launcher_leaves_no_component_running(make_job_config, tmp_path):
    from astraflow.topology.processes import ORPHAN_GRACE_S
    p, nodes, broker = _run(make_job_config({"trainer": {"steps": 200}}, name="orphans"), tmp_path)
    try:
        time.sleep(3)
        p.kill()
        p.communicate()
        deadline = time.monotonic() + ORPHAN_GRACE_S + 10
        while _running([*nodes, broker]) and time.monotonic() < deadline:
            time.sleep(0.5)
        alive = _running([*nodes, broker])
    finally:
        _kill_group(p.pid)
    assert not alive, [(c.pid, _cmdline(c)[:6]) for c in alive]


@pytest.mark.slow
def test_the_broker_dying_stops_the_run_with_its_log_as_the_last_line(make_job_config, tmp_path):
    p, nodes, broker = _run(make_job_config({"trainer": {"steps": 200}}, name="brokerdies"), tmp_path)
    try:
        time.sleep(3)
        broker.kill()
        out, _ = p.communicate(timeout=180)
    except BaseException:
        _kill_group(p.pid)
        raise
    assert "Traceback" not in out, out
    last = [ln for ln in out.splitlines() if ln.strip()][-1]
    assert last.startswith("astraflow: error: kafka: the embedded Kafka broker (pid ") and \
        last.endswith(f"its log: {tmp_path / 'run' / 'kafka' / 'server.log'}"), out
    assert p.returncode == 1, out
    time.sleep(1)
    assert not _running(nodes), [c.pid for c in _running(nodes)]


def test_a_dead_broker_is_the_cause_of_a_failed_client_call(tmp_path):
    """Before, the launcher printed a raw traceback at ensure_topics, naming no log."""
    from astraflow.launcher import _broker_watched, broker_failure
    from astraflow.topics import EmbeddedBroker, JobTopics, ensure_topics
    from astraflow.topology.processes import RunFailed
    broker = EmbeddedBroker(tmp_path / "kafka", heap="256m").start()
    try:
        assert broker_failure(broker) is None and broker_failure(None) is None
        os.kill(broker.pid, signal.SIGKILL)
        _wait_for(lambda: broker.exit_code() is not None, 30, "the broker did not die")
        failure = broker_failure(broker)
        assert failure is not None and failure.log_path == tmp_path / "kafka" / "server.log"
        assert str(failure).endswith(f"exited with code -9; its log: {tmp_path / 'kafka' / 'server.log'}")
        called = []
        with pytest.raises(RunFailed, match="its log: .*/kafka/server.log$"):
            with _broker_watched(broker):  # no client call waits on a broker known to be dead
                called.append(ensure_topics(broker.bootstrap_servers, JobTopics(job="gone").specs(), timeout=5))
        assert not called
    finally:
        broker.stop()


def test_only_the_launcher_that_started_a_component_is_watched():
    """A command that inherited the variable from a component (a backend's start command that
    runs a detached node) is not that component's child: nothing to watch there."""
    from astraflow.topology.processes import LAUNCHER_PID_ENV
    code = "from astraflow.topology.processes import watch_launcher; print(watch_launcher('x'))"

    def watched(pid: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != LAUNCHER_PID_ENV}
        if pid is not None:
            env[LAUNCHER_PID_ENV] = pid
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=120).stdout.strip()

    assert watched(str(os.getpid())) == "True"  # its parent: watched
    assert watched(str(os.getppid())) == "False"  # alive, but not its parent
    assert watched(None) == "False"  # started by hand
