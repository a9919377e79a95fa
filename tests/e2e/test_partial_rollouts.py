"""Partial rollouts in a real job (``rollout.partial: true``): new versions land mid-generation,
rows go on under them, a RaaS node is SIGKILLed mid-row, and the topics still keep the
conservation law and the staleness bound (counted from each sample's oldest token).

The job is the SmolLM2 chat job on a random-weight model of its architecture (rows run to
their length limit); each node's engine waits 50 ms between tokens (the ``raas.between_tokens`` fault point, a test
hook: :mod:`astraflow.chaos.hooks`), so a call outlasts a trainer step and
versions arrive while rows are in flight, as they do on long generations.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from astraflow.chaos.hooks import SLOW_TOKENS
from astraflow.topics import TrajectoryGroup, ensure_topics, job_topics
from astraflow.topics.replay import read_topic

from .test_chaos import _assert_conserved

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_rows_span_versions_and_a_kill_mid_row_loses_nothing(bootstrap, smol_random, tmp_path, monkeypatch):
    from astraflow.chaos.harness import JobHarness
    from astraflow.config import load_config

    monkeypatch.setenv(SLOW_TOKENS, "*:0.05")
    # a random-weight model: its rows run to max_new_tokens instead of stopping after a few tokens
    sets = {"job": f"partial-{uuid.uuid4().hex[:8]}", "model.name": None, "model.path": str(smol_random),
            "trainer.steps": 8, "trainer.engine.threads": 1, "trainer.checkpoint_every": 2, "trainer.snapshot_every": 4,
            "dataflow.groups_per_batch": 2, "rollout.n_samples": 2, "rollout.tasks_per_call": 2,
            "rollout.max_new_tokens": 16, "rollout.heartbeat_s": 1.0, "rollout.partial": True,
            "eval.every": 0, "eval.problems": 4, "run_dir": str(tmp_path / "runs")}
    cfg = load_config(ROOT / "examples" / "smollm2_chat_arithmetic.yaml", sets)
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run",
                   overrides=[f"{k}={'null' if v is None else v}" for k, v in sets.items()])
    try:
        for role, node in (("dataflow", "dataflow"), ("trainer", "trainer"), ("raas", "raas-0"), ("raas", "raas-1")):
            h.start(role, node)
        # raas-0 has continued rows under a newer version: kill it while it generates
        h.wait_for(lambda m: m.name == "raas.partial_rows" and m.labels.get("node") == "raas-0", 300,
                   "raas-0 continuing rows across a version")
        h.kill("raas-0")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    _assert_conserved(report, cfg)  # every task settled once, none lost with raas-0's rows in flight
    assert report.max_staleness_seen <= cfg.effective_staleness  # from each sample's oldest token
    groups = [m for _, _, m in read_topic(bootstrap, h.topics.trajectories) if isinstance(m, TrajectoryGroup)]
    spanning = [s for g in groups for s in g.samples if len(set(s.versions)) > 1]
    assert spanning, "no sample spans two versions: the partial path never ran"
    for s in spanning:  # versions only move forward within a row
        assert list(s.versions) == sorted(s.versions)
    # per step the trained tokens' mean lag is at most the oldest token's, and below it where a
    # row crossed a version (its later tokens are newer): what partial rollouts shorten
    by_step = {}
    for m in h.metrics:
        if m.name in ("trainer.token_lag_mean", "trainer.staleness_max"):
            by_step.setdefault(m.step, {})[m.name] = m.value
    lags = [(v["trainer.token_lag_mean"], v["trainer.staleness_max"]) for v in by_step.values() if len(v) == 2]
    assert lags and all(0 <= mean <= oldest for mean, oldest in lags)
    assert any(mean < oldest for mean, oldest in lags)
