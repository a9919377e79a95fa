"""The trained model out: HF exports from the trainer and rebuilt from the log, and a run dir read offline.

Real DeepSpeed on CPU trains the tiny model; the real publisher writes its versions to
the real broker (snapshots + deltas); ``export --model`` rebuilds them. The offline test
records a job into a broker of its own, stops it, and reads the run dir with no live broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample  # noqa: E402
from astraflow.engines.config import TrainerConfig  # noqa: E402
from astraflow.replay.recorded import RecordError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
POLICY = "policy"


@pytest.fixture(scope="module")
def tiny_model_path():
    from astraflow.models.bootstrap import ensure_tiny_model
    return ensure_tiny_model()


@pytest.fixture(scope="module")
def batch(tiny_model_path):
    """Samples of the tiny model on arithmetic prompts, rewarded by exact match (+ a bonus for variance)."""
    from transformers import AutoTokenizer

    from astraflow.engines.cpu import CpuEngine
    from astraflow.workflows.arithmetic import generate_problems, reward

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    engine = CpuEngine(tiny_model_path)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=(tok.eos_token_id,), seed=3)
    samples = []
    try:
        for gi, prob in enumerate(generate_problems(3, seed=7)):
            ids = tok.encode(prob.prompt, add_special_tokens=False)
            for g in engine.generate([ids] * 4, params):
                r = reward(tok.decode(g.tokens, skip_special_tokens=True), prob.answer)
                samples.append(TrainSample(tuple(ids), g.tokens, g.logprobs, reward=r + (len(samples) % 2),
                                           group_id=gi))
    finally:
        engine.close()
    return TrainBatch(tuple(samples))


def _trainer(path):
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer
    return DeepSpeedTrainer(path, TrainerConfig(lr=1e-3, seed=0, grad_clip=1.0))


def _train_and_publish(bootstrap, topics, model_path, batch, steps: int, snapshot_every: int = 2):
    """Train ``steps`` versions, publishing each; returns the trainer (at the last) and every version's weights."""
    from astraflow.weights import WeightPublisher

    trainer = _trainer(model_path)
    by_version = {0: trainer.named_weights()}
    pub = WeightPublisher(bootstrap, topics, POLICY, snapshot_every=snapshot_every, trim=False)
    try:
        pub.resume(by_version[0], 0)
        for _ in range(steps):
            trainer.train_step(batch)
            by_version[trainer.step] = trainer.named_weights()
            pub.publish(by_version[trainer.step], trainer.step)
        pub.flush(timeout=120)
    finally:
        pub.close()
    return trainer, by_version


def _logprobs(model, batch) -> torch.Tensor:
    """Token log-probs of every sample of ``batch`` under ``model`` (the trainer's formula)."""
    from astraflow.engines.trainer_logprobs import token_logprobs

    cfg = TrainerConfig()
    out = []
    with torch.no_grad():
        for s in batch.samples:
            ids = torch.tensor([list(s.prompt_ids) + list(s.completion_ids)])
            mask = torch.ones(1, ids.shape[1] - 1)
            logp, _, _ = token_logprobs(model, ids, mask, cfg)
            out.append(logp.flatten())
    return torch.cat(out)


def test_log_rebuilds_every_version_bit_for_bit_and_exports_load_with_the_trainers_logprobs(
        bootstrap, job_topics, tiny_model_path, batch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.replay.model_export import export_model, rebuild_version, rebuildable_versions

    trainer, by_version = _train_and_publish(bootstrap, job_topics, tiny_model_path, batch, steps=3)
    assert rebuildable_versions(bootstrap, job_topics, POLICY) == [0, 1, 2, 3]
    for k in (1, 2, 3):  # 1: snapshot 0 + a delta; 2: a snapshot; 3: snapshot 2 + a delta
        rebuilt = rebuild_version(bootstrap, job_topics, POLICY, k)
        assert rebuilt.version == k and set(rebuilt.weights) == set(by_version[k])
        for name, t in by_version[k].items():
            assert torch.equal(rebuilt.weights[name], t), (k, name)
    assert not all(torch.equal(by_version[1][n], by_version[3][n]) for n in by_version[1])  # the versions differ

    # The trainer's own export of its current version and the log's export of the same version.
    from_trainer = trainer.export_hf(tmp_path / "trainer-v3")
    from_log, rebuilt = export_model(bootstrap, job_topics.job, POLICY, tmp_path / "log-v3",
                                     base_model=tiny_model_path, version=3)
    assert rebuilt.version == 3 and (from_log / "model.safetensors").is_file()
    reference = _logprobs(trainer.engine.module.eval(), batch)
    for out in (from_trainer, from_log):
        model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        AutoTokenizer.from_pretrained(str(out))
        for name, t in by_version[3].items():
            assert torch.equal(model.state_dict()[name], t), (out, name)
        torch.testing.assert_close(_logprobs(model, batch), reference, rtol=0, atol=1e-5)
    # ... and not those of the model it started from: the check can fail.
    start = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    assert not torch.allclose(_logprobs(start, batch), reference, rtol=0, atol=1e-5)
    trainer.close()


def test_a_version_no_chain_holds_is_a_clear_error(bootstrap, job_topics, tiny_model_path, batch):
    from astraflow.replay.model_export import rebuild_version

    _train_and_publish(bootstrap, job_topics, tiny_model_path, batch, steps=1)
    with pytest.raises(RecordError, match=r"version 7 of 'policy' is in no announced chain .*versions 0\.\.1"):
        rebuild_version(bootstrap, job_topics, POLICY, 7)


def _astraflow(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


@pytest.mark.timeout(1200)  # three commands, each starting a broker on the log (a minute or two on 2 busy cores)
def test_a_finished_run_dir_is_read_offline(tmp_path, tiny_model_path, batch, job_name):
    """status and export --model on a run dir whose broker is gone: each starts its own on the log."""
    from safetensors.torch import load_file

    from astraflow.topics import EmbeddedBroker, JobTopics, ensure_topics

    run = tmp_path / "run"
    topics = JobTopics(job=job_name, policies=(POLICY,), task_partitions=1, trajectory_partitions=1)
    with EmbeddedBroker(run / "kafka", heap="512m") as broker:
        ensure_topics(broker.bootstrap_servers, topics.specs())
        trainer, by_version = _train_and_publish(broker.bootstrap_servers, topics, tiny_model_path, batch, steps=2)
        trainer.close()
        recorded_at = broker.bootstrap_servers
        from astraflow.offline import OfflineBroker, OfflineError
        with pytest.raises(OfflineError, match=f"its broker is still running at {recorded_at}; read it there"):
            OfflineBroker(run).__enter__()
    props = (run / "kafka" / "server.properties").read_text()

    st = _astraflow("status", "--run-dir", str(run), "--job", job_name)
    assert st.returncode == 0, st.stderr[-2000:]
    assert "version 2" in st.stdout, st.stdout  # the trained version
    out = tmp_path / "model"
    ex = _astraflow("export", "--model", "--job", job_name, "--run-dir", str(run), "--version", "1", "--out",
                    str(out), "--base-model", str(tiny_model_path))
    assert ex.returncode == 0, ex.stderr[-2000:]
    assert f"exported version 1 of {POLICY}" in ex.stdout and str(out) in ex.stdout
    got = load_file(str(out / "model.safetensors"))
    for name, t in by_version[1].items():
        if name in got:  # (a tied lm_head is stored once)
            assert torch.equal(got[name], t), name
    # A bootstrap given as the run dir's path works the same; the run's own files stay as it left them.
    ex2 = _astraflow("export", "--model", "--job", job_name, "--bootstrap-servers", str(run), "--out",
                     str(tmp_path / "latest"), "--base-model", str(tiny_model_path))
    assert ex2.returncode == 0 and "exported version 2" in ex2.stdout, ex2.stderr[-2000:]
    assert (run / "kafka" / "server.properties").read_text() == props and recorded_at in props


def test_a_dir_without_a_kafka_log_and_an_unreachable_bootstrap_are_one_line_errors(tmp_path):
    from astraflow.topics.broker import free_port

    proc = _astraflow("status", "--run-dir", str(tmp_path), "--job", "j", timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"astraflow: error: {tmp_path}: no Kafka log here")
    port = free_port()
    proc = _astraflow("export", "--model", "--job", "j", "--bootstrap-servers", f"127.0.0.1:{port}", "--out",
                      str(tmp_path / "m"), timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "no broker accepted a connection" in lines[0] and "Traceback" not in proc.stderr
