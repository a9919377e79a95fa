"""Replay and export of a real job: 20 steps trained by separate processes, then re-trained
from ``batches.<policy>`` by ``astraflow replay`` (its own process, the real DeepSpeed
trainer on CPU) and exported by ``astraflow export``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.launcher import run_job
from astraflow.replay.recorded import end_offsets, recorded_versions
from astraflow.topics import Batch, TrajectoryGroup, job_topics
from astraflow.topics.replay import read_topic

pytestmark = pytest.mark.slow

STEPS = 20


@pytest.fixture(scope="module")
def job(bootstrap, tmp_path_factory):
    """One 20-step job (checkpoints every step, snapshots every 2 versions) shared by the tests below."""
    from .conftest import ROOT, SMALL, _merge  # noqa: F401 - module-scoped twin of make_job_config
    import uuid

    import yaml

    from astraflow.config import load_config
    tmp = tmp_path_factory.mktemp("replay")
    data = _merge(yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text()), SMALL)
    data.update(job=f"replay-{uuid.uuid4().hex[:8]}", run_dir=str(tmp / "runs"))
    data["trainer"]["steps"] = STEPS
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp / "run", progress=False, timeout_s=900)
    assert summary["steps_trained"] == STEPS
    return cfg, path, tmp / "run"


def astraflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True, text=True, timeout=600)


def replay(bootstrap, job, run_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    cfg, path, _ = job
    p = astraflow("replay", "--job", cfg.job, "--bootstrap-servers", bootstrap, "--config", str(path),
                  "--run-dir", str(run_dir), *extra)
    summary = run_dir / "summary.json"
    return p, json.loads(summary.read_text()) if summary.exists() else None


def first_changed_version(bootstrap, cfg, after: int = 0) -> int:
    """The first version after ``after`` whose recorded weights differ from the previous
    version's (a step whose batch had no learning signal leaves the weights as they were)."""
    rec = recorded_versions(bootstrap, job_topics(cfg), cfg.policy)
    return next(v for v in range(after + 1, STEPS + 1) if rec[v].digest != rec[v - 1].digest)


def test_replay_reproduces_every_version_bit_for_bit(bootstrap, job, tmp_path):
    p, summary = replay(bootstrap, job, tmp_path / "verify", "--no-eval")
    assert p.returncode == 0, p.stderr[-3000:]
    for step in range(STEPS):
        assert f"step {step} -> v{step + 1}: weights " in p.stdout and "match the recorded version bit for bit" in \
            p.stdout, p.stdout
    assert f"bit-exact: {STEPS} of {STEPS} replayed versions match" in p.stdout
    assert summary["bit_exact"] is True and summary["versions_matched"] == STEPS
    assert [s["status"] for s in summary["steps"]] == ["match"] * STEPS
    assert summary["lineage"] == "recorded" and summary["mode"] == "verify"
    for name in ("metrics.jsonl", "plot.png"):
        assert (tmp_path / "verify" / name).exists()
    state = json.loads((tmp_path / "verify" / "checkpoints" / "policy" / "step_00000020" / "state.json").read_text())
    assert state["lineage_id"] == "recorded" and state["job"] == job[0].job and state["step"] == STEPS


def test_a_changed_lr_is_a_new_lineage_and_leaves_the_job_topics_untouched(bootstrap, job, tmp_path):
    cfg = job[0]
    topics = job_topics(cfg)
    before = end_offsets(bootstrap, topics)
    p, summary = replay(bootstrap, job, tmp_path / "lr", "--set", "trainer.engine.lr=2e-2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert end_offsets(bootstrap, topics) == before  # no record written, no topic created
    changed = first_changed_version(bootstrap, cfg)
    div = summary["first_divergence"]
    assert div["version"] == changed and div["step"] == changed - 1
    assert f"step {changed - 1} -> v{changed}: diverges from the recorded weights" in p.stdout
    assert [s["status"] for s in summary["steps"][:changed - 1]] == ["match"] * (changed - 1)
    assert summary["mode"] == "what-if" and summary["lineage"].startswith("whatif-")
    assert summary["changes"] == {"trainer.engine.lr": [cfg.trainer.engine.lr, 2e-2]}
    assert summary["bit_exact"] is None and summary["reproduced_recorded_history"] is True
    # Its own held-out evaluation (first and last version), beside the job's own.
    assert set(summary["accuracy_by_version"]) == {"0", str(STEPS)}
    assert summary["recorded_accuracy_by_version"]["0"] == summary["accuracy_by_version"]["0"]
    assert summary["recorded_accuracy_final"] is not None
    rows = [json.loads(line) for line in (tmp_path / "lr" / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows if r["name"] == "trainer.lr"} == set(range(1, STEPS + 1))
    assert all(r["value"] == 2e-2 for r in rows if r["name"] == "trainer.lr")
    state = json.loads((tmp_path / "lr" / "checkpoints" / "policy" / "LATEST").read_text())
    state = json.loads((tmp_path / "lr" / "checkpoints" / "policy" / state["dir"] / "state.json").read_text())
    assert state["lineage_id"] == summary["lineage"] and state["changes"] == summary["changes"]


def test_a_what_if_from_step_k_retrains_the_recorded_steps_then_branches(bootstrap, job, tmp_path):
    cfg = job[0]
    p, summary = replay(bootstrap, job, tmp_path / "branch", "--from-step", "3", "--to-step", "8", "--no-eval",
                        "--set", "trainer.engine.lr=2e-2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "step 3: branching from the recorded lineage" in p.stdout
    changed = first_changed_version(bootstrap, cfg, after=3)
    assert summary["branch_step"] == 3 and summary["steps_trained"] == 8
    assert [s["status"] for s in summary["steps"][:3]] == ["match"] * 3
    assert (summary["first_divergence"] or {}).get("version") == (changed if changed <= 8 else None)
    ckpts = tmp_path / "branch" / "checkpoints" / "policy"
    final = json.loads((ckpts / "step_00000008" / "state.json").read_text())
    assert final["lineage_id"] == summary["lineage"] and final["step"] == 8


def test_from_the_job_checkpoint_and_a_checkpoint_of_another_lineage(bootstrap, job, tmp_path):
    cfg, _, run_dir = job
    ckpt = run_dir / "checkpoints" / "policy" / f"step_{STEPS - 1:08d}"
    # Unchanged: the last step again, bit for bit.
    p, summary = replay(bootstrap, job, tmp_path / "same", "--from-checkpoint", str(ckpt), "--no-eval")
    assert p.returncode == 0, p.stderr[-3000:]
    assert summary["start_version"] == STEPS - 1 and summary["versions_matched"] == 1
    # A changed LR diverges at once; the weights payload of v20 is still on the log, so the
    # divergence names its tensors.
    p, summary = replay(bootstrap, job, tmp_path / "lr", "--from-checkpoint", str(ckpt), "--no-eval",
                        "--set", "trainer.engine.lr=2e-2")
    assert p.returncode == 0, p.stderr[-3000:]
    div = summary["first_divergence"]
    assert div["version"] == STEPS and div["tensors"], div
    assert f"tensors {div['tensors'][0]}" in p.stdout
    other = tmp_path / "lr" / "checkpoints" / "policy"
    # That checkpoint says what it is ...
    p, _ = replay(bootstrap, job, tmp_path / "bad1", "--from-checkpoint", str(other), "--no-eval")
    assert p.returncode == 3
    assert p.stderr.strip().splitlines()[-1].startswith(
        f"astraflow: error: checkpoint {other / f'step_{STEPS:08d}'} is of lineage {summary['lineage']}")
    # ... and without its label (as a trainer checkpoint of another job: no job name in its
    # state), its weights give it away.
    foreign = tmp_path / "foreign"
    shutil.copytree(other / f"step_{STEPS:08d}", foreign)
    state = json.loads((foreign / "state.json").read_text())
    for key in ("job", "policy", "lineage_id", "changes"):
        state.pop(key)
    (foreign / "state.json").write_text(json.dumps(state))
    p, _ = replay(bootstrap, job, tmp_path / "bad2", "--from-checkpoint", str(foreign), "--no-eval")
    assert p.returncode == 3
    line = p.stderr.strip().splitlines()[-1]
    assert f"checkpoint {foreign} holds version {STEPS} with weights" in line
    assert "it belongs to another job or lineage" in line


def test_export_round_trips_through_parquet(bootstrap, job, tmp_path):
    import pyarrow.dataset as ds

    cfg = job[0]
    topics = job_topics(cfg)
    p = astraflow("export", "--job", cfg.job, "--bootstrap-servers", bootstrap, "--out", str(tmp_path / "ds"))
    assert p.returncode == 0, p.stderr[-3000:]
    table = ds.dataset(tmp_path / "ds", format="parquet").to_table()
    rows = {(r["task_id"], r["sample_index"]): r for r in table.to_pylist()}
    groups = [(part, off, g) for part, off, g in read_topic(bootstrap, topics.trajectories)
              if isinstance(g, TrajectoryGroup) and g.status == "ok"]
    assert len(rows) == table.num_rows == sum(len(g.samples) for _, _, g in groups)
    step_of = {(s.partition, s.offset): b.step for _, _, b in read_topic(bootstrap, topics.batches(cfg.policy))
               if isinstance(b, Batch) for s in b.sources}
    assert set(step_of.values()) == set(range(STEPS))
    for part, off, g in groups:
        for i, s in enumerate(g.samples):
            r = rows[(g.task_id, i)]
            assert (r["completion_token_ids"], r["behaviour_logprobs"], r["token_versions"], r["reward"]) == \
                (s.tokens, s.logprobs, s.versions, s.reward)
            assert r["prompt_token_ids"] == g.prompt_ids and r["completion_text"] == s.text
            assert r["batch_step"] == step_of.get((part, off)) and r["prompt"] and r["answer"]
    meta = json.loads((tmp_path / "ds" / "_export.json").read_text())
    assert meta["rows"] == table.num_rows and meta["groups_trained"] == len(step_of)
