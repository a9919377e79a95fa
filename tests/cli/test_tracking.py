"""Tracking: what the sinks write, TensorBoard's and MLflow's own readers read back exactly, and
``astraflow track`` writes both from a job's ``metrics`` topic on the real broker.

The readers are the libraries' own: TensorBoard's ``EventAccumulator`` (what ``tensorboard
--logdir`` shows) and ``MlflowClient.get_metric_history`` (what ``mlflow ui`` shows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from astraflow.config import ConfigError, load_config
from astraflow.topics import Heartbeat, Metric, Producer
from astraflow.tracking import MlflowSink, Sinks, TensorBoardSink, open_sinks, tag

ROOT = Path(__file__).resolve().parents[2]

#: A job's kinds of records: per-policy trainer metrics, a RaaS node's, a policy-labelled one.
METRICS = [
    Metric("trainer.policy", "trainer.reward", 0.125, 1, 1_700_000_001.25, {}),
    Metric("trainer.policy", "trainer.reward", 0.5, 2, 1_700_000_002.5, {}),
    Metric("trainer.policy", "trainer.reward", 0.1, 3, 1_700_000_003.75, {}),
    Metric("raas-0", "raas.busy_s", 2.25, 3, 1_700_000_004.0, {"version": 2}),
    Metric("eval.solver", "eval.policy_reward", 0.75, 3, 1_700_000_005.0, {"policy": "verifier", "version": 3}),
    Metric("eval.solver", "eval.policy_reward", 0.25, 3, 1_700_000_005.5, {"policy": "solver", "version": 3}),
]


def _by_tag(metrics):
    out: dict[str, list[Metric]] = {}
    for m in metrics:
        out.setdefault(tag(m), []).append(m)
    return out


def _tensorboard(log_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """``{tag: [(step, value, wall_time)]}`` as TensorBoard itself reads the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _mlflow(uri: str, run_id: str, key: str) -> list[tuple[int, float, int]]:
    from mlflow.tracking import MlflowClient
    return sorted((m.step, m.value, m.timestamp) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_tags_are_component_and_name_with_the_policy_label():
    assert [tag(m) for m in METRICS[2:]] == ["trainer.policy/trainer.reward", "raas-0/raas.busy_s",
                                             "eval.solver/eval.policy_reward/verifier",
                                             "eval.solver/eval.policy_reward/solver"]


def test_tensorboard_reads_back_what_the_sink_wrote(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    for m in METRICS:
        sink.write(m)
    sink.close()
    read = _tensorboard(tmp_path / "tb")
    want = {t: [(m.step, float(np.float32(m.value)), m.ts) for m in ms] for t, ms in _by_tag(METRICS).items()}
    assert read == want  # TensorBoard keeps a scalar as float32, its wall time as the metric's ts


def test_mlflow_reads_back_what_the_sink_wrote(tmp_path):
    from mlflow.tracking import MlflowClient
    uri = (tmp_path / "mlruns").as_uri()
    odd = Metric("raas@0", "raas.tokens_per_s", 1e6 / 3, 4, 1_700_000_006.0, {})  # "@": not in an MLflow key
    sink = MlflowSink(uri, "arith", "run-1", tags={"astraflow.job": "arith"}, flush_every=2)  # several batches
    for m in [*METRICS, odd]:
        sink.write(m)
    sink.close()
    for key, ms in _by_tag(METRICS).items():
        assert _mlflow(uri, sink.run_id, key) == sorted((m.step, m.value, int(m.ts * 1000)) for m in ms), key
    assert _mlflow(uri, sink.run_id, "raas_0/raas.tokens_per_s") == [(4, 1e6 / 3, 1_700_000_006_000)]
    run = MlflowClient(uri).get_run(sink.run_id)
    assert (run.info.status, run.info.run_name, run.data.tags["astraflow.job"]) == ("FINISHED", "run-1", "arith")
    assert MlflowClient(uri).get_experiment(run.info.experiment_id).name == "arith"
    again = MlflowSink(uri, "arith", "run-2")  # the experiment is found, a run of its own
    again.close()
    assert again.experiment_id == sink.experiment_id and again.run_id != sink.run_id


def test_sinks_feed_every_sink_metrics_only(tmp_path):
    from astraflow.config import TrackingConfig
    with open_sinks(TrackingConfig(tensorboard=True, mlflow=True, experiment="exp"), tmp_path / "run-a", "j") as sinks:
        assert [type(s).__name__ for s in sinks.sinks] == ["TensorBoardSink", "MlflowSink"]
        sinks.write(Heartbeat("raas-0", "raas", "policy", 3))  # the launcher's feed reads control too
        for m in METRICS:
            sinks.write(m)
        mlflow = sinks.sinks[1]
    assert sinks.written == len(METRICS)
    assert set(_tensorboard(tmp_path / "run-a" / "tensorboard")) == set(_by_tag(METRICS))
    uri = (tmp_path / "run-a" / "mlruns").resolve().as_uri()
    assert mlflow.uri == uri and len(_mlflow(uri, mlflow.run_id, "trainer.policy/trainer.reward")) == 3
    assert Sinks().written == 0 and open_sinks(TrackingConfig(), tmp_path / "off", "j").sinks == []
    assert not (tmp_path / "off").exists()  # tracking off (the default) writes nothing


def _cfg(tmp_path: Path, tracking):
    data = yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text())
    data["tracking"] = tracking
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_the_tracking_section(tmp_path):
    assert not load_config(ROOT / "examples" / "arithmetic_grpo.yaml").tracking.enabled  # off by default
    t = _cfg(tmp_path, {"tensorboard": True, "mlflow": "sqlite:///x.db", "experiment": "e"}).tracking
    assert (t.tensorboard, t.mlflow, t.experiment, t.run_name, t.enabled) == (True, "sqlite:///x.db", "e", None, True)
    assert _cfg(tmp_path, {"mlflow": True}).tracking.mlflow is True


@pytest.mark.parametrize(("tracking", "key", "message"), [
    ({"tensorbord": True}, "tracking.tensorbord", "unknown key"),
    ({"tensorboard": "yes"}, "tracking.tensorboard", "expected bool"),
    ({"mlflow": 3}, "tracking.mlflow", "expected"),
    ({"mlflow": " "}, "tracking", "tracking.mlflow must be true, false or a tracking URI"),
    ({"experiment": ""}, "tracking", "tracking.experiment must be a non-empty name"),
])
def test_a_bad_tracking_section_names_the_key_and_the_file(tmp_path, tracking, key, message):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, tracking)
    assert e.value.key == key and e.value.file == str(tmp_path / "job.yaml"), e.value
    assert message in str(e.value)


def test_astraflow_track_writes_a_jobs_metrics_from_its_topic(bootstrap, job_topics, tmp_path, capsys):
    """A job as `node --topology` runs it: no launcher; the metrics on the topic, an undecodable
    record among them, the trainer's done and the final evaluation. ``track`` stops by itself."""
    from astraflow.cli import main
    job = job_topics.job
    sent = [*METRICS, Metric("eval.policy", "eval.accuracy", 0.5, 3, 1_700_000_007.0, {"heldout": "split"}),
            Metric("trainer.policy", "trainer.done", 3, 3, 1_700_000_008.0, {})]
    with Producer(bootstrap, client_id="test-track") as p:
        for m in sent[:3]:
            p.send(job_topics.metrics, m, key=m.component)
        p.send_raw(job_topics.metrics, b"{]", key=b"raas-0", headers=[("af-type", b"metric")]).get(10)
        for m in sent[3:]:
            p.send(job_topics.metrics, m, key=m.component)
        p.flush()
    run = tmp_path / "track"
    assert main(["track", "--job", job, "--bootstrap-servers", bootstrap, "--run-dir", str(run),
                 "--until-idle", "120"]) == 0
    out = capsys.readouterr().out
    assert f"track: {len(sent)} metrics written (done; trainers done: policy at version 3; 1 undecodable" in out, out
    read = _tensorboard(run / "tensorboard")
    assert read == {t: [(m.step, float(np.float32(m.value)), m.ts) for m in ms] for t, ms in _by_tag(sent).items()}

    from mlflow.tracking import MlflowClient
    uri = (run / "mlruns").resolve().as_uri()
    client = MlflowClient(uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name(job).experiment_id])
    assert (mlrun.info.run_name, mlrun.info.status, mlrun.data.tags["astraflow.source"]) == ("track", "FINISHED",
                                                                                         "astraflow track")
    for key, ms in _by_tag(sent).items():
        assert _mlflow(uri, mlrun.info.run_id, key) == sorted((m.step, m.value, int(m.ts * 1000)) for m in ms), key

    # --from-now: nothing of what the topic already holds; --until-idle ends it
    assert main(["track", "--job", job, "--bootstrap-servers", bootstrap, "--run-dir", str(tmp_path / "now"),
                 "--tensorboard", "--from-now", "--until-idle", "2"]) == 0
    assert "track: 0 metrics written (idle)" in capsys.readouterr().out
    assert not (tmp_path / "now" / "mlruns").exists()


def test_track_names_a_job_the_cluster_does_not_have(bootstrap, tmp_path, capsys):
    from astraflow.cli import main
    assert main(["track", "--job", "no-such-job-x1", "--bootstrap-servers", bootstrap, "--run-dir",
                 str(tmp_path / "t"), "--tensorboard"]) != 0
    assert "no job 'no-such-job-x1'" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()  # refused before anything was written


def test_sigterm_stops_track_with_everything_it_read_written(bootstrap, job_topics, tmp_path, monkeypatch):
    """A job still running (no trainer done): ``track`` follows it until SIGTERM, then closes its
    sinks: the count it reports is what TensorBoard's and MLflow's readers find."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    with Producer(bootstrap, client_id="test-track") as p:
        for m in METRICS:
            p.send(job_topics.metrics, m, key=m.component)
        p.flush()
    run = tmp_path / "live"
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "track", "--job", job_topics.job,
                             "--bootstrap-servers", bootstrap, "--run-dir", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # "tracking job ... into:" and a line per sink
        assert lines[0].startswith(f"tracking job {job_topics.job}"), lines
        time.sleep(3)  # it reads what the topic holds, then waits for more
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    written = int(re.search(r"track: (\d+) metrics written \(stopped\)", out).group(1))
    assert sum(len(v) for v in _tensorboard(run / "tensorboard").values()) == written
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the reader opts in to the file store as the sink did
    uri = (run / "mlruns").resolve().as_uri()
    client = MlflowClient(uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name(job_topics.job).experiment_id])
    assert mlrun.info.status == "FINISHED"
    assert sum(len(_mlflow(uri, mlrun.info.run_id, t)) for t in _by_tag(METRICS)) == written
