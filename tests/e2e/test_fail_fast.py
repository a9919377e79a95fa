"""Deterministic failures stop the job at once, with their cause as the last line on screen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from astraflow.errors import EXIT_FATAL

BAD_ROWS = '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": 4,\n{"prompt": "3+3=", "answer": "6"}\n'


def _astraflow(*args: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run the CLI in its own process group, so a timeout also ends the components it started."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    p = subprocess.Popen([sys.executable, "-m", "astraflow", *args], text=True, stdin=subprocess.DEVNULL,
                         start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _last_line(out: str) -> str:
    return [ln for ln in out.splitlines() if ln.strip()][-1]


@pytest.fixture
def bad_data_config(make_job_config, tmp_path):
    (tmp_path / "d.jsonl").write_text(BAD_ROWS)
    return make_job_config({"data": {"source": str(tmp_path / "d.jsonl")}}, name="failfast")


def test_bad_row_stops_the_run_with_its_cause_as_the_last_line(bootstrap, bad_data_config, tmp_path):
    from astraflow.models.bootstrap import ensure_tiny_model
    ensure_tiny_model()  # built once per machine; not part of what this test bounds
    # Before: 6 in-process retries x 4 process restarts (minutes), then a traceback.
    r = _astraflow("run", bad_data_config.source, "--bootstrap-servers", bootstrap, "--quiet",
                   "--run-dir", str(tmp_path / "run"), timeout=30)
    assert "Traceback" not in r.stdout, r.stdout
    assert "d.jsonl:2: not JSON" in _last_line(r.stdout), r.stdout
    assert r.returncode == EXIT_FATAL, r.stdout


@pytest.mark.slow
def test_fatal_component_is_not_restarted_and_stops_the_job(bootstrap, bad_data_config, tmp_path, monkeypatch):
    """The path a preflight cannot cover: the dataflow process itself meets the bad row."""
    import astraflow.checks
    from astraflow.launcher import run_job
    from astraflow.topology.processes import RunFailed
    monkeypatch.setattr(astraflow.checks, "check_data", lambda cfg: "not checked")
    run_dir = tmp_path / "run"
    with pytest.raises(RunFailed) as e:
        run_job(bad_data_config, bootstrap=bootstrap, run_dir=run_dir, progress=False, timeout_s=300)
    assert not e.value.retriable and e.value.node_id == "dataflow"
    assert "d.jsonl:2: not JSON" in e.value.cause and str(e.value) == f"dataflow: {e.value.cause}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] == {} and "d.jsonl:2: not JSON" in summary["error"]
    # The component ended with the cause as its last line (and the fatal exit code the launcher read).
    last = _last_line((run_dir / "logs" / "dataflow.log").read_text())
    assert last.startswith("astraflow node dataflow: fatal: ") and "d.jsonl:2: not JSON" in last


def test_launcher_restarts_crashes_but_not_fatal_exits(tmp_path):
    from astraflow.topology.processes import Proc, supervise

    def proc(name: str, code: int, line: str) -> Proc:
        p = Proc("raas", name, [sys.executable, "-c", f"import sys; print({line!r}, file=sys.stderr); sys.exit({code})"],
                 tmp_path / f"{name}.log")
        p.start()
        p.popen.wait()
        return p

    crashed = proc("raas-0", 1, "Traceback: a broker blip")
    assert supervise([crashed], max_restarts=3, progress=False) is None
    assert crashed.restarts == 1
    crashed.popen.wait()

    fatal = proc("raas-1", EXIT_FATAL, "astraflow node raas-1: fatal: model.path /m: no such directory")
    first = fatal.popen
    failure = supervise([fatal], max_restarts=3, progress=False)
    assert failure is not None and not failure.retriable
    assert (failure.node_id, failure.cause) == ("raas-1", "model.path /m: no such directory")
    assert fatal.restarts == 0 and fatal.popen is first


def test_a_failed_heartbeat_stops_the_run_like_a_fatal_exit(tmp_path):
    """A component the launcher does not own (another host's) says on control that it stopped."""
    from astraflow.launcher import _failure_reported
    from astraflow.topics import Heartbeat
    from astraflow.topology.processes import Proc
    procs = [Proc("raas", "raas-0", [], tmp_path / "raas-0.log")]
    assert _failure_reported(Heartbeat("raas-0", "raas", "policy", 2, ts=1.0), procs) is None
    failure = _failure_reported(Heartbeat("raas-0", "raas", "policy", 2, ts=1.0, status="failed",
                                          error="16 episodes in a row failed"), procs)
    assert not failure.retriable and str(failure) == "raas-0: 16 episodes in a row failed"
    assert failure.log_path == tmp_path / "raas-0.log"
    remote = _failure_reported(Heartbeat("raas-eu-3", "raas", "policy", 2, status="failed", error="x"), procs)
    assert remote.node_id == "raas-eu-3" and remote.log_path is None


def test_config_check_reads_every_row(bad_data_config):
    r = _astraflow("config", "check", bad_data_config.source, timeout=60)
    assert r.returncode == EXIT_FATAL, r.stdout
    assert "Traceback" not in r.stdout
    assert "d.jsonl:2: not JSON" in _last_line(r.stdout)


def test_config_check_counts_rows_to_skip(make_job_config, tmp_path):
    (tmp_path / "d.jsonl").write_text(BAD_ROWS)
    cfg = make_job_config({"data": {"source": str(tmp_path / "d.jsonl"), "on_bad_row": "skip"}})
    r = _astraflow("config", "check", cfg.source, timeout=60, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert "d.jsonl: 2 rows, 1 bad rows to skip into the dlq (first: " in r.stderr and "d.jsonl:2: not JSON" in r.stderr


def test_config_check_checks_the_model_path(make_job_config, tmp_path):
    missing = make_job_config({"model": {"path": str(tmp_path / "nowhere")}})
    r = _astraflow("config", "check", missing.source, timeout=60)
    assert r.returncode == EXIT_FATAL and "Traceback" not in r.stdout, r.stdout
    assert f"model.path {tmp_path / 'nowhere'}: no such directory" in _last_line(r.stdout)

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    bad = make_job_config({"model": {"path": str(broken)}})
    r = _astraflow("config", "check", bad.source, timeout=60)
    assert r.returncode == EXIT_FATAL and "config.json does not load" in _last_line(r.stdout), r.stdout


def test_config_check_passes_a_good_config(make_job_config, tmp_path):
    (tmp_path / "ok.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    good = make_job_config({"data": {"source": str(tmp_path / "ok.jsonl")}})
    r = _astraflow("config", "check", good.source, timeout=60, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["source"] == str(tmp_path / "ok.jsonl")
    assert "ok.jsonl: 2 rows; 1 held out for evaluation" in r.stderr and _last_line(r.stderr).endswith(": valid")


def test_skip_sends_bad_rows_to_the_dlq_and_publishes_the_rest(bootstrap, make_job_config, tmp_path):
    import time

    from astraflow.actors.dataflow import DataflowActor
    from astraflow.actors.signing import with_run_keys
    from astraflow.topics import DeadLetter, Prompt, ensure_topics, job_topics
    from astraflow.topics.replay import read_topic

    (tmp_path / "d.jsonl").write_text(BAD_ROWS)
    (tmp_path / "e.jsonl").write_text('{"prompt": "9+9=", "answer": "18"}\n')  # held out apart: both rows train
    cfg = with_run_keys(make_job_config({"data": {"source": str(tmp_path / "d.jsonl"), "on_bad_row": "skip"},
                                         "eval": {"data": str(tmp_path / "e.jsonl")}}), tmp_path)
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    ref = DataflowActor.start(None, "dataflow", cfg, bootstrap)
    try:
        deadline = time.monotonic() + 120
        prompts: list = []
        while not prompts and time.monotonic() < deadline and ref.is_alive():
            prompts = [m for _, _, m in read_topic(bootstrap, topics.prompts) if isinstance(m, Prompt)]
    finally:
        if ref.is_alive():
            ref.stop()
    assert [p.text for p in prompts] == ["1+1=", "3+3="]
    [letter] = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
    assert (letter.source_topic, letter.offset) == (f"file:{tmp_path / 'd.jsonl'}", 2)
    assert "d.jsonl:2: not JSON" in letter.error


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGHUP"])
def test_sigterm_stops_every_component_of_the_run(make_job_config, tmp_path, sig):
    """systemd, CI runners and `kill` send SIGTERM, a closed terminal SIGHUP: the run stops its
    components as on Ctrl-C (before, they were re-parented to PID 1 and a RaaS node retried the
    broker for minutes)."""
    import re
    import time

    import psutil
    cfg = make_job_config({"trainer": {"steps": 200}}, name="sigterm")
    # the run gets the signal's default disposition, as from a terminal: under `nohup` the test
    # runner ignores SIGHUP, an ignored signal stays ignored across exec, and a run that inherits
    # that keeps going on purpose (astraflow/launcher.py); a handler of ours is reset by the exec
    previous = signal.signal(sig, lambda *_: None)
    try:
        # its own embedded broker, whose address the run prints for `astraflow status` and other clients
        p = subprocess.Popen([sys.executable, "-m", "astraflow", "run", cfg.source,
                              "--run-dir", str(tmp_path / "run")], text=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        signal.signal(sig, previous)
    try:
        launcher = psutil.Process(p.pid)
        deadline = time.monotonic() + 120
        def nodes() -> list:
            out = []
            for c in launcher.children():
                try:
                    if "node" in c.cmdline():
                        out.append(c)
                except psutil.Error:  # a short-lived child (the broker's storage format) exited meanwhile
                    pass
            return out
        while len(nodes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        children = nodes()
        assert len(children) == 3, children  # dataflow, trainer, raas-0
        time.sleep(3)  # the run under way
        p.send_signal(sig)
        out, _ = p.communicate(timeout=90)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    assert p.returncode == 130, out
    assert "interrupted after" in out and "everything stopped" in out, out
    assert re.search(r"^kafka: 127\.0\.0\.1:\d+ \(embedded; its log: .*/run/kafka/server\.log\)$", out, re.M), out
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, [c.pid for c in alive]


ALWAYS_FAILS = '''
from astraflow.workflows.api import workflow


@workflow("test_reward_breaks", roles=("solver",))
def episode(ep):
    """Generates, then scores with a reward that cannot read the answer (a user bug)."""
    ep.roles["solver"].generate([ep.encode(ep.prompt)] * ep.n_samples)
    raise ValueError(f"cannot score answer {ep.answer!r}: expected a fraction")
'''


@pytest.mark.slow
def test_deterministic_episode_errors_stop_the_run_and_lose_no_task(bootstrap, make_job_config, tmp_path):
    """Before, a RaaS node logged `episode … failed` forever and the job sat at 0/N."""
    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.topics import Heartbeat, Task, TrajectoryGroup, job_topics
    from astraflow.topics.replay import read_topic
    ensure_tiny_model()
    # the module sits beside the config file: found there, without PYTHONPATH
    (tmp_path / "breaking_workflows.py").write_text(ALWAYS_FAILS)
    cfg = make_job_config({"workflow": {"name": "test_reward_breaks", "module": "breaking_workflows"},
                           "rollout": {"max_episode_failures": 6}}, name="epfail")
    r = _astraflow("run", cfg.source, "--bootstrap-servers", bootstrap, "--quiet", "--run-dir", str(tmp_path / "run"),
                   timeout=400, cwd="/")
    assert "Traceback" not in r.stdout, r.stdout
    last = _last_line(r.stdout)
    assert r.returncode == EXIT_FATAL, r.stdout
    assert last.startswith("astraflow: error: raas-0: ") and "episodes in a row failed" in last, r.stdout
    assert "ValueError: cannot score answer" in last and "rollout.max_episode_failures: 6" in last, r.stdout
    topics = job_topics(cfg)
    # the node said so on control (what a launcher that does not own its process stops on)
    [beat] = [m for _, _, m in read_topic(bootstrap, topics.control)
              if isinstance(m, Heartbeat) and m.status == "failed"]
    assert beat.node_id == "raas-0" and "ValueError: cannot score answer" in beat.error
    # nothing lost: every task below the group's committed offset has its (failed) group; the
    # poll that crossed the bound stayed uncommitted, for a fixed job to redo
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    group = topics.rollout_group(cfg.policy)
    committed = {tp.partition: o.offset for tp, o in admin.list_group_offsets(group).get(group, {}).items()}
    admin.close()
    tasks = [(p, o, m) for p, o, m in read_topic(bootstrap, topics.tasks(cfg.policy)) if isinstance(m, Task)]
    groups = {m.task_id: m for _, _, m in read_topic(bootstrap, topics.trajectories) if isinstance(m, TrajectoryGroup)}
    answered = [m.task_id for p, o, m in tasks if o < committed.get(p, 0)]
    pending = [m.task_id for p, o, m in tasks if o >= committed.get(p, 0)]
    assert answered and pending, (committed, len(tasks))
    assert all(t in groups and groups[t].status == "failed" for t in answered)
    assert not any(t in groups for t in pending)
