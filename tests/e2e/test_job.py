"""The whole job, end to end, on the real broker: separate processes, only Kafka between them."""

from __future__ import annotations

import base64
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.chaos.invariants import audit
from astraflow.topics.replay import read_topic
from astraflow.launcher import run_job
from astraflow.topics import DeadLetter, Producer, SnapshotRequest, ensure_topics, job_topics

pytestmark = [pytest.mark.slow, pytest.mark.core]


def _inject_bad_records(bootstrap, topics, policy):
    """Garbage on the task, trajectory, control and metrics topics before the job starts: must
    reach the DLQ (control is read by the trainer, metrics by the launcher: once, each of
    those stopped its reader)."""
    ensure_topics(bootstrap, topics.specs())
    p = Producer(bootstrap, client_id="vandal")
    p.send_raw(topics.tasks(policy), b"\x00garbage", key=b"bad-task", headers=[("af-type", b"task")]).get(10)
    p.send_raw(topics.trajectories, b'{"task_id": 1}', key=b"bad-traj",
               headers=[("af-type", b"trajectory-group"), ("af-schema", b"7")]).get(10)
    p.send_raw(topics.control, b"{]", key=b"bad-control").get(10)
    p.send_raw(topics.metrics, b"{]", key=b"bad-metric", headers=[("af-type", b"metric")]).get(10)
    p.close()


@pytest.fixture(scope="module")
def finished_run(bootstrap, tmp_path_factory):
    """One short async run shared by the assertions below."""
    from .conftest import ROOT, SMALL, _merge  # noqa: F401 - module-scoped twin of make_job_config
    import uuid

    import yaml

    from astraflow.config import load_config
    tmp = tmp_path_factory.mktemp("e2e")
    data = _merge(yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text()), SMALL)
    data.update(job=f"e2e-{uuid.uuid4().hex[:8]}", run_dir=str(tmp / "runs"))
    data["trainer"]["steps"] = 6
    data["trainer"]["snapshot_every"] = 4  # scheduled snapshots at 0 and 4 only
    data["trainer"]["publish_dtype"] = "bfloat16"  # as GPU engines hold weights: sparse deltas
    data["audit"] = {"every_versions": 2}  # the running job audits itself too: no false alarm mid-run
    data["tracking"] = {"tensorboard": True, "mlflow": True}  # the launcher feeds both sinks
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    topics = job_topics(cfg)
    _inject_bad_records(bootstrap, topics, cfg.policy)
    # a node's snapshot request (what a RaaS node sends when deltas fail): the trainer must answer
    p = Producer(bootstrap, client_id="test-node")
    p.send_sync(topics.control, SnapshotRequest(cfg.policy, "raas-x", 0, "test: corrupt delta", 0.0), key=cfg.policy)
    p.close()
    summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp / "run", progress=False, timeout_s=600)
    return cfg, topics, summary, tmp / "run"


def test_every_task_once_no_group_twice_staleness_bounded(finished_run, bootstrap):
    cfg, topics, summary, _ = finished_run
    report = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations
    assert report.batches == cfg.trainer.steps
    assert report.batched_groups == cfg.trainer.steps * cfg.dataflow.groups_per_batch
    assert report.tasks >= report.batched_groups
    assert report.max_staleness_seen <= cfg.effective_staleness
    assert summary["steps_trained"] == cfg.trainer.steps


def test_the_run_audited_itself_while_running_and_at_the_end(finished_run):
    cfg, _, summary, run_dir = finished_run
    audit = summary["audit"]
    assert audit["ok"] is True and audit["final"]["ok"] and audit["final"]["violations"] == []
    assert audit["final"]["counts"]["policy"]["batches"] == cfg.trainer.steps
    during = audit["during"]
    assert during and all(v["ok"] and not v["final"] for v in during), during
    assert all(v["version"] >= 2 for v in during) and len(during) <= cfg.trainer.steps // 2
    assert json.loads((run_dir / "summary.json").read_text())["audit"] == audit


def test_weights_travel_as_sparse_bf16_deltas(finished_run):
    _, _, summary, _ = finished_run
    assert 0 < summary["weights_delta_changed_frac_mean"] < 1
    assert summary["weights_delta_bytes_mean"] < summary["weights_snapshot_bytes_mean"]


def test_trainer_answers_a_snapshot_request_with_an_extra_snapshot(finished_run):
    cfg, _, _, run_dir = finished_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r["name"] == "trainer.snapshot_requests" and r.get("label.node") == "raas-x" for r in rows)
    snapshots = {r["step"] for r in rows if r["name"] == "weights.snapshot_bytes"}
    scheduled = {v for v in range(cfg.trainer.steps + 1) if v % cfg.trainer.snapshot_every == 0}
    assert snapshots - scheduled  # an off-schedule snapshot answered the request


def test_every_announcement_is_signed_by_the_key_the_run_made_and_none_was_refused(finished_run, bootstrap):
    """No key configured: `astraflow run` made the policy's pair in the run dir, the trainer
    signed with it, and the nodes, the evaluator and the dataflow refused nothing."""
    from kafka import KafkaConsumer, TopicPartition

    from astraflow.actors.signing import run_key_paths
    from astraflow.weights.signing import AnnouncementVerifier, load_public_key
    cfg, topics, _, run_dir = finished_run
    verifier = AnnouncementVerifier(load_public_key(run_key_paths(run_dir, cfg.policy)[1]))
    tp = TopicPartition(topics.versions, 0)
    kc = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    kc.assign([tp])
    kc.seek_to_beginning(tp)
    records, end = [], kc.end_offsets([tp])[tp]
    while kc.position(tp) < end:
        records += kc.poll(timeout_ms=2000).get(tp, [])
    kc.close()
    assert len(records) > cfg.trainer.steps
    for r in records:
        verifier.check(r.topic, r.value, r.headers)  # raises for any unsigned or foreign one
    letters = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
    assert not [d for d in letters if d.source_topic == topics.versions]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["name"].endswith("versions_rejected")]


def test_the_trainer_node_runs_at_the_configured_niceness(finished_run):
    cfg, _, _, run_dir = finished_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ready = [r for r in rows if r["name"] == "trainer.rank_ready"]
    assert cfg.trainer.cpu_nice > 0 and ready  # the demo config sets it; the nodes start at this process's
    assert {r["label.nice"] for r in ready} == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + cfg.trainer.cpu_nice)}
    # ...but the weight publisher's threads (its own and its producer's) keep the node's start value:
    # the next batch's rollout waits for the weights they send
    lead = [r for r in ready if "label.publisher_nice" in r]
    assert [(r["label.publisher_nice"], r["label.publisher_threads"]) for r in lead] == \
        [(os.getpriority(os.PRIO_PROCESS, 0), 2)]


def test_the_evaluator_runs_at_its_configured_niceness(finished_run):
    cfg, _, _, run_dir = finished_run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["name"] == "eval.accuracy"]
    assert cfg.eval.cpu_nice > 0 and evals
    assert {r["label.nice"] for r in evals} == {min(19, os.getpriority(os.PRIO_PROCESS, 0) + cfg.eval.cpu_nice)}


def test_the_benchmarks_critical_path_reads_every_stage_of_a_real_run(finished_run, bootstrap):
    """benchmarks/critical_path.py on this run's own records: one row per steady-state batch, each
    stage in causal order (a stage's end is never before its start, up to the records' 1 ms grain),
    so each batch's path is at least its own rollout. Checked per batch, then summarized. (The old
    check, median path >= median rollout - 4 ms, failed once at 0.0246 vs 0.0409: the median is
    monotone, so some batch had read a publish stage <= -13 ms, a hand-off stamped after its
    announcement, which the niced trainer thread can do; critical_path.py bounds it by that.)"""
    from statistics import median

    from astraflow.benchmarks.critical_path import PATH_STAGES, STAGES, batch_paths, summarize
    cfg, _, _, run_dir = finished_run
    rows = batch_paths(bootstrap, cfg, run_dir)
    assert [r["step"] for r in rows] == list(range(3, cfg.trainer.steps))
    grain = 0.001 * 3  # schedule, to_rollout and batch may each read 1 ms below 0 (the records' grain)
    for r in rows:
        # the bound holds on the tokens' versions; the scheduled version may be older (a task
        # scheduled at v can roll out on v+1 weights and be trained at step v+1+staleness)
        assert r["version"] <= r["step"] and r["step"] - cfg.effective_staleness <= r["token_version"] <= r["step"], r
        assert 0 <= r["publish_s"] < 60, r
        for stage in ("schedule_s", "to_rollout_s", "rollout_s", "batch_s"):
            assert -0.001 <= r[stage] < 60, (stage, r)
        assert r["path_s"] == pytest.approx(sum(r[s] for s in PATH_STAGES)), r
        assert r["path_s"] >= r["rollout_s"] - grain and r["rollout_s"] > 0, r
    summary = summarize(rows)
    assert summary["batches"] == len(rows) and set(STAGES) < set(summary)
    assert summary["path_s"] == median(r["path_s"] for r in rows)
    assert summary["rollout_s"] == median(r["rollout_s"] for r in rows)


def test_run_directory_has_summary_metrics_and_plot(finished_run):
    cfg, _, summary, run_dir = finished_run
    for name in ("summary.json", "metrics.jsonl", "metrics.csv", "plot.png"):
        assert (run_dir / name).stat().st_size > 0, name
    assert json.loads((run_dir / "summary.json").read_text())["job"] == cfg.job
    assert set(summary["accuracy_by_version"]) >= {0, cfg.trainer.steps}
    assert 0 < summary["time_to_first_step_s"] < summary["wall_s"]


def test_the_run_tracked_every_metric_in_tensorboard_and_mlflow(finished_run):
    """tracking.tensorboard / tracking.mlflow: every row of metrics.jsonl, as TensorBoard's and
    MLflow's own readers read the run dir's tensorboard/ and mlruns/."""
    import numpy as np
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _, _, run_dir = finished_run
    same = lambda v: "nan" if v != v else v  # noqa: E731 - NaN equals itself here

    def order(points):  # by step and time (a NaN does not order)
        return sorted(points, key=lambda p: (p[0], p[2], repr(p[1])))
    want: dict[str, list] = {}
    for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        tag = f"{r['component']}/{r['name']}" + (f"/{r['label.policy']}" if r.get("label.policy") else "")
        want.setdefault(tag, []).append((r["step"], r["value"], r["ts"]))
    assert "trainer.policy/trainer.reward" in want
    tb = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    tb.Reload()
    assert {t: order((e.step, same(e.value), e.wall_time) for e in tb.Scalars(t)) for t in tb.Tags()["scalars"]} \
        == {t: order((s, same(float(np.float32(v))), ts) for s, v, ts in rows) for t, rows in want.items()}
    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.job).experiment_id])
    assert (run.info.status, run.info.run_name) == ("FINISHED", run_dir.name)
    for t, rows in want.items():
        assert order((m.step, same(m.value), m.timestamp) for m in client.get_metric_history(run.info.run_id, t)) \
            == order((s, same(v), int(ts * 1000)) for s, v, ts in rows), t


def test_bad_records_went_to_the_dlq_and_the_run_continued(finished_run, bootstrap):
    cfg, topics, summary, _ = finished_run
    letters = [m for _, _, m in read_topic(bootstrap, topics.dlq) if isinstance(m, DeadLetter)]
    by_topic = {m.source_topic: m for m in letters}
    assert set(by_topic) == {topics.tasks(cfg.policy), topics.trajectories, topics.control, topics.metrics}
    # one letter per record and reader, however often a reader re-read it
    assert sorted((m.source_topic, m.consumer) for m in letters if m.source_topic in (topics.control, topics.metrics)) \
        == [(topics.control, "trainer.policy"), (topics.metrics, "launcher")]
    assert base64.b64decode(by_topic[topics.tasks(cfg.policy)].value) == b"\x00garbage"
    assert by_topic[topics.trajectories].error_type == "UnsupportedSchema"
    assert by_topic[topics.trajectories].offset == 0
    assert summary["error"] is None


def test_one_trace_connects_schedule_rollout_batch_and_train_step(finished_run):
    _, _, _, run_dir = finished_run
    spans = {}
    for f in glob.glob(str(run_dir / "traces" / "*.jsonl")):
        service = Path(f).stem.rsplit("-", 1)[0]
        for line in open(f):
            s = json.loads(line)
            s["service"] = service
            spans[s["context"]["span_id"]] = s
    step = next(s for s in spans.values() if s["name"] == "trainer.step")
    chain = []
    s = step
    while s is not None:
        chain.append((s["service"], s["name"]))
        s = spans.get(s["parent_id"])
    assert [n for _, n in chain] == ["trainer.step", "dataflow.batch", "raas.rollout", "dataflow.schedule"]
    assert [svc for svc, _ in chain] == ["trainer", "dataflow", "raas-0", "dataflow"]
    assert len({spans[sid]["context"]["trace_id"] for sid in spans if spans[sid]["name"] in
                {n for _, n in chain}} & {step["context"]["trace_id"]}) == 1
    rollout = next(s for s in spans.values() if s["name"] == "raas.rollout"
                   and any(c["parent_id"] == s["context"]["span_id"] and c["name"] == "raas.generate"
                           for c in spans.values()))
    kids = {c["name"] for c in spans.values() if c["parent_id"] == rollout["context"]["span_id"]}
    assert {"raas.generate", "raas.workflow"} <= kids  # each role call, and the episode's workflow (rewards)
    assert any(s["name"] == "weights.publish" for s in spans.values())
    assert any(s["name"] == "raas.weights.apply" for s in spans.values())


def test_bad_config_is_rejected_naming_key_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("job: x\nrollout:\n  n_sample: 4\n")
    proc = subprocess.run([sys.executable, "-m", "astraflow", "run", str(bad)], capture_output=True, text=True,
                          timeout=120)
    from astraflow.errors import EXIT_FATAL
    assert proc.returncode == EXIT_FATAL  # a bad config is not worth a retry
    assert f"{bad}: rollout.n_sample: unknown key" in proc.stderr


#: Steps of the learning run. The held-out accuracy of this sync run (seed 0, 200 problems x 4),
#: measured every 10 versions: 0.171, 0.158, 0.177, 0.190, 0.200, 0.229, 0.239, 0.250, 0.237 at 80:
#: from version 50 on it is above the margin by about as much as at 80 (+0.058 vs +0.066), at 40
#: (+0.029) it is not. The run used to be 80 steps; 50 is the same check for 5/8 of the time.
LEARN_STEPS = 50


def test_training_raises_heldout_accuracy(make_job_config, bootstrap):
    """Sync mode: each batch is exactly the tasks scheduled at its version, so the run is
    reproducible and the margin below is not noise (200 problems x 4 samples)."""
    cfg = make_job_config({"mode": "sync",
                           "rollout": {"n_samples": 8, "tasks_per_call": 8},
                           "dataflow": {"groups_per_batch": 16},
                           "trainer": {"steps": LEARN_STEPS, "checkpoint_every": 25, "snapshot_every": 25},
                           "eval": {"every": 0, "problems": 200, "k": 4}}, name="learn")
    summary = run_job(cfg, bootstrap=bootstrap, progress=False, timeout_s=900)
    before, after = summary["accuracy_initial"], summary["accuracy_final"]
    assert set(summary["accuracy_by_version"]) == {0, LEARN_STEPS}
    assert after >= before + 0.03, summary["accuracy_by_version"]
    # sync: every token of every batch was generated at the version being trained, so each
    # step reports the training-inference gap, and the trainer's log-probs match the engine's
    assert summary["train_inference_logp_gap_steps"] == LEARN_STEPS
    assert summary["train_inference_logp_gap"] < 1e-4 and summary["train_inference_logp_gap_max"] < 1e-3


def test_status_reads_versions_nodes_and_lag_from_the_topics(finished_run, bootstrap):
    from astraflow.status import format_status, job_status
    cfg, _, summary, _ = finished_run
    s = job_status(bootstrap, cfg.job)
    assert s["versions"][cfg.policy]["version"] == cfg.trainer.steps
    nodes = {n["node"]: n for n in s["nodes"]}
    assert nodes["raas-0"]["role"] == "raas" and nodes["raas-0"]["version"] >= cfg.trainer.steps - 1
    assert nodes[f"trainer.{cfg.policy}"]["version"] == cfg.trainer.steps
    # finished: done, no task lag left to mislead, and the trainer's whole time (summary.json's)
    assert s["state"] == "done" and s["done"] == {cfg.policy: cfg.trainer.steps} and s["task_lag"] is None
    assert s["trainer_train_s_total"] == pytest.approx(summary["trainer_train_s"], abs=0.01)
    assert s["trainer_train_s_total"] > 0
    assert f"done at version {cfg.trainer.steps}" in format_status(s)
